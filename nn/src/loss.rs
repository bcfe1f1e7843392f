//! Losses, each a scalar mean: [`cross_entropy`] over rows (fused kernel, optional label
//! smoothing), [`linear_cross_entropy`] (an output head and cross-entropy in chunks of rows,
//! never holding the whole logits) and [`mse`] over elements.

use plimsoll_autograd::{Category, DType, Derivative, Grads, Tensor};
use plimsoll_kernels_wgsl::DeviceSlice;
use plimsoll_kernels_wgsl::kernels::cross_entropy::{self, CrossEntropyDims};
use plimsoll_kernels_wgsl::kernels::matmul::{self, MatmulDims};
use plimsoll_kernels_wgsl::kernels::reduce;

use crate::error::{Error, Result};

/// Mean cross-entropy of `[.., classes]` `logits` against u32 `targets` (one per row, shape
/// `logits.shape()[..rank-1]` or flat), with label smoothing in `[0, 1]`:
/// `(1 - s) * -log p[target] + s * mean_c(-log p[c])`, averaged over rows.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, label_smoothing: f32) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&label_smoothing) {
        return Err(Error::InvalidConfig {
            what: "cross_entropy",
            message: format!("label_smoothing {label_smoothing} must be in [0, 1] (0.1 is usual)"),
        });
    }
    if targets.dtype() != DType::U32 {
        return Err(Error::InputShape {
            module: "cross_entropy",
            expected: "u32 class targets (Tensor::from_indices)".to_string(),
            found: targets.shape().to_vec(),
        });
    }
    Ok(logits.cross_entropy(targets, label_smoothing)?)
}

/// Mean squared error `mean((pred - target)^2)` over every element; the shapes must be equal
/// (no broadcasting, which would silently average the wrong pairs).
pub fn mse(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    if pred.shape() != target.shape() {
        return Err(Error::InputShape {
            module: "mse",
            expected: format!("the target's shape {:?}", target.shape()),
            found: pred.shape().to_vec(),
        });
    }
    let diff = pred.sub(target)?;
    Ok(diff.mul(&diff)?.mean_all()?)
}

/// Rows per chunk of [`linear_cross_entropy`] when none is given: the Liger kernel's rule, so a
/// chunk's logits hold about as many elements as the `[rows, width]` input (`rows / ceil(vocab
/// / width)`), but at least [`MIN_CHUNK_LOGITS`] of them (a narrow model would otherwise make
/// chunks of a row or two, each a few launches), rounded up to a power of two; never more rows
/// than there are, and never a chunk whose logits pass `max_binding_bytes` (one binding of
/// f32). At least 1.
pub fn loss_chunk_rows(rows: usize, width: usize, vocab: usize, max_binding_bytes: u64) -> usize {
    let (rows, vocab) = (rows.max(1), vocab.max(1));
    let ratio = vocab.div_ceil(width.max(1));
    let liger = rows.div_ceil(ratio).max(MIN_CHUNK_LOGITS.div_ceil(vocab));
    let binding = (max_binding_bytes / (4 * vocab as u64)).max(1);
    liger
        .next_power_of_two()
        .min(rows)
        .min(usize::try_from(binding).unwrap_or(usize::MAX))
}

/// The fewest logits (elements) an automatic chunk of [`loss_chunk_rows`] holds: 8 MiB of f32.
pub const MIN_CHUNK_LOGITS: usize = 1 << 21;

