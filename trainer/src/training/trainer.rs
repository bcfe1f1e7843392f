//! [`Trainer`]: the loop. It owns the model, the optimizer and the run's position, and runs
//! steps ([`Trainer::step`]) with the guarantees of the crate docs: accumulation, out-of-memory
//! recovery, the after-step leak check, fence deadlines (with a checkpoint of the last good
//! state on timeout), the non-finite check, periodic and final checkpoints, evaluation and a
//! clean stop when the stop flag (Ctrl-C) is raised.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use plimsoll_allocator::StepOutcome;
use plimsoll_autograd::{Gpu, Tensor};
use plimsoll_nn::Optimizer;

use crate::checkpoint_io::RunPosition;
use crate::collective::{Collective, SingleProcess};
use crate::config::{CheckpointPolicy, Offload, RunLength, TrainConfig};
use crate::data::EpochOrder;
use crate::error::{Error, Result};
use crate::loader::Loader;
use crate::metrics::Observer;
use crate::observe::hooks::{CheckFailure, HookContext, Hooks, StepHook};
use crate::plan::{MemoryPlan, plan};
use crate::profiling::ProfiledStep;
use crate::task::{Data, Evaluation, Model, Recipe};
use crate::timeline::Timeline;
use crate::training::attempt::Begun;

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Steps completed in total (including those before a resume).
    pub steps: u64,
    /// The training loss at the end: the last step's [`crate::StepReport::loss_mean`] (the mean of
    /// the last [`LOSS_WINDOW`] steps).
    pub last_loss: Option<f32>,
    /// The last evaluation.
    pub last_evaluation: Option<Evaluation>,
    /// Whether the stop flag ended it early.
    pub interrupted: bool,
    /// The last checkpoint written.
    pub checkpoint: Option<PathBuf>,
    /// The lowest evaluation loss of the run (resumed runs included), saved as
    /// `best.safetensors` when there is a checkpoint directory.
    pub best_eval_loss: Option<f32>,
    /// Device losses the run went on from ([`crate::recovery`]).
    pub device_losses: u64,
}

/// A training run in progress. See the module docs.
pub struct Trainer {
    pub(crate) gpu: Gpu,
    pub(crate) config: TrainConfig,
    pub(crate) model: Box<dyn Model>,
    pub(crate) params: Vec<(String, Tensor)>,
    pub(crate) optimizer: Box<dyn Optimizer>,
    pub(crate) train: Arc<dyn Data>,
    pub(crate) test: Option<Box<dyn Data>>,
    /// The data order of `order_epoch` (a permutation of the training samples), kept so a
    /// step does not shuffle a million windows again.
    pub(crate) order: EpochOrder,
    pub(crate) order_epoch: Option<u64>,
    /// Builds each step's samples in host memory ahead of it.
    pub(crate) loader: Loader,
    /// Invariant: `1 <= micro_batch <= config.effective_batch`.
    pub(crate) micro_batch: usize,
    pub(crate) segment_len: usize,
    pub(crate) plan: Option<MemoryPlan>,
    /// What the model was built from (the plan's choice of variant), kept to plan again when
    /// the device's budget changes mid-run ([`Trainer::step`]).
    pub(crate) recipe: Box<dyn Recipe>,
    pub(crate) position: RunPosition,
    /// Invariant: at most [`LOG_LINES_KEPT`] lines before `delivered_log` once a line has been
    /// delivered (`deliver_log`).
    pub(crate) log: Vec<String>,
    /// Lines of `log` already handed to [`Trainer::run`]'s observer.
    pub(crate) delivered_log: usize,
    pub(crate) stop: Arc<AtomicBool>,
    /// The last [`LOSS_WINDOW`] step losses, for [`crate::StepReport::loss_mean`].
    pub(crate) recent_losses: VecDeque<f32>,
    /// The step and path of the last training state this trainer saved.
    pub(crate) last_saved: Option<(u64, PathBuf)>,
    /// What watches each step: the memory timeline, the kernel profile, the leak check.
    pub(crate) hooks: Hooks,
    /// The processes training this model together ([`SingleProcess`] for one).
    pub(crate) collective: Box<dyn Collective>,
    /// Whether the ranks agreed, in the last step's sum, to stop after it. With several ranks
    /// the run stops on this, never on this rank's own flag: a signal that reaches one rank
    /// between steps would otherwise leave the others waiting for it in the next step.
    pub(crate) agreed_stop: bool,
    /// The state a lost device's run goes on from ([`crate::recovery`]).
    pub(crate) snapshot: Option<crate::recovery::HostSnapshot>,
    /// Whether a snapshot was refused (said once).
    pub(crate) snapshot_refused: bool,
    /// Device losses since the last new step finished.
    pub(crate) losses_in_a_row: u32,
    /// Device losses the run went on from.
    pub(crate) device_losses: u64,
    /// Opens the device to go on with after a loss.
    pub(crate) reopen: crate::recovery::Reopen,
    /// The budget the run was given (or the adapter's default), which the driver's figure may
    /// lower ([`Trainer::follow_driver_budget`]).
    pub(crate) run_budget: u64,
    /// The budget [`Trainer::follow_driver_budget`] last set, if it set one.
    pub(crate) driver_set: Option<u64>,
    /// The step begun ahead of the one being completed ([`Trainer::attempt_step`]).
    pub(crate) ahead: Option<Begun>,
    /// How the step begun ahead failed, returned by the next attempt.
    pub(crate) deferred: Option<Failure>,
    /// A step whose update was recorded before its read-back timed out: the state on the
    /// device may or may not hold it, so [`Trainer::save_last_good`] saves nothing.
    pub(crate) unconfirmed_update: Option<u64>,
    /// When the last step completed (step times run from it when steps overlap).
    pub(crate) last_completed: Option<Instant>,
    /// Steps begun before the step before them completed ([`Trainer::steps_begun_ahead`]).
    pub(crate) steps_begun_ahead: u64,
}

