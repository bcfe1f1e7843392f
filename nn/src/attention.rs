//! [`CausalSelfAttention`]: multi-head self-attention with a causal mask (position `t` attends
//! to positions `<= t`), one fused `qkv` projection and an output projection `proj`.

use plimsoll_autograd::{Gpu, Tensor};

use crate::error::{Error, Result};
use crate::linear::{Init, Linear, derive_seed};
use crate::module::{Module, prefixed};

/// Causal multi-head self-attention over `[batch, time, dim]`. Parameters, under nanoGPT's
/// names: `c_attn.weight` `[3 dim, dim]` (queries, keys, values), `c_attn.bias`,
/// `c_proj.weight` `[dim, dim]`, `c_proj.bias` (PyTorch's `[out, in]`).
#[derive(Debug, Clone)]
pub struct CausalSelfAttention {
    qkv: Linear,
    proj: Linear,
    /// Invariant: divides `dim`.
    heads: usize,
    training: bool,
}

impl CausalSelfAttention {
    /// Attention over `dim` features split into `heads` heads of `dim / heads` each, initialised
    /// (Xavier uniform) from `seed`. Errors: `heads` zero or not dividing `dim`.
    pub fn new(gpu: &Gpu, dim: usize, heads: usize, seed: u64) -> Result<CausalSelfAttention> {
        if heads == 0 || dim == 0 || !dim.is_multiple_of(heads) {
            return Err(Error::InvalidConfig {
                what: "CausalSelfAttention::new",
                message: format!(
                    "dim {dim} must be a positive multiple of heads {heads} (each head gets \
                     dim / heads features)"
                ),
            });
        }
        let init = Init::XavierUniform;
        Ok(CausalSelfAttention {
            qkv: Linear::new(gpu, dim, 3 * dim, true, init, derive_seed(seed, 1))?,
            proj: Linear::new(gpu, dim, dim, true, init, derive_seed(seed, 2))?,
            heads,
            training: true,
        })
    }

    /// Attention from its two projections: `qkv` (`dim` to `3 dim`) and `proj` (`dim` to
    /// `dim`). Errors: shapes that do not fit, `heads` not dividing `dim`.
    pub fn from_parts(qkv: Linear, proj: Linear, heads: usize) -> Result<CausalSelfAttention> {
        let dim = proj.out_features();
        let fits = qkv.in_features() == dim
            && qkv.out_features() == 3 * dim
            && proj.in_features() == dim
            && heads > 0
            && dim.is_multiple_of(heads);
        if !fits {
            return Err(Error::InvalidConfig {
                what: "CausalSelfAttention::from_parts",
                message: format!(
                    "qkv {} -> {}, proj {} -> {dim}, {heads} heads: need qkv dim -> 3 dim, proj \
                     dim -> dim, and heads dividing dim",
                    qkv.in_features(),
                    qkv.out_features(),
                    proj.in_features()
                ),
            });
        }
        Ok(CausalSelfAttention {
            qkv,
            proj,
            heads,
            training: true,
        })
    }

    /// Number of heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// The input projection to queries, keys and values (`[3 dim, dim]`: queries, keys, values, in that order).
    pub fn qkv(&self) -> &Linear {
        &self.qkv
    }

    /// The output projection.
    pub fn proj(&self) -> &Linear {
        &self.proj
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dim = self.qkv.in_features();
        let &[batch, time, channels] = x.shape() else {
            return Err(Error::InputShape {
                module: "CausalSelfAttention",
                expected: format!("[batch, time, {dim}]"),
                found: x.shape().to_vec(),
            });
        };
        if channels != dim {
            return Err(Error::InputShape {
                module: "CausalSelfAttention",
                expected: format!("[batch, time, {dim}]"),
                found: x.shape().to_vec(),
            });
        }
        let (heads, head_dim) = (self.heads, dim / self.heads);
        // (B, T, 3C) -> (B, T, 3, H, D) -> (3, B, H, T, D): q, k, v are then leading slices.
        let qkv = self
            .qkv
            .forward(x)?
            .reshape(&[batch, time, 3, heads, head_dim])?
            .permute(&[2, 0, 3, 1, 4])?;
        let part = |i: usize| -> Result<Tensor> {
            Ok(qkv
                .slice(0, i, 1)?
                .reshape(&[batch, heads, time, head_dim])?)
        };
        let scale = 1.0 / (head_dim as f32).sqrt();
        let q = part(0)?; // (B, H, T, D)
        let k = part(1)?; // (B, H, T, D)
        let v = part(2)?; // (B, H, T, D)
        // q · kᵀ / sqrt(D): the transpose a flag and the scale the alpha of one kernel (no copy
        // of k, no pass over q); the causal mask inside the softmax (no mask tensor).
        let scores = q.matmul_transposed_scaled(&k, scale)?; // (B, H, T, T)
        let attention = scores.softmax_causal()?;
        let y = attention
            .matmul(&v)? // (B, H, T, D)
            .permute(&[0, 2, 1, 3])? // (B, T, H, D)
            .reshape(&[batch, time, dim])?;
        self.proj.forward(&y)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("c_attn", self.qkv.parameters());
        p.extend(prefixed("c_proj", self.proj.parameters()));
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
