//! [`CausalSelfAttention`]: multi-head self-attention with a causal mask (position `t` attends
//! to positions `<= t`), one fused `qkv` projection and an output projection `proj`.

use plimsoll_autograd::{Category, DType, Derivative, Gpu, Grads, Tensor};
use plimsoll_kernels_wgsl::kernels::attention::{self, AttentionDims};

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
    /// Whether attention runs as one fused op that never stores the `T x T` probabilities
    /// ([`causal_attention`]), or as scores, causal softmax and a product (the reference).
    memory_efficient: bool,
    /// Dropout on the attention probabilities in training (nanoGPT's `attn_dropout`).
    dropout: f32,
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
            memory_efficient: false,
            dropout: 0.0,
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
            memory_efficient: false,
            dropout: 0.0,
        })
    }

    /// Uses the fused attention ([`causal_attention`]) or, with `false` (the default), the
    /// reference path that stores the `T x T` probabilities for backward.
    pub fn set_memory_efficient(&mut self, on: bool) {
        self.memory_efficient = on;
    }

    /// Drops each attention probability with probability `p` in training (nanoGPT's
    /// `attn_dropout`; 0, the default, drops none). Both paths draw one seed from the thread's
    /// random state per forward and drop the same probabilities for it. Errors: `p` outside
    /// `[0, 1)`.
    pub fn set_dropout(&mut self, p: f32) -> Result<()> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::InvalidConfig {
                what: "CausalSelfAttention::set_dropout",
                message: format!("dropout {p} outside [0, 1)"),
            });
        }
        self.dropout = p;
        Ok(())
    }

    /// The attention dropout ([`CausalSelfAttention::set_dropout`]).
    pub fn dropout(&self) -> f32 {
        self.dropout
    }

    /// Whether the fused attention is used (see [`CausalSelfAttention::set_memory_efficient`]).
    pub fn is_memory_efficient(&self) -> bool {
        self.memory_efficient
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
        let p = if self.training { self.dropout } else { 0.0 };
        let seed = if p > 0.0 {
            plimsoll_autograd::grad_mode::next_seed()
        } else {
            0
        };
        let attended = if self.memory_efficient {
            causal_attention_dropout(&q, &k, &v, scale, p, seed)?
        } else {
            // q · kᵀ / sqrt(D): the transpose a flag and the scale the alpha of one kernel (no
            // copy of k, no pass over q); the causal mask inside the softmax (no mask tensor).
            let scores = q.matmul_transposed_scaled(&k, scale)?; // (B, H, T, T)
            let probs = scores.softmax_causal()?;
            let probs = match p > 0.0 {
                true => probs.dropout_with_seed(p, seed)?,
                false => probs,
            };
            probs.matmul(&v)?
        }; // (B, H, T, D)
        let y = attended
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

/// Causal attention of queries, keys and values of one shape `[.., T, D]` (the leading
/// dimensions are batch and heads): `softmax(scale * q kᵀ, causal) v`, each position attending
/// to itself and the positions before it, computed by the `attention` kernels without the
/// `T x T` scores or probabilities (FlashAttention). What it saves for backward is its inputs,
/// its output and one log-sum-exp per row; the backward recomputes the probabilities tile by
/// tile. f16 inputs are read as f16 by the kernels and computed in f32 (mixed f16 and f32
/// inputs are widened first). Grouped-query attention: `k` and `v` may
/// hold fewer heads (`[.., H / G, T, D]` against `q`'s `[.., H, T, D]`), each serving `G`
/// consecutive query heads, read in place (never repeated per query head). Errors: shapes that
/// do not fit, a rank under 2, a head dimension past [`attention::MAX_HEAD_DIM`], and (on
/// lavapipe) a `T` past its loop limit.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    causal_attention_dropout(q, k, v, scale, 0.0, 0)
}

/// Query heads per key/value head when keys of shape `k` can serve queries of shape `q`: 1 for
/// one shape, `H / H_kv` for `q` `[.., H, T, D]` and `k` `[.., H_kv, T, D]` with `H_kv`
/// dividing `H` and the other axes equal; `None` otherwise.
fn kv_group(q: &[usize], k: &[usize]) -> Option<usize> {
    if q == k {
        return Some(1);
    }
    let rank = q.len();
    if rank < 3
        || k.len() != rank
        || q[..rank - 3] != k[..rank - 3]
        || q[rank - 2..] != k[rank - 2..]
    {
        return None;
    }
    let (heads, kv_heads) = (q[rank - 3], k[rank - 3]);
    (kv_heads > 0 && heads.is_multiple_of(kv_heads)).then_some(heads / kv_heads)
}

