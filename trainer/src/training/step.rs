//! One optimizer step: the effective batch split into micro-batches, gradients accumulated, the
//! losses and a finiteness check of every gradient read back *once*, then the update.
//!
//! Accumulation: each micro-batch's mean loss is scaled by `micro_len / batch_len` before its
//! backward, so the accumulated gradient is the gradient of the mean loss over the whole batch
//! (the same update one big batch gives; the last micro-batch may be shorter). The scaled,
//! detached losses are summed on the device, so the loss costs no extra wait.
//!
//! Out-of-memory recovery: if a micro-batch's forward or backward fails with out-of-memory, the
//! partial graph and gradients are dropped (their blocks return to the allocator at once; the open
//! batch is submitted), the micro-batch is halved and the *same* step runs again from its first
//! sample with the same random state. Only at a micro-batch of one does the error surface.
//!
//! Between micro-batches the open batch is submitted (not waited for: on a one-in-flight
//! adapter the submit only waits for the previous micro-batch to finish). The previous
//! micro-batch's blocks are already back in the allocator (freed blocks are reused at once); the
//! next micro-batch's upload likely lands in them, and an upload into bytes the open batch used
//! would submit it anyway (kernels-wgsl's host/GPU ordering rule).
//!
//! The one read-back: after the last backward, one tensor `[loss, sum(g_0²), sum(g_1²), ...,
//! flags]` is read back. A NaN or infinity in a gradient propagates into its sums of squares,
//! and the `nonfinite` kernel checks the loss and the sums on the device into the two flag words
//! at the end: the step is refused (or, in f16, skipped) before the update when it found one, and
//! the sums name the first parameter whose gradient is not finite; they also give the global
//! gradient norm, so clipping costs no extra wait.
//!
//! `--precision f16` ([`Precision::F16`]): each micro-batch's forward runs under autograd's
//! `f16_activations` (activations stored in f16), all of them under `f16_weight_copies`
//! (matmuls read each weight through one f16 copy per update), and its loss is also multiplied by the loss
//! scale ([`crate::scaler`]). The read-back is divided by it (the loss, the norm) and so is the
//! update's gradient scale (with clipping's factor, from the unscaled norm). A loss or gradient
//! that is not finite does not fail the step: it is skipped ([`StepResult::overflow`]; no
//! update, no optimizer step) and the trainer lowers the scale.

use plimsoll_allocator::{Phase, StepOutcome};
use plimsoll_autograd::grad_mode::{rng_state, set_rng_state};
use plimsoll_autograd::{Category, Gpu, Tensor, f16_activations, f16_weight_copies, no_grad};
use plimsoll_kernels_wgsl::kernels::optimizer::{ControlInputs, step_control};
use plimsoll_kernels_wgsl::kernels::{copy, fill, nonfinite};
use plimsoll_nn::{Optimizer, zero_grad};

use crate::collective::{BUCKET_BYTES, Collective, buckets};
use crate::config::{Precision, Shard};
use crate::error::{Error, Result};
use crate::read_back::{PLANNED_READ_BACK, StepReadBack, SumsLayout, gather_sums};
use crate::task::{Data, HostBatch, Model};
use crate::zero;

