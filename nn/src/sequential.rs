//! [`Sequential`]: children run one after another, named `"0"`, `"1"`, ...; optionally in
//! checkpointed segments ([`Sequential::forward_checkpointed`]); and [`mlp`], its builder for
//! multi-layer perceptrons.

use std::sync::{Arc, RwLock, RwLockReadGuard};

use plimsoll_autograd::{Gpu, Tensor, checkpoint, checkpoint_with};

use crate::activation::Activation;
use crate::error::{Error, Result};
use crate::linear::{Linear, derive_seed};
use crate::module::{Module, prefixed};

/// A child, shared with the checkpointed segments that backward recomputes (they must outlive
/// the forward call). The lock is only ever taken for writing by `set_training`.
type Child = Arc<RwLock<Box<dyn Module>>>;

fn read(child: &Child) -> RwLockReadGuard<'_, Box<dyn Module>> {
    child.read().unwrap_or_else(|p| p.into_inner())
}

/// Modules applied in order. Children are named by their index.
pub struct Sequential {
    children: Vec<Child>,
    training: bool,
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequential")
            .field("len", &self.children.len())
            .field("training", &self.training)
            .finish()
    }
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential::new()
    }
}

impl Sequential {
    /// An empty sequence (its forward is the identity), in training mode.
    pub fn new() -> Sequential {
        Sequential {
            children: Vec::new(),
            training: true,
        }
    }

    /// This sequence with `module` appended (it takes the sequence's mode).
    pub fn push(self, module: impl Module + 'static) -> Sequential {
        self.push_boxed(Box::new(module))
    }

    /// [`Sequential::push`] for a boxed module.
    pub fn push_boxed(mut self, mut module: Box<dyn Module>) -> Sequential {
        module.set_training(self.training);
        self.children.push(Arc::new(RwLock::new(module)));
        self
    }

    /// Number of children.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether there are no children.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Runs the children, every run of `segment_len` consecutive children (the last run may be
    /// shorter) as one [`plimsoll_autograd::checkpoint()`] segment: its intermediates are not
    /// kept, and backward runs it again (with the same dropout masks). `segment_len >= len()`
    /// makes the whole sequence one segment; `segment_len == 0` means no checkpointing (the plain
    /// [`Module::forward`]). Which segment length to use is the caller's policy; this is the
    /// mechanism.
    pub fn forward_checkpointed(&self, x: &Tensor, segment_len: usize) -> Result<Tensor> {
        if segment_len == 0 {
            return self.forward(x);
        }
        let mut h = x.clone();
        for segment in self.children.chunks(segment_len) {
            let segment: Vec<Child> = segment.to_vec();
            h = checkpoint(&[&h], move |inputs: &[Tensor]| {
                let h = inputs.first().cloned().ok_or_else(|| {
                    plimsoll_autograd::Error::InvalidArgument {
                        op: "Sequential::forward_checkpointed",
                        message: "segment called without its input".to_string(),
                    }
                })?;
                run_children(&segment, &h).map_err(into_autograd)
            })?;
        }
        Ok(h)
    }
}

thread_local! {
    /// Whether models built on this thread evict each block's parameters as it is made
    /// ([`evict_blocks_as_built`]).
    static EVICT_BLOCKS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Until the guard drops, [`crate::Gpt::new`] and [`crate::Llama::new`] on this thread send each
/// block's parameters to host memory ([`Tensor::evict`]) as soon as the block is made, so that
/// a model whose blocks do not fit the device together can still be built for parameter
/// streaming (`run_blocks` brings them up for their segment).
pub fn evict_blocks_as_built() -> EvictBlocksGuard {
    EvictBlocksGuard {
        previous: EVICT_BLOCKS.with(|e| e.replace(true)),
    }
}

/// Restores the previous [`evict_blocks_as_built`] setting when dropped.
#[must_use = "blocks stay on the device once the guard drops"]
pub struct EvictBlocksGuard {
    previous: bool,
}

impl Drop for EvictBlocksGuard {
    fn drop(&mut self) {
        EVICT_BLOCKS.with(|e| e.set(self.previous));
    }
}

/// `block`, its parameters sent to host memory under [`evict_blocks_as_built`].
pub(crate) fn built<B: Module>(block: B) -> Result<B> {
    if EVICT_BLOCKS.with(std::cell::Cell::get) {
        let params = block.parameters();
        let refs: Vec<&Tensor> = params.iter().map(|(_, p)| p).collect();
        Tensor::evict(&refs, plimsoll_kernels_wgsl::Evict::ReadBack)?;
    }
    Ok(block)
}

/// An nn error inside a checkpointed segment, which must return autograd's error type.
/// `x` through `blocks` in order, each run of `segment_len` blocks through autograd's
/// checkpoint (0: none, every block's activations kept): a decoder's stack of blocks. `op`
/// names the caller in the error a segment called without its input would give.
///
/// Blocks whose parameters are in host memory (parameter streaming, [`Tensor::evict`]) have
/// them brought to the device for their segment and sent back after it
/// ([`plimsoll_autograd::checkpoint_with`]); with `segment_len == 0` each block is then a
/// segment of its own, since a block kept for backward would need its parameters there.
pub(crate) fn run_blocks<B: Module + Clone + 'static>(
    blocks: &[B],
    x: Tensor,
    segment_len: usize,
    op: &'static str,
) -> Result<Tensor> {
    let segment_len = match segment_len {
        0 if streams_any(blocks) => 1,
        n => n,
    };
    if segment_len == 0 {
        return blocks.iter().try_fold(x, |h, block| block.forward(&h));
    }
    let mut x = x;
    for run in blocks.chunks(segment_len) {
        let run: Vec<B> = run.to_vec();
        let parameters: Vec<Tensor> = run
            .iter()
            .flat_map(|b| b.parameters())
            .map(|(_, p)| p)
            .collect();
        x = checkpoint_with(&[&x], &parameters, move |xs: &[Tensor]| {
            let mut h =
                xs.first()
                    .cloned()
                    .ok_or_else(|| plimsoll_autograd::Error::InvalidArgument {
                        op,
                        message: "segment called without its input".to_string(),
                    })?;
            for block in &run {
                h = block.forward(&h).map_err(into_autograd)?;
            }
            Ok(h)
        })?;
    }
    Ok(x)
}

