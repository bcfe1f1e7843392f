//! The checkpoint (recompute) mechanism: [`checkpoint`] runs a segment without saving its
//! intermediates and records one node that keeps only the segment's inputs, its function and the
//! random state; backward runs the function again with a tape and back-propagates through it.
//! Which segments to checkpoint is the trainer's decision, not this crate's.
//!
//! Parameters the function captures (rather than takes as inputs) receive their gradients
//! directly during the recomputation's backward, as in PyTorch's `torch.utils.checkpoint`.

use std::cell::Cell;
use std::sync::Arc;

use plimsoll_kernels_wgsl::kernels::copy;
use plimsoll_kernels_wgsl::{Category, Evict};

use crate::backward::Grads;
use crate::error::Result;
use crate::grad_mode::{enable_grad, is_grad_enabled, no_grad, rng_state, set_rng_state};
use crate::half::{f16_activations, saves_f16_activations};
use crate::op::{Op, Replay};
use crate::tape::{attach, backward_from};
use crate::tensor::{Autograd, Tensor};
use smallvec::SmallVec;

thread_local! {
    /// Whether [`checkpoint`] keeps its inputs in host memory ([`offload_inputs`]).
    static OFFLOAD: Cell<bool> = const { Cell::new(false) };
    /// Host bytes held now by the segment inputs this thread offloaded, and the most held
    /// since [`reset_offloaded_peak`] (a step's forward and backward run on one thread).
    static HOST_BYTES: Cell<u64> = const { Cell::new(0) };
    static HOST_PEAK: Cell<u64> = const { Cell::new(0) };
}

/// Until the guard drops, [`checkpoint`] on this thread keeps its segments' activation inputs
/// in host memory (PyTorch's `save_on_cpu` for what checkpointing keeps): each one's read-back
/// is started once the segment's forward is recorded (the copy submitted, not waited for), its
/// device memory freed, and it is written back when its backward starts, which waits for the
/// read if it has not arrived. Parameters (leaves that require a gradient) stay where they are.
/// On a planning device nothing is read: only the allocations count.
pub fn offload_inputs() -> OffloadGuard {
    OffloadGuard {
        previous: OFFLOAD.with(|o| o.replace(true)),
    }
}

/// Whether [`offload_inputs`] is in force on this thread.
pub fn offloads_inputs() -> bool {
    OFFLOAD.with(Cell::get)
}

/// Restores the previous [`offload_inputs`] setting when dropped.
#[must_use = "offloading stops when the guard drops"]
pub struct OffloadGuard {
    previous: bool,
}

impl Drop for OffloadGuard {
    fn drop(&mut self) {
        OFFLOAD.with(|o| o.set(self.previous));
    }
}

/// Host bytes that the segment inputs this thread offloaded hold now, and at most since
/// [`reset_offloaded_peak`] (a planning device's count their sizes, unread).
pub fn offloaded_host_bytes() -> (u64, u64) {
    (HOST_BYTES.with(Cell::get), HOST_PEAK.with(Cell::get))
}

/// Starts [`offloaded_host_bytes`]'s peak on this thread again from what is held now.
pub fn reset_offloaded_peak() {
    HOST_PEAK.with(|p| p.set(HOST_BYTES.with(Cell::get)));
}

/// A segment input kept for its backward: the tensor, or its values in host memory.
#[derive(Debug, Clone)]
pub enum Kept {
    /// On the device.
    Device(Tensor),
    /// Read back ([`offload_inputs`]): written back to the device for the backward.
    Host(Arc<HostKept>),
}

impl Kept {
    /// The tensor, when it is on the device.
    pub fn on_device(&mut self) -> Option<&mut Tensor> {
        match self {
            Kept::Device(t) => Some(t),
            Kept::Host(_) => None,
        }
    }

    /// The tensor on the device: itself, or its values written to a new `Activation` tensor.
    fn to_device(&self) -> Result<Tensor> {
        match self {
            Kept::Device(t) => Ok(t.detach()),
            Kept::Host(h) => h.upload(),
        }
    }
}

/// An f32 segment input's values in host memory (none read on a planning device). The read
/// is started when the segment's forward is recorded and waited for when its backward needs
/// the values, so the device runs the segments after it meanwhile.
pub struct HostKept {
    gpu: plimsoll_kernels_wgsl::Gpu,
    shape: crate::tensor::Shape,
    values: std::sync::Mutex<HostValues>,
    bytes: u64,
}

/// A [`HostKept`]'s values: on their way, or read.
enum HostValues {
    Reading(plimsoll_kernels_wgsl::PendingRead),
    Read(Vec<f32>),
    /// The read failed (its error went to the caller that waited).
    Lost,
}

