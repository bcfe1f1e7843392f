//! The one error type of `plimsoll-kernels-wgsl`. Every variant names the numbers involved and says
//! what to do next; nothing in this crate panics because of wgpu.

use std::fmt;

use plimsoll_allocator::AllocError;

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// One entry of the ring of recent submissions that is attached to every [`Error::Timeout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmissionRecord {
    /// The fence serial of this submission (monotonically increasing per [`crate::Gpu`]).
    pub serial: u64,
    /// What was submitted (the batch label, e.g. the first kernel's stem or the caller's label).
    pub label: String,
    /// Number of compute dispatches in the submission.
    pub dispatches: u32,
    /// Milliseconds between this submission and the moment the report was made.
    pub age_ms: u64,
    /// Whether the GPU had finished it when the report was made.
    pub done: bool,
}

/// The recent submissions, oldest first, as shown in a timeout message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentSubmissions(pub Vec<SubmissionRecord>);

impl fmt::Display for RecentSubmissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.0 {
            let state = if r.done { "done" } else { "RUNNING" };
            writeln!(
                f,
                "  #{:<6} {:<8} {:>5} dispatches  {:>7} ms ago  {}",
                r.serial, state, r.dispatches, r.age_ms, r.label
            )?;
        }
        Ok(())
    }
}

