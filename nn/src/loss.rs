//! Losses, each a scalar mean: [`cross_entropy()`] over rows (fused kernel, optional label
//! smoothing), [`linear_cross_entropy`] (an output head and cross-entropy in chunks of rows,
//! never holding the whole logits) and [`mse`] over elements.

use plimsoll_autograd::{Category, DType, Derivative, Grads, Tensor};
use plimsoll_kernels_wgsl::DeviceSlice;
use plimsoll_kernels_wgsl::kernels::cross_entropy::{self, CrossEntropyDims};
use plimsoll_kernels_wgsl::kernels::matmul::{self, MatmulDims};
use plimsoll_kernels_wgsl::kernels::{copy, reduce};

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
/// [`cross_entropy()`] of `x.matmul_transposed(weight)` within f32 rounding. f16 inputs are
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
    linear_cross_entropy_parts(x, &[weight], targets, label_smoothing, chunk_rows)
}

/// [`linear_cross_entropy`] with the weight kept in parts of whole rows, in order (each
/// `[rows, width]`: a table larger than one binding, see `Embedding::in_parts`). A chunk's
/// logits are made part by part, as their transpose (`[vocab, chunk]`, each part's rows one
/// contiguous block) turned into `[chunk, vocab]` by one strided copy; backward turns the
/// chunk's `dlogits` back the same way and gives each part its gradient. Gradients: `x`'s, then
/// each part's.
pub fn linear_cross_entropy_parts(
    x: &Tensor,
    parts: &[&Tensor],
    targets: &Tensor,
    label_smoothing: f32,
    chunk_rows: usize,
) -> Result<Tensor> {
    if x.dtype() == DType::F16 || parts.iter().any(|t| t.dtype() == DType::F16) {
        let x = x.widened()?;
        let wide: Vec<Tensor> = parts
            .iter()
            .map(|p| p.widened())
            .collect::<std::result::Result<_, _>>()?;
        let wide: Vec<&Tensor> = wide.iter().collect();
        return linear_cross_entropy_parts(&x, &wide, targets, label_smoothing, chunk_rows);
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
    let shapes: Vec<_> = parts.iter().map(|p| p.shape().to_vec()).collect();
    let width = x.shape().last().copied().unwrap_or(0);
    let rows = x.numel() / width.max(1);
    let part_rows: Vec<usize> = parts.iter().map(|p| p.shape()[0]).collect();
    let vocab = part_rows.iter().sum::<usize>();
    let fits = !parts.is_empty()
        && parts
            .iter()
            .all(|p| p.rank() == 2 && p.shape()[1] == width && p.dtype() == DType::F32)
        && rows > 0
        && width > 0
        && part_rows.iter().all(|&r| r > 0)
        && targets.numel() == rows
        && targets.dtype() == DType::U32
        && x.dtype() == DType::F32;
    if !fits {
        return Err(invalid(format!(
            "x {:?} ({:?}), weight {shapes:?}, targets {:?} ({:?}): need x [.., width] f32, \
             weight [vocab, width] f32 (or parts [rows, width]) and one u32 target per row of x",
            x.shape(),
            x.dtype(),
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
        parts: part_rows,
        cpu: gpu.is_cpu(),
    };
    let losses = Tensor::empty(gpu, &[rows], Category::Temporary, "loss rows")?;
    let scratch = head.scratch(gpu)?;
    let losses_all = losses.elements()?;
    let weights: Vec<DeviceSlice<'_>> = parts
        .iter()
        .map(|p| p.elements())
        .collect::<std::result::Result<_, _>>()?;
    let (x_all, t_all) = (x.elements()?, targets.elements()?);
    for (start, len) in head.chunks() {
        let chunk_logits = head.logits(gpu, &scratch, x_all, &weights, (start, len))?;
        cross_entropy::forward(
            gpu,
            &head.dims(len),
            losses_all.slice(start as u64, len as u64)?,
            chunk_logits,
            t_all.slice(start as u64, len as u64)?,
        )?;
    }
    let inputs: Vec<&Tensor> = std::iter::once(x)
        .chain(parts.iter().copied())
        .chain(std::iter::once(targets))
        .collect();
    let out = Tensor::empty(gpu, &[], Tensor::output_category(&inputs), "loss")?;
    reduce::mean_all(gpu, out.elements()?, losses_all)?;
    drop((losses, scratch));
    Ok(Tensor::from_op(out, &inputs, || LinearCrossEntropy {
        head,
        x: x.detach(),
        weights: parts.iter().map(|p| p.detach()).collect(),
        targets: targets.detach(),
    })?)
}

/// The figures of one [`linear_cross_entropy_parts`]: `rows` of `width` against a `vocab`-row
/// weight in parts of `parts` rows, `chunk` rows at a time.
#[derive(Debug, Clone)]
struct ChunkedHead {
    rows: usize,
    width: usize,
    vocab: usize,
    chunk: usize,
    smoothing: f32,
    parts: Vec<usize>,
    /// Whether the adapter runs on the CPU ([`ChunkedHead::transposes`]).
    cpu: bool,
}

/// A chunk's buffers: its logits (`[chunk, vocab]`) and, when [`ChunkedHead::transposes`],
/// their transpose.
struct Scratch {
    logits: Tensor,
    transposed: Option<Tensor>,
}

impl ChunkedHead {
    /// `(first row, rows)` of each chunk.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + use<> {
        let (rows, chunk) = (self.rows, self.chunk.max(1));
        (0..rows)
            .step_by(chunk)
            .map(move |start| (start, chunk.min(rows - start)))
    }

    /// `(first row, rows)` of each part of the weight.
    fn part_spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.parts.iter().scan(0, |first, &rows| {
            let span = (*first, rows);
            *first += rows;
            Some(span)
        })
    }

    /// Whether a chunk's logits are made as their transpose (`[vocab, len]`, then one strided
    /// copy) and backward goes through dlogitsᵀ: for a weight in parts, and on a CPU adapter
    /// for a vocabulary that is not a multiple of 4 (GPT-2's 50,257), whose `[len, vocab]`
    /// rows the tiled matmul cannot load four at a time: the transposed products all have
    /// rows of `len` or `width` and take it (on lavapipe 2.3 -> 8 GFLOP/s for the head; on an
    /// H200 the same route made the step 2.3x slower, so a GPU keeps the direct products).
    fn transposes(&self) -> bool {
        self.parts.len() > 1 || (self.cpu && !self.vocab.is_multiple_of(4))
    }

    /// The cross-entropy kernels' figures for a chunk of `len` rows.
    fn dims(&self, len: usize) -> CrossEntropyDims {
        CrossEntropyDims {
            rows: len as u64,
            cols: self.vocab as u64,
            smoothing: self.smoothing,
        }
    }

    /// The buffers a chunk needs.
    fn scratch(&self, gpu: &plimsoll_autograd::Gpu) -> Result<Scratch> {
        let shape = [self.chunk, self.vocab];
        let logits = Tensor::empty(gpu, &shape, Category::Temporary, "logits chunk")?;
        let transposed = match self.transposes() {
            false => None,
            true => Some(Tensor::empty(
                gpu,
                &shape,
                Category::Temporary,
                "logits chunk, transposed",
            )?),
        };
        Ok(Scratch { logits, transposed })
    }

    /// Records `logits = x[start..start + len] · weightᵀ` (`[len, vocab]`) into the scratch's
    /// logits and returns them.
    fn logits<'a>(
        &self,
        gpu: &plimsoll_autograd::Gpu,
        scratch: &'a Scratch,
        x: DeviceSlice<'_>,
        weights: &[DeviceSlice<'_>],
        (start, len): (usize, usize),
    ) -> Result<DeviceSlice<'a>> {
        let x_rows = x.slice((start * self.width) as u64, (len * self.width) as u64)?;
        let logits = scratch
            .logits
            .elements()?
            .slice(0, (len * self.vocab) as u64)?;
        let (Some(transposed), true) = (&scratch.transposed, self.transposes()) else {
            let weight = weights
                .first()
                .copied()
                .ok_or_else(|| Error::InvalidConfig {
                    what: "linear_cross_entropy",
                    message: "no weight".to_string(),
                })?;
            let dims = MatmulDims {
                trans_b: true,
                ..MatmulDims::dense(1, len, self.vocab, self.width)
            };
            matmul::matmul(gpu, &dims, logits, x_rows, weight)?;
            return Ok(logits);
        };
        // Each part's rows of logitsᵀ = weight_part · x_rowsᵀ ([rows, len]), then one copy.
        let t = transposed.elements()?;
        for ((first, rows), &weight) in self.part_spans().zip(weights) {
            let block = t.slice((first * len) as u64, (rows * len) as u64)?;
            let dims = MatmulDims {
                trans_b: true,
                ..MatmulDims::dense(1, rows, len, self.width)
            };
            matmul::matmul(gpu, &dims, block, weight, x_rows)?;
        }
        let t = t.slice(0, (len * self.vocab) as u64)?;
        let (l, v) = (len as u32, self.vocab as u32);
        copy::strided_copy(gpu, logits, t, &[l, v], &[1, l])?;
        Ok(logits)
    }
}

/// What [`linear_cross_entropy_parts`]'s backward reads: its inputs (the logits are made again).
#[derive(Debug, Clone)]
struct LinearCrossEntropy {
    head: ChunkedHead,
    x: Tensor,
    weights: Vec<Tensor>,
    targets: Tensor,
}

impl Derivative for LinearCrossEntropy {
    /// Per chunk: its logits again, `dlogits` by the cross-entropy kernel (scaled by `g / rows`),
    /// `dx[chunk] = dlogits · weight` and `dweight += dlogitsᵀ · x[chunk]` (per part, from
    /// `dlogitsᵀ`, for a weight in parts).
    fn backward(&self, g: &Tensor, needs: &[bool]) -> plimsoll_autograd::Result<Grads> {
        // Saved tensors may be stored in f16 (`f16_activations`); the kernels read f32.
        let (g, x) = (g.widened()?, self.x.widened()?);
        let h = &self.head;
        let gpu = g.gpu();
        let want = |i: usize| needs.get(i).copied().unwrap_or(true);
        let dx = match want(0) {
            true => Some(Tensor::empty(gpu, x.shape(), Category::Temporary, "dx")?),
            false => None,
        };
        let dws: Vec<Option<Tensor>> = (0..self.weights.len())
            .map(|p| match want(p + 1) {
                true => Tensor::empty(gpu, self.weights[p].shape(), Category::Temporary, "dweight")
                    .map(Some),
                false => Ok(None),
            })
            .collect::<plimsoll_autograd::Result<_>>()?;
        // Keeps an out-of-memory (or any kernel error) typed, so the trainer recovers from it.
        let to_autograd = crate::sequential::into_autograd;
        let scratch = h.scratch(gpu).map_err(to_autograd)?;
        let dlogits = Tensor::empty(
            gpu,
            &[h.chunk, h.vocab],
            Category::Temporary,
            "dlogits chunk",
        )?;
        let dlogits_all = dlogits.elements()?;
        let weights: Vec<DeviceSlice<'_>> = self
            .weights
            .iter()
            .map(|w| w.elements())
            .collect::<std::result::Result<_, _>>()?;
        let x_all = x.elements()?;
        let (t_all, g_all) = (self.targets.elements()?, g.elements()?);
        for (index, (start, len)) in h.chunks().enumerate() {
            let (s, l) = ((start * h.width) as u64, (len * h.width) as u64);
            let dlogits_c = dlogits_all.slice(0, (len * h.vocab) as u64)?;
            let logits_c = h
                .logits(gpu, &scratch, x_all, &weights, (start, len))
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
            // Each part's block of dlogits, `[len, rows]` with row stride vocab (one part: all
            // of it), or `[rows, len]` contiguous from dlogitsᵀ (parts).
            let transposed = match &scratch.transposed {
                Some(t) if h.transposes() => {
                    let t = t.elements()?.slice(0, (len * h.vocab) as u64)?;
                    let (l, v) = (len as u32, h.vocab as u32);
                    copy::strided_copy(gpu, t, dlogits_c, &[v, l], &[1, v])?;
                    Some(t)
                }
                _ => None,
            };
            for (p, ((first, rows), &weight)) in h.part_spans().zip(&weights).enumerate() {
                let (a, trans) = match transposed {
                    Some(t) => (t.slice((first * len) as u64, (rows * len) as u64)?, true),
                    None => (dlogits_c, false),
                };
                if let Some(dx) = &dx {
                    // dx[chunk] (+)= dlogits_part · weight_part: [len, rows] · [rows, width].
                    let dims = MatmulDims {
                        trans_a: trans,
                        accumulate: p > 0,
                        ..MatmulDims::dense(1, len, h.width, rows)
                    };
                    matmul::matmul(gpu, &dims, dx.elements()?.slice(s, l)?, a, weight)?;
                }
                if let Some(dw) = &dws[p] {
                    // dweight_part (+)= dlogits_partᵀ · x[chunk]: [rows, len] · [len, width].
                    let dims = MatmulDims {
                        trans_a: !trans,
                        accumulate: index > 0,
                        ..MatmulDims::dense(1, rows, h.width, len)
                    };
                    matmul::matmul(gpu, &dims, dw.elements()?, a, x_all.slice(s, l)?)?;
                }
            }
        }
        let mut grads: Grads = Grads::new();
        grads.push(dx);
        grads.extend(dws);
        grads.push(None);
        Ok(grads)
    }

    fn saved_activations(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.x]
    }

    fn outputs_activation(&self) -> bool {
        false
    }
}