/// Whether a block's parameters are in host memory (streamed: [`run_blocks`] then runs every
/// block as a checkpointed segment at least).
pub(crate) fn streams_any<B: Module>(blocks: &[B]) -> bool {
    blocks
        .iter()
        .any(|b| b.parameters().iter().any(|(_, p)| !p.is_resident()))
}

/// The logits of hidden states `h` (`[.., dim]`) against an output head kept in `parts` of
/// rows (`[rows, dim]` each, in order): one product per part, joined on the last axis.
pub(crate) fn head_logits(h: &Tensor, parts: &[&Tensor]) -> Result<Tensor> {
    let logits = parts
        .iter()
        .map(|p| h.matmul_transposed(p))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if let [one] = &logits[..] {
        return Ok(one.clone());
    }
    let logits: Vec<&Tensor> = logits.iter().collect();
    Ok(Tensor::concat(&logits, h.rank() - 1)?)
}

/// The time axis of u32 token ids `[batch, time]` for a model (`module`, in errors) of
/// `context` positions. Errors: another rank, or `time` outside `1..=context`.
pub(crate) fn token_time(ids: &Tensor, context: usize, module: &'static str) -> Result<usize> {
    match *ids.shape() {
        [_, time] if (1..=context).contains(&time) => Ok(time),
        [_, _] => Err(Error::InputShape {
            module,
            expected: format!("[batch, time] with 1 <= time <= {context}"),
            found: ids.shape().to_vec(),
        }),
        _ => Err(Error::InputShape {
            module,
            expected: "[batch, time] u32 token ids".to_string(),
            found: ids.shape().to_vec(),
        }),
    }
}

/// The mean next-token cross-entropy of hidden states `h` (`[batch, time, width]`) through an
/// output head kept in `parts`, against `targets` (`[batch, time]`), in chunks of `chunk_rows`
/// rows ([`crate::loss::linear_cross_entropy_parts`]; the logits never whole).
pub(crate) fn chunked_head_loss(
    h: &Tensor,
    parts: &[&Tensor],
    targets: &Tensor,
    label_smoothing: f32,
    chunk_rows: usize,
) -> Result<Tensor> {
    let width = h.shape().last().copied().unwrap_or(0);
    crate::loss::linear_cross_entropy_parts(
        &h.reshape(&[h.numel() / width.max(1), width])?,
        parts,
        &targets.reshape(&[targets.numel()])?,
        label_smoothing,
        chunk_rows,
    )
}

pub(crate) fn into_autograd(e: Error) -> plimsoll_autograd::Error {
    match e {
        Error::Autograd(e) => e,
        Error::Kernel(e) => plimsoll_autograd::Error::Kernel(e),
        other => plimsoll_autograd::Error::InvalidArgument {
            op: "checkpointed segment",
            message: other.to_string(),
        },
    }
}

/// Runs `children` in order on `x`; a child followed by a ReLU runs both through its
/// [`Module::forward_relu`] when it can (a linear layer: the ReLU in its matmul's epilogue).
fn run_children(children: &[Child], x: &Tensor) -> Result<Tensor> {
    let mut h = x.clone();
    let mut i = 0;
    while let Some(child) = children.get(i) {
        let child = read(child);
        let next_is_relu = children.get(i + 1).is_some_and(|c| read(c).is_relu());
        match next_is_relu.then(|| child.forward_relu(&h)).flatten() {
            Some(fused) => {
                h = fused?;
                i += 2;
            }
            None => {
                h = child.forward(&h)?;
                i += 1;
            }
        }
    }
    Ok(h)
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        run_children(&self.children, x)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.children
            .iter()
            .enumerate()
            .flat_map(|(i, child)| prefixed(&i.to_string(), read(child).parameters()))
            .collect()
    }

    fn buffers(&self) -> Vec<(String, Tensor)> {
        self.children
            .iter()
            .enumerate()
            .flat_map(|(i, child)| prefixed(&i.to_string(), read(child).buffers()))
            .collect()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
        for child in &self.children {
            child
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .set_training(training);
        }
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// A multi-layer perceptron over `widths` (`[in, hidden.., out]`, at least two):
/// `Linear, act, Linear, act, ..., Linear` (no activation after the last), with biases, each
/// layer initialised for `activation` ([`Activation::init`]) from a seed derived from `seed`.
/// Parameter names: `0.weight`, `0.bias`, `2.weight`, ... (activations are children too).
pub fn mlp(gpu: &Gpu, widths: &[usize], activation: Activation, seed: u64) -> Result<Sequential> {
    if widths.len() < 2 {
        return Err(Error::InvalidConfig {
            what: "mlp",
            message: format!(
                "widths {widths:?}: need at least [in, out] (two widths), e.g. [784, 128, 10]"
            ),
        });
    }
    let mut net = Sequential::new();
    let layers = widths.len() - 1;
    for (i, pair) in widths.windows(2).enumerate() {
        let linear = Linear::new(
            gpu,
            pair[0],
            pair[1],
            true,
            activation.init(),
            derive_seed(seed, i as u64 + 100),
        )?;
        net = net.push(linear);
        if i + 1 < layers {
            net = net.push_boxed(activation.module());
        }
    }
    Ok(net)
}