/// Everything that can go wrong on the GPU side.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No adapter matched (or none exists at all).
    #[error(
        "no GPU adapter found{}; available: [{}]. Install Mesa's software Vulkan driver \
         (lavapipe) with `apt-get install mesa-vulkan-drivers libvulkan1`, or unset/fix \
         PLIMSOLL_ADAPTER",
        .requested.as_ref().map(|r| format!(" matching {r:?}")).unwrap_or_default(),
        .available.join(", ")
    )]
    NoAdapter {
        /// The name substring or backend the user asked for, if any.
        requested: Option<String>,
        /// Every adapter wgpu enumerated, as `name (backend, type)`.
        available: Vec<String>,
    },
    /// The adapter refused to create a device.
    #[error("could not create a device on adapter {adapter:?}: {message}")]
    RequestDevice {
        /// Adapter name.
        adapter: String,
        /// wgpu's message.
        message: String,
    },
    /// The device was lost (driver reset, fatal out-of-memory, `destroy`). Every later call fails.
    #[error("GPU device lost ({reason}); create a new Gpu (restart the process if the GPU hung)")]
    DeviceLost {
        /// What wgpu said, or where the loss was noticed.
        reason: String,
    },
    /// A fence was not reached before its deadline. The GPU is still working on it.
    #[error(
        "submission #{serial} {label:?} did not finish within {deadline_ms} ms; the GPU is still \
         busy (wait again with a longer deadline, or make batches smaller). Recent submissions:\n\
         {recent}"
    )]
    Timeout {
        /// Label of the submission waited on.
        label: String,
        /// Its fence serial.
        serial: u64,
        /// The deadline that passed, in milliseconds.
        deadline_ms: u64,
        /// The last submissions, oldest first, with whether each had finished.
        recent: RecentSubmissions,
    },
    /// The memory budget (or the device) could not hold the request. The report says what holds
    /// memory and what to do.
    #[error("{0}")]
    OutOfMemory(Box<plimsoll_allocator::OutOfMemory>),
    /// One buffer over the largest size a kernel can bind (`max_storage_buffer_binding_size`).
    /// Such tensors must be split by the caller (e.g. along the batch dimension).
    #[error(
        "buffer {label:?} of {requested_bytes} bytes is larger than the largest bindable block \
         ({max_bytes} bytes = device limit max_storage_buffer_binding_size); split the tensor \
         (e.g. along the batch dimension) or reduce its size"
    )]
    TooLarge {
        /// Label of the request.
        label: String,
        /// Bytes asked for.
        requested_bytes: u64,
        /// The largest block this device can bind.
        max_bytes: u64,
    },
    /// A size or offset that is not a multiple of what the device needs.
    #[error("{what} = {value} is not a multiple of {required} bytes ({label:?})")]
    Misaligned {
        /// What was misaligned (e.g. `size_bytes`, `offset_bytes`).
        what: &'static str,
        /// The offending value.
        value: u64,
        /// The required multiple.
        required: u64,
        /// Label of the buffer.
        label: String,
    },
    /// An element range outside a buffer, or inconsistent launcher arguments.
    #[error("{op}: {message}")]
    InvalidArgument {
        /// The operation (kernel stem or method).
        op: &'static str,
        /// What is wrong, with the numbers.
        message: String,
    },
    /// A launch whose shader invocations would loop more often than the adapter allows. Mesa's
    /// lavapipe (llvmpipe) silently stops a shader's loops after 65,535 iterations in total per
    /// invocation, which would give wrong results; the launcher refuses instead (see
    /// `kernels` module docs, "Loop limit on lavapipe").
    #[error(
        "{op}: one shader invocation would run {iterations} loop iterations, more than this \
         adapter's limit of {limit} (Mesa's lavapipe stops loops there silently, which would give \
         wrong results); {hint}, or run on a GPU adapter (PLIMSOLL_ADAPTER)"
    )]
    LoopLimit {
        /// The launcher.
        op: &'static str,
        /// Loop iterations (passes, see the `kernels` docs) one invocation would need.
        iterations: u64,
        /// The adapter's limit ([`crate::Gpu::loop_iteration_limit`]).
        limit: u64,
        /// What to change, with the largest value that fits (e.g. `use at most 262128 columns`).
        hint: String,
    },
    /// Any other allocator refusal (zero size, bad alignment, unknown allocation).
    #[error(transparent)]
    Allocation(AllocError),
    /// wgpu reported a validation error (bad shader, bad binding, bad copy). A bug in a kernel or
    /// launcher, never the user's data.
    #[error("wgpu validation error in {context}: {message}")]
    Validation {
        /// What we were doing.
        context: String,
        /// wgpu's message.
        message: String,
    },
    /// wgpu reported an internal error (e.g. a shader the backend could not compile).
    #[error("wgpu internal error in {context}: {message}")]
    Internal {
        /// What we were doing.
        context: String,
        /// wgpu's message.
        message: String,
    },
    /// Host memory a run keeps on purpose for the device (an offloaded optimizer's state,
    /// offloaded activations) was refused ([`crate::Gpu::host_allocation`]).
    #[error(
        "host memory refused {bytes} bytes for {what}; free host memory, or keep less on the \
         host (--offload)"
    )]
    HostMemory {
        /// What the memory was for.
        what: String,
        /// Bytes asked for.
        bytes: u64,
    },
    /// A kernel was given a buffer whose values are in host memory ([`crate::Gpu::evict`]).
    #[error(
        "{op} used {label:?} while it was evicted to host memory; restore it first \
         (Gpu::restore)"
    )]
    Evicted {
        /// Label of the buffer.
        label: String,
        /// What used it.
        op: String,
    },
    /// Mapping a read-back buffer failed.
    #[error("reading back {label:?} failed: {message}")]
    Map {
        /// Label of the buffer read.
        label: String,
        /// wgpu's message.
        message: String,
    },
    /// A fence whose submission wgpu rejected (it failed validation, or belongs to another device).
    #[error("submission #{serial} {label:?} was rejected by wgpu: {message}")]
    Rejected {
        /// Fence serial.
        serial: u64,
        /// Label of the submission.
        label: String,
        /// wgpu's message.
        message: String,
    },
}

impl From<AllocError> for Error {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::OutOfMemory(report) => Error::OutOfMemory(report),
            AllocError::TooLarge {
                requested_bytes,
                max_segment_bytes,
                label,
            } => Error::TooLarge {
                label: label.to_string(),
                requested_bytes,
                max_bytes: max_segment_bytes,
            },
            other => Error::Allocation(other),
        }
    }
}

impl Error {
    /// Converts a wgpu error caught by an error scope, naming what we were doing.
    pub(crate) fn from_wgpu(context: &str, e: wgpu::Error) -> Self {
        match e {
            wgpu::Error::OutOfMemory { .. } => Error::Validation {
                context: context.to_string(),
                message: format!("out of device memory: {e}"),
            },
            wgpu::Error::Validation { description, .. } => Error::Validation {
                context: context.to_string(),
                message: description,
            },
            wgpu::Error::Internal { description, .. } => Error::Internal {
                context: context.to_string(),
                message: description,
            },
        }
    }
}
