//! The one error type of `plimsoll-trainer`. Every variant carries the numbers a user needs and the
//! message ends with what to do next.

use std::path::PathBuf;

use plimsoll_allocator::{format_bytes, format_bytes_at_least};
use plimsoll_kernels_wgsl::Error as KernelError;

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can stop training.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A layer, loss, optimizer or state file failed (this wraps out-of-memory and timeouts that
    /// happened inside `nn`; [`Error::kernel_error`] finds them).
    #[error(transparent)]
    Nn(#[from] plimsoll_nn::Error),
    /// A tensor op failed.
    #[error(transparent)]
    Autograd(#[from] plimsoll_autograd::Error),
    /// The GPU layer failed directly (device lost, timeout, out of memory).
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// Out of memory even with a micro-batch of one sample.
    #[error(
        "{}: out of memory even with a micro-batch of 1 sample (effective batch \
         {effective_batch}).\n{source}\nhint: enable activation checkpointing \
         (--checkpointing auto), use a smaller model, or raise --memory-budget",
        step_name(*step)
    )]
    OutOfMemoryAtMicroBatchOne {
        /// The step that failed.
        step: u64,
        /// The effective batch.
        effective_batch: usize,
        /// The last out-of-memory error.
        source: Box<Error>,
    },
    /// A step waited past the fence deadline. The last good state was saved first (if a
    /// checkpoint directory is set).
    #[error(
        "step {step} exceeded the fence deadline of {deadline_ms} ms{}.\n{source}\nhint: raise \
         --deadline-ms, or lower the micro-batch so each submission is shorter",
        .saved.as_ref().map(|p| format!("; the last good state (step {}) was saved to {}",
            step.saturating_sub(1), p.display())).unwrap_or_default()
    )]
    StepTimeout {
        /// The step that timed out.
        step: u64,
        /// The deadline in milliseconds.
        deadline_ms: u64,
        /// Where the last good state was saved, if anywhere.
        saved: Option<PathBuf>,
        /// The timeout error, with the recent submissions.
        source: Box<Error>,
    },
    /// Other ranks of a data-parallel run did not reach a collective call within the deadline
    /// (they died, hang, or failed on their own): nothing was updated in this step. Rank 0
    /// saved the last good state first (if it has a checkpoint directory).
    #[error("{0}")]
    RanksUnresponsive(Box<Unresponsive>),
    /// A tensor of the step is larger than the largest buffer a kernel can bind at the smallest
    /// micro-batch the run may use (the plan treats such a tensor as not fitting, like out of
    /// memory, and picks a micro-batch that avoids it when one exists).
    #[error(
        "{made_by}: tensor {label:?} of {} is larger than the largest buffer a kernel can \
         bind ({}, the adapter's max_storage_buffer_binding_size).\nhint: {hint}",
        format_bytes(*bytes), format_bytes(*max_bytes)
    )]
    TensorTooLarge {
        /// The tensor's label.
        label: String,
        /// Its bytes.
        bytes: u64,
        /// The largest bindable buffer.
        max_bytes: u64,
        /// What made it: "the step at micro-batch 12", "the model's parameters".
        made_by: String,
        /// What to do.
        hint: String,
    },
    /// The memory plan's dry run waited past the deadline. It runs on a throwaway model before
    /// any training step, so no state was at risk.
    #[error(
        "the memory plan's dry run exceeded the fence deadline of {deadline_ms} ms, before any \
         training step: nothing was lost (a resumed run's checkpoint is as it was).\n{source}\n\
         hint: raise --deadline-ms, or give --micro-batch and --checkpointing none (or a number) \
         to skip the plan"
    )]
    PlanTimeout {
        /// The deadline in milliseconds.
        deadline_ms: u64,
        /// The timeout error, with the recent submissions.
        source: Box<Error>,
    },
    /// A NaN or infinity in the loss or a gradient.
    #[error(
        "{}: non-finite values: loss = {loss}; first parameter with a non-finite \
         gradient: {}. The step was not applied.\nhint: lower the learning rate \
         (--lr), clip gradients, or check the input data for NaN/inf",
        step_name(*step),
        .first_parameter.as_deref().unwrap_or("none (only the loss)")
    )]
    NonFinite {
        /// The step.
        step: u64,
        /// The loss read back (may be finite when only a gradient overflowed).
        loss: f32,
        /// The first parameter (in module order) whose gradient holds a NaN or infinity.
        first_parameter: Option<String>,
    },
    /// `--precision f16`: the step overflowed with the loss scale already at 1, so no lower
    /// scale is left to try.
    #[error(
        "{}: the loss or the gradients are not finite with the loss scale already lowered to 1 \
         (it halves at each overflow from 65536; {skipped} steps skipped over the run); first \
         parameter with a non-finite gradient: {}. The step was not applied.\nhint: an \
         activation overflows f16 (|x| > 65504: train with --precision f32), or the model \
         diverged (lower the learning rate with --lr, clip gradients)",
        step_name(*step),
        .first_parameter.as_deref().unwrap_or("none (only the loss)")
    )]
    LossScaleExhausted {
        /// The step.
        step: u64,
        /// The first parameter (in module order) whose gradient holds a NaN or infinity.
        first_parameter: Option<String>,
        /// Steps skipped for overflows over the run.
        skipped: u64,
    },
    /// Memory still allocated after a step beyond parameters, gradients and optimizer state.
    #[error(
        "step {step}: {} still allocated after the step beyond parameters, gradients and \
         optimizer state ({} expected): {}.\nhint: drop tensors you keep across steps, or \
         set the leak policy to warn",
        format_bytes(*leaked_bytes), format_bytes(*expected_bytes), holders
    )]
    Leak {
        /// The step.
        step: u64,
        /// Bytes allocated outside the expected categories.
        leaked_bytes: u64,
        /// Parameters + gradients + optimizer state bytes.
        expected_bytes: u64,
        /// `label (category): size` of each holder, largest first.
        holders: String,
    },
    /// The memory budget cannot hold the model's parameters.
    #[error(
        "memory budget {} cannot hold the model: its {parameters} parameters alone need {}, \
         before gradients, optimizer state and activations.\nhint: raise --memory-budget or use \
         a smaller model (a smaller micro-batch or checkpointing does not shrink parameters)",
        format_bytes(*budget_bytes), format_bytes((*parameters as u64).saturating_mul(4))
    )]
    ModelTooLarge {
        /// The budget.
        budget_bytes: u64,
        /// Parameters of the model (f32, 4 bytes each).
        parameters: usize,
    },
    /// The memory budget cannot hold even the model's fixed state plus one sample's step
    /// (`predicted_bytes`: the least budget, within 1%, in which a dry run of that step fits).
    #[error(
        "memory budget {} cannot hold one step: the leanest step (micro-batch 1 or the whole \
         batch, or the micro-batch given) needs a budget of at least {} (fixed state {}).\nhint: \
         {}raise --memory-budget \
         to at least that, use a smaller model, or (if you turned it off) let --checkpointing \
         auto try checkpointing",
        format_bytes(*budget_bytes), format_bytes_at_least(*predicted_bytes),
        format_bytes(*fixed_bytes), f16_hint(*f16_fits)
    )]
    BudgetTooSmall {
        /// The budget.
        budget_bytes: u64,
        /// The least budget the leanest step fits in.
        predicted_bytes: u64,
        /// Bytes that do not depend on the micro-batch.
        fixed_bytes: u64,
        /// In f32 only: the micro-batch and predicted peak reserved bytes of the plan with
        /// `--precision f16`, when it fits this budget.
        f16_fits: Option<(usize, u64)>,
    },
    /// Sampling's largest forward (the longest context it will use) does not fit the budget,
    /// even after the allocator's cache was emptied.
    #[error(
        "sampling: one forward over a context of {context} tokens does not fit the memory budget \
         {} (the model's parameters take {} of it).\n{}\nhint: raise --memory-budget; a \
         shorter --prompt with fewer --tokens also shortens the context (up to the model's \
         block size)",
        format_bytes(*budget_bytes), format_bytes(*parameter_bytes), memory_state(source)
    )]
    SampleOutOfMemory {
        /// Tokens in the forward that failed.
        context: usize,
        /// The budget.
        budget_bytes: u64,
        /// Bytes the parameters hold.
        parameter_bytes: u64,
        /// The last out-of-memory error.
        source: Box<Error>,
    },
    /// What a run keeps in host memory on purpose passes its host budget
    /// ([`crate::TrainConfig::host_memory_budget`]). Refused before step 1.
    #[error(
        "the run would keep {} in host memory ({parts}), past its host budget of {}{}.\nhint: \
         raise --host-memory-budget if the machine has the memory, or keep less there: \
         --prefetch 0, --snapshot-every off, --offload optimizer (activations on the device) \
         or --offload none (with a --memory-budget that holds the optimizer's state)",
        format_bytes_at_least(*.needed_bytes),
        format_bytes(*.budget_bytes),
        if *.default_budget { " (80% of what the host has available; --host-memory-budget)" } else { "" }
    )]
    HostBudgetTooSmall {
        /// Bytes the run would keep in host memory.
        needed_bytes: u64,
        /// The host budget.
        budget_bytes: u64,
        /// Whether the budget is the default share of what is available.
        default_budget: bool,
        /// What the bytes are, each with its size.
        parts: String,
    },
    /// A request larger than the host's available memory (or than 2^64 bytes).
    #[error(
        "{what} needs {} of host memory, and this machine has {} available.\nhint: ask for \
         less (a smaller model, batch or data set)",
        .needed_bytes.map(format_bytes).unwrap_or_else(|| "more than 2^64 bytes".to_string()),
        .available_bytes.map(format_bytes).unwrap_or_else(|| "an unknown amount".to_string())
    )]
    HostMemory {
        /// What was asked for.
        what: String,
        /// Bytes it needs (`None`: the size overflows).
        needed_bytes: Option<u64>,
        /// Bytes the host has available (`None`: unknown).
        available_bytes: Option<u64>,
    },
    /// A checkpoint (or the exported model) was not written: refused before the first byte when
    /// the file system has less room than the file needs, or its write failed (its temporary
    /// file was removed). What is on disk is as it was.
    #[error(
        "could not write {} (the state after step {step}): {cause}. It needs {}; {} free on \
         that file system.\n{}\nhint: {}",
        .path.display(), bytes_exact(*needed_bytes),
        .available_bytes.map(bytes_exact).unwrap_or_else(|| "an unknown amount is".to_string()),
        safe_on_disk(saved), space_hint(*needed_bytes, *available_bytes, saved)
    )]
    CheckpointNotWritten {
        /// The file that was not written.
        path: PathBuf,
        /// The step whose state it was to hold.
        step: u64,
        /// What happened: too little room, or the I/O error.
        cause: String,
        /// Bytes the file needs.
        needed_bytes: u64,
        /// Bytes free to this process on its file system (`None`: the platform does not say).
        available_bytes: Option<u64>,
        /// The checkpoints on disk (path, step), intact.
        saved: Vec<(PathBuf, u64)>,
    },
    /// Bad configuration or data.
    #[error("{what}: {message}")]
    Invalid {
        /// What was bad (an option, a file).
        what: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// `step N`, or `the dry run` for step 0 (the memory plan's steps).
fn step_name(step: u64) -> String {
    if step == 0 {
        "the memory plan's dry run".to_string()
    } else {
        format!("step {step}")
    }
}

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(what: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Invalid {
            what: what.into(),
            message: message.into(),
        }
    }

    /// The GPU-layer error at the bottom of this error, if any, looking through the `nn` and
    /// `autograd` wrappers (which are `#[error(transparent)]`, so `source()` skips them).
    pub fn kernel_error(&self) -> Option<&KernelError> {
        match self {
            Error::Kernel(k) => Some(k),
            Error::Autograd(a) => autograd_kernel_error(a),
            Error::Nn(n) => nn_kernel_error(n),
            Error::OutOfMemoryAtMicroBatchOne { source, .. }
            | Error::SampleOutOfMemory { source, .. }
            | Error::PlanTimeout { source, .. }
            | Error::StepTimeout { source, .. } => source.kernel_error(),
            _ => None,
        }
    }

    /// The label, bytes and the largest bindable size when this is (or wraps) a buffer larger
    /// than a kernel can bind.
    pub fn too_large_for_binding(&self) -> Option<(&str, u64, u64)> {
        match self.kernel_error() {
            Some(KernelError::TooLarge {
                label,
                requested_bytes,
                max_bytes,
            }) => Some((label.as_str(), *requested_bytes, *max_bytes)),
            _ => None,
        }
    }

    /// Whether this is (or wraps) an out-of-memory error.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self.kernel_error(), Some(KernelError::OutOfMemory(_)))
            || matches!(self, Error::OutOfMemoryAtMicroBatchOne { .. })
    }

    /// Whether this is a usage error: an error about a command-line flag, which names it
    /// `--flag` (the `plimsoll` command exits with 2 for these, as clap does for its own).
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::Invalid { what, .. } if what.starts_with("--"))
    }

    /// Whether this is (or wraps) a lost device ([`KernelError::DeviceLost`]).
    pub fn is_device_lost(&self) -> bool {
        matches!(self.kernel_error(), Some(KernelError::DeviceLost { .. }))
    }

    /// Whether this is (or wraps) a fence timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self.kernel_error(), Some(KernelError::Timeout { .. }))
            || matches!(self, Error::StepTimeout { .. })
    }
}

