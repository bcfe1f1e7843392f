//! CPU reference for `cross_entropy`: fused log-softmax + negative log-likelihood over
//! `[rows, cols]` logits with `u32` class targets, optional label smoothing `eps` (PyTorch's
//! `label_smoothing`: the target distribution is `q = (1 - eps) onehot(t) + eps / cols`).
//!
//! The forward writes one loss per row; the mean is a `reduce::mean_all` on top. A target
//! `>= cols` is invalid: that row's loss and gradients are NaN (loud: the mean loss is NaN),
//! never an out-of-bounds read. Computed in `f64`.

/// Row max and log-sum-exp of one row, in `f64`: `lse = max + log sum_j exp(x_j - max)`.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row
        .iter()
        .map(|&v| f64::from(v))
        .fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    max + sum.ln()
}

/// Per-row loss `l_r = -sum_j q_j log p_j = (1 - eps)(lse - x_t) + eps (lse - mean_j x_j)`,
/// `p = softmax(x_r)`, or NaN if `targets[r] >= cols`.
pub fn forward(
    logits: &[f32],
    targets: &[u32],
    rows: usize,
    cols: usize,
    smoothing: f32,
) -> Vec<f32> {
    let eps = f64::from(smoothing);
    logits
        .chunks_exact(cols)
        .zip(targets)
        .take(rows)
        .map(|(row, &t)| {
            let t = t as usize;
            if t >= cols {
                return f32::NAN;
            }
            let lse = log_sum_exp(row);
            let mean_x = row.iter().map(|&v| f64::from(v)).sum::<f64>() / cols as f64;
            ((1.0 - eps) * (lse - f64::from(row[t])) + eps * (lse - mean_x)) as f32
        })
        .collect()
}

/// `dlogits[r, j] = (softmax(x_r)_j - q_j) * dloss[r or 0] * scale`.
///
/// `dloss` holds either one value (the gradient of a reduced loss, broadcast to every row) or
/// `rows` values (per-row losses); `scale` is `1/rows` for a mean reduction, else 1. Rows with
/// an invalid target get NaN.
pub fn backward(
    logits: &[f32],
    targets: &[u32],
    rows: usize,
    cols: usize,
    smoothing: f32,
    dloss: &[f32],
    scale: f32,
) -> Vec<f32> {
    let eps = f64::from(smoothing);
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
            dx.extend(std::iter::repeat_n(f32::NAN, cols));
            continue;
        }
        let g = f64::from(dloss[if per_row { r } else { 0 }]) * f64::from(scale);
        let lse = log_sum_exp(row);
        for (j, &v) in row.iter().enumerate() {
            let q = if j == t { 1.0 - eps } else { 0.0 } + eps / cols as f64;
            dx.push((((f64::from(v) - lse).exp() - q) * g) as f32);
        }
    }
    dx
}
