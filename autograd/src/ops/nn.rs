//! Network ops: softmax and log-softmax over the last axis, fused cross-entropy with u32 targets
//! (mean over rows), layer norm over the last axis, embedding, and seeded dropout.
//! Kernels: `softmax`, `cross_entropy`, `reduce`, `layer_norm`, `embedding`, `dropout`.

use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::kernels::cross_entropy::{self, CrossEntropyDims};
use plimsoll_kernels_wgsl::kernels::layer_norm::{self, LayerNormDims};
use plimsoll_kernels_wgsl::kernels::softmax::{self, SoftmaxKind};
use plimsoll_kernels_wgsl::kernels::{dropout, embedding, reduce};
use smallvec::smallvec;

use crate::backward::Grads;
use crate::error::{Error, Result};
use crate::grad_mode::next_seed;
use crate::half::any_f16;
use crate::op::{Derivative, Op};
use crate::ops::mismatch;
use crate::tape::{output_category, record, records};
use crate::tensor::{DType, Shape, Tensor};

/// `(rows, cols)` of a tensor seen as a matrix over its last axis.
fn rows_cols(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    x.expect_dtype(op, DType::F32)?;
    let cols = *x.shape.last().ok_or_else(|| Error::BadAxis {
        op,
        axis: 0,
        shape: x.shape.to_vec(),
    })?;
    Ok((x.numel() / cols.max(1), cols))
}

fn softmax_like(x: &Tensor, log: bool) -> Result<Tensor> {
    if x.dtype == DType::F16 {
        return softmax_like(&x.widened()?, log);
    }
    let name = if log { "log_softmax" } else { "softmax" };
    let (rows, cols) = rows_cols(name, x)?;
    let recording = records(&[x]);
    let out = Tensor::empty(&x.gpu, &x.shape, output_category(recording), name)?;
    let kind = if log {
        SoftmaxKind::LogSoftmax
    } else {
        SoftmaxKind::Softmax
    };
    let (y, x_elements) = (out.elements()?, x.elements()?);
    softmax::forward(&x.gpu, kind, y, x_elements, rows as u64, cols as u64)?;
    let y = out.detach();
    record(out, &[x], || match log {
        true => Op::LogSoftmax { cols, y },
        false => Op::Softmax { cols, y },
    })
}

impl Tensor {
    /// Softmax over the last axis.
    pub fn softmax(&self) -> Result<Tensor> {
        softmax_like(self, false)
    }

    /// Causal softmax of attention scores `[.., T, T]`: row `i` of each `T×T` block (query
    /// position `i`) normalised over columns `0..=i`, and 0 after. The same values as adding a
    /// `-1e9` mask above the diagonal and calling [`Tensor::softmax`] (bit for bit), in one pass
    /// and without a mask tensor; its backward is softmax's.
    pub fn softmax_causal(&self) -> Result<Tensor> {
        if self.dtype == DType::F16 {
            return self.widened()?.softmax_causal();
        }
        let (rows, cols) = rows_cols("softmax_causal", self)?;
        let rank = self.shape.len();
        if rank < 2 || self.shape[rank - 2] != cols {
            let hint = "the last two dimensions must be equal: [.., T, T] scores";
            return Err(mismatch("softmax_causal", &self.shape, &self.shape, hint));
        }
        let recording = records(&[self]);
        let out = Tensor::empty(
            &self.gpu,
            &self.shape,
            output_category(recording),
            "softmax",
        )?;
        let (y, x_elements) = (out.elements()?, self.elements()?);
        softmax::forward_causal(&self.gpu, y, x_elements, rows as u64, cols as u64)?;
        let y = out.detach();
        record(out, &[self], || Op::Softmax { cols, y })
    }

    /// Log-softmax over the last axis.
    pub fn log_softmax(&self) -> Result<Tensor> {
        softmax_like(self, true)
    }