fn autograd_kernel_error(e: &plimsoll_autograd::Error) -> Option<&KernelError> {
    match e {
        plimsoll_autograd::Error::Kernel(k) => Some(k),
        _ => None,
    }
}

/// `nn`'s error down to the GPU error (its tensor ops and its own kernel launches).
fn nn_kernel_error(e: &plimsoll_nn::Error) -> Option<&KernelError> {
    match e {
        plimsoll_nn::Error::Autograd(a) => autograd_kernel_error(a),
        plimsoll_nn::Error::Kernel(k) => Some(k),
        _ => None,
    }
}

/// An out-of-memory error's report without the allocator's hint (which speaks of training
/// steps), or the whole error when it is something else.
fn memory_state(error: &Error) -> String {
    match error.kernel_error() {
        Some(KernelError::OutOfMemory(report)) => report.state(),
        _ => error.to_string(),
    }
}

/// `98.5 KiB (100,864 bytes)`: the figure to compare and the exact one to free.
fn bytes_exact(bytes: u64) -> String {
    let digits = bytes.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    match bytes < 1024 {
        true => format!("{grouped} bytes"),
        false => format!("{} ({grouped} bytes)", format_bytes(bytes)),
    }
}

/// What [`Error::CheckpointNotWritten`] left safe: each checkpoint on disk and its step, or that
/// there is none.
fn safe_on_disk(saved: &[(PathBuf, u64)]) -> String {
    if saved.is_empty() {
        return "no checkpoint of this run exists yet: its record (run.json, metrics.jsonl) \
                is all it has on disk"
            .to_string();
    }
    let list: Vec<String> = saved
        .iter()
        .map(|(path, step)| format!("{} holds step {step}", path.display()))
        .collect();
    format!("safe on disk, as they were: {}", list.join("; "))
}

