//! [`TrainConfig`]: everything a run is told before it starts. Defaults are the ones the
//! `plimsoll train digits` command uses.

use std::path::PathBuf;
use std::time::Duration;

use plimsoll_nn::LrSchedule;

use crate::error::{Error, Result};

/// Activation checkpointing: which children of the model's `Sequential` run through
/// `autograd::checkpoint` (keeping only their inputs and recomputing in backward).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointPolicy {
    /// Save every activation (fastest, most memory).
    None,
    /// Checkpoint every run of this many consecutive children ("blocks") of the `Sequential`.
    EveryBlocks(usize),
    /// Let the memory plan decide: no checkpointing when the effective batch fits the budget,
    /// otherwise the segment length that allows the largest micro-batch.
    Automatic,
}

/// Where a step's device memory goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocatorMode {
    /// Every request takes the best-fitting free block of the cached segments.
    #[default]
    Caching,
    /// Once a step repeats the one before, its allocations are placed offline from their
    /// lifetimes and the following steps replay that placement (no fragmentation; see
    /// `plimsoll_allocator`'s step plans). A step that differs falls back to best fit.
    Planned,
}

/// What the per-step leak check does when it finds memory beyond parameters, gradients and
/// optimizer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeakPolicy {
    /// Do not check.
    Off,
    /// Log a warning naming the holders, and go on.
    Warn,
    /// Stop with [`Error::Leak`].
    Error,
}

/// How long a run lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    /// Whole passes over the training set.
    Epochs(u64),
    /// Optimizer steps.
    Steps(u64),
}

/// The configuration of one training run.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Samples per optimizer step (the batch whose mean loss the update follows).
    pub effective_batch: usize,
    /// Samples per forward/backward; `None`: the memory plan picks the largest that fits.
    /// Invariant once the run starts: `1 <= micro_batch <= effective_batch`.
    pub micro_batch: Option<usize>,
    /// How long to train.
    pub length: RunLength,
    /// Learning rate per step.
    pub schedule: LrSchedule,
    /// Seed of the data order (and of nothing else: the model's seed is the model builder's).
    pub seed: u64,
    /// Memory budget in bytes; `None`: the adapter's default.
    pub memory_budget_bytes: Option<u64>,
    /// Activation checkpointing.
    pub checkpointing: CheckpointPolicy,
    /// Deadline of every GPU wait (set as the Gpu's default deadline).
    pub fence_deadline: Duration,
    /// Deadline of the reads that save the last good state before giving up on a step; at
    /// most `fence_deadline` is used, so giving up takes at most twice the deadline.
    pub save_deadline: Duration,
    /// Evaluate every this many steps (`None`: at the end of every epoch).
    pub eval_interval_steps: Option<u64>,
    /// Where training checkpoints go (`None`: none are written).
    pub checkpoint_dir: Option<PathBuf>,
    /// Save every this many steps (`None`: only at the end, on Ctrl-C and on timeout).
    pub checkpoint_interval_steps: Option<u64>,
    /// What the after-step leak check does.
    pub leak_policy: LeakPolicy,
    /// Label smoothing of the cross-entropy loss.
    pub label_smoothing: f32,
    /// Clip the global gradient norm to this (`None`: no clipping).
    pub clip_grad_norm: Option<f32>,
    /// Record the allocator's events over these steps as a memory timeline (see
    /// [`crate::timeline`]); written into `checkpoint_dir` when there is one.
    pub memory_timeline: Option<crate::timeline::StepSpan>,
    /// Time every dispatch of these steps (see [`crate::profiling`]); the table and a Chrome
    /// trace go into `checkpoint_dir` when there is one.
    pub profile_steps: Option<crate::timeline::StepSpan>,
    /// Best fit for every request, or planned steps.
    pub allocator: AllocatorMode,
    /// f32 throughout, or activations stored in f16 with dynamic loss scaling.
    pub precision: Precision,
    /// Training batches the loader thread builds in host memory ahead of the step
    /// ([`crate::loader`]); 0: each step builds its own when it starts.
    pub prefetch: usize,
    /// How often the training state is kept in host memory, the state a lost device's run goes
    /// on from ([`Trainer::step`](crate::Trainer::step); a saved checkpoint is kept too).
    pub snapshot_every: SnapshotEvery,
    /// Device losses in a row (with no new step finished between them) that the run recovers
    /// from on a new device; the next one ends it. 0: a lost device ends the run.
    pub max_device_losses: u32,
    /// Where a resumed run goes on from, with optimizer state loaded before its first step
    /// ([`Trainer::resume`](crate::Trainer::resume) plans again with this set): the plan's dry
    /// runs then load state of the same sizes, in the same order, and replay the run's events
    /// from there, so that the allocator's layout, and the peak, are the run's. `None` for a
    /// new run.
    pub resumed_at: Option<ResumePoint>,
    /// Where the optimizer keeps its state and updates: on the device, or in host memory
    /// ([`Offload::OptimizerState`]).
    pub offload: Offload,
    /// Host bytes the run may hold for what it keeps there on purpose: the loader's batches,
    /// an offloaded optimizer's state, the snapshot of the training state. `None`:
    /// [`crate::host::HOST_SHARE`] of what the host has available when the run starts. A run
    /// that needs more is refused before step 1 ([`crate::Error::HostBudgetTooSmall`]), and
    /// `Offload::Auto` does not offload past it.
    pub host_memory_budget: Option<u64>,
    /// What the ranks of a data-parallel run divide between them (ZeRO stages 1 and 2);
    /// nothing with one process.
    pub shard: Shard,
    /// This process's rank and how many ranks train the model (`(0, 1)` for one process): the
    /// rows a sharded optimizer keeps ([`Shard`]), in the run and in its plan's dry runs. The
    /// trainer sets it from its collective.
    pub rank: (usize, usize),
}

