//! CPU reference for [`binary`](super): `out = a op b` with numpy broadcasting, the scalar forms
//! `a op s` and `s op a`, and the backward at the *output* shape.
//!
//! The backward returns `(da, db)` both shaped like the output; the gradient of a broadcast
//! operand is then [`crate::kernels::reduce::reference::sum_to_shape`] of it (a sequence of axis sums).
//! `max`/`min` propagate NaN (as PyTorch's `maximum`/`minimum`), and on ties their backward
//! gives half of `dy` to each side (as PyTorch).

use super::{BinaryOp, Broadcast};
use crate::kernels::{narrow, widen};

/// The CPU math of each op (the oracle the kernel tests and gradient checks use).
impl BinaryOp {
    /// `a op b` for one element pair, in `f64` (the gradient checks differentiate it).
    pub fn apply_f64(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Max if a.is_nan() || b.is_nan() => f64::NAN,
            BinaryOp::Max => a.max(b),
            BinaryOp::Min if a.is_nan() || b.is_nan() => f64::NAN,
            BinaryOp::Min => a.min(b),
        }
    }

    /// `a op b` for one element pair: [`BinaryOp::apply_f64`] rounded to `f32`, which is exactly
    /// the `f32` operation (`f64` carries more than twice `f32`'s 24 bits, so rounding twice
    /// gives the correctly rounded `f32` sum, difference, product and quotient).
    pub fn apply(self, a: f32, b: f32) -> f32 {
        self.apply_f64(f64::from(a), f64::from(b)) as f32
    }

    /// `(d(a op b)/da * dy, d(a op b)/db * dy)` for one element pair.
    pub fn apply_backward(self, a: f32, b: f32, dy: f32) -> (f32, f32) {
        match self {
            // d(a+b) = (1, 1)
            BinaryOp::Add => (dy, dy),
            // d(a-b) = (1, -1)
            BinaryOp::Sub => (dy, -dy),
            // d(ab) = (b, a)
            BinaryOp::Mul => (dy * b, dy * a),
            // d(a/b) = (1/b, -a/b^2)
            BinaryOp::Div => (dy / b, -dy * a / (b * b)),
            // d max = ([a>b], [b>a]), half each on a tie
            BinaryOp::Max => split_by_winner(a > b, b > a, dy),
            // d min = ([a<b], [b<a]), half each on a tie
            BinaryOp::Min => split_by_winner(a < b, b < a, dy),
        }
    }
}

/// The gradient goes to the winner; on a tie (neither wins) each side gets `dy / 2`.
fn split_by_winner(a_wins: bool, b_wins: bool, dy: f32) -> (f32, f32) {
    match (a_wins, b_wins) {
        (true, _) => (dy, 0.0),
        (_, true) => (0.0, dy),
        _ => (dy * 0.5, dy * 0.5),
    }
}

/// `out[i] = a[ia] op b[ib]` over the broadcast output, row-major, in `f64`.
pub fn broadcast_f64(op: BinaryOp, a: &[f64], b: &[f64], shape: &Broadcast) -> Vec<f64> {
    (0..shape.len())
        .map(|i| {
            let (ia, ib) = shape.operand_offsets(i);
            op.apply_f64(a[ia], b[ib])
        })
        .collect()
}

/// [`broadcast_f64`] on `f32` data (exact in `f32`: see [`BinaryOp::apply`]).
pub fn broadcast(op: BinaryOp, a: &[f32], b: &[f32], shape: &Broadcast) -> Vec<f32> {
    narrow(&broadcast_f64(op, &widen(a), &widen(b), shape))
}

/// `out[i] = a[i] op s`.
pub fn scalar_rhs(op: BinaryOp, a: &[f32], s: f32) -> Vec<f32> {
    a.iter().map(|&v| op.apply(v, s)).collect()
}

/// `out[i] = s op a[i]`.
pub fn scalar_lhs(op: BinaryOp, s: f32, a: &[f32]) -> Vec<f32> {
    a.iter().map(|&v| op.apply(s, v)).collect()
}

/// Backward at the output shape: `(da_full, db_full)`, each `shape.len()` long, with
/// `da_full[i] = dy[i] * d(a op b)/da` at the operands of output element `i`. Reduce each to its
/// operand's shape with [`crate::kernels::reduce::reference::sum_to_shape`].
pub fn backward(
    op: BinaryOp,
    a: &[f32],
    b: &[f32],
    dy: &[f32],
    shape: &Broadcast,
) -> (Vec<f32>, Vec<f32>) {
    (0..shape.len())
        .map(|i| {
            let (ia, ib) = shape.operand_offsets(i);
            op.apply_backward(a[ia], b[ib], dy[i])
        })
        .unzip()
}