    /// Mean cross-entropy of these `[.., classes]` logits against u32 `targets` (one per row),
    /// with label smoothing `smoothing` in `[0, 1]`; a scalar. A target `>= classes` gives NaN.
    pub fn cross_entropy(&self, targets: &Tensor, smoothing: f32) -> Result<Tensor> {
        if self.dtype == DType::F16 {
            return self.widened()?.cross_entropy(targets, smoothing);
        }
        let (rows, cols) = rows_cols("cross_entropy", self)?;
        targets.expect_dtype("cross_entropy", DType::U32)?;
        if targets.numel() != rows {
            let hint = "one target per row of logits";
            return Err(mismatch("cross_entropy", &self.shape, &targets.shape, hint));
        }
        let recording = records(&[self]);
        let losses = Tensor::empty(
            &self.gpu,
            &[rows],
            Category::Temporary,
            "cross_entropy rows",
        )?;
        let dims = CrossEntropyDims {
            rows: rows as u64,
            cols: cols as u64,
            smoothing,
        };
        let (logits, targets_elements) = (self.elements()?, targets.elements()?);
        cross_entropy::forward(
            &self.gpu,
            &dims,
            losses.elements()?,
            logits,
            targets_elements,
        )?;
        let out = Tensor::empty(&self.gpu, &[], output_category(recording), "cross_entropy")?;
        reduce::mean_all(&self.gpu, out.elements()?, losses.elements()?)?;
        record(out, &[self, targets], || Op::CrossEntropy {
            rows,
            cols,
            smoothing,
            logits: self.detach(),
            targets: targets.detach(),
        })
    }

    /// Layer norm over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`, `gamma` and
    /// `beta` of shape `[cols]`.
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        if any_f16(&[self, gamma, beta]) {
            let (gamma, beta) = (gamma.widened()?, beta.widened()?);
            return self.widened()?.layer_norm(&gamma, &beta, eps);
        }
        let (rows, cols) = layer_norm_shape(self, gamma, beta)?;
        let category = output_category(records(&[self, gamma, beta]));
        let (out, mean, rstd) = layer_norm_outputs(self, rows, category)?;
        layer_norm::forward(
            &self.gpu,
            &layer_norm_dims(rows, cols, eps),
            [out.elements()?, mean.elements()?, rstd.elements()?],
            self.elements()?,
            gamma.elements()?,
            beta.elements()?,
        )?;
        record_layer_norm(self, [out, mean, rstd], gamma, beta, (rows, cols))
    }

    /// `(self + other, layer_norm(self + other))`: a residual addition and the layer norm of its
    /// sum (a pre-norm transformer block's "add and norm"), the same values and gradients as
    /// [`Tensor::add`] then [`Tensor::layer_norm`], bit for bit, and recorded as those two ops.
    /// Where both are f32 of one shape the two run as one kernel (`layer_norm::forward_add`),
    /// which writes the sum and normalises it in one pass; otherwise as the two ops. `other` (a
    /// block's branch) is taken: where nothing else holds its buffer, the sum is written over
    /// it, so the fusion needs no buffer more than the two ops did.
    pub fn add_layer_norm(
        &self,
        other: Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        let fused = self.shape == other.shape
            && [self, &other, gamma, beta]
                .iter()
                .all(|t| t.dtype == DType::F32);
        if !fused {
            let sum = self.add(&other)?;
            drop(other);
            let y = sum.layer_norm(gamma, beta, eps)?;
            return Ok((sum, y));
        }
        let (rows, cols) = layer_norm_shape(self, gamma, beta)?;
        let adds = records(&[self, &other]);
        let sole = std::sync::Arc::strong_count(&other.storage) == 1
            && other.offset == 0
            && other.storage.len() == other.numel() as u64;
        let sum = match sole {
            true => other.view(&other.shape, 0),
            false => Tensor::empty(&self.gpu, &self.shape, output_category(adds), "add")?,
        };
        let category = output_category(adds || records(&[gamma, beta]));
        let (out, mean, rstd) = layer_norm_outputs(self, rows, category)?;
        layer_norm::forward_add(
            &self.gpu,
            &layer_norm_dims(rows, cols, eps),
            [out.elements()?, mean.elements()?, rstd.elements()?],
            [sum.elements()?, self.elements()?, other.elements()?],
            gamma.elements()?,
            beta.elements()?,
        )?;
        let sum = record(sum, &[self, &other], || Op::Add {
            lhs: self.shape.clone(),
            rhs: other.shape.clone(),
        })?;
        drop(other);
        let y = record_layer_norm(&sum, [out, mean, rstd], gamma, beta, (rows, cols))?;
        Ok((sum, y))
    }

    /// Rows of this `[vocab, dim]` table picked by u32 `ids` (any shape): `[ids.., dim]`. An id
    /// `>= vocab` gives a row of NaN.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if self.dtype == DType::F16 {
            return self.widened()?.embedding(ids);
        }
        self.expect_dtype("embedding", DType::F32)?;
        ids.expect_dtype("embedding", DType::U32)?;
        let (vocab, dim) = match self.shape.as_slice() {
            [vocab, dim] => (*vocab, *dim),
            _ => {
                return Err(mismatch(
                    "embedding",
                    &self.shape,
                    &ids.shape,
                    "the table is [vocab, dim]",
                ));
            }
        };
        let mut shape: Shape = ids.shape.clone();
        shape.push(dim);
        let recording = records(&[self]);
        let out = Tensor::empty(&self.gpu, &shape, output_category(recording), "embedding")?;
        let (table, ids_elements) = (self.elements()?, ids.elements()?);
        let (vocab_u64, dim_u64) = (vocab as u64, dim as u64);
        embedding::gather(
            &self.gpu,
            out.elements()?,
            table,
            ids_elements,
            vocab_u64,
            dim_u64,
        )?;
        record(out, &[self, ids], || Op::Embedding {
            vocab,
            dim,
            ids: ids.detach(),
        })
    }

    /// Inverted dropout: each element zeroed with probability `p`, the rest scaled by
    /// `1 / (1 - p)`; the mask's seed is drawn from this thread's random state
    /// ([`crate::manual_seed`]). The identity when `p == 0`.
    pub fn dropout(&self, p: f32) -> Result<Tensor> {
        self.dropout_with_seed(p, next_seed())
    }

    /// [`Tensor::dropout`] with an explicit mask seed (the same seed gives the same mask, on the
    /// GPU and in `kernels::dropout::reference`).
    pub fn dropout_with_seed(&self, p: f32, seed: u64) -> Result<Tensor> {
        if self.dtype == DType::F16 {
            return self.widened()?.dropout_with_seed(p, seed);
        }
        self.expect_dtype("dropout", DType::F32)?;
        if !(0.0..1.0).contains(&p) {
            return Err(Error::InvalidArgument {
                op: "dropout",
                message: format!("probability {p} outside [0, 1)"),
            });
        }
        let recording = records(&[self]);
        let out = Tensor::empty(
            &self.gpu,
            &self.shape,
            output_category(recording),
            "dropout",
        )?;
        dropout_raw(self, &out, p, seed)?;
        Tensor::from_op(out, &[self], || Dropout { p, seed })
    }
}

