//! Memory, read from the allocator's per-category statistics.

use plimsoll_allocator::TraceEventKind;
use plimsoll_autograd::{Category, Result, Tensor, TensorOptions, no_grad};
use plimsoll_kernels_wgsl::testing::{Rng, allocator_trace_of, fresh_gpu};

use crate::common::{allocated, param, peak, reset_peaks, total_allocated};

/// A 3-layer MLP's mean-squared loss; every intermediate is dropped on return.
fn mlp_loss(x: &Tensor, weights: &[Tensor]) -> Result<Tensor> {
    let mut h = x.clone();
    for w in weights {
        h = h.matmul(w)?.gelu()?;
    }
    h.mul(&h)?.mean_all()
}

fn weights(gpu: &plimsoll_autograd::Gpu) -> Vec<Tensor> {
    (0..3)
        .map(|i| param(gpu, &Rng::new(i).vec_f32(33 * 33, -0.3, 0.3), &[33, 33]))
        .collect()
}

#[test]
fn after_backward_no_saved_activation_remains() {
    let gpu = fresh_gpu();
    let ws = weights(&gpu);
    let x = Tensor::from_slice(&gpu, &Rng::new(9).vec_f32(7 * 33, -1.0, 1.0), &[7, 33]).unwrap();
    let loss = mlp_loss(&x, &ws).unwrap();
    let saving = gpu.with_allocator(|a| a.stats().category(Category::Activation).live_allocations);
    assert!(saving >= 6, "the graph saves activations ({saving} live)");
    loss.backward().unwrap();
    // Only the loss itself (an op output the caller still holds) is left in Activation.
    let (bytes, live) = {
        let a = allocated(&gpu, Category::Activation);
        (
            a,
            gpu.with_allocator(|al| al.stats().category(Category::Activation).live_allocations),
        )
    };
    assert_eq!(
        live,
        1,
        "{bytes} activation bytes left:\n{}",
        gpu.memory_summary()
    );
    drop(loss);
    assert_eq!(allocated(&gpu, Category::Activation), 0);
    assert_eq!(
        allocated(&gpu, Category::Temporary),
        0,
        "backward scratch is freed"
    );
    assert!(allocated(&gpu, Category::Gradient) >= 3 * 33 * 33 * 4);
}

/// Release at last use, watched *during* backward (the test above looks only after it returns,
/// which a backward that kept every saved tensor until its end would pass too).
///
/// A chain of n = 16 layers `h_k = tanh(h_{k-1} + b_k)`, `x` and every `b_k` of shape
/// (R, C) = (320, 1024): S = 320 · 1024 · 4 B = 1 310 720 B per tensor, over the allocator's
/// 1 MiB small-request limit, so each gets a block of exactly S (no granule rounding or unsplit
/// remainder blurs the count). `add` saves nothing and `tanh` saves its output, so the forward
/// leaves in Activation the n saved outputs y_1..y_n and the scalar loss L (one block of
/// `block_alignment` bytes): n·S + L.
///
/// Backward visits tanh_n, add_n, tanh_{n-1}, add_{n-1}, ... Released at last use, y_k goes
/// right after tanh_k's backward, and only then does add_k's backward create b_k's gradient
/// (Gradient, S). So Activation + Gradient runs n·S + L, (n-1)·S + L, n·S + L, ... and its peak
/// over the whole backward is n·S + L = 16 · 1 310 720 + 256 = 20 971 776 B (with a 256 B
/// alignment). Were the saved tensors kept until backward returns, the gradients would pile up
/// on all of them: 2n·S + L = 41 943 296 B once b_1's gradient is made. (Temporary
/// scratch, the incoming gradients and tanh's dx, is left out: it is not what release at last
/// use decides.) The peak is replayed from the allocator's trace of the backward.
#[test]
fn backward_frees_each_saved_activation_at_its_last_use() {
    const LAYERS: u64 = 16;
    const SHAPE: [usize; 2] = [320, 1024];
    let tensor_bytes = (SHAPE[0] * SHAPE[1] * 4) as u64; // S
    let gpu = fresh_gpu();
    let loss_bytes = gpu.block_alignment(); // L: one f32 in one aligned block
    let x = Tensor::from_slice(
        &gpu,
        &Rng::new(1).vec_f32(SHAPE[0] * SHAPE[1], -1.0, 1.0),
        &SHAPE,
    )
    .unwrap();
    let biases: Vec<Tensor> = (0..LAYERS)
        .map(|k| {
            param(
                &gpu,
                &Rng::new(100 + k).vec_f32(SHAPE[0] * SHAPE[1], -0.1, 0.1),
                &SHAPE,
            )
        })
        .collect();
    let mut h = x.clone();
    for b in &biases {
        h = h.add(b).unwrap().tanh().unwrap();
    }
    let loss = h.sum_all().unwrap();
    drop(h); // now only tanh's nodes hold the y_k

    let saved_bytes = LAYERS * tensor_bytes + loss_bytes; // n·S + L
    let before = allocated(&gpu, Category::Activation) + allocated(&gpu, Category::Gradient);
    assert_eq!(
        before,
        saved_bytes,
        "the forward keeps the {LAYERS} tanh outputs and the loss:\n{}",
        gpu.memory_summary()
    );

    let ((), trace) = allocator_trace_of(&gpu, || loss.backward().unwrap());
    let mut live = before;
    let mut peak = (before, "before backward".to_string());
    for event in &trace.events {
        if !matches!(
            event.category,
            Some(Category::Activation | Category::Gradient)
        ) {
            continue;
        }
        match event.kind {
            TraceEventKind::Allocate => live += event.size_bytes,
            TraceEventKind::Free => live -= event.size_bytes,
            _ => continue,
        }
        if live > peak.0 {
            let label = event.label.as_deref().unwrap_or("?");
            peak = (
                live,
                format!("event {} ({:?} {label})", event.event, event.kind),
            );
        }
    }
    assert_eq!(
        peak.0, saved_bytes,
        "Activation + Gradient peaked during backward at {} B, after {}; release at last use \
         keeps it at {LAYERS} x {tensor_bytes} + {loss_bytes} = {saved_bytes} B",
        peak.0, peak.1
    );
    // At the end: the loss (still held) and one gradient per bias.
    assert_eq!(allocated(&gpu, Category::Activation), loss_bytes);
    assert_eq!(allocated(&gpu, Category::Gradient), LAYERS * tensor_bytes);
}