impl std::fmt::Debug for HostKept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKept")
            .field("shape", &self.shape)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl HostKept {
    /// Starts reading `t`'s values back (submitting within the GPU's default deadline, not
    /// waiting for the copy).
    fn read(t: &Tensor) -> Result<HostKept> {
        let bytes = 4 * t.numel() as u64;
        let values = match t.gpu().is_planning() {
            true => HostValues::Read(Vec::new()),
            false => {
                let what = "a checkpointed segment's input (--offload activations)";
                t.gpu().host_allocation(what, bytes)?;
                t.expect_dtype("offload", crate::DType::F32)?;
                let deadline = t.gpu().default_deadline();
                let from = 4 * t.offset;
                HostValues::Reading(
                    t.gpu()
                        .start_read_bytes(&t.storage, from, bytes, deadline)?,
                )
            }
        };
        let now = HOST_BYTES.with(|b| {
            b.set(b.get() + bytes);
            b.get()
        });
        HOST_PEAK.with(|p| p.set(p.get().max(now)));
        Ok(HostKept {
            gpu: t.gpu().clone(),
            shape: t.shape.clone(),
            values: std::sync::Mutex::new(values),
            bytes,
        })
    }

    /// Writes the values to a new `Activation` tensor, first waiting for the read (within the
    /// GPU's default deadline) if it has not been waited for yet.
    fn upload(&self) -> Result<Tensor> {
        let options = crate::tensor::TensorOptions {
            category: Category::Activation,
            label: "offloaded checkpoint input",
            requires_grad: false,
        };
        if self.gpu.is_planning() {
            return Tensor::unwritten(&self.gpu, &self.shape, options);
        }
        let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        // Lost until the wait succeeds: a failed wait's error goes to this caller.
        *values = match std::mem::replace(&mut *values, HostValues::Lost) {
            HostValues::Reading(pending) => {
                HostValues::Read(pending.wait_as(self.gpu.default_deadline())?)
            }
            other => other,
        };
        match &*values {
            HostValues::Read(v) => Tensor::from_slice_with(&self.gpu, v, &self.shape, options),
            _ => Err(crate::error::Error::InvalidArgument {
                op: "checkpoint backward",
                message: "an offloaded segment input whose read-back failed earlier: run the \
                          step again"
                    .to_string(),
            }),
        }
    }
}

impl Drop for HostKept {
    fn drop(&mut self) {
        // Dropped on another thread than the one that read it, the count there is left as is.
        let _ = HOST_BYTES.try_with(|b| b.set(b.get().saturating_sub(self.bytes)));
    }
}

/// A recomputable segment: a pure function of its inputs (and of captured tensors that do not
/// change between forward and backward). Implemented for every suitable closure.
pub trait Segment: Send + Sync {
    /// Runs the segment.
    fn run(&self, inputs: &[Tensor]) -> Result<Tensor>;
}

impl<F> Segment for F
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync,
{
    fn run(&self, inputs: &[Tensor]) -> Result<Tensor> {
        self(inputs)
    }
}

/// Runs `f(inputs)` without saving its intermediates; backward recomputes it (with the same
/// dropout masks: the thread's random state is saved and restored around the recomputation).
/// Outside grad mode this is just `f(inputs)`.
///
/// The output is copied into an `Activation` buffer (one copy per segment), because it is what
/// the rest of the graph saves, and the segment ran with recording off (`Temporary` outputs).
pub fn checkpoint<F>(inputs: &[&Tensor], f: F) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    checkpoint_with(inputs, &[], f)
}

/// [`checkpoint`] of a segment that captures `parameters`, some of which may be evicted to
/// host memory ([`Tensor::evict`]: parameter streaming). Those come to the device for the
/// forward and leave after it (no read: a forward does not change them); for the
/// recomputation they come back with their gradients, and after its backward the parameters
/// leave again and the gradients are read back into host memory, where the next
/// recomputation's backward finds them to add to. The device then holds one segment's
/// parameters and gradients at a time. Parameters on the device stay where they are.
pub fn checkpoint_with<F>(inputs: &[&Tensor], parameters: &[Tensor], f: F) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    let streamed: Vec<Tensor> = parameters
        .iter()
        .filter(|p| !p.is_resident())
        .cloned()
        .collect();
    let values: Vec<Tensor> = inputs.iter().map(|t| t.detach()).collect();
    if !is_grad_enabled() {
        return with_restored(&streamed, || f(&values));
    }
    let rng = rng_state();
    let out = with_restored(&streamed, || {
        let _no_grad = no_grad();
        // A segment that returns an input as it came may hand back an f16 tensor.
        f(&values)?.widened()
    })?;
    let kept = Tensor::empty_typed(
        &out.gpu,
        &out.shape,
        out.dtype,
        Category::Activation,
        "checkpoint",
    )?;
    copy::copy(&out.gpu, kept.elements()?, out.elements()?)?;
    // Under `offload_inputs`, activations (not parameters) go to host memory: read back once
    // the segment is recorded, their device blocks freed with the last handle.
    let offload = offloads_inputs();
    if offload {
        drop(out);
    }
    let mut saved: SmallVec<[Kept; 4]> = SmallVec::new();
    for (value, input) in values.into_iter().zip(inputs) {
        let parameter = input.is_leaf() && input.requires_grad();
        saved.push(
            match offload && !parameter && value.dtype == crate::DType::F32 {
                true => Kept::Host(Arc::new(HostKept::read(&value)?)),
                false => Kept::Device(value),
            },
        );
    }
    let op = Op::Checkpoint {
        inputs: saved,
        replay: Replay {
            function: Arc::new(f),
            rng,
            f16: saves_f16_activations(),
            streamed,
        },
    };
    attach(kept, op, inputs)
}

