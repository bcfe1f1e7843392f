//! A residual stream's "add and norm": `add_layer_norm` is `add` then `layer_norm`, bit for bit,
//! forward and backward; and in backward, layer norm adds its input's gradient into the
//! residual stream's gradient in its own kernel (no addition, no temporary for it) when nothing
//! else holds that gradient, and leaves a shared one alone.

use plimsoll_allocator::TraceEventKind;
use plimsoll_autograd::{Category, Gpu, Tensor};
use plimsoll_kernels_wgsl::testing::{Rng, allocator_trace_of, fresh_gpu, gpu};

use crate::common::param;

const ROWS: usize = 6;
const COLS: usize = 40;
const EPS: f32 = 1e-5;

/// Random `[ROWS, COLS]` values from `seed`.
fn values(seed: u64) -> Vec<f32> {
    Rng::new(seed).vec_f32(ROWS * COLS, -1.5, 1.5)
}

fn constant(gpu: &Gpu, seed: u64) -> Tensor {
    Tensor::from_slice(gpu, &values(seed), &[ROWS, COLS]).unwrap()
}

/// `sum((x + h) * w2) + sum(layer_norm(x + h) * w1)`, the add and norm fused or not; returns
/// the loss and the leaves `[x, h, gamma, beta]`.
fn residual_loss(gpu: &Gpu, fused: bool) -> (Tensor, [Tensor; 4]) {
    let x = param(gpu, &values(1), &[ROWS, COLS]);
    let h = param(gpu, &values(2), &[ROWS, COLS]);
    let gamma = param(gpu, &Rng::new(3).vec_f32(COLS, 0.5, 1.5), &[COLS]);
    let beta = param(gpu, &Rng::new(4).vec_f32(COLS, -0.5, 0.5), &[COLS]);
    let (s, y) = match fused {
        true => x.add_layer_norm(h.clone(), &gamma, &beta, EPS).unwrap(),
        false => {
            let s = x.add(&h).unwrap();
            let y = s.layer_norm(&gamma, &beta, EPS).unwrap();
            (s, y)
        }
    };
    let on_norm = y.mul(&constant(gpu, 5)).unwrap().sum_all().unwrap();
    let on_stream = s.mul(&constant(gpu, 6)).unwrap().sum_all().unwrap();
    (on_stream.add(&on_norm).unwrap(), [x, h, gamma, beta])
}

fn grads(leaves: &[Tensor]) -> Vec<Vec<f32>> {
    leaves
        .iter()
        .map(|t| t.grad().unwrap().to_vec().unwrap())
        .collect()
}

#[test]
fn add_layer_norm_is_add_then_layer_norm_bit_for_bit() {
    let gpu = gpu();
    let x = constant(&gpu, 7);
    let h = constant(&gpu, 8);
    let gamma = Tensor::from_slice(&gpu, &Rng::new(9).vec_f32(COLS, 0.5, 1.5), &[COLS]).unwrap();
    let beta = Tensor::from_slice(&gpu, &Rng::new(10).vec_f32(COLS, -0.5, 0.5), &[COLS]).unwrap();
    let (s, y) = x.add_layer_norm(h.clone(), &gamma, &beta, EPS).unwrap();
    let s_apart = x.add(&h).unwrap();
    let y_apart = s_apart.layer_norm(&gamma, &beta, EPS).unwrap();
    assert_eq!(s.to_vec().unwrap(), s_apart.to_vec().unwrap());
    assert_eq!(y.to_vec().unwrap(), y_apart.to_vec().unwrap());

    let mut results = Vec::new();
    for fused in [true, false] {
        let (loss, leaves) = residual_loss(&gpu, fused);
        loss.backward().unwrap();
        results.push((loss.to_vec().unwrap(), grads(&leaves)));
    }
    assert_eq!(results[0], results[1], "fused against add then layer_norm");
}