/// Where a resumed run goes on from ([`TrainConfig::resumed_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumePoint {
    /// Optimizer steps done.
    pub step: u64,
    /// Epochs done.
    pub epoch: u64,
    /// Samples of the current epoch done.
    pub sample_in_epoch: usize,
}

/// What a run keeps in host memory instead of on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Offload {
    /// Everything on the device.
    #[default]
    None,
    /// The plan decides: everything on the device when a choice fits there, else the
    /// optimizer's state in host memory when that fits (the run then goes on as
    /// [`Offload::OptimizerState`]).
    Auto,
    /// The optimizer's state (AdamW's moments) in host memory, its update on the host
    /// ([`plimsoll_nn::HostAdamW`]): 8 bytes per parameter less on the device, 12 per
    /// parameter moved each step (the gradient and the value read back, the value written).
    OptimizerState,
    /// [`Offload::OptimizerState`], and the activations that checkpointed segments keep for
    /// their backward (their inputs: with checkpointing, the hidden state at each segment's
    /// start) in host memory too ([`plimsoll_autograd::offload_inputs`]): each read back after
    /// its segment's forward, written back when its backward starts.
    Activations,
    /// [`Offload::Activations`], and the parameters of the model's blocks streamed (the last
    /// resort): they live in host memory, come to the device for their checkpointed segment's
    /// forward and again for its recomputation, and leave after each; their gradients are read
    /// back after each segment's backward and accumulated in host memory, where the optimizer
    /// updates them ([`plimsoll_autograd::checkpoint_with`]). The device holds one segment's
    /// parameters and gradients at a time, besides the embeddings and the head.
    Parameters,
}

impl Offload {
    /// Whether the optimizer keeps its state in host memory.
    pub fn optimizer_on_host(self) -> bool {
        matches!(
            self,
            Offload::OptimizerState | Offload::Activations | Offload::Parameters
        )
    }

    /// Whether checkpointed segments keep their inputs in host memory.
    pub fn activations_on_host(self) -> bool {
        matches!(self, Offload::Activations | Offload::Parameters)
    }

    /// Whether the blocks' parameters live in host memory between their uses.
    pub fn parameters_on_host(self) -> bool {
        self == Offload::Parameters
    }
}

impl std::fmt::Display for Offload {
    /// As `--offload` takes it: `none`, `auto`, `optimizer`, `activations`, `parameters`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Offload::None => "none",
            Offload::Auto => "auto",
            Offload::OptimizerState => "optimizer",
            Offload::Activations => "activations",
            Offload::Parameters => "parameters",
        })
    }
}

