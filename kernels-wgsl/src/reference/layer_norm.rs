//! CPU reference for `layer_norm` over the last axis of `[rows, cols]`, as PyTorch's
//! `nn.LayerNorm(cols, eps)`: biased variance, per-column `gamma` and `beta`. The forward also
//! returns each row's mean and `rstd = 1/sqrt(var + eps)`, saved for the backward. `f64` inside.

/// Forward results: output, and the per-row statistics saved for the backward.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormForward {
    /// `[rows, cols]`: `(x - mean) * rstd * gamma + beta`.
    pub y: Vec<f32>,
    /// `[rows]`: row mean.
    pub mean: Vec<f32>,
    /// `[rows]`: `1 / sqrt(var + eps)`, biased variance.
    pub rstd: Vec<f32>,
}

/// Backward results.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormBackward {
    /// `[rows, cols]`: gradient of `x`.
    pub dx: Vec<f32>,
    /// `[cols]`: `sum_r dy * xhat`.
    pub dgamma: Vec<f32>,
    /// `[cols]`: `sum_r dy`.
    pub dbeta: Vec<f32>,
}

/// `y = (x - mean) / sqrt(var + eps) * gamma + beta` per row, `var = mean((x - mean)^2)`.
pub fn forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    rows: usize,
    cols: usize,
    eps: f32,
) -> LayerNormForward {
    let mut out = LayerNormForward {
        y: Vec::with_capacity(rows * cols),
        mean: Vec::with_capacity(rows),
        rstd: Vec::with_capacity(rows),
    };
    for row in x.chunks_exact(cols).take(rows) {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / cols as f64;
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / cols as f64;
        let rstd = 1.0 / (var + f64::from(eps)).sqrt();
        for (j, &v) in row.iter().enumerate() {
            let xhat = (f64::from(v) - mean) * rstd;
            out.y
                .push((xhat * f64::from(gamma[j]) + f64::from(beta[j])) as f32);
        }
        out.mean.push(mean as f32);
        out.rstd.push(rstd as f32);
    }
    out
}

/// With `xhat = (x - mean) rstd` and `g = dy * gamma`:
/// `dx = rstd (g - mean_j g - xhat mean_j(g xhat))`, `dgamma = sum_r dy xhat`, `dbeta = sum_r dy`.
pub fn backward(
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dy: &[f32],
    rows: usize,
    cols: usize,
) -> LayerNormBackward {
    let mut dx = Vec::with_capacity(rows * cols);
    let mut dgamma = vec![0.0f64; cols];
    let mut dbeta = vec![0.0f64; cols];
    for r in 0..rows {
        let (m, s) = (f64::from(mean[r]), f64::from(rstd[r]));
        let xr = &x[r * cols..(r + 1) * cols];
        let gr = &dy[r * cols..(r + 1) * cols];
        let xhat: Vec<f64> = xr.iter().map(|&v| (f64::from(v) - m) * s).collect();
        let g: Vec<f64> = gr
            .iter()
            .zip(gamma)
            .map(|(&d, &w)| f64::from(d) * f64::from(w))
            .collect();
        let mean_g = g.iter().sum::<f64>() / cols as f64;
        let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / cols as f64;
        for j in 0..cols {
            dx.push((s * (g[j] - mean_g - xhat[j] * mean_gx)) as f32);
            dgamma[j] += f64::from(gr[j]) * xhat[j];
            dbeta[j] += f64::from(gr[j]);
        }
    }
    LayerNormBackward {
        dx,
        dgamma: dgamma.into_iter().map(|v| v as f32).collect(),
        dbeta: dbeta.into_iter().map(|v| v as f32).collect(),
    }
}