/// How much to free, when room was short (otherwise what else limits a write), and how to go
/// on: resume from `latest.safetensors` when it is among the `saved`, else train again.
fn space_hint(needed_bytes: u64, available_bytes: Option<u64>, saved: &[(PathBuf, u64)]) -> String {
    let resumable = saved.iter().any(|(path, _)| {
        path.file_name()
            .is_some_and(|n| n == crate::checkpoint_io::LATEST)
    });
    let then = match resumable {
        true => "then continue the run with --resume",
        false => {
            "then start the run again in a new directory (with no latest checkpoint there is \
             nothing to resume)"
        }
    };
    match available_bytes {
        Some(free) if free < needed_bytes => format!(
            "free at least {} on that file system (or move the run to a larger one), {then}",
            bytes_exact(needed_bytes - free)
        ),
        _ => format!(
            "the file system refused the write with room to spare: check its quota, a \
             file-size limit (ulimit -f) or the device, {then}"
        ),
    }
}

/// What [`Error::RanksUnresponsive`] knows.
#[derive(Debug)]
pub struct Unresponsive {
    /// What was waited for.
    pub what: String,
    /// The step (0 outside a step).
    pub step: u64,
    /// This rank.
    pub rank: usize,
    /// The ranks that never reached the call.
    pub missing: Vec<usize>,
    /// The ranks that reached the call but then answered no ping: dead or hung in it.
    pub silent: Vec<usize>,
    /// Per rank, the step of its last call seen by this one (`None`: none yet, or this rank).
    pub last_seen: Vec<Option<u64>>,
    /// The deadline in milliseconds.
    pub deadline_ms: u64,
    /// Whether this rank's communication thread had died.
    pub thread_gone: bool,
    /// Where the last good state was saved, if anywhere.
    pub saved: Option<PathBuf>,
}

