//! Plimsoll's trainer: the training loop and the `plimsoll` command. A [`Trainer`] runs
//! optimizer steps over an in-memory [`Dataset`] with a fixed effective batch split into
//! micro-batches, and keeps the promises of the design:
//!
//! - accumulation: k micro-batches give the update one batch of k times the size gives
//!   ([`step`]);
//! - out-of-memory recovery: a step that runs out of memory is run again with half the
//!   micro-batch, logged, and only fails at a micro-batch of one ([`step`]);
//! - budget first: a dry run predicts each step's peak and picks the micro-batch and
//!   checkpointing that fit ([`plan`]);
//! - leak check: after every step only parameters, gradients and optimizer state may remain
//!   ([`leak`]);
//! - deadlines: every wait uses the fence deadline; a step's losses and finiteness flags are
//!   read back once per step; a timeout saves the last good state first ([`trainer`]);
//! - non-finite values stop the step and name the first parameter ([`step`]);
//! - checkpoints are atomic safetensors files and resume bit-identically ([`checkpoint_io`]);
//! - a lost device is not a lost run: the trainer goes on with a new device from the state kept
//!   in host memory, and the finished run is bit-identical to an undisturbed one ([`recovery`]).
//!
//! It is not a layer library (that is `plimsoll-nn`): it trains whatever a [`Recipe`] builds on
//! whatever [`Data`] holds ([`task`]); the MLP classifier and nanoGPT's GPT come with it
//! ([`model`]). Map, one folder per part: the loop (`training/`: [`trainer`], [`step`], [`plan`],
//! [`recovery`], [`scaler`], [`collective`]), runs on disk (`runs/`: [`checkpoint_io`], [`run_dir`]), what
//! watches the run (`observe/`: the step hooks [`timeline`], [`profiling`] and [`leak`], with
//! [`memory_viz`], [`metrics`], [`report`]), what is trained (`workload/`: [`task`], [`model`],
//! [`data`], [`text`], [`sample`](mod@sample), [`host`]); [`config`] and [`error`] at the root.

pub mod config;
pub mod error;
#[cfg(feature = "mpi")]
pub mod mpi;
mod observe;
mod runs;
mod training;
mod workload;

// Each part's modules, at the crate root where their paths have always been.
pub use observe::{host_memory, leak, memory_viz, metrics, profiling, report, timeline};
pub use runs::{checkpoint_io, run_dir};
pub use training::{collective, loader, plan, read_back, recovery, scaler, step, trainer, zero};
pub use workload::{
    data, host, images, model, prepare, sample, task, text, token_files, tokenizer,
};

pub use config::{
    AllocatorMode, CheckpointPolicy, DEFAULT_SNAPSHOT_INTERVAL, LeakPolicy, Offload, Precision,
    ResumePoint, RunLength, Shard, SnapshotEvery, TrainConfig,
};
pub use data::{Dataset, TokenData};
pub use error::{Error, Result};
pub use images::{CnnSpec, ImageSet, ImageTransform, ResNetSpec, SyntheticImages};
pub use metrics::{EvalRecord, JsonLines, Observer, Silent, StepReport};
pub use model::{
    Arch, Attention, ExportLayout, GptSpec, LlamaShape, LossHead, ModelSpec, OptimizerSpec,
};
pub use plan::MemoryPlan;
pub use sample::{SampleOptions, SamplePlan, Sampled, sample};
pub use task::{Batch, Data, EvalSums, Evaluation, Model, Recipe};
pub use text::{CharCorpus, TokenWindows};
pub use timeline::{HostBytes, StepSpan, Timeline};
pub use token_files::{TokenFile, TokenFolder};
pub use tokenizer::Tokenizer;
pub use trainer::{LOG_LINES_KEPT, LOSS_WINDOW, MODEL_FILE, RunSummary, Trainer};

// What a user of this crate alone needs to define a model and open a device.
pub use plimsoll_autograd::{Gpu, Tensor, TensorOptions, no_grad};
pub use plimsoll_kernels_wgsl::GpuOptions;
/// Layers, losses, optimizers and schedules (`plimsoll-nn`).
pub use plimsoll_nn as nn;