/// What one step needs besides the optimizer.
pub struct StepInputs<'a> {
    /// The device.
    pub gpu: &'a Gpu,
    /// The model.
    pub model: &'a dyn Model,
    /// Its parameters (handles), in module order.
    pub params: &'a [(String, Tensor)],
    /// Where the samples come from.
    pub data: &'a dyn Data,
    /// This rank's samples of the step already built in host memory, in the order of the
    /// step's indices (the loader's, [`crate::loader`]); `None`: uploaded from `data`.
    pub host: Option<&'a HostBatch>,
    /// Children per checkpointed segment; 0: no checkpointing.
    pub segment_len: usize,
    /// Cross-entropy label smoothing.
    pub label_smoothing: f32,
    /// Largest global gradient norm: larger gradients are scaled down to it (inside the fused
    /// update, through the optimizer's gradient scale: no extra pass or wait).
    pub clip_grad_norm: Option<f32>,
    /// The step number (1-based), for messages.
    pub step: u64,
    /// Samples in the whole step over every rank: each micro-batch's loss is scaled by its
    /// share of these (`indices.len()` for one process).
    pub batch_len: usize,
    /// The other processes of a data-parallel run, whose gradients are summed with this one's
    /// before the update ([`crate::collective`]); `None` for one process.
    pub collective: Option<&'a dyn Collective>,
    /// Whether this process was asked to stop (Ctrl-C, SIGTERM): told to the other ranks in
    /// the step's sum, so that every rank stops after the same step ([`StepResult::stop`]).
    pub stop: bool,
    /// What activations are stored in.
    pub precision: Precision,
    /// The loss scale ([`crate::scaler::LossScaler::scale`]; 1 in f32).
    pub loss_scale: f32,
    /// What the ranks divide ([`crate::zero`]): with [`Shard::Gradients`] the gradients are
    /// reduce-scattered rather than summed on every rank.
    pub shard: Shard,
    /// Whether checkpointed segments keep their inputs in host memory
    /// ([`crate::Offload::Activations`], [`plimsoll_autograd::offload_inputs`]).
    pub offload_activations: bool,
}

/// Runs `f` as one step of the allocator's planned steps (a no-op bracket when planning is off):
/// the step's allocations are recorded and, once a plan exists, replayed. Returns what `f`
/// returned and how the step went for the allocator.
pub fn as_planned_step<T>(gpu: &Gpu, f: impl FnOnce() -> T) -> (T, StepOutcome) {
    gpu.with_allocator(|a| a.begin_step());
    let result = f();
    let outcome = gpu.with_allocator(|a| a.end_step());
    (result, outcome)
}

/// What a step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// Mean loss over the effective batch.
    pub loss: f32,
    /// The micro-batch the step finished with (smaller than asked after a recovery).
    pub micro_batch: usize,
    /// Forward/backward passes in the successful attempt.
    pub micro_batches: usize,
    /// Samples in the batch.
    pub samples: usize,
    /// The global gradient norm before clipping (`sqrt` of the sum of every gradient's squares).
    pub grad_norm: f32,
    /// With a loss scale: `Some` when the loss or a (scaled) gradient was not finite, naming
    /// the first parameter whose gradient was not (empty when only the loss was); the update
    /// was then skipped.
    pub overflow: Option<String>,
    /// One line per out-of-memory recovery (`micro-batch 64 -> 32`).
    pub recoveries: Vec<String>,
    /// How the step went for the allocator's planned steps.
    pub allocation: StepOutcome,
    /// Whether any rank was asked to stop (always [`StepInputs::stop`] for one process).
    pub stop: bool,
    /// Bytes this rank passed to the all-reduce of gradients (0 for one process).
    pub allreduce_bytes: u64,
    /// Milliseconds this rank spent in the all-reduce calls: waiting for the slowest rank to
    /// arrive, then the sum itself (0 for one process). Reading gradients back and writing the
    /// sums are not included.
    pub allreduce_ms: f64,
}