/// Backward of a checkpoint node: recompute with a tape from fresh leaves, back-propagate `g`,
/// and return the leaves' gradients.
pub(crate) fn backward(
    inputs: &[Kept],
    replay: &Replay,
    g: &Tensor,
    needs: &[bool],
) -> Result<Grads> {
    if replay.streamed.is_empty() {
        return recompute_backward(inputs, replay, g, needs);
    }
    // The streamed parameters and the gradients they have so far come back for the
    // recomputation; afterwards the parameters leave as they were and the gradients are read
    // back (all of them: the device then holds none of this segment's).
    let grads = || -> Vec<Tensor> { replay.streamed.iter().filter_map(Tensor::grad).collect() };
    let result = grads().iter().try_for_each(Tensor::restore).and_then(|()| {
        with_restored(&replay.streamed, || {
            recompute_backward(inputs, replay, g, needs)
        })
    });
    let grads = grads();
    // Read back without waiting: the device goes on with the next segment's backward, and the
    // host records it, while the copies land.
    let evicted = evict(&grads, Evict::ReadBackLater);
    let grads = result?;
    evicted?;
    Ok(grads)
}

/// `run()` with each of `tensors` restored to the device first, and those evicted again after
/// it (whatever it returned; no read: the caller's `run` does not write them). A failure to
/// restore evicts those already restored and is the error.
fn with_restored<T>(tensors: &[Tensor], run: impl FnOnce() -> Result<T>) -> Result<T> {
    if tensors.is_empty() {
        return run();
    }
    let restored = tensors.iter().try_for_each(Tensor::restore);
    let result = restored.and_then(|()| run());
    // Their f16 copies (under `f16_weight_copies`) go too: made again when next needed.
    crate::half::forget_weight_copies_of(tensors);
    let evicted = evict(tensors, Evict::Unchanged);
    let value = result?;
    evicted?;
    Ok(value)
}

/// [`Tensor::evict`] of `tensors`.
fn evict(tensors: &[Tensor], how: Evict) -> Result<()> {
    Tensor::evict(&tensors.iter().collect::<Vec<_>>(), how)
}

/// Backward of a checkpoint node with everything it uses on the device.
fn recompute_backward(
    inputs: &[Kept],
    replay: &Replay,
    g: &Tensor,
    needs: &[bool],
) -> Result<Grads> {
    let leaves: Vec<Tensor> = inputs
        .iter()
        .zip(needs.iter().chain(std::iter::repeat(&false)))
        .map(|(kept, &need)| {
            let t = kept.to_device()?;
            Ok(match need {
                true => t.into_leaf(Category::Temporary),
                false => t,
            })
        })
        .collect::<Result<_>>()?;
    let outer_rng = rng_state();
    set_rng_state(replay.rng);
    let out = {
        let _grad = enable_grad();
        let _again = crate::grad_mode::recomputing();
        // Recomputed as first computed: in f16 when its forward ran under f16_activations.
        let _half = replay.f16.then(f16_activations);
        replay.function.run(&leaves)
    };
    set_rng_state(outer_rng);
    let out = out?;
    match &out.autograd {
        Autograd::Node(node) => backward_from(node, g.clone(), false)?,
        Autograd::Leaf(slot) => slot.accumulate(g)?,
        Autograd::None => {}
    }
    // Dropping the recomputed activations returns their blocks to the allocator at once (later
    // recorded work may reuse them, see kernels-wgsl's host/GPU ordering rule), so the next
    // segment recomputes into the same memory, which is the point of checkpointing.
    drop(out);
    Ok(leaves.iter().map(Tensor::grad).collect())
}