/// Why an attempt at a step failed.
pub(crate) enum Failure {
    /// Before the step started: returned as it is.
    Before(Error),
    /// During step `.0`: the trainer gives up on it (saving the last good state) unless it can
    /// go on.
    Step(u64, Error),
    /// In the after-step checks, which saved what they could: returned as it is.
    Checked(Error),
}

impl Failure {
    /// The error.
    pub(crate) fn into_error(self) -> Error {
        match self {
            Failure::Before(e) | Failure::Step(_, e) | Failure::Checked(e) => e,
        }
    }
}

/// The file [`Trainer::run`] exports the model to, in the checkpoint directory, at the end of
/// a run (see [`Trainer::export_model`]).
pub const MODEL_FILE: &str = "model.safetensors";

/// How long the ranks of a data-parallel run wait for each other where one may be slow for good
/// reason: before the first step (each compiles its kernels and plans its memory) and at the end
/// (rank 0 saves and exports the model). At least this, or the fence deadline.
pub const START_DEADLINE: Duration = Duration::from_secs(300);

/// The least time a step waits for the loader thread's batch before that is an error (or the
/// fence deadline, when longer): a first batch from a cold disk can take seconds.
pub const LOADER_DEADLINE: Duration = Duration::from_secs(120);

/// What the run's seed is mixed with to start the thread's random state (dropout masks), so
/// that the masks are not drawn from the data order's stream.
const DROPOUT_STREAM: u64 = 0xD50D_7A1C_E5EE_D001;

/// Log lines [`Trainer::log`] keeps once [`Trainer::run`] has handed them to its observer.
pub const LOG_LINES_KEPT: usize = 16;

/// Steps in the running mean of the training loss ([`crate::StepReport::loss_mean`]).
pub const LOSS_WINDOW: usize = 20;

impl Trainer {
    /// What a checkpoint saves of the model: its parameters, then its buffers (state that is
    /// not trained, such as BatchNorm's running statistics).
    pub(crate) fn saved_tensors(&self) -> Vec<(String, Tensor)> {
        let mut tensors = self.params.clone();
        tensors.extend(self.model.buffers());
        tensors
    }

    /// Prepares a run of the model `recipe` builds on `train` (evaluated on `test`): applies the
    /// budget and deadline to `gpu`, plans memory when something is left to choose (no
    /// micro-batch given, or automatic checkpointing), builds the model.
    pub fn new(
        gpu: &Gpu,
        config: TrainConfig,
        recipe: &dyn Recipe,
        train: impl Data + 'static,
        test: Option<Box<dyn Data>>,
    ) -> Result<Trainer> {
        Self::new_distributed(gpu, config, recipe, train, test, Box::new(SingleProcess))
    }