/// Forward and backward of every micro-batch of `indices`, gradients accumulated into the
/// parameters; returns the summed scaled loss (a detached scalar on the device).
pub fn accumulate_gradients(
    inputs: &StepInputs<'_>,
    indices: &[usize],
    micro_batch: usize,
) -> Result<Tensor> {
    let batch_len = inputs.batch_len.max(indices.len()) as f32;
    // In f16 the matmuls read each weight through an f16 copy made once for all the update's
    // micro-batches, forward and backward, and freed here, before the optimizer changes them.
    let _weights = (inputs.precision == Precision::F16).then(f16_weight_copies);
    let mut loss_sum: Option<Tensor> = None;
    let mut done = 0;
    // The previous micro-batch's graph is already freed and its blocks are reused at once; an
    // upload that lands in bytes the open batch used submits that batch first (kernels-wgsl's
    // rule), so no explicit submit is needed here.
    for chunk in indices.chunks(micro_batch.max(1)) {
        set_phase(inputs.gpu, inputs.step, Phase::Forward);
        let batch = match inputs.host {
            Some(host) => host.upload_rows(inputs.gpu, done..done + chunk.len())?,
            None => inputs.data.upload(inputs.gpu, chunk)?,
        };
        let mean = {
            let _half = (inputs.precision == Precision::F16).then(f16_activations);
            let _offload = inputs
                .offload_activations
                .then(plimsoll_autograd::offload_inputs);
            inputs
                .model
                .loss(&batch, inputs.segment_len, inputs.label_smoothing)?
        };
        drop(batch);
        // One micro-batch of the whole batch in f32: the factor is exactly 1 and x * 1 is x, so
        // no pass (forward or backward) multiplies by it. In f16 the scale is always applied,
        // whatever its value, so every step allocates as the memory plan's dry run did.
        let factor = chunk.len() as f32 / batch_len * inputs.loss_scale;
        let scaled = if factor == 1.0 && inputs.precision == Precision::F32 {
            mean
        } else {
            mean.mul_scalar(factor)?
        };
        // The last micro-batch's weight-gradient matmuls leave each gradient whole (written or
        // accumulated): they compute its squares for the read-back, with no pass over it. Asked
        // for with several processes too, although their sum then changes the gradients (the
        // squares go stale and the read-back sums the gradients itself): the memory plan's dry
        // run, one process, launches the same matmuls, so the kernels its warm-up compiled for
        // those arguments are the ones step 1 runs (lavapipe compiles for the arguments seen).
        if chunk.len() + done >= indices.len() {
            for (_, p) in inputs.params {
                p.want_grad_squares();
            }
        }
        done += chunk.len();
        set_phase(inputs.gpu, inputs.step, Phase::Backward);
        scaled.backward()?;
        let value = scaled.detach();
        drop(scaled);
        loss_sum = Some(match loss_sum {
            None => value,
            Some(sum) => {
                let _no_grad = no_grad();
                sum.add(&value)?
            }
        });
    }
    loss_sum.ok_or_else(|| Error::invalid("step", "an empty batch"))
}

/// Tells the device's allocator which phase of step `step` runs now (per-phase peaks, and the
/// memory timeline's phase boundaries).
pub fn set_phase(gpu: &Gpu, step: u64, phase: Phase) {
    gpu.with_allocator(|a| a.set_phase(step, phase));
}

/// One optimizer step over the samples `indices` with learning rate `lr`, starting from
/// `micro_batch` samples per forward (halved on out-of-memory; the value it ends with is what
/// [`StepResult::micro_batch`] says). Gradients are cleared afterwards, also on error, and the
/// model's buffers are as they were before it on error (`KeptBuffers`). [`record_step`],
/// then [`Recorded::finish`]: returns once the step's read-back is in.
pub fn run_step(
    inputs: &StepInputs<'_>,
    optimizer: &mut dyn Optimizer,
    indices: &[usize],
    micro_batch: usize,
    lr: f32,
) -> Result<StepResult> {
    record_step(inputs, optimizer, indices, micro_batch, lr)?.finish(optimizer)
}