/// [`causal_attention`] with dropout `p` (in `[0, 1)`) on the probabilities, inside the
/// kernels: probability `(bh, i, j)` is kept (times `1 / (1 - p)`) by the mask
/// [`Tensor::dropout_with_seed`] draws with `seed` over the reference path's `[.., T, T]`
/// probabilities, so both paths drop the same ones. The backward redraws the mask from the
/// seed; nothing of it is stored.
pub fn causal_attention_dropout(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    p: f32,
    seed: u64,
) -> Result<Tensor> {
    let halves = [q, k, v].iter().all(|t| t.dtype() == DType::F16);
    if !halves && [q, k, v].iter().any(|t| t.dtype() == DType::F16) {
        let (q, k, v) = (q.widened()?, k.widened()?, v.widened()?);
        return causal_attention_dropout(&q, &k, &v, scale, p, seed);
    }
    let shape = q.shape();
    let rank = shape.len();
    let group = kv_group(shape, k.shape());
    let fits = rank >= 2
        && group.is_some()
        && v.shape() == k.shape()
        && (halves || [q, k, v].iter().all(|t| t.dtype() == DType::F32));
    if !fits {
        return Err(Error::InvalidConfig {
            what: "causal_attention",
            message: format!(
                "q {:?} ({:?}), k {:?} ({:?}), v {:?} ({:?}): need one float shape [.., T, D], \
                 or q [.., H, T, D] with k and v [.., H / G, T, D] (grouped-query attention)",
                q.shape(),
                q.dtype(),
                k.shape(),
                k.dtype(),
                v.shape(),
                v.dtype()
            ),
        });
    }
    let (time, head_dim) = (shape[rank - 2], shape[rank - 1]);
    let heads_batch = shape[..rank - 2].iter().product::<usize>();
    let dims = AttentionDims {
        heads_batch: heads_batch as u64,
        group: group.unwrap_or(1) as u64,
        time: time as u64,
        head_dim: head_dim as u64,
        scale,
        dropout: p,
        seed,
    };
    let inputs = [q, k, v];
    let category = Tensor::output_category(&inputs);
    let gpu = q.gpu();
    let out = Tensor::empty(gpu, shape, category, "attention")?;
    let lse = Tensor::empty(gpu, &[heads_batch, time], category, "attention lse")?;
    let outputs = [out.elements()?, lse.elements()?];
    match halves {
        // f16 storage: the kernels widen each value as they load it (no f32 copies).
        true => {
            attention::forward_f16(gpu, &dims, outputs, [q.halves()?, k.halves()?, v.halves()?])?
        }
        false => attention::forward(
            gpu,
            &dims,
            outputs,
            [q.elements()?, k.elements()?, v.elements()?],
        )?,
    }
    let o = out.detach();
    Ok(Tensor::from_op(out, &inputs, || FusedAttention {
        dims,
        q: q.detach(),
        k: k.detach(),
        v: v.detach(),
        o,
        lse,
    })?)
}

/// What [`causal_attention`]'s backward reads: its inputs, its output and the log-sum-exp of
/// each row of scores.
#[derive(Debug, Clone)]
struct FusedAttention {
    dims: AttentionDims,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
}

impl Derivative for FusedAttention {
    /// `dq`, `dk`, `dv` by the `attention` kernels (probabilities recomputed from `lse`): the
    /// f16 kernels when the saved `q`, `k`, `v`, `o` are all f16 (f16 storage), else on f32.
    fn backward(&self, g: &Tensor, _needs: &[bool]) -> plimsoll_autograd::Result<Grads> {
        let saved = [&self.q, &self.k, &self.v, &self.o];
        let halves = saved.iter().all(|t| t.dtype() == DType::F16);
        let g = g.widened()?;
        let [q, k, v, o] = match halves {
            true => saved.map(|t| t.clone()),
            false => [
                self.q.widened()?,
                self.k.widened()?,
                self.v.widened()?,
                self.o.widened()?,
            ],
        };
        let gpu = g.gpu();
        // dq, dk and dv in one allocation, in that order: where q, k and v are slices of one
        // tensor in that order (a GPT's projection), its gradient is then this allocation as
        // it is, with no copy into place (autograd's `Pending`).
        let (q_len, kv_len) = (q.numel(), k.numel());
        let all = Tensor::empty(
            gpu,
            &[q_len + 2 * kv_len],
            Category::Temporary,
            "attention dq dk dv",
        )?;
        let part =
            |start: usize, len: usize, shape: &[usize]| all.slice(0, start, len)?.reshape(shape);
        let (dq, dk, dv) = (
            part(0, q_len, q.shape())?,
            part(q_len, kv_len, k.shape())?,
            part(q_len + kv_len, kv_len, v.shape())?,
        );
        let delta = Tensor::empty(
            gpu,
            self.lse.shape(),
            Category::Temporary,
            "attention delta",
        )?;
        let outputs = [
            dq.elements()?,
            dk.elements()?,
            dv.elements()?,
            delta.elements()?,
        ];
        match halves {
            true => attention::backward_f16(
                gpu,
                &self.dims,
                outputs,
                [q.halves()?, k.halves()?, v.halves()?, o.halves()?],
                [self.lse.elements()?, g.elements()?],
            )?,
            false => attention::backward(
                gpu,
                &self.dims,
                outputs,
                [
                    q.elements()?,
                    k.elements()?,
                    v.elements()?,
                    o.elements()?,
                    self.lse.elements()?,
                    g.elements()?,
                ],
            )?,
        }
        Ok([Some(dq), Some(dk), Some(dv)].into_iter().collect())
    }

    fn saved_activations(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.q, &mut self.k, &mut self.v, &mut self.o]
    }

    /// The f16 kernels read saved halves (a mix of f16 and f32 is widened in `backward`).
    fn reads_saved_f16(&self) -> bool {
        true
    }
}