/// The oracle: `d/dx` of the loss is `w2` (through the stream) plus layer norm's input
/// gradient of `w1` (taken alone, from a leaf), added in f32, exactly as the kernel adds them.
#[test]
fn layer_norm_adds_its_input_gradient_into_the_residual_streams() {
    let gpu = fresh_gpu();
    let s_leaf = param(
        &gpu,
        &values(1)
            .iter()
            .zip(values(2))
            .map(|(a, b)| a + b)
            .collect::<Vec<_>>(),
        &[ROWS, COLS],
    );
    let (loss, leaves) = residual_loss(&gpu, true);
    let [_, _, gamma, beta] = &leaves;
    let alone = s_leaf.layer_norm(gamma, beta, EPS).unwrap();
    alone
        .mul(&constant(&gpu, 5))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let dx_norm = s_leaf.grad().unwrap().to_vec().unwrap();
    let want: Vec<f32> = values(6).iter().zip(&dx_norm).map(|(w, d)| w + d).collect();

    let ((), trace) = allocator_trace_of(&gpu, || loss.backward().unwrap());
    let additions = trace
        .events
        .iter()
        .filter(|e| e.kind == TraceEventKind::Allocate)
        .filter(|e| e.category == Some(Category::Temporary) && e.label.as_deref() == Some("add"))
        .count();
    assert_eq!(additions, 0, "backward allocated an addition's output");
    let got = grads(&leaves);
    assert_eq!(got[0], want, "dL/dx");
    assert_eq!(got[1], want, "dL/dh");
}

/// `z` is made before `x + h`, so when backward reaches the layer norm, the gradient of
/// `(x + h) + z` that `x + h` received is still also `z`'s: it must not be added into.
#[test]
fn a_residual_gradient_another_node_still_holds_is_not_added_into() {
    let gpu = gpu();
    let x2 = param(&gpu, &values(11), &[ROWS, COLS]);
    let z = x2.mul_scalar(1.0).unwrap();
    let x = param(&gpu, &values(1), &[ROWS, COLS]);
    let h = param(&gpu, &values(2), &[ROWS, COLS]);
    let gamma = param(&gpu, &Rng::new(3).vec_f32(COLS, 0.5, 1.5), &[COLS]);
    let beta = param(&gpu, &Rng::new(4).vec_f32(COLS, -0.5, 0.5), &[COLS]);
    let (s, y) = x.add_layer_norm(h.clone(), &gamma, &beta, EPS).unwrap();
    let on_norm = y.mul(&constant(&gpu, 5)).unwrap().sum_all().unwrap();
    let on_stream = s
        .add(&z)
        .unwrap()
        .mul(&constant(&gpu, 6))
        .unwrap()
        .sum_all()
        .unwrap();
    on_stream.add(&on_norm).unwrap().backward().unwrap();
    assert_eq!(
        x2.grad().unwrap().to_vec().unwrap(),
        values(6),
        "dL/dx2 = w2"
    );
    let (reference, leaves) = residual_loss(&gpu, false);
    reference.backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec().unwrap(),
        grads(&leaves)[0],
        "dL/dx"
    );
}

/// A branch nothing else holds is taken: the sum is written over its buffer (no buffer is
/// allocated for it), with the same values and gradients as the two ops apart.
#[test]
fn the_sum_is_written_over_a_branch_nothing_else_holds() {
    let gpu = fresh_gpu();
    let mut runs = Vec::new();
    for fused in [true, false] {
        let x = param(&gpu, &values(1), &[ROWS, COLS]);
        let h = param(&gpu, &values(2), &[ROWS, COLS]);
        let gamma = param(&gpu, &Rng::new(3).vec_f32(COLS, 0.5, 1.5), &[COLS]);
        let beta = param(&gpu, &Rng::new(4).vec_f32(COLS, -0.5, 0.5), &[COLS]);
        let branch = h.mul_scalar(-1.5).unwrap();
        let ((s, y), trace) = allocator_trace_of(&gpu, || match fused {
            true => x.add_layer_norm(branch, &gamma, &beta, EPS).unwrap(),
            false => {
                let s = x.add(&branch).unwrap();
                (s.clone(), s.layer_norm(&gamma, &beta, EPS).unwrap())
            }
        });
        let sums = trace
            .events
            .iter()
            .filter(|e| e.kind == TraceEventKind::Allocate && e.label.as_deref() == Some("add"))
            .count();
        assert_eq!(
            sums,
            usize::from(!fused),
            "buffers for the sum (fused: {fused})"
        );
        let on_norm = y.mul(&constant(&gpu, 5)).unwrap().sum_all().unwrap();
        let on_stream = s.mul(&constant(&gpu, 6)).unwrap().sum_all().unwrap();
        on_stream.add(&on_norm).unwrap().backward().unwrap();
        let values = [&s, &y].map(|t| t.to_vec().unwrap());
        runs.push((values, grads(&[x, h, gamma, beta])));
    }
    assert_eq!(runs[0], runs[1]);
}