/// What the ranks of a data-parallel run divide between them, ZeRO's stages 1 and 2
/// (`--shard`). Each rank keeps the optimizer state of about 1/N of the parameters' rows
/// ([`plimsoll_nn::ShardedAdamW`]) and updates only those; the updated rows are then gathered
/// by every rank. The update equals one process's on the whole batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shard {
    /// Every rank keeps all of the optimizer state and updates every parameter.
    #[default]
    None,
    /// Stage 1: the optimizer state is divided; the gradients are summed on every rank
    /// (all-reduce) as without sharding.
    OptimizerState,
    /// Stage 2: the optimizer state and the summed gradients are divided: a reduce-scatter
    /// leaves each rank only its rows' gradients, and the whole gradients are freed before the
    /// update.
    Gradients,
}

impl std::fmt::Display for Shard {
    /// As `--shard` takes it: `none`, `optimizer`, `gradients`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Shard::None => "none",
            Shard::OptimizerState => "optimizer",
            Shard::Gradients => "gradients",
        })
    }
}

/// How often [`TrainConfig::snapshot_every`] keeps the training state in host memory. Each
/// snapshot reads the parameters and the optimizer state back (one read-back; host memory as
/// large as a checkpoint). After a device loss the steps since the snapshot run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotEvery {
    /// Before every this many steps (at least 1).
    Steps(u64),
    /// Before the first step after this much time since the last snapshot.
    Interval(Duration),
    /// None kept: a lost device goes on from the last checkpoint this run saved, if any.
    Off,
}

/// The default [`SnapshotEvery`]: two minutes of training at most to run again.
pub const DEFAULT_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(120);

impl std::fmt::Display for SnapshotEvery {
    /// As `--snapshot-every` takes it: `50` (steps), `120s`, `off`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotEvery::Steps(n) => write!(f, "{n}"),
            SnapshotEvery::Interval(d) => write!(f, "{}s", d.as_secs()),
            SnapshotEvery::Off => f.write_str("off"),
        }
    }
}

/// What a step stores activations in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// As PyTorch's autocast: activations (the outputs of layers, and what backward saves)
    /// stored in f16, half the bytes; matmuls read 16-bit inputs (weights through f16 copies
    /// made once per update) and sum in f32; elementwise ops run in 16 bits; parameters,
    /// gradients, optimizer state, layer norm statistics, softmax and the loss stay f32. The
    /// loss is scaled dynamically ([`crate::scaler`]) and a step whose gradients overflow is
    /// skipped.
    F16,
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
        })
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            effective_batch: 64,
            micro_batch: None,
            length: RunLength::Epochs(30),
            schedule: LrSchedule::Constant { lr: 2e-3 },
            seed: 0,
            memory_budget_bytes: None,
            checkpointing: CheckpointPolicy::Automatic,
            fence_deadline: Duration::from_secs(30),
            save_deadline: Duration::from_secs(120),
            eval_interval_steps: None,
            checkpoint_dir: None,
            checkpoint_interval_steps: None,
            leak_policy: LeakPolicy::Warn,
            label_smoothing: 0.0,
            clip_grad_norm: None,
            memory_timeline: None,
            profile_steps: None,
            allocator: AllocatorMode::Caching,
            precision: Precision::F32,
            prefetch: 2,
            snapshot_every: SnapshotEvery::Interval(DEFAULT_SNAPSHOT_INTERVAL),
            max_device_losses: 3,
            resumed_at: None,
            offload: Offload::None,
            host_memory_budget: None,
            shard: Shard::None,
            rank: (0, 1),
        }
    }
}

impl std::fmt::Display for CheckpointPolicy {
    /// As `--checkpointing` takes it: `none`, `auto`, `every 2 modules`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointPolicy::None => f.write_str("none"),
            CheckpointPolicy::Automatic => f.write_str("auto"),
            CheckpointPolicy::EveryBlocks(1) => f.write_str("every module"),
            CheckpointPolicy::EveryBlocks(k) => write!(f, "every {k} modules"),
        }
    }
}

impl std::fmt::Display for AllocatorMode {
    /// As `--allocator` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AllocatorMode::Caching => "caching",
            AllocatorMode::Planned => "planned",
        })
    }
}

impl std::fmt::Display for LeakPolicy {
    /// As `--leak-check` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LeakPolicy::Off => "off",
            LeakPolicy::Warn => "warn",
            LeakPolicy::Error => "error",
        })
    }
}

impl std::fmt::Display for RunLength {
    /// `30 epochs`, `1 step`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, unit) = match *self {
            RunLength::Epochs(n) => (n, "epoch"),
            RunLength::Steps(n) => (n, "step"),
        };
        write!(f, "{n} {unit}{}", if n == 1 { "" } else { "s" })
    }
}