/// [`run_step`] up to its update: forward and backward of every micro-batch, then the update,
/// recorded and submitted. Where the update can be decided on the device
/// ([`device_decides`]), nothing waits: the step's read-back is on its way
/// ([`Recorded::Pending`]) and the caller may record the next step before it
/// [`Recorded::finish`]es this one. Elsewhere the read-back comes first and the host decides
/// ([`Recorded::Done`]).
pub fn record_step(
    inputs: &StepInputs<'_>,
    optimizer: &mut dyn Optimizer,
    indices: &[usize],
    micro_batch: usize,
    lr: f32,
) -> Result<Recorded> {
    let (result, outcome) = as_planned_step(inputs.gpu, || {
        let result = KeptBuffers::take(inputs.model).and_then(|kept| {
            let stepped = run_step_inner(inputs, optimizer, indices, micro_batch, lr, &kept);
            if stepped.is_err() {
                // The step failed: its forwards' moves of the running statistics go too. A
                // device that cannot take the copy back is lost, and recovery restores the
                // state from its snapshot.
                let _ = kept.put_back();
            }
            stepped
        });
        zero_grad(inputs.params);
        if optimizer.row_shard().is_some() {
            // Rows' gradients a failed step gave the optimizer go with the others.
            let _ = optimizer.set_row_gradients(Default::default());
        }
        result
    });
    set_phase(inputs.gpu, inputs.step, Phase::Other);
    let mut recorded = result?;
    match &mut recorded {
        Recorded::Done(r) => r.allocation = outcome,
        Recorded::Pending(p) => p.result.allocation = outcome,
    }
    Ok(recorded)
}

/// Whether a step's update is decided on the device (`optimizer::step_control`) rather than
/// on the host after its read-back: one process (several sum their gradients on the host
/// first), a model without buffers (a refused step puts BatchNorm's statistics back, which
/// needs the decision before the step ends), every gradient on the device, and an optimizer
/// with a control vector ([`Optimizer::control`]). In f16 an overflow skips the update on the
/// device as a non-finite f32 step does ([`Recorded::finish`] then reports it as
/// [`StepResult::overflow`]).
pub fn device_decides(inputs: &StepInputs<'_>) -> bool {
    inputs.collective.is_none_or(|c| c.ranks() <= 1) && inputs.model.buffers().is_empty()
}

/// A step as [`record_step`] left it.
#[must_use = "a recorded step's result (and its errors) come with `finish`"]
pub enum Recorded {
    /// Decided on the host after its read-back: finished.
    Done(StepResult),
    /// Its update decided on the device, recorded and submitted; its read-back on its way.
    Pending(Box<PendingStep>),
}

/// A step whose update was recorded before the host read its sums (see [`Recorded`]).
pub struct PendingStep {
    /// Everything but the loss and the norm, which come with the read-back.
    result: StepResult,
    /// The read-back of [`gather_sums`]'s tensor; `None` on a planning device.
    read: Option<plimsoll_kernels_wgsl::PendingRead>,
    layout: SumsLayout,
    /// The optimizer's step count before this step's update.
    steps_before: u64,
    gpu: Gpu,
    loss_scale: f32,
    precision: Precision,
    step: u64,
}

impl Recorded {
    /// What is known before the read-back: everything but the loss and the norm (NaN while
    /// pending), and, when pending, no overflow.
    pub fn known(&self) -> &StepResult {
        match self {
            Recorded::Done(result) => result,
            Recorded::Pending(pending) => &pending.result,
        }
    }

    /// Whether the read-back is still to come ([`Recorded::Pending`]).
    pub fn is_pending(&self) -> bool {
        matches!(self, Recorded::Pending(_))
    }