#[test]
fn no_grad_forward_saves_nothing() {
    let gpu = fresh_gpu();
    let ws = weights(&gpu);
    let x = Tensor::from_slice(&gpu, &Rng::new(9).vec_f32(7 * 33, -1.0, 1.0), &[7, 33]).unwrap();
    reset_peaks(&gpu);
    let loss = {
        let _g = no_grad();
        mlp_loss(&x, &ws).unwrap()
    };
    assert!(!loss.requires_grad());
    assert_eq!(peak(&gpu, Category::Activation), 0);
    assert!(loss.item().unwrap().is_finite());
}

#[test]
fn dropping_the_loss_without_backward_frees_the_graph() {
    let gpu = fresh_gpu();
    let ws = weights(&gpu);
    let x = Tensor::from_slice(&gpu, &Rng::new(9).vec_f32(7 * 33, -1.0, 1.0), &[7, 33]).unwrap();
    let before = total_allocated(&gpu);
    let loss = mlp_loss(&x, &ws).unwrap();
    assert!(total_allocated(&gpu) > before);
    drop(loss);
    assert_eq!(total_allocated(&gpu), before, "{}", gpu.memory_summary());
}

#[test]
fn unsaved_outputs_are_freed_when_dropped() {
    let gpu = fresh_gpu();
    let w = param(&gpu, &Rng::new(1).vec_f32(1000, -1.0, 1.0), &[1000]);
    // add_scalar saves nothing: its output, dropped by the user, is gone although the graph lives.
    let y = w.add_scalar(1.0).unwrap();
    let z = y.mul_scalar(2.0).unwrap();
    let with_y = allocated(&gpu, Category::Activation);
    drop(y);
    assert!(allocated(&gpu, Category::Activation) < with_y);
    z.sum_all().unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![2.0; 1000]);
}

#[test]
fn gradients_accumulate_until_cleared_and_clearing_frees() {
    let gpu = fresh_gpu();
    let w = param(&gpu, &[1.0, -2.0], &[2]);
    for _ in 0..3 {
        w.mul_scalar(5.0)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
    }
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![15.0, 15.0]);
    assert!(allocated(&gpu, Category::Gradient) > 0);
    w.clear_grad();
    assert!(w.grad().is_none());
    assert_eq!(allocated(&gpu, Category::Gradient), 0);
}