/// A learning-rate schedule in words: `constant 0.002`, or `warm-up over 100 steps to 0.001,
/// then cosine decay to 0.0001 at step 2000`.
pub fn describe_schedule(schedule: &LrSchedule) -> String {
    match *schedule {
        LrSchedule::Constant { lr } => format!("constant {lr}"),
        LrSchedule::WarmupCosine {
            peak_lr,
            warmup_steps: 0,
            total_steps,
            min_lr,
        } => format!("cosine decay from {peak_lr} to {min_lr} at step {total_steps}"),
        LrSchedule::WarmupCosine {
            peak_lr,
            warmup_steps,
            total_steps,
            min_lr,
        } => format!(
            "warm-up over {warmup_steps} steps to {peak_lr}, then cosine decay to {min_lr} at \
             step {total_steps}"
        ),
    }
}

impl TrainConfig {
    /// Every setting as JSON, for the record a run keeps of itself (`run.json`). Numbers stay
    /// numbers; the length, the schedule and the policies are written in words (`30 epochs`,
    /// `auto`), as the flags take them where there is a flag.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "effective_batch": self.effective_batch,
            "micro_batch": self.micro_batch,
            "length": self.length.to_string(),
            "schedule": describe_schedule(&self.schedule),
            "seed": self.seed,
            "memory_budget_bytes": self.memory_budget_bytes,
            "checkpointing": self.checkpointing.to_string(),
            "fence_deadline_ms": self.fence_deadline.as_millis() as u64,
            "save_deadline_ms": self.save_deadline.as_millis() as u64,
            "eval_interval_steps": self.eval_interval_steps,
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint_interval_steps": self.checkpoint_interval_steps,
            "leak_policy": self.leak_policy.to_string(),
            "label_smoothing": self.label_smoothing,
            "clip_grad_norm": self.clip_grad_norm,
            "allocator": self.allocator.to_string(),
            "precision": self.precision.to_string(),
            "prefetch": self.prefetch,
            "offload": self.offload.to_string(),
            "host_memory_budget": self.host_memory_budget,
            "shard": self.shard.to_string(),
        })
    }

    /// Whether the trainer makes a memory plan before step 1: unless both the micro-batch and
    /// a checkpointing other than automatic are given.
    pub fn needs_plan(&self) -> bool {
        self.micro_batch.is_none() || self.checkpointing == CheckpointPolicy::Automatic
    }

    /// [`TrainConfig::validate`], and that a checkpointing segment length fits a model of
    /// `blocks` checkpointable modules.
    pub fn validate_for(&self, blocks: usize) -> Result<()> {
        self.validate()?;
        if let CheckpointPolicy::EveryBlocks(k) = self.checkpointing
            && k > blocks
        {
            return Err(Error::invalid(
                "--checkpointing",
                format!(
                    "{k}, but the model has {blocks} checkpointable modules; use a number from \
                     1 to {blocks}, auto or none"
                ),
            ));
        }
        Ok(())
    }

    /// Checks the numbers that must hold before a run starts.
    pub fn validate(&self) -> Result<()> {
        if self.effective_batch == 0 {
            return Err(Error::invalid(
                "--batch",
                "the effective batch must be at least 1",
            ));
        }
        if let Some(m) = self.micro_batch
            && (m == 0 || m > self.effective_batch)
        {
            return Err(Error::invalid(
                "--micro-batch",
                format!(
                    "{m} is not between 1 and the effective batch (--batch) {b}; give a \
                     --micro-batch of at most {b}, a --batch of at least {m}, or leave \
                     --micro-batch out for the largest that fits",
                    b = self.effective_batch
                ),
            ));
        }
        if let CheckpointPolicy::EveryBlocks(0) = self.checkpointing {
            return Err(Error::invalid(
                "--checkpointing",
                "segments must hold at least one block",
            ));
        }
        if self.fence_deadline.is_zero() {
            return Err(Error::invalid(
                "--deadline-ms",
                "the fence deadline must be positive",
            ));
        }
        if let Some(max) = self.clip_grad_norm
            && !(max.is_finite() && max > 0.0)
        {
            return Err(Error::invalid(
                "--clip-grad-norm",
                format!("{max} must be positive and finite (1.0 is usual)"),
            ));
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return Err(Error::invalid(
                "label smoothing",
                format!("{} is not in [0, 1)", self.label_smoothing),
            ));
        }
        Ok(())
    }
}