    /// [`Trainer::new`] for one rank of a data-parallel run ([`crate::collective`]): every
    /// rank builds the same model from the same seed, takes its shard of each step's batch,
    /// and sums gradients with the others through `collective` before each update. The memory
    /// plan fits this rank's largest shard. Only rank 0 should be given a checkpoint
    /// directory.
    pub fn new_distributed(
        gpu: &Gpu,
        config: TrainConfig,
        recipe: &dyn Recipe,
        train: impl Data + 'static,
        test: Option<Box<dyn Data>>,
        collective: Box<dyn Collective>,
    ) -> Result<Trainer> {
        config.validate_for(recipe.blocks())?;
        recipe.check(&train)?;
        if let Some(test) = &test {
            recipe.check(test.as_ref())?;
            if test.is_empty() {
                return Err(Error::invalid(
                    "data",
                    format!(
                        "the evaluation set is empty ({} training samples); give more data",
                        train.len()
                    ),
                ));
            }
        }
        if train.is_empty() {
            return Err(Error::invalid("data", "the training set is empty"));
        }
        if let Some(budget) = config.memory_budget_bytes {
            gpu.set_memory_budget(budget);
        }
        gpu.set_default_deadline(config.fence_deadline);
        let effective = config.effective_batch;
        let needs_plan = config.needs_plan();
        // Each rank runs its shard of every batch: that is what its memory must fit.
        let mut config = config;
        config.rank = (collective.rank(), collective.ranks());
        let mut per_rank = config.clone();
        per_rank.effective_batch = crate::collective::largest_shard(effective, collective.ranks());
        let plan = if needs_plan {
            Some(
                plan(gpu, recipe, &train, test.as_deref(), &per_rank).map_err(|e| {
                    match e.is_timeout() {
                        true => Error::PlanTimeout {
                            deadline_ms: config.fence_deadline.as_millis() as u64,
                            source: Box::new(e),
                        },
                        false => e,
                    }
                })?,
            )
        } else {
            None
        };
        // `--offload auto` is the plan's choice (on the device without a plan).
        config.offload = match (&plan, config.offload) {
            (Some(p), _) if p.offload == Offload::OptimizerState.to_string() => {
                Offload::OptimizerState
            }
            (Some(p), _) if p.offload == Offload::Activations.to_string() => Offload::Activations,
            (Some(p), _) if p.offload == Offload::Parameters.to_string() => Offload::Parameters,
            (Some(_), _) | (None, Offload::Auto) => Offload::None,
            (None, offload) => offload,
        };
        let (micro_batch, segment_len) = match &plan {
            Some(p) => (p.micro_batch, p.segment_len),
            None => (
                config.micro_batch.unwrap_or(effective),
                match (config.checkpointing, config.offload.parameters_on_host()) {
                    (CheckpointPolicy::EveryBlocks(k), streamed) => k.max(usize::from(streamed)),
                    // Streamed blocks run in segments of at least one block.
                    (_, true) => 1,
                    (_, false) => 0,
                },
            ),
        };
        let mut log = Vec::new();
        // A new run plans afresh (nothing recorded by an earlier trainer on this device counts),
        // from the model's first parameter on.
        let planned = config.allocator == crate::config::AllocatorMode::Planned;
        gpu.with_allocator(|a| a.set_step_planning(planned));
        // The plan may have chosen the recipe's memory-efficient variant.
        let variant = match plan.as_ref().and_then(|p| p.variant.as_ref()) {
            Some(_) => recipe.memory_efficient_variant().map(|(_, r)| r),
            None => None,
        };
        let recipe = variant.as_deref().unwrap_or(recipe);
        // As the plan's dry runs start: segments cached from before are released and the
        // allocator caches from what stays reserved, so its steps are the ones planned.
        gpu.empty_cache();
        let (model, optimizer) = crate::task::build_for_run(recipe, gpu, &config)?;
        let params = model.parameters();
        let position = RunPosition {
            step: 0,
            epoch: 0,
            sample_in_epoch: 0,
            // Dropout's masks follow the run's seed, not whatever this thread drew before
            // (a plan's dry runs, an earlier trainer): two runs of one seed drop alike.
            rng_state: config.seed ^ DROPOUT_STREAM,
            seed: config.seed,
            micro_batch,
            best_eval_loss: None,
            loss_scaler: (config.precision == crate::config::Precision::F16)
                .then(crate::scaler::LossScaler::default),
        };
        if let Some(p) = &plan {
            log.push(p.to_string());
        }
        log.extend(crate::training::placement::notes(
            &config,
            plan.as_ref(),
            &params,
            optimizer.as_ref(),
            segment_len,
        )?);
        crate::host::check_run_budget(
            &config,
            plan.as_ref().map_or(0, |p| p.offload_activation_bytes),
            &train,
            &params,
            model.as_ref(),
            optimizer.as_ref(),
            collective.ranks(),
        )?;
        let train: Arc<dyn Data> = Arc::new(train);
        let loader = Loader::new(
            Arc::clone(&train),
            config.seed,
            config.effective_batch,
            (collective.rank(), collective.ranks()),
            config.prefetch,
            config.fence_deadline.max(LOADER_DEADLINE),
        );
        Ok(Trainer {
            gpu: gpu.clone(),
            config,
            model,
            params,
            optimizer,
            loader,
            train,
            test,
            order: EpochOrder::Shuffled(Vec::new()),
            order_epoch: None,
            micro_batch,
            segment_len,
            plan,
            recipe: recipe.clone_recipe(),
            position,
            log,
            delivered_log: 0,
            recent_losses: VecDeque::with_capacity(LOSS_WINDOW),
            stop: Arc::new(AtomicBool::new(false)),
            last_saved: None,
            hooks: Hooks::default(),
            collective,
            agreed_stop: false,
            snapshot: None,
            snapshot_refused: false,
            losses_in_a_row: 0,
            device_losses: 0,
            reopen: crate::recovery::default_reopen(),
            run_budget: gpu.memory_budget_bytes(),
            driver_set: None,
            ahead: None,
            deferred: None,
            unconfirmed_update: None,
            last_completed: None,
            steps_begun_ahead: 0,
        })
    }