#[test]
fn a_ten_thousand_node_chain_drops_and_backpropagates_without_recursion() {
    let gpu = fresh_gpu();
    let w = param(&gpu, &[1.0], &[1]);
    let mut y = w.clone();
    for _ in 0..10_000 {
        y = y.add_scalar(1.0).unwrap();
    }
    drop(y); // iterative Node::drop
    let mut y = w.clone();
    for _ in 0..10_000 {
        y = y.mul_scalar(1.0).unwrap();
    }
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![1.0]);
    let _ = TensorOptions::default();
}

/// Gradients that a kernel writes whole go straight into a leaf's slot: a broadcast bias's
/// sum over rows, layer norm's dγ and dβ, an embedding table's rows. Watched through the peak
/// of `Temporary` bytes during backward: besides the incoming gradient (and layer norm's dx,
/// the sort's small scratch), no temporary of the parameter's size is allocated, which the old
/// path (a temporary, then a copy into the slot) did. Each gradient is checked against its
/// hand-worked value, and is a `Gradient` buffer.
#[test]
fn written_gradients_go_straight_into_leaf_slots() {
    let gpu = fresh_gpu();
    let n = 4096usize;
    let row = 4 * n as u64; // bytes of one [n] tensor
    let grad = |t: &Tensor| {
        let g = t.grad().unwrap();
        assert_eq!(g.category(), Category::Gradient);
        g.to_vec().unwrap()
    };
    // y = x + b with x [2, n] (not a leaf) and b [n]: db = column sums of the ones = 2.
    let x = Tensor::ones(&gpu, &[2, n], TensorOptions::default()).unwrap();
    let b = param(&gpu, &vec![0.5; n], &[n]);
    let y = x.add(&b).unwrap().sum_all().unwrap();
    reset_peaks(&gpu);
    y.backward().unwrap();
    // The incoming [2, n] gradient (2 rows) and the scalar seed; a temporary db would be one
    // row more.
    let temporary = peak(&gpu, Category::Temporary);
    assert!(
        temporary < 2 * row + row / 2,
        "{temporary} B of temporaries for the bias"
    );
    assert_eq!(grad(&b), vec![2.0; n]);

    // Layer norm of [2, n] rows: dβ = Σ_rows g = 2; dγ = Σ_rows x̂ = 0 for two rows that are
    // each other's negation (x̂ is ±1 per column, opposite in the two rows).
    let data: Vec<f32> = (0..2 * n)
        .map(|i| {
            if (i / n + i % 2).is_multiple_of(2) {
                1.0
            } else {
                -1.0
            }
        })
        .collect();
    let x = Tensor::from_slice(&gpu, &data, &[2, n]).unwrap();
    let gamma = param(&gpu, &vec![1.0; n], &[n]);
    let beta = param(&gpu, &vec![0.0; n], &[n]);
    let y = x
        .layer_norm(&gamma, &beta, 1e-5)
        .unwrap()
        .sum_all()
        .unwrap();
    reset_peaks(&gpu);
    y.backward().unwrap();
    // The incoming gradient and dx (2 rows each); dγ and dβ as temporaries would be 2 rows more.
    let temporary = peak(&gpu, Category::Temporary);
    assert!(
        temporary < 5 * row,
        "{temporary} B of temporaries for dγ and dβ"
    );
    assert_eq!(grad(&beta), vec![2.0; n]);
    assert!(grad(&gamma).iter().all(|v| v.abs() < 1e-5));

    // An embedding table [64, 64] looked up by 4 ids: each row's gradient is its count.
    let table = param(&gpu, &vec![0.0; 64 * 64], &[64, 64]);
    let ids = Tensor::from_indices(&gpu, &[3, 9, 3, 63], &[4]).unwrap();
    let y = table.embedding(&ids).unwrap().sum_all().unwrap();
    reset_peaks(&gpu);
    y.backward().unwrap();
    // The incoming [4, 64] gradient and the sort's scratch are far below the 16 KiB table.
    let temporary = peak(&gpu, Category::Temporary);
    assert!(
        temporary < 8 * 1024,
        "{temporary} B of temporaries for the table"
    );
    let got = grad(&table);
    for (r, want) in [(3, 2.0), (9, 1.0), (63, 1.0), (0, 0.0)] {
        assert!(
            got[r * 64..(r + 1) * 64].iter().all(|&v| v == want),
            "row {r}"
        );
    }
}
