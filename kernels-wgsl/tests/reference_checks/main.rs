//! Sanity checks of the CPU references against independent oracles, so that a wrong reference
//! never becomes a wrong oracle for the GPU kernels: central finite differences (in `f64`) of
//! each forward reference for every backward, hand-worked small cases (derivations in the
//! comments), and identities.
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plimsoll_kernels_wgsl::kernels::nonfinite::reference as nonfinite;
use plimsoll_kernels_wgsl::reference::{
    binary, convert, cross_entropy, embedding, layer_norm, optimizer, reduce, softmax,
};
// The types the references take live with their launchers.
use plimsoll_kernels_wgsl::kernels::binary::{BinaryOp, Broadcast};
use plimsoll_kernels_wgsl::kernels::optimizer::{AdamWConfig, SgdConfig};
use plimsoll_kernels_wgsl::kernels::reduce::AxisView;
use plimsoll_kernels_wgsl::kernels::unary::UnaryOp;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close};

/// Central-difference gradient of the scalar `loss(x)` with respect to every element of `x`.
/// The step is taken in `f32` and the actual `(x+h) - (x-h)` is the denominator.
fn numeric_gradient(x: &[f32], h: f32, loss: impl Fn(&[f32]) -> f64) -> Vec<f32> {
    let mut xs = x.to_vec();
    (0..x.len())
        .map(|i| {
            let (plus, minus) = (x[i] + h, x[i] - h);
            xs[i] = plus;
            let lp = loss(&xs);
            xs[i] = minus;
            let lm = loss(&xs);
            xs[i] = x[i];
            ((lp - lm) / (f64::from(plus) - f64::from(minus))) as f32
        })
        .collect()
}

/// `sum_i w_i v_i` in f64: a random linear functional, whose gradient is the backward with dy = w.
fn dot(w: &[f32], v: &[f32]) -> f64 {
    w.iter()
        .zip(v)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

mod elementwise;
mod rows;
mod state_and_storage;
