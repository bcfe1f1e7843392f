//! CPU reference for [`attention`](super): the same attention with the `T x T` probabilities
//! materialised, in `f64`.

use super::AttentionDims;

/// The causal probabilities of head `h`: row `i` over keys `0..=i`, and the row's
/// log-sum-exp of scaled scores.
fn probabilities(
    dims: &AttentionDims,
    q: &[f32],
    k: &[f32],
    h: usize,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let (t, d) = (dims.time as usize, dims.head_dim as usize);
    let kvh = h / dims.group as usize;
    let at = |x: &[f32], r: usize, c: usize| f64::from(x[(h * t + r) * d + c]);
    let at_kv = |x: &[f32], r: usize, c: usize| f64::from(x[(kvh * t + r) * d + c]);
    let mut probs = Vec::with_capacity(t);
    let mut lses = Vec::with_capacity(t);
    for i in 0..t {
        let scores: Vec<f64> = (0..=i)
            .map(|j| {
                f64::from(dims.scale)
                    * (0..d).map(|c| at(q, i, c) * at_kv(k, j, c)).sum::<f64>()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        probs.push(scores.iter().map(|s| (s - max).exp() / sum).collect());
        lses.push(max + sum.ln());
    }
    (probs, lses)
}

/// What probability `(h, i, j)` is multiplied by under the dims' dropout: 1 without, else
/// 0 or `1 / (1 - p)` by [`crate::kernels::dropout::reference::keep`] at its index in the
/// `[BH, T, T]` probabilities.
fn kept(dims: &AttentionDims, h: usize, i: usize, j: usize) -> f64 {
    use crate::kernels::dropout::reference::{keep, scale};
    if dims.dropout <= 0.0 {
        return 1.0;
    }
    let t = dims.time as usize;
    let index = ((h * t + i) * t + j) as u32;
    match keep(dims.seed, index, dims.dropout) {
        true => f64::from(scale(dims.dropout)),
        false => 0.0,
    }
}

/// `(o, lse)` of the forward (`[BH, T, D]`, `[BH, T]`; `k`, `v` are `[BH / group, T, D]`).
pub fn forward(dims: &AttentionDims, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (t, d) = (dims.time as usize, dims.head_dim as usize);
    let mut o = vec![0.0f32; dims.heads_batch as usize * t * d];
    let mut lse = vec![0.0f32; dims.heads_batch as usize * t];
    for h in 0..dims.heads_batch as usize {
        let kvh = h / dims.group as usize;
        let (probs, lses) = probabilities(dims, q, k, h);
        for i in 0..t {
            for c in 0..d {
                let sum: f64 = (0..=i)
                    .map(|j| {
                        probs[i][j] * kept(dims, h, i, j) * f64::from(v[(kvh * t + j) * d + c])
                    })
                    .sum();
                o[(h * t + i) * d + c] = sum as f32;
            }
            lse[h * t + i] = lses[i] as f32;
        }
    }
    (o, lse)
}

/// `(dq, dk, dv)` given the output's gradient `d_o`: with `Z` the dropout's factors,
/// `dP = (dO vᵀ) * Z`, `dS = P * (dP - rowsum(dP * P))`, `dq = scale dS k`,
/// `dk = scale dSᵀ q`, `dv = (P * Z)ᵀ dO`.
pub fn backward(
    dims: &AttentionDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_o: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (t, d) = (dims.time as usize, dims.head_dim as usize);
    let n = dims.heads_batch as usize * t * d;
    let kv_n = n / dims.group as usize;
    let (mut dq, mut dk, mut dv) = (vec![0.0f64; n], vec![0.0f64; kv_n], vec![0.0f64; kv_n]);
    let scale = f64::from(dims.scale);
    for h in 0..dims.heads_batch as usize {
        let (probs, _) = probabilities(dims, q, k, h);
        let kvh = h / dims.group as usize;
        let at = |x: &[f32], r: usize, c: usize| f64::from(x[(h * t + r) * d + c]);
        let at_kv = |x: &[f32], r: usize, c: usize| f64::from(x[(kvh * t + r) * d + c]);
        for i in 0..t {
            let dp: Vec<f64> = (0..=i)
                .map(|j| {
                    kept(dims, h, i, j)
                        * (0..d).map(|c| at(d_o, i, c) * at_kv(v, j, c)).sum::<f64>()
                })
                .collect();
            let row: f64 = (0..=i).map(|j| dp[j] * probs[i][j]).sum();
            for j in 0..=i {
                let p = probs[i][j];
                let ds = p * (dp[j] - row);
                let dropped = p * kept(dims, h, i, j);
                for c in 0..d {
                    dq[(h * t + i) * d + c] += scale * ds * at_kv(k, j, c);
                    dk[(kvh * t + j) * d + c] += scale * ds * at(q, i, c);
                    dv[(kvh * t + j) * d + c] += dropped * at(d_o, i, c);
                }
            }
        }
    }
    let f32s = |x: Vec<f64>| x.into_iter().map(|v| v as f32).collect();
    (f32s(dq), f32s(dk), f32s(dv))
}