impl std::fmt::Display for Unresponsive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.what)?;
        if self.step > 0 {
            write!(f, " of step {}", self.step)?;
        }
        write!(f, " did not complete within {} ms: ", self.deadline_ms)?;
        let name = |r: usize| match self.last_seen.get(r).copied().flatten() {
            Some(s) => format!("rank {r} (its last call was in step {s})"),
            None => format!("rank {r} (no call in any step yet)"),
        };
        let list = |ranks: &[usize]| {
            ranks
                .iter()
                .map(|&r| name(r))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!("{} never reached it", list(&self.missing)));
        }
        if !self.silent.is_empty() {
            parts.push(format!(
                "{} reached it but no longer answers (dead or hung)",
                list(&self.silent)
            ));
        }
        match parts.is_empty() {
            true => write!(
                f,
                "every rank reached it and answers, but the sum did not arrive"
            )?,
            false => write!(f, "{}", parts.join("; "))?,
        }
        if self.thread_gone {
            write!(f, " (this rank's MPI thread died)")?;
        }
        if let Some(p) = &self.saved {
            write!(
                f,
                "; the last good state (step {}) was saved to {}",
                self.step.saturating_sub(1),
                p.display()
            )?;
        }
        write!(
            f,
            ".\nhint: look at the missing ranks' own output (and mpirun's) for why; resume from \
             the last checkpoint with the same mpirun command and --resume, or raise \
             --deadline-ms if a rank is merely slow"
        )
    }
}

/// The part of [`Error::BudgetTooSmall`]'s hint about `--precision f16`, when it fits.
fn f16_hint(f16_fits: Option<(usize, u64)>) -> String {
    match f16_fits {
        Some((micro, reserved)) => format!(
            "--precision f16 fits this budget (activations in 16 bits: micro-batch {micro}, \
             peak {} reserved); or ",
            format_bytes(reserved)
        ),
        None => String::new(),
    }
}