/// Mean cross-entropy of the logits `x · weightᵀ` (an output head without bias, such as a GPT's
/// head tied to its token embedding) against u32 `targets`, with label smoothing, computed
/// `chunk_rows` rows at a time so the `[rows, vocab]` logits never exist: each chunk's logits
/// are made, turned into its losses, and dropped (the fused linear cross-entropy of the Liger
/// kernel). `x` is `[.., width]` (its rows flattened), `weight` `[vocab, width]`, `targets` one
/// per row. What it saves for backward is `x`, `weight` and `targets`; backward makes each
/// chunk's logits again and turns them into its share of `dx` and `dweight`, so one step holds
/// two `[chunk_rows, vocab]` buffers at most. Same loss and gradients as
/// [`cross_entropy`] of `x.matmul_transposed(weight)` within f32 rounding. f16 inputs are
/// widened and computed in f32. `chunk_rows` 0 picks [`loss_chunk_rows`].
///
/// Errors: shapes that do not fit, targets not u32, smoothing outside `[0, 1]`, and a chunk's
/// logits past one binding (a smaller `chunk_rows` avoids it).
pub fn linear_cross_entropy(
    x: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    label_smoothing: f32,
    chunk_rows: usize,
) -> Result<Tensor> {
    if [x, weight].iter().any(|t| t.dtype() == DType::F16) {
        let (x, weight) = (x.widened()?, weight.widened()?);
        return linear_cross_entropy(&x, &weight, targets, label_smoothing, chunk_rows);
    }
    let invalid = |message: String| Error::InvalidConfig {
        what: "linear_cross_entropy",
        message,
    };
    if !(0.0..=1.0).contains(&label_smoothing) {
        return Err(invalid(format!(
            "label_smoothing {label_smoothing} must be in [0, 1] (0.1 is usual)"
        )));
    }
    let (&[vocab, width], Some(&x_width)) = (weight.shape(), x.shape().last()) else {
        return Err(invalid(format!(
            "x {:?} and weight {:?}: need x [.., width] and weight [vocab, width]",
            x.shape(),
            weight.shape()
        )));
    };
    let rows = x.numel() / x_width.max(1);
    let fits = x_width == width
        && rows > 0
        && width > 0
        && vocab > 0
        && targets.numel() == rows
        && targets.dtype() == DType::U32
        && [x, weight].iter().all(|t| t.dtype() == DType::F32);
    if !fits {
        return Err(invalid(format!(
            "x {:?} ({:?}), weight {:?} ({:?}), targets {:?} ({:?}): need x [.., width] f32, \
             weight [vocab, width] f32 and one u32 target per row of x",
            x.shape(),
            x.dtype(),
            weight.shape(),
            weight.dtype(),
            targets.shape(),
            targets.dtype()
        )));
    }
    let gpu = x.gpu();
    let chunk = match chunk_rows {
        0 => loss_chunk_rows(rows, width, vocab, gpu.max_buffer_bytes()),
        n => n.min(rows.max(1)),
    };
    let head = ChunkedHead {
        rows,
        width,
        vocab,
        chunk,
        smoothing: label_smoothing,
    };
    let losses = Tensor::empty(gpu, &[rows], Category::Temporary, "loss rows")?;
    let logits = Tensor::empty(gpu, &[chunk, vocab], Category::Temporary, "logits chunk")?;
    let (losses_all, logits_all) = (losses.elements()?, logits.elements()?);
    let (x_all, w_all, t_all) = (x.elements()?, weight.elements()?, targets.elements()?);
    for (start, len) in head.chunks() {
        let chunk_logits = logits_all.slice(0, (len * vocab) as u64)?;
        head.logits(gpu, chunk_logits, x_all, w_all, (start, len))?;
        cross_entropy::forward(
            gpu,
            &head.dims(len),
            losses_all.slice(start as u64, len as u64)?,
            chunk_logits,
            t_all.slice(start as u64, len as u64)?,
        )?;
    }
    let inputs = [x, weight, targets];
    let out = Tensor::empty(gpu, &[], Tensor::output_category(&inputs), "loss")?;
    reduce::mean_all(gpu, out.elements()?, losses_all)?;
    drop((losses, logits));
    Ok(Tensor::from_op(out, &inputs, || LinearCrossEntropy {
        head,
        x: x.detach(),
        weight: weight.detach(),
        targets: targets.detach(),
    })?)
}

/// The figures of one [`linear_cross_entropy`]: `rows` of `width` against a `vocab`-row
/// weight, `chunk` rows at a time.
#[derive(Debug, Clone, Copy)]
struct ChunkedHead {
    rows: usize,
    width: usize,
    vocab: usize,
    chunk: usize,
    smoothing: f32,
}

impl ChunkedHead {
    /// `(first row, rows)` of each chunk.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + use<> {
        let (rows, chunk) = (self.rows, self.chunk.max(1));
        (0..rows)
            .step_by(chunk)
            .map(move |start| (start, chunk.min(rows - start)))
    }

    /// The cross-entropy kernels' figures for a chunk of `len` rows.
    fn dims(&self, len: usize) -> CrossEntropyDims {
        CrossEntropyDims {
            rows: len as u64,
            cols: self.vocab as u64,
            smoothing: self.smoothing,
        }
    }

    /// Records `logits = x[start..start + len] · weightᵀ` (`[len, vocab]`).
    fn logits(
        &self,
        gpu: &plimsoll_autograd::Gpu,
        logits: DeviceSlice<'_>,
        x: DeviceSlice<'_>,
        weight: DeviceSlice<'_>,
        (start, len): (usize, usize),
    ) -> Result<()> {
        let x_rows = x.slice((start * self.width) as u64, (len * self.width) as u64)?;
        let dims = MatmulDims {
            trans_b: true,
            ..MatmulDims::dense(1, len, self.vocab, self.width)
        };
        matmul::matmul(gpu, &dims, logits, x_rows, weight)?;
        Ok(())
    }
}

