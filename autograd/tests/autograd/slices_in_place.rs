//! Products of slices of one tensor (an attention's q, k and v) write their gradients straight
//! into their places in the parent's gradient, so the pieces tile it with no copies. The oracle
//! is the same graph with `mul_scalar(1.0)` between each slice and its product (exact both
//! ways), whose gradients take the old path: a temporary per slice, copied into place.

use plimsoll_allocator::TraceEventKind;
use plimsoll_autograd::{Category, Gpu, Tensor};
use plimsoll_kernels_wgsl::testing::{Rng, allocator_trace_of, fresh_gpu, gpu};

use crate::common::param;

const ROWS: usize = 16;
const COLS: usize = 24;

/// Parts `[start, start + 1)` of `[3, ROWS, COLS]` `parent`, as `[ROWS, COLS]`; through
/// `mul_scalar(1.0)` when `apart`.
fn part(parent: &Tensor, start: usize, apart: bool) -> Tensor {
    let p = parent
        .slice(0, start, 1)
        .unwrap()
        .reshape(&[ROWS, COLS])
        .unwrap();
    match apart {
        true => p.mul_scalar(1.0).unwrap(),
        false => p,
    }
}

/// `sum(((q · kᵀ) / 4) · v ⊙ w)` with q, k, v the parts `starts` of `2 x` (`x` a
/// `[3, ROWS, COLS]` leaf; `extra`: q used again, `+ sum(q · vᵀ)`); returns the loss and `x`.
fn attention_like(gpu: &Gpu, starts: [usize; 3], apart: bool, extra: bool) -> (Tensor, Tensor) {
    let x = param(
        gpu,
        &Rng::new(1).vec_f32(3 * ROWS * COLS, -1.0, 1.0),
        &[3, ROWS, COLS],
    );
    let parent = x.mul_scalar(2.0).unwrap();
    let [q, k, v] = starts.map(|s| part(&parent, s, apart));
    let w = Tensor::from_slice(
        gpu,
        &Rng::new(2).vec_f32(ROWS * COLS, -1.0, 1.0),
        &[ROWS, COLS],
    )
    .unwrap();
    let scores = q.matmul_transposed_scaled(&k, 0.25).unwrap();
    let mut loss = scores
        .matmul(&v)
        .unwrap()
        .mul(&w)
        .unwrap()
        .sum_all()
        .unwrap();
    if extra {
        let again = q.matmul_transposed(&v).unwrap().sum_all().unwrap();
        loss = loss.add(&again).unwrap();
    }
    (loss, x)
}

/// Temporaries labelled `label` allocated during `loss`'s backward.
fn allocations_in_backward(gpu: &Gpu, loss: &Tensor, label: &str) -> usize {
    let ((), trace) = allocator_trace_of(gpu, || loss.backward().unwrap());
    trace
        .events
        .iter()
        .filter(|e| e.kind == TraceEventKind::Allocate)
        .filter(|e| e.category == Some(Category::Temporary) && e.label.as_deref() == Some(label))
        .count()
}

#[test]
fn products_of_slices_write_their_gradients_into_the_parents() {
    let gpu = fresh_gpu();
    // The products' temporaries: the scores' gradient, then dq, dk, dv where not in place.
    let (loss, x) = attention_like(&gpu, [0, 1, 2], false, false);
    let products = allocations_in_backward(&gpu, &loss, "matmul");
    assert_eq!(products, 1, "dq, dk or dv in a buffer of their own");
    let (reference, x_apart) = attention_like(&gpu, [0, 1, 2], true, false);
    let apart = allocations_in_backward(&gpu, &reference, "matmul");
    assert_eq!(
        apart, 4,
        "the oracle's path: a product's temporary per slice"
    );
    let (got, want) = (x.grad().unwrap(), x_apart.grad().unwrap());
    assert_eq!(got.to_vec().unwrap(), want.to_vec().unwrap());
}

/// Out of order, a slice used twice (its gradient then a sum), and parts that overlap (lent
/// once): the same gradients as the oracle's, bit for bit.
#[test]
fn slices_out_of_order_used_twice_or_overlapping_get_the_same_gradients() {
    let gpu = gpu();
    for (starts, extra) in [
        ([2, 0, 1], false),
        ([0, 1, 2], true),
        ([1, 1, 0], false),
        ([0, 0, 0], true),
    ] {
        let mut grads = Vec::new();
        for apart in [false, true] {
            let (loss, x) = attention_like(&gpu, starts, apart, extra);
            loss.backward().unwrap();
            grads.push((loss.to_vec().unwrap(), x.grad().unwrap().to_vec().unwrap()));
        }
        assert_eq!(
            grads[0], grads[1],
            "starts {starts:?}, q used again: {extra}"
        );
    }
}
