//! CPU reference for [`layer_norm`](super) over the last axis of `[rows, cols]`, as PyTorch's
//! `nn.LayerNorm(cols, eps)`: biased variance, per-column `gamma` and `beta`. The forward also
//! returns each row's mean and `rstd = 1/sqrt(var + eps)`, saved for the backward. Computed in
//! `f64` ([`forward_f64`], [`backward_f64`]); the `f32` entry points round the results once.

use crate::kernels::{narrow, widen};

/// Forward results: output, and the per-row statistics saved for the backward.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormForward<T = f32> {
    /// `[rows, cols]`: `(x - mean) * rstd * gamma + beta`.
    pub y: Vec<T>,
    /// `[rows]`: row mean.
    pub mean: Vec<T>,
    /// `[rows]`: `1 / sqrt(var + eps)`, biased variance.
    pub rstd: Vec<T>,
}

/// Backward results.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormBackward<T = f32> {
    /// `[rows, cols]`: gradient of `x`.
    pub dx: Vec<T>,
    /// `[cols]`: `sum_r dy * xhat`.
    pub dgamma: Vec<T>,
    /// `[cols]`: `sum_r dy`.
    pub dbeta: Vec<T>,
}

/// `y = (x - mean) / sqrt(var + eps) * gamma + beta` per row, `var = mean((x - mean)^2)`.
pub fn forward_f64(
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    rows: usize,
    cols: usize,
    eps: f64,
) -> LayerNormForward<f64> {
    let mut out = LayerNormForward {
        y: Vec::with_capacity(rows * cols),
        mean: Vec::with_capacity(rows),
        rstd: Vec::with_capacity(rows),
    };
    for row in x.chunks_exact(cols).take(rows) {
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|&v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (j, &v) in row.iter().enumerate() {
            out.y.push((v - mean) * rstd * gamma[j] + beta[j]);
        }
        out.mean.push(mean);
        out.rstd.push(rstd);
    }
    out
}

/// With `xhat = (x - mean) rstd` and `g = dy * gamma`:
/// `dx = rstd (g - mean_j g - xhat mean_j(g xhat))`, `dgamma = sum_r dy xhat`, `dbeta = sum_r dy`.
pub fn backward_f64(
    x: &[f64],
    gamma: &[f64],
    mean: &[f64],
    rstd: &[f64],
    dy: &[f64],
    rows: usize,
    cols: usize,
) -> LayerNormBackward<f64> {
    let mut out = LayerNormBackward {
        dx: Vec::with_capacity(rows * cols),
        dgamma: vec![0.0; cols],
        dbeta: vec![0.0; cols],
    };
    for r in 0..rows {
        let (m, s) = (mean[r], rstd[r]);
        let xr = &x[r * cols..(r + 1) * cols];
        let gr = &dy[r * cols..(r + 1) * cols];
        let xhat: Vec<f64> = xr.iter().map(|&v| (v - m) * s).collect();
        let g: Vec<f64> = gr.iter().zip(gamma).map(|(&d, &w)| d * w).collect();
        let mean_g = g.iter().sum::<f64>() / cols as f64;
        let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / cols as f64;
        for j in 0..cols {
            out.dx.push(s * (g[j] - mean_g - xhat[j] * mean_gx));
            out.dgamma[j] += gr[j] * xhat[j];
            out.dbeta[j] += gr[j];
        }
    }
    out
}

/// [`forward_f64`] on `f32` data, each result rounded once to `f32`.
pub fn forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    rows: usize,
    cols: usize,
    eps: f32,
) -> LayerNormForward {
    let f = forward_f64(
        &widen(x),
        &widen(gamma),
        &widen(beta),
        rows,
        cols,
        f64::from(eps),
    );
    LayerNormForward {
        y: narrow(&f.y),
        mean: narrow(&f.mean),
        rstd: narrow(&f.rstd),
    }
}

/// [`backward_f64`] on `f32` data (the statistics as [`forward`] returns them), each result
/// rounded once to `f32`.
pub fn backward(
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dy: &[f32],
    rows: usize,
    cols: usize,
) -> LayerNormBackward {
    let b = backward_f64(
        &widen(x),
        &widen(gamma),
        &widen(mean),
        &widen(rstd),
        &widen(dy),
        rows,
        cols,
    );
    LayerNormBackward {
        dx: narrow(&b.dx),
        dgamma: narrow(&b.dgamma),
        dbeta: narrow(&b.dbeta),
    }
}

/// RMSNorm (PyTorch's `nn.RMSNorm`, Llama's norm), in `f64`: `y = x * rstd * gamma` with
/// `rstd = 1 / sqrt(mean(x²) + eps)` per row; returns `(y, rstd)`.
pub fn rms_forward_f64(
    x: &[f64],
    gamma: &[f64],
    rows: usize,
    cols: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = Vec::with_capacity(rows * cols);
    let mut rstds = Vec::with_capacity(rows);
    for row in x.chunks_exact(cols).take(rows) {
        let rstd = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / cols as f64 + eps).sqrt();
        y.extend(row.iter().zip(gamma).map(|(v, w)| v * rstd * w));
        rstds.push(rstd);
    }
    (y, rstds)
}

/// The gradients of [`rms_forward_f64`] given `dy`, by the chain rule written out per row:
/// `d rstd / d x_k = -rstd³ x_k / cols`, so
/// `dx_k = rstd g_k - rstd³ x_k / cols * sum_j g_j x_j` with `g = dy * gamma`, and
/// `dgamma = sum_r dy x rstd`; returns `(dx, dgamma)`.
pub fn rms_backward_f64(
    x: &[f64],
    gamma: &[f64],
    dy: &[f64],
    rows: usize,
    cols: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>) {
    let (_, rstds) = rms_forward_f64(x, gamma, rows, cols, eps);
    let mut dx = Vec::with_capacity(rows * cols);
    let mut dgamma = vec![0.0; cols];
    for r in 0..rows {
        let s = rstds[r];
        let xr = &x[r * cols..(r + 1) * cols];
        let gr = &dy[r * cols..(r + 1) * cols];
        let gx: f64 = (0..cols).map(|j| gr[j] * gamma[j] * xr[j]).sum();
        for j in 0..cols {
            dx.push(s * gr[j] * gamma[j] - s * s * s * xr[j] / cols as f64 * gx);
            dgamma[j] += gr[j] * xr[j] * s;
        }
    }
    (dx, dgamma)
}