/// What [`linear_cross_entropy`]'s backward reads: its inputs (the logits are made again).
#[derive(Debug, Clone)]
struct LinearCrossEntropy {
    head: ChunkedHead,
    x: Tensor,
    weight: Tensor,
    targets: Tensor,
}

impl Derivative for LinearCrossEntropy {
    /// Per chunk: its logits again, `dlogits` by the cross-entropy kernel (scaled by `g / rows`),
    /// `dx[chunk] = dlogits · weight` and `dweight += dlogitsᵀ · x[chunk]`.
    fn backward(&self, g: &Tensor, needs: &[bool]) -> plimsoll_autograd::Result<Grads> {
        // Saved tensors may be stored in f16 (`f16_activations`); the kernels read f32.
        let f32_of = |t: &Tensor| match t.dtype() {
            DType::F16 => t.to_f32(),
            _ => Ok(t.clone()),
        };
        let (g, x) = (f32_of(g)?, f32_of(&self.x)?);
        let h = self.head;
        let gpu = g.gpu();
        let want = |i: usize| needs.get(i).copied().unwrap_or(true);
        let dx = match want(0) {
            true => Some(Tensor::empty(
                gpu,
                self.x.shape(),
                Category::Temporary,
                "dx",
            )?),
            false => None,
        };
        let dw = match want(1) {
            true => Some(Tensor::empty(
                gpu,
                self.weight.shape(),
                Category::Temporary,
                "dweight",
            )?),
            false => None,
        };
        let scratch =
            |label: &str| Tensor::empty(gpu, &[h.chunk, h.vocab], Category::Temporary, label);
        let (logits, dlogits) = (scratch("logits chunk")?, scratch("dlogits chunk")?);
        let (logits_all, dlogits_all) = (logits.elements()?, dlogits.elements()?);
        let (x_all, w_all) = (x.elements()?, self.weight.elements()?);
        let (t_all, g_all) = (self.targets.elements()?, g.elements()?);
        let to_autograd = |e: crate::error::Error| plimsoll_autograd::Error::InvalidArgument {
            op: "linear_cross_entropy backward",
            message: e.to_string(),
        };
        for (index, (start, len)) in h.chunks().enumerate() {
            let (s, l) = ((start * h.width) as u64, (len * h.width) as u64);
            let logits_c = logits_all.slice(0, (len * h.vocab) as u64)?;
            let dlogits_c = dlogits_all.slice(0, (len * h.vocab) as u64)?;
            h.logits(gpu, logits_c, x_all, w_all, (start, len))
                .map_err(to_autograd)?;
            cross_entropy::backward(
                gpu,
                &h.dims(len),
                dlogits_c,
                logits_c,
                t_all.slice(start as u64, len as u64)?,
                g_all,
                1.0 / h.rows.max(1) as f32,
            )?;
            if let Some(dx) = &dx {
                // dx[chunk] = dlogits · weight: [len, vocab] · [vocab, width].
                let dims = MatmulDims::dense(1, len, h.width, h.vocab);
                matmul::matmul(gpu, &dims, dx.elements()?.slice(s, l)?, dlogits_c, w_all)?;
            }
            if let Some(dw) = &dw {
                // dweight (+)= dlogitsᵀ · x[chunk]: [vocab, len] · [len, width].
                let dims = MatmulDims {
                    trans_a: true,
                    accumulate: index > 0,
                    ..MatmulDims::dense(1, h.vocab, h.width, len)
                };
                matmul::matmul(gpu, &dims, dw.elements()?, dlogits_c, x_all.slice(s, l)?)?;
            }
        }
        Ok([dx, dw, None].into_iter().collect())
    }

    fn saved_activations(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.x]
    }

    fn outputs_activation(&self) -> bool {
        false
    }
}