/// Inverted dropout with the mask of `seed`: its backward redraws the same mask, so it saves
/// nothing but the seed ([`Op::Custom`]).
#[derive(Debug, Clone)]
struct Dropout {
    /// Probability of zeroing an element.
    p: f32,
    /// The mask's seed.
    seed: u64,
}

impl Derivative for Dropout {
    /// dx = g ⊙ mask / (1 - p), the mask redrawn from the seed.
    fn backward(&self, g: &Tensor, _needs: &[bool]) -> Result<Grads> {
        let dx = Tensor::empty(&g.gpu, &g.shape, Category::Temporary, "dropout grad")?;
        dropout_raw(g, &dx, self.p, self.seed)?;
        Ok(smallvec![Some(dx)])
    }
}

/// `out = dropout(x)` with `seed` (also the backward: `dx = dropout(dy)` with the same mask).
pub(crate) fn dropout_raw(x: &Tensor, out: &Tensor, p: f32, seed: u64) -> Result<()> {
    dropout::dropout(&x.gpu, out.elements()?, x.elements()?, p, seed)?;
    Ok(())
}

/// The gradient of softmax (`log`: log-softmax) from its output `y`.
pub(crate) fn softmax_grad(g: &Tensor, y: &Tensor, cols: usize, log: bool) -> Result<Tensor> {
    let dx = Tensor::empty(&g.gpu, &g.shape, Category::Temporary, "softmax grad")?;
    let rows = (g.numel() / cols.max(1)) as u64;
    let kind = if log {
        SoftmaxKind::LogSoftmax
    } else {
        SoftmaxKind::Softmax
    };
    let (y, dy) = (y.elements()?, g.elements()?);
    softmax::backward(&g.gpu, kind, dx.elements()?, y, dy, rows, cols as u64)?;
    Ok(dx)
}