    /// Steps [`Trainer::run`] began (recorded forward, backward and update) before the step
    /// before them had completed: the device ran one while the host recorded the next. A run
    /// does so between steps after which nothing needs the model (no evaluation, checkpoint,
    /// snapshot, stop, profile or memory timeline), when the update is decided on the device
    /// ([`crate::step::device_decides`]).
    pub fn steps_begun_ahead(&self) -> u64 {
        self.steps_begun_ahead
    }

    /// The loader of the training batches (its depth, its host bytes).
    pub fn loader(&self) -> &Loader {
        &self.loader
    }

    /// This process's rank and the number of ranks (`(0, 1)` for one process).
    pub fn rank(&self) -> (usize, usize) {
        (self.collective.rank(), self.collective.ranks())
    }

    /// Every rank's `bytes` on rank 0, in rank order (an empty list elsewhere), within the
    /// [`START_DEADLINE`] (rank 0 may still be saving): what a data-parallel run gathers into
    /// rank 0's run directory.
    pub fn gather(&self, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        self.collective.gather(bytes, self.long_deadline())
    }

    /// The deadline of waits on other ranks that may include rank 0 writing files or every
    /// rank starting up: [`START_DEADLINE`] or the fence deadline, whichever is longer.
    fn long_deadline(&self) -> Duration {
        self.config.fence_deadline.max(START_DEADLINE)
    }

    pub(crate) fn note(&mut self, line: String) {
        self.log.push(line);
    }

    /// The hooks, and the context they are called with.
    fn hooks_and_context(&mut self) -> (&mut Hooks, HookContext<'_>) {
        let host = crate::timeline::HostBytes {
            loader: self.loader.host_bytes(),
            optimizer_state: self.plan.as_ref().map_or(0, |p| p.offload_host_bytes),
            activations: self.plan.as_ref().map_or(0, |p| p.offload_activation_bytes),
            parameters: self
                .plan
                .as_ref()
                .map_or(0, |p| p.offload_streamed_parameters.saturating_mul(8)),
        };
        let cx = HookContext::new(
            &self.gpu,
            &self.config,
            host,
            self.position.step,
            &mut self.log,
        );
        (&mut self.hooks, cx)
    }

