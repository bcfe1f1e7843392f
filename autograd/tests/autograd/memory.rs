//! Memory, read from the allocator's per-category statistics.

use plimsoll_autograd::{Category, Result, Tensor, TensorOptions, no_grad};

use crate::common::{allocated, fresh_gpu, param, peak, reset_peaks, total_allocated, values};

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
        .map(|i| param(gpu, &values(i, 33 * 33, -0.3, 0.3), &[33, 33]))
        .collect()
}

#[test]
fn after_backward_no_saved_activation_remains() {
    let gpu = fresh_gpu();
    let ws = weights(&gpu);
    let x = Tensor::from_slice(&gpu, &values(9, 7 * 33, -1.0, 1.0), &[7, 33]).unwrap();
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

#[test]
fn no_grad_forward_saves_nothing() {
    let gpu = fresh_gpu();
    let ws = weights(&gpu);
    let x = Tensor::from_slice(&gpu, &values(9, 7 * 33, -1.0, 1.0), &[7, 33]).unwrap();
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
    let x = Tensor::from_slice(&gpu, &values(9, 7 * 33, -1.0, 1.0), &[7, 33]).unwrap();
    let before = total_allocated(&gpu);
    let loss = mlp_loss(&x, &ws).unwrap();
    assert!(total_allocated(&gpu) > before);
    drop(loss);
    assert_eq!(total_allocated(&gpu), before, "{}", gpu.memory_summary());
}

#[test]
fn unsaved_outputs_are_freed_when_dropped() {
    let gpu = fresh_gpu();
    let w = param(&gpu, &values(1, 1000, -1.0, 1.0), &[1000]);
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