/// The gradient of mean cross-entropy of `[rows, cols]` `logits` against `targets` with respect
/// to the logits.
pub(crate) fn cross_entropy_grad(
    g: &Tensor,
    logits: &Tensor,
    targets: &Tensor,
    (rows, cols): (usize, usize),
    smoothing: f32,
) -> Result<Tensor> {
    let dx = Tensor::empty(
        &g.gpu,
        &logits.shape,
        Category::Temporary,
        "cross_entropy grad",
    )?;
    let dims = CrossEntropyDims {
        rows: rows as u64,
        cols: cols as u64,
        smoothing,
    };
    // `g` is the gradient of the mean: one value, broadcast to every row.
    let scale = 1.0 / rows.max(1) as f32;
    cross_entropy::backward(
        &g.gpu,
        &dims,
        dx.elements()?,
        logits.elements()?,
        targets.elements()?,
        g.elements()?,
        scale,
    )?;
    Ok(dx)
}

/// The gradient `dx` of layer norm from what its forward saved, with `dgamma` and `dbeta`
/// written into the two tensors given. With `into` (x's gradient so far, of x's shape) `dx` is
/// added to it in the same kernel, and it is returned.
pub(crate) fn layer_norm_grads(
    g: &Tensor,
    [x, gamma, mean, rstd]: [&Tensor; 4],
    [dgamma, dbeta]: [&Tensor; 2],
    rows: usize,
    cols: usize,
    into: Option<Tensor>,
) -> Result<Tensor> {
    let dims = layer_norm_dims(rows, cols, 0.0);
    let (dx, launch): (_, fn(_, _, _, _, _) -> _) = match into {
        Some(sum) => (sum, layer_norm::backward_adding),
        None => (
            Tensor::empty(&g.gpu, &x.shape, Category::Temporary, "layer_norm grad")?,
            layer_norm::backward,
        ),
    };
    launch(
        &g.gpu,
        &dims,
        [dx.elements()?, dgamma.elements()?, dbeta.elements()?],
        [
            x.elements()?,
            gamma.elements()?,
            mean.elements()?,
            rstd.elements()?,
        ],
        g.elements()?,
    )?;
    Ok(dx)
}

/// `(rows, cols)` of a layer norm's input, checking `gamma` and `beta` are f32 `[cols]`.
fn layer_norm_shape(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<(usize, usize)> {
    let (rows, cols) = rows_cols("layer_norm", x)?;
    for p in [gamma, beta] {
        p.expect_dtype("layer_norm", DType::F32)?;
        if p.shape.as_slice() != [cols] {
            return Err(mismatch(
                "layer_norm",
                &x.shape,
                &p.shape,
                "gamma and beta are [cols]",
            ));
        }
    }
    Ok((rows, cols))
}

/// A layer norm's output (of `x`'s shape) and its `[rows]` mean and rstd, in that order.
fn layer_norm_outputs(
    x: &Tensor,
    rows: usize,
    category: Category,
) -> Result<(Tensor, Tensor, Tensor)> {
    Ok((
        Tensor::empty(&x.gpu, &x.shape, category, "layer_norm")?,
        Tensor::empty(&x.gpu, &[rows], category, "layer_norm mean")?,
        Tensor::empty(&x.gpu, &[rows], category, "layer_norm rstd")?,
    ))
}

fn layer_norm_dims(rows: usize, cols: usize, eps: f32) -> LayerNormDims {
    LayerNormDims {
        rows: rows as u64,
        cols: cols as u64,
        eps,
        rms: false,
    }
}

/// Records a computed layer norm of `x` (`out` with its saved mean and rstd).
fn record_layer_norm(
    x: &Tensor,
    [out, mean, rstd]: [Tensor; 3],
    gamma: &Tensor,
    beta: &Tensor,
    (rows, cols): (usize, usize),
) -> Result<Tensor> {
    record(out, &[x, gamma, beta], || Op::LayerNorm {
        rows,
        cols,
        x: x.detach(),
        gamma: gamma.detach(),
        mean,
        rstd,
    })
}

/// Writes the gradient of an embedding table into `dtable`: rows of `g` added up per id of `ids`.
pub(crate) fn embedding_grad(
    dtable: &Tensor,
    g: &Tensor,
    ids: &Tensor,
    vocab: usize,
    dim: usize,
) -> Result<()> {
    let (dy, ids) = (g.elements()?, ids.elements()?);
    embedding::scatter_add(
        &g.gpu,
        dtable.elements()?,
        dy,
        ids,
        vocab as u64,
        dim as u64,
    )?;
    Ok(())
}
