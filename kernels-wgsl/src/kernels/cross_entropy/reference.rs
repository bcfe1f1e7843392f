//! CPU reference for [`cross_entropy`](super): fused log-softmax + negative log-likelihood over
//! `[rows, cols]` logits with `u32` class targets, optional label smoothing `eps` (PyTorch's
//! `label_smoothing`: the target distribution is `q = (1 - eps) onehot(t) + eps / cols`).
//!
//! The forward writes one loss per row; the mean is a `reduce::mean_all` on top. A target
//! `>= cols` is invalid: that row's loss and gradients are NaN (loud: the mean loss is NaN),
//! never an out-of-bounds read. Computed in `f64` ([`forward_f64`], [`backward_f64`]); the `f32`
//! entry points round each result once.

use crate::kernels::softmax::reference::log_sum_exp;
use crate::kernels::{narrow, widen};

/// Per-row loss `l_r = -sum_j q_j log p_j = (1 - eps)(lse - x_t) + eps (lse - mean_j x_j)`,
/// `p = softmax(x_r)`, or NaN if `targets[r] >= cols`.
pub fn forward_f64(
    logits: &[f64],
    targets: &[u32],
    rows: usize,
    cols: usize,
    smoothing: f64,
) -> Vec<f64> {
    let eps = smoothing;
    logits
        .chunks_exact(cols)
        .zip(targets)
        .take(rows)
        .map(|(row, &t)| {
            let t = t as usize;
            if t >= cols {
                return f64::NAN;
            }
            let lse = log_sum_exp(row);
            let mean_x = row.iter().sum::<f64>() / cols as f64;
            (1.0 - eps) * (lse - row[t]) + eps * (lse - mean_x)
        })
        .collect()
}

/// `dlogits[r, j] = (softmax(x_r)_j - q_j) * dloss[r or 0] * scale`.
///
/// `dloss` holds either one value (the gradient of a reduced loss, broadcast to every row) or
/// `rows` values (per-row losses); `scale` is `1/rows` for a mean reduction, else 1. Rows with
/// an invalid target get NaN.
pub fn backward_f64(
    logits: &[f64],
    targets: &[u32],
    rows: usize,
    cols: usize,
    smoothing: f64,
    dloss: &[f64],
    scale: f64,
) -> Vec<f64> {
    let eps = smoothing;
    let per_row = dloss.len() != 1;
    let mut dx = Vec::with_capacity(rows * cols);
    for (r, (row, &t)) in logits
        .chunks_exact(cols)
        .zip(targets)
        .take(rows)
        .enumerate()
    {
        let t = t as usize;
        if t >= cols {
            dx.extend(std::iter::repeat_n(f64::NAN, cols));
            continue;
        }
        let g = dloss[if per_row { r } else { 0 }] * scale;
        let lse = log_sum_exp(row);
        for (j, &v) in row.iter().enumerate() {
            let q = if j == t { 1.0 - eps } else { 0.0 } + eps / cols as f64;
            dx.push(((v - lse).exp() - q) * g);
        }
    }
    dx
}

/// [`forward_f64`] on `f32` logits.
pub fn forward(
    logits: &[f32],
    targets: &[u32],
    rows: usize,
    cols: usize,
    smoothing: f32,
) -> Vec<f32> {
    narrow(&forward_f64(
        &widen(logits),
        targets,
        rows,
        cols,
        f64::from(smoothing),
    ))
}

/// [`backward_f64`] on `f32` data.
pub fn backward(
    logits: &[f32],
    targets: &[u32],
    rows: usize,
    cols: usize,
    smoothing: f32,
    dloss: &[f32],
    scale: f32,
) -> Vec<f32> {
    narrow(&backward_f64(
        &widen(logits),
        targets,
        rows,
        cols,
        f64::from(smoothing),
        &widen(dloss),
        f64::from(scale),
    ))
}