    /// The step's result, waiting for its read-back (within the device's default deadline)
    /// when it is pending. A pending step whose loss or gradients were not finite was skipped
    /// on the device, and so was every update recorded after it (`step_control`'s halt): this
    /// takes `optimizer`'s step count back to before the step ([`Optimizer::rewind`]), lets
    /// later updates run again, and returns [`Error::NonFinite`], the model as it was before
    /// the step; in f16 the step's result with [`StepResult::overflow`] instead (GradScaler's
    /// skipped step), and the steps recorded after it are to be run again (their updates
    /// were skipped too).
    pub fn finish(self, optimizer: &mut dyn Optimizer) -> Result<StepResult> {
        let pending = match self {
            Recorded::Done(result) => return Ok(result),
            Recorded::Pending(pending) => *pending,
        };
        let read = match pending.read {
            None => PLANNED_READ_BACK,
            Some(read) => pending
                .layout
                .parse(read.wait_as::<f32>(pending.gpu.default_deadline())?),
        };
        if read.nonfinite {
            optimizer.rewind(pending.steps_before);
            // The halt has done its work on every update recorded so far: the next ones run.
            if let Some(control) = optimizer.control(&pending.gpu)? {
                fill::fill(&pending.gpu, control.elements()?.slice(1, 2)?, 0.0)?;
            }
        }
        let mut result = pending.result;
        settle(
            &mut result,
            read,
            (pending.loss_scale, pending.precision, pending.step),
        )?;
        Ok(result)
    }
}

/// Puts step `step`'s read-back into its `result`: the loss and the norm unscaled by
/// `loss_scale`; when the loss or a gradient is not finite, in f16 the overflow (GradScaler's
/// skipped step, naming the first parameter), in f32 [`Error::NonFinite`].
fn settle(
    result: &mut StepResult,
    read: StepReadBack,
    (loss_scale, precision, step): (f32, Precision, u64),
) -> Result<()> {
    result.loss = read.loss / loss_scale;
    result.grad_norm = read.grad_norm / loss_scale;
    if !read.nonfinite {
        return Ok(());
    }
    match precision {
        Precision::F16 => {
            result.overflow = Some(read.first_nonfinite.unwrap_or_default());
            Ok(())
        }
        Precision::F32 => Err(Error::NonFinite {
            step,
            loss: result.loss,
            first_parameter: read.first_nonfinite,
        }),
    }
}

/// Device copies of the model's buffers (BatchNorm's running statistics and counts) taken
/// before a step. Forward moves them, so a step that runs its micro-batches again after an
/// out-of-memory puts them back first (they move once per micro-batch, as in one attempt),
/// and a step that fails puts them back before its error: the model as it was. Nothing for a
/// model without buffers.
struct KeptBuffers(Vec<(Tensor, Tensor)>);

impl KeptBuffers {
    fn take(model: &dyn Model) -> Result<KeptBuffers> {
        let mut kept = Vec::new();
        for (_, buffer) in model.buffers() {
            let gpu = buffer.gpu();
            let copy = Tensor::empty(gpu, buffer.shape(), Category::Temporary, "kept buffer")?;
            copy::copy(gpu, copy.elements()?, buffer.elements()?)?;
            kept.push((buffer, copy));
        }
        Ok(KeptBuffers(kept))
    }

    fn put_back(&self) -> Result<()> {
        for (buffer, copy) in &self.0 {
            copy::copy(buffer.gpu(), buffer.elements()?, copy.elements()?)?;
        }
        Ok(())
    }
}

