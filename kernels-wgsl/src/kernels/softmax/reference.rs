//! CPU reference for [`softmax`](super): softmax and log-softmax over the last axis of a
//! `[rows, cols]` row-major matrix, and their backwards. Numerically stable (the row max is
//! subtracted before `exp`), computed in `f64` (the `*_f64` entry points); the `f32` entry
//! points round each result once.

use crate::kernels::{narrow, widen};

/// Row max and `log sum_j exp(x_j - max)` of one row.
fn row_max_and_log_sum_exp(row: &[f64]) -> (f64, f64) {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = row.iter().map(|&v| (v - max).exp()).sum();
    (max, sum.ln())
}

/// `log sum_j exp(x_j)` of one row, computed stably: `max + log sum_j exp(x_j - max)`.
pub fn log_sum_exp(row: &[f64]) -> f64 {
    let (max, lse) = row_max_and_log_sum_exp(row);
    max + lse
}

/// `y[r, j] = exp(x[r, j] - max_r) / sum_k exp(x[r, k] - max_r)`.
pub fn softmax_f64(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    log_softmax_f64(x, rows, cols)
        .into_iter()
        .map(f64::exp)
        .collect()
}

/// `y[r, j] = x[r, j] - max_r - log sum_k exp(x[r, k] - max_r)`.
pub fn log_softmax_f64(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(rows * cols);
    for row in x.chunks_exact(cols).take(rows) {
        let (max, lse) = row_max_and_log_sum_exp(row);
        y.extend(row.iter().map(|&v| v - max - lse));
    }
    y
}

/// Softmax backward from the forward output `y`: `dx = y * (dy - sum_j dy_j y_j)` per row.
pub fn softmax_backward_f64(y: &[f64], dy: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut dx = Vec::with_capacity(rows * cols);
    for (yr, gr) in y.chunks_exact(cols).zip(dy.chunks_exact(cols)).take(rows) {
        let dot: f64 = yr.iter().zip(gr).map(|(&a, &b)| a * b).sum();
        dx.extend(yr.iter().zip(gr).map(|(&a, &b)| a * (b - dot)));
    }
    dx
}

/// Log-softmax backward from the forward output `y` (= log-softmax):
/// `dx = dy - exp(y) * sum_j dy_j` per row (`exp(y)` is the softmax).
pub fn log_softmax_backward_f64(y: &[f64], dy: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut dx = Vec::with_capacity(rows * cols);
    for (yr, gr) in y.chunks_exact(cols).zip(dy.chunks_exact(cols)).take(rows) {
        let sum: f64 = gr.iter().sum();
        dx.extend(yr.iter().zip(gr).map(|(&a, &b)| b - a.exp() * sum));
    }
    dx
}

/// [`softmax_f64`] on `f32` data.
pub fn softmax(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    narrow(&softmax_f64(&widen(x), rows, cols))
}

/// [`log_softmax_f64`] on `f32` data.
pub fn log_softmax(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    narrow(&log_softmax_f64(&widen(x), rows, cols))
}

/// [`softmax_backward_f64`] on `f32` data.
pub fn softmax_backward(y: &[f32], dy: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    narrow(&softmax_backward_f64(&widen(y), &widen(dy), rows, cols))
}

/// [`log_softmax_backward_f64`] on `f32` data.
pub fn log_softmax_backward(y: &[f32], dy: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    narrow(&log_softmax_backward_f64(&widen(y), &widen(dy), rows, cols))
}