    /// Calls `event` on each hook, in order.
    pub(crate) fn each_hook(
        &mut self,
        mut event: impl FnMut(&mut dyn StepHook, &mut HookContext<'_>),
    ) {
        let (hooks, mut cx) = self.hooks_and_context();
        for hook in hooks.each() {
            event(hook, &mut cx);
        }
    }

    /// Runs each hook's check after step `step`'s update; the first failure stops the step
    /// (after the state is saved, when the check itself failed: the update is in).
    pub(crate) fn check_step(&mut self, step: u64) -> Result<()> {
        let (hooks, mut cx) = self.hooks_and_context();
        let checked = hooks
            .each()
            .into_iter()
            .try_for_each(|hook| hook.check_step(&mut cx, step));
        let error = match checked {
            Ok(()) => return Ok(()),
            Err(CheckFailure::Device(error)) => {
                self.save_last_good(step, &error);
                error
            }
            Err(CheckFailure::Refused(error)) => error,
        };
        self.each_hook(|hook, cx| hook.step_failed(cx));
        Err(error)
    }

    /// Ends a memory timeline in progress (at the end of a run, or when a step gave up at
    /// `step`) and writes it into the checkpoint directory, if there is one; a file that cannot
    /// be written is a note, not an error. Returns the timeline, also kept for
    /// [`Trainer::timeline`].
    pub fn finish_timeline(&mut self, step: u64) -> Option<&Timeline> {
        let (hooks, mut cx) = self.hooks_and_context();
        hooks.timeline.finish_recording(&mut cx, step)
    }

    /// The last memory timeline recorded (see [`crate::TrainConfig::memory_timeline`]).
    pub fn timeline(&self) -> Option<&Timeline> {
        self.hooks.timeline.finished.as_ref()
    }

    /// The profiled steps so far (see [`crate::TrainConfig::profile_steps`]).
    pub fn profiled_steps(&self) -> &[ProfiledStep] {
        &self.hooks.profiling.steps
    }

    /// Logs what the allocator's planned steps did in `step` when it is news: a plan built, or an
    /// arena the budget refused.
    pub(crate) fn note_allocation(&mut self, step: u64, outcome: StepOutcome) {
        match outcome {
            StepOutcome::Planned {
                arena_bytes,
                max_live_bytes,
            } => self.note(format!(
                "step {step}: steps repeat; planned every allocation of the next ones from this \
                 step's lifetimes (new arena {}, at most {} live at once)",
                plimsoll_allocator::format_bytes(arena_bytes),
                plimsoll_allocator::format_bytes(max_live_bytes)
            )),
            StepOutcome::ArenaRefused { arena_bytes } => self.note(format!(
                "step {step}: a planned step needs an arena of {} that the memory budget does \
                 not allow; steps go on with best fit",
                plimsoll_allocator::format_bytes(arena_bytes)
            )),
            _ => {}
        }
    }

    /// The log lines so far (plan, recoveries, leaks, checkpoints): every line [`Trainer::run`]
    /// has not yet handed to its observer, and the last [`LOG_LINES_KEPT`] it has, so a long
    /// run's log does not grow with it.
    pub fn log(&self) -> &[String] {
        &self.log
    }

    /// The flag that stops [`Trainer::run`] cleanly after the current step (Ctrl-C sets it).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// The model's parameters (handles).
    pub fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// The model's buffers (handles): state that is not trained, such as BatchNorm's running
    /// statistics ([`crate::task::Model::buffers`]).
    pub fn buffers(&self) -> Vec<(String, Tensor)> {
        self.model.buffers()
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &dyn Optimizer {
        self.optimizer.as_ref()
    }

    /// The micro-batch in use.
    pub fn micro_batch(&self) -> usize {
        self.micro_batch
    }

    /// Children per checkpointed segment (0: none).
    pub fn segment_len(&self) -> usize {
        self.segment_len
    }

    /// The memory plan, if one was made.
    pub fn plan(&self) -> Option<&MemoryPlan> {
        self.plan.as_ref()
    }

    /// Where the run stands.
    pub fn position(&self) -> RunPosition {
        self.position
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Optimizer steps per epoch (the last batch of an epoch may be smaller).
    pub fn steps_per_epoch(&self) -> u64 {
        self.train.len().div_ceil(self.config.effective_batch) as u64
    }

    /// Steps of the whole run: the steps done and those left at the current effective batch
    /// (which a resumed run may have changed).
    pub fn total_steps(&self) -> u64 {
        match self.config.length {
            RunLength::Epochs(e) => {
                let p = &self.position;
                if p.epoch >= e {
                    return p.step;
                }
                let left_in_epoch = (self.train.len().saturating_sub(p.sample_in_epoch))
                    .div_ceil(self.config.effective_batch)
                    as u64;
                p.step + left_in_epoch + (e - p.epoch - 1) * self.steps_per_epoch()
            }
            RunLength::Steps(s) => s,
        }
    }

    /// Whether the run has reached its configured length.
    pub fn finished(&self) -> bool {
        match self.config.length {
            RunLength::Epochs(e) => self.position.epoch >= e,
            RunLength::Steps(s) => self.position.step >= s,
        }
    }

    fn deliver_log(&mut self, observer: &mut dyn Observer) {
        for line in &self.log[self.delivered_log..] {
            observer.on_log(line);
        }
        let delivered = self.log.len().saturating_sub(LOG_LINES_KEPT);
        self.log.drain(..delivered);
        self.delivered_log = self.log.len();
    }

    /// Runs to the configured length (or until the stop flag), evaluating and checkpointing as
    /// configured; the stop flag saves a checkpoint and returns with `interrupted`.
    pub fn run(&mut self, observer: &mut dyn Observer) -> Result<RunSummary> {
        let mut summary = RunSummary {
            steps: self.position.step,
            last_loss: None,
            last_evaluation: None,
            interrupted: false,
            checkpoint: None,
            best_eval_loss: self.position.best_eval_loss,
            device_losses: self.device_losses,
        };
        if let (Some(dir), Some(plan)) = (&self.config.checkpoint_dir, &self.plan)
            && let Err(e) = crate::report::write_plan(dir, plan)
        {
            self.log
                .push(format!("warning: the memory plan was not saved: {e}"));
        }
        self.deliver_log(observer);
        if self.collective.ranks() > 1 {
            // Ranks start at different times (compiling kernels, planning): the first step's
            // deadline starts once all are here.
            self.collective.wait_for_all(
                "waiting for every rank to be ready to train",
                self.long_deadline(),
            )?;
        }
        // A step begun ahead (see `attempt_step`) is always completed before the loop ends.
        while !self.finished() || self.ahead.is_some() {
            let stopping = match self.collective.ranks() {
                1 => self.stop.load(Ordering::SeqCst),
                _ => self.agreed_stop,
            };
            if stopping && self.ahead.is_none() {
                summary.interrupted = true;
                self.note(format!("interrupted after step {}", self.position.step));
                break;
            }
            let report = self.step_ahead(true);
            self.deliver_log(observer);
            let report = report?;
            observer.on_step(&report);
            summary.steps = report.step;
            summary.last_loss = Some(report.loss_mean);
            if self.ahead.is_some() {
                // The next step began ahead of this one's end: nothing was due after this one
                // (`may_run_ahead`), and the position is already the next step's.
                self.each_hook(|hook, cx| hook.after_evaluation(cx, report.step));
                self.deliver_log(observer);
                continue;
            }
            let epoch_done = self.position.sample_in_epoch == 0;
            let eval_due = crate::training::schedule::eval_due(
                self.config.eval_interval_steps,
                report.step,
                epoch_done,
                self.finished(),
            );
            let evaluation = match eval_due {
                true => self.with_recovery(Trainer::evaluate),
                false => Ok(None),
            };
            let evaluation = match evaluation {
                Ok(e) => e,
                Err(error) => {
                    // The model is the one after this step: keep it before giving up.
                    self.finish_timeline(report.step);
                    self.save_last_good(report.step, &error);
                    self.deliver_log(observer);
                    return Err(error);
                }
            };
            if let Some(evaluation) = evaluation {
                self.with_recovery(|t| t.keep_if_best(&evaluation))?;
                self.deliver_log(observer);
                observer.on_eval(report.epoch, report.step, &evaluation);
                summary.last_evaluation = Some(evaluation);
            }
            self.each_hook(|hook, cx| hook.after_evaluation(cx, report.step));
            // With several ranks, the others wait for this save (rank 0's) in the next step's
            // sum, within the fence deadline, so a dead rank is found as fast here as anywhere.
            if let Some(k) = self.config.checkpoint_interval_steps
                && report.step % k.max(1) == 0
            {
                summary.checkpoint = self.with_recovery(Trainer::save_checkpoint)?;
            }
            self.deliver_log(observer);
        }
        let last = self.position.step;
        self.each_hook(|hook, cx| hook.finish(cx, last));
        if let Some(path) = self.with_recovery(Trainer::save_checkpoint)? {
            summary.checkpoint = Some(path);
        }
        summary.best_eval_loss = self.position.best_eval_loss;
        summary.device_losses = self.device_losses;
        if let Some(dir) = self.config.checkpoint_dir.clone() {
            let path = dir.join(MODEL_FILE);
            self.with_recovery(|t| t.export_model(&path))?;
            self.note(format!(
                "exported the model for PyTorch to {}",
                path.display()
            ));
        }
        self.deliver_log(observer);
        Ok(summary)
    }
}