/// [`run_step`] once the buffers are kept in `kept`.
fn run_step_inner(
    inputs: &StepInputs<'_>,
    optimizer: &mut dyn Optimizer,
    indices: &[usize],
    mut micro_batch: usize,
    lr: f32,
    kept: &KeptBuffers,
) -> Result<Recorded> {
    let rng = rng_state();
    let mut recoveries = Vec::new();
    let loss_sum = loop {
        if indices.is_empty() && inputs.collective.is_some() {
            // This rank's shard of a batch smaller than the ranks: its gradients count as zero.
            break None;
        }
        match accumulate_gradients(inputs, indices, micro_batch) {
            Ok(sum) => break Some(sum),
            Err(e) if e.is_out_of_memory() && micro_batch > 1 => {
                zero_grad(inputs.params);
                // A planned step that ran out of memory drops its plan, so the retry (and the
                // plan rebuilt once the smaller micro-batch repeats) may release its segments.
                inputs.gpu.with_allocator(|a| a.clear_step_plan());
                // The failed attempt's blocks are already free; submit what it recorded so the
                // retry starts from an empty batch.
                inputs.gpu.flush("out-of-memory recovery")?;
                kept.put_back()?;
                set_rng_state(rng);
                let smaller = micro_batch.div_ceil(2);
                let line = format!(
                    "step {}: out of memory at micro-batch {micro_batch}; retrying the step \
                     with micro-batch {smaller} ({} micro-batches; the update is unchanged)",
                    inputs.step,
                    indices.len().div_ceil(smaller)
                );
                inputs.gpu.with_allocator(|a| a.mark(&line));
                recoveries.push(line);
                micro_batch = smaller;
            }
            Err(e) if e.is_out_of_memory() => {
                return Err(Error::OutOfMemoryAtMicroBatchOne {
                    step: inputs.step,
                    effective_batch: indices.len(),
                    source: Box::new(e),
                });
            }
            Err(e) => return Err(e),
        }
    };
    set_phase(inputs.gpu, inputs.step, Phase::Optimizer);
    let mut shared = Shared {
        stop: inputs.stop,
        bytes: 0,
        ms: 0.0,
    };
    let ranks = inputs.collective.filter(|c| c.ranks() > 1);
    let (loss_sum, read) = match ranks {
        Some(c) if inputs.shard == Shard::Gradients => {
            let mut traffic = zero::Traffic {
                bytes: &mut shared.bytes,
                ms: &mut shared.ms,
            };
            let (loss, stop, read) =
                zero::reduce_scatter_gradients(inputs, c, loss_sum, optimizer, &mut traffic)?;
            shared.stop = stop;
            (loss, Some(read))
        }
        Some(c) => (
            all_reduce_gradients(inputs, c, loss_sum, &mut shared)?,
            None,
        ),
        None => (
            loss_sum.ok_or_else(|| Error::invalid("step", "an empty batch"))?,
            None,
        ),
    };
    let mut result = StepResult {
        loss: f32::NAN,
        grad_norm: f32::NAN,
        overflow: None,
        micro_batch,
        micro_batches: indices.len().div_ceil(micro_batch),
        samples: inputs.batch_len.max(indices.len()),
        recoveries,
        allocation: StepOutcome::NotPlanning,
        stop: shared.stop,
        allreduce_bytes: shared.bytes,
        allreduce_ms: shared.ms,
    };
    let read = match read {
        Some(read) => read,
        None => {
            let (all, layout) = gather_sums(&loss_sum, inputs.params)?;
            if ranks.is_none()
                && layout.on_host.is_empty()
                && !layout.partials().is_empty()
                && device_decides(inputs)
                && let Some(control) = optimizer.control(inputs.gpu)?
            {
                let (read, steps_before) =
                    decide_on_device(inputs, optimizer, (all, &layout), &control, lr)?;
                drop(loss_sum);
                return Ok(Recorded::Pending(Box::new(PendingStep {
                    result,
                    read,
                    layout,
                    steps_before,
                    gpu: inputs.gpu.clone(),
                    loss_scale: inputs.loss_scale,
                    precision: inputs.precision,
                    step: inputs.step,
                })));
            }
            layout.read(&all)?
        }
    };
    drop(loss_sum);
    settle(
        &mut result,
        read,
        (inputs.loss_scale, inputs.precision, inputs.step),
    )?;
    if result.overflow.is_some() {
        // GradScaler's skipped step: no update; the trainer halves the scale.
        return Ok(Recorded::Done(result));
    }
    // torch.nn.utils.clip_grad_norm_'s rule: scale by max / (norm + 1e-6) when norm > max.
    let grad_norm = result.grad_norm;
    let clip = match inputs.clip_grad_norm {
        Some(max) if grad_norm > max => max / (grad_norm + 1e-6),
        _ => 1.0,
    };
    optimizer.set_lr(lr);
    optimizer.set_grad_scale(clip / inputs.loss_scale);
    let stepped = record_update(inputs, optimizer);
    optimizer.set_grad_scale(1.0);
    stepped?;
    if let (Some(c), Some(shard)) = (ranks, optimizer.row_shard().cloned()) {
        // Each rank updated its rows: every rank gets the others'.
        let mut traffic = zero::Traffic {
            bytes: &mut result.allreduce_bytes,
            ms: &mut result.allreduce_ms,
        };
        zero::all_gather_parameters(inputs, c, &shard, &mut traffic)?;
    }
    Ok(Recorded::Done(result))
}

/// Records `optimizer::step_control` over the read-back tensor `all` (laid out as `layout`
/// says) into `control`, starts the read-back, and records and submits the update that reads
/// the decision (all or nothing, as the host-decided update). Returns the read on its way
/// (`None` on a planning device) and the optimizer's step count before the update.
fn decide_on_device(
    inputs: &StepInputs<'_>,
    optimizer: &mut dyn Optimizer,
    (all, layout): (Tensor, &SumsLayout),
    control: &Tensor,
    lr: f32,
) -> Result<(Option<plimsoll_kernels_wgsl::PendingRead>, u64)> {
    let gpu = inputs.gpu;
    {
        let sums = all.elements()?;
        let partials = layout.partials();
        let flags = sums.slice(all.numel() as u64 - nonfinite::FLAG_WORDS, 1)?;
        let decide = ControlInputs {
            max_norm: inputs.clip_grad_norm,
            loss_scale: inputs.loss_scale,
        };
        let partials = sums.slice(partials.start as u64, partials.len() as u64)?;
        step_control(gpu, &decide, partials, flags, control.elements()?)?;
    }
    let read = match gpu.is_planning() {
        true => None,
        false => Some(all.start_read()?),
    };
    drop(all);
    let steps_before = optimizer.step_count();
    optimizer.set_lr(lr);
    optimizer.set_controlled(true);
    let stepped = record_update(inputs, optimizer);
    optimizer.set_controlled(false);
    stepped?;
    Ok((read, steps_before))
}

/// Records and submits the optimizer's update of every parameter, all or nothing: the
/// optimizer creates its state before recording any update, and a failure while recording or
/// submitting it discards what was recorded (and undoes the optimizer's step count and new
/// state), so an error leaves every parameter and the optimizer state as they were. Once
/// submitted, the step is committed.
fn record_update(inputs: &StepInputs<'_>, optimizer: &mut dyn Optimizer) -> Result<()> {
    inputs.gpu.atomically("optimizer update", || {
        optimizer.step(inputs.params)?;
        inputs.gpu.flush("optimizer update").map_err(|e| {
            optimizer.undo_step();
            Error::from(e)
        })?;
        Ok(())
    })
}

/// What the ranks agreed on in a step, and what it cost.
struct Shared {
    stop: bool,
    bytes: u64,
    ms: f64,
}

/// Replaces every parameter's gradient with the sum over all ranks (each rank's is already
/// scaled by its share of the whole batch, so the sum is the whole batch's gradient), and
/// returns the summed loss as a one-element tensor. The gradients go in buckets of at most
/// [`BUCKET_BYTES`]: each bucket is gathered on the device and read back in one wait, summed
/// across ranks, and written back in place. The first bucket starts with a header: the loss,
/// the stop requests, and per parameter how many ranks have a gradient for it (a parameter no
/// rank has a gradient for keeps none, as with one process). So a model under 16 MiB costs
/// one read-back and one collective call per step. Nothing here touches a parameter or the
/// optimizer, so an error leaves the model as it was.
fn all_reduce_gradients(
    inputs: &StepInputs<'_>,
    collective: &dyn Collective,
    loss_sum: Option<Tensor>,
    shared: &mut Shared,
) -> Result<Tensor> {
    let _no_grad = no_grad();
    let deadline = inputs.gpu.default_deadline();
    // Only the time inside the collective calls counts: the first read-back below also waits
    // for this rank's own forward and backward to finish on the GPU.
    let sum = |values: Vec<f32>, shared: &mut Shared| {
        let start = std::time::Instant::now();
        let summed = collective.all_reduce_sum(values, inputs.step, deadline);
        shared.ms += start.elapsed().as_secs_f64() * 1e3;
        summed
    };
    let grads: Vec<Option<Tensor>> = inputs.params.iter().map(|(_, p)| p.grad()).collect();
    let sizes: Vec<usize> = inputs.params.iter().map(|(_, p)| p.numel()).collect();
    let header_len = 2 + grads.len();
    let planning = inputs.gpu.is_planning();
    let mut ranges = buckets(&sizes, BUCKET_BYTES / 4);
    if ranges.is_empty() {
        ranges.push(0..0);
    }
    let (mut loss, mut have) = (f32::NAN, Vec::new());
    for (b, range) in ranges.into_iter().enumerate() {
        // One read-back per bucket: the first also carries this rank's loss.
        let mut present: Vec<Tensor> = Vec::new();
        if b == 0
            && let Some(l) = &loss_sum
        {
            present.push(l.reshape(&[1])?);
        }
        for g in range
            .clone()
            .filter_map(|i| grads.get(i).cloned().flatten())
        {
            present.push(g.reshape(&[g.numel()])?);
        }
        let mut read = match present.len() {
            0 => Vec::new(),
            _ => {
                let refs: Vec<&Tensor> = present.iter().collect();
                let gathered = Tensor::concat(&refs, 0)?;
                match planning {
                    // A plan's dry run: the gathered copy's allocation is all that counts (its
                    // values would be zeros, and a large model's would cost the host gigabytes).
                    true => Vec::new(),
                    false => gathered.to_vec()?,
                }
            }
        }
        .into_iter();
        drop(present);
        if planning {
            // The run writes the sums into every gradient: what their matmuls computed of
            // their squares is stale, and the read-back sums them again.
            for (_, p) in inputs.params.get(range).unwrap_or(&[]) {
                p.grad_changed();
            }
            continue;
        }
        let mut values =
            Vec::with_capacity(header_len + sizes[range.clone()].iter().sum::<usize>());
        if b == 0 {
            // The header: the loss, the stop requests, and which parameters have a gradient.
            let own_loss = match loss_sum.is_some() {
                true => read.next().unwrap_or(f32::NAN),
                false => 0.0,
            };
            values.push(own_loss);
            values.push(f32::from(u8::from(inputs.stop)));
            values.extend(grads.iter().map(|g| f32::from(u8::from(g.is_some()))));
        }
        for i in range.clone() {
            let n = sizes.get(i).copied().unwrap_or(0);
            match grads.get(i).is_some_and(Option::is_some) {
                true => values.extend(read.by_ref().take(n)),
                false => values.extend(std::iter::repeat_n(0.0, n)),
            }
        }
        shared.bytes += (values.len() * 4) as u64;
        let summed = sum(values, shared)?;
        let mut at = 0;
        if b == 0 {
            let (Some(&l), Some(&stop), Some(h)) =
                (summed.first(), summed.get(1), summed.get(2..header_len))
            else {
                return Err(Error::invalid("all-reduce", "a short header came back"));
            };
            (loss, shared.stop, have) = (l, stop > 0.0, h.to_vec());
            at = header_len;
        }
        for i in range {
            let n = sizes.get(i).copied().unwrap_or(0);
            let part = summed.get(at..at + n).unwrap_or(&[]);
            at += n;
            if have.get(i).is_some_and(|&h| h > 0.0)
                && let Some((_, p)) = inputs.params.get(i)
            {
                p.set_grad_from_slice(part)?;
            }
        }
    }
    drop(loss_sum);
    Ok(Tensor::from_slice(inputs.gpu, &[loss], &[1])?)
}
