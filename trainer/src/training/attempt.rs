//! A trainer's step: [`Trainer::step`] and its attempts, each a step begun
//! ([`Trainer::begin_step`]: recorded, the position moved on) and completed
//! ([`Trainer::complete_step`]: its read-back, its report), and, in [`Trainer::run`], the next
//! step begun before this one completes where nothing between them needs the model
//! ([`Trainer::may_run_ahead`]). The f16 loss scaler moves on here too.

use std::sync::atomic::Ordering;
use std::time::Instant;

use plimsoll_autograd::grad_mode::{rng_state, set_rng_state};

use crate::checkpoint_io::RunPosition;
use crate::collective::shard;
use crate::data::EpochOrder;
use crate::error::{Error, Result};
use crate::metrics::{PhasePeak, StepReport};
use crate::scaler::{GROWTH_INTERVAL, ScaleChange};
use crate::step::{Recorded, StepInputs, record_step};
use crate::trainer::{Failure, LOSS_WINDOW, Trainer};

/// A step begun ([`Trainer::begin_step`]): recorded, the position moved on, its read-back
/// (and so its report) still to come ([`Trainer::complete_step`]).
pub(crate) struct Begun {
    step: u64,
    epoch: u64,
    lr: f32,
    loss_scale: Option<f32>,
    ranks: usize,
    start: Instant,
    data_wait_ms: f64,
    /// The allocator's statistics once the step was recorded.
    stats: plimsoll_allocator::Stats,
    /// A pending f16 step after which the loss scale grew (from, to), if no overflow.
    grew_from: Option<(f32, f32)>,
    /// The position, micro-batch and agreed stop before the step, put back if it fails.
    before: (RunPosition, usize, bool),
    recorded: Recorded,
}

impl Trainer {
    /// Runs one optimizer step on the next batch; see the module docs for what it guarantees.
    /// A lost device is replaced and the step run on the new one ([`crate::recovery`]).
    pub fn step(&mut self) -> Result<StepReport> {
        self.step_ahead(false)
    }

    /// [`Trainer::step`]; with `ahead`, the step after it may begin before this one completes
    /// ([`Trainer::attempt_step`]), and the next call completes it.
    pub(crate) fn step_ahead(&mut self, ahead: bool) -> Result<StepReport> {
        if self.ahead.is_none() {
            // With a step begun ahead, the snapshot waits for the next step boundary.
            self.keep_snapshot_if_due();
        }
        let losses_before = self.device_losses;
        loop {
            let failure = match self.attempt_step(ahead) {
                Ok(mut report) => {
                    self.losses_in_a_row = 0;
                    report.device_losses = self.device_losses - losses_before;
                    return Ok(report);
                }
                Err(f) => f,
            };
            match failure {
                Failure::Step(step, error) if self.recoverable(&error) => {
                    if let Err(e) = self.recover_device(error) {
                        return Err(self.give_up(step, e));
                    }
                }
                Failure::Step(step, error) => return Err(self.give_up(step, error)),
                // The update is in and the position moved on: recovery runs this step again
                // and its report is the step's.
                Failure::Checked(error) if self.recoverable(&error) => {
                    return match self.recover_device(error) {
                        Ok(Some(mut report)) => {
                            self.losses_in_a_row = 0;
                            report.device_losses = self.device_losses - losses_before;
                            Ok(report)
                        }
                        Ok(None) => Err(Error::invalid(
                            "device-loss recovery",
                            "the state restored was the one after this step; nothing ran again",
                        )),
                        Err(e) => Err(e),
                    };
                }
                Failure::Before(error) | Failure::Checked(error) => return Err(error),
            }
        }
    }

    /// One attempt at the next step (see [`Trainer::step`]): the step begun (unless it already
    /// was, ahead), with `ahead` the step after it too when [`Trainer::may_run_ahead`] allows,
    /// then this step completed.
    pub(crate) fn attempt_step(&mut self, ahead: bool) -> std::result::Result<StepReport, Failure> {
        self.state_known().map_err(Failure::Before)?;
        if let Some(failure) = self.deferred.take() {
            return Err(failure);
        }
        let begun = match self.ahead.take() {
            Some(begun) => begun,
            None => self.begin_step()?,
        };
        if ahead && begun.recorded.is_pending() && self.may_run_ahead(begun.step) {
            // Step k+1's forward, backward and update are recorded while the device runs
            // step k's; step k's read-back is waited for after.
            match self.begin_step() {
                Ok(next) => {
                    self.steps_begun_ahead += 1;
                    if self.steps_begun_ahead == 1 {
                        self.note(format!(
                            "from step {} on, each step is recorded while the device still runs \
                             the one before it, where nothing between them needs the model (the \
                             update is decided on the device: clipping and the non-finite check \
                             need no wait)",
                            next.step
                        ));
                    }
                    self.ahead = Some(next);
                }
                // Step k+1's failure is the next attempt's; step k completes first.
                Err(failure) => self.deferred = Some(failure),
            }
        }
        self.complete_step(begun)
    }

    /// Refuses to go on from a state that may or may not hold an update
    /// ([`Trainer::unconfirmed_update`]): the next step, a checkpoint and an export would each
    /// take it for the state before that update.
    pub(crate) fn state_known(&self) -> Result<()> {
        match self.unconfirmed_update {
            None => Ok(()),
            Some(step) => Err(Error::invalid(
                "training state",
                format!(
                    "step {step}'s update was recorded before its read-back timed out, so whether \
                     the model holds it is not known; go on from the last checkpoint on disk \
                     (--resume) with a new device"
                ),
            )),
        }
    }

    /// Whether step `step + 1` may begin before step `step` completes: nothing between them
    /// needs the model or step `step`'s results (the run goes on, no evaluation, checkpoint,
    /// snapshot or stop is due after it), and no profile or memory timeline records either.
    fn may_run_ahead(&self, step: u64) -> bool {
        let epoch_done = self.position.sample_in_epoch == 0;
        let finished = self.finished();
        let eval = crate::training::schedule::eval_due(
            self.config.eval_interval_steps,
            step,
            epoch_done,
            finished,
        );
        let checkpoint = self
            .config
            .checkpoint_interval_steps
            .is_some_and(|k| step.is_multiple_of(k.max(1)));
        let observed = |span: Option<crate::StepSpan>| {
            span.is_some_and(|s| s.contains(step) || s.contains(step + 1))
        };
        !(finished
            || eval
            || checkpoint
            || self.stop.load(Ordering::SeqCst)
            || self.snapshot_due()
            || observed(self.config.profile_steps)
            || observed(self.config.memory_timeline))
    }

    /// Begins the next step: its batch, then [`crate::step::record_step`] (forward, backward
    /// and the update recorded), then everything that does not need its read-back: the
    /// position moves on and the after-step checks run. [`Trainer::complete_step`] finishes it.
    pub(crate) fn begin_step(&mut self) -> std::result::Result<Begun, Failure> {
        let start = Instant::now();
        self.follow_budget(self.position.step + 1)
            .map_err(Failure::Before)?;
        let effective = self.config.effective_batch;
        if self.order_epoch != Some(self.position.epoch) {
            self.order = EpochOrder::new(self.train.len(), self.config.seed, self.position.epoch);
            self.order_epoch = Some(self.position.epoch);
        }
        let first = self.position.sample_in_epoch;
        let taken = effective.min(self.order.len().saturating_sub(first));
        crate::host::check("the step's sample indices", taken as u64, 8)
            .map_err(Failure::Before)?;
        let indices = self.order.range(first, effective);
        if indices.is_empty() {
            return Err(Failure::Before(Error::invalid(
                "data position",
                format!("no batch at sample {first} of {}", self.order.len()),
            )));
        }
        let indices = indices.as_slice();
        let ranks = self.collective.ranks();
        let mine = shard(indices, self.collective.rank(), ranks);
        let step = self.position.step + 1;
        let taken = match self.loader.take((self.position.epoch, first), mine) {
            Ok(t) => t,
            Err(e) => return Err(Failure::Step(step, e)),
        };
        let lr = self.config.schedule.lr_at(self.position.step);
        set_rng_state(self.position.rng_state);
        self.each_hook(|hook, cx| hook.before_step(cx, step));
        self.gpu.with_allocator(|a| {
            // With a plan installed, segments an evaluation left empty are released before the
            // step's peaks start (the plan has room for the whole step; its own are pinned).
            if a.step_plan_stats().planned_requests > 0 {
                a.empty_cache();
            }
            a.reset_peaks();
        });
        let inputs = StepInputs {
            gpu: &self.gpu,
            model: self.model.as_ref(),
            params: &self.params,
            data: self.train.as_ref(),
            host: taken.batch.as_ref(),
            segment_len: self.segment_len,
            label_smoothing: self.config.label_smoothing,
            clip_grad_norm: self.config.clip_grad_norm,
            step,
            batch_len: indices.len(),
            collective: (ranks > 1).then_some(self.collective.as_ref()),
            stop: self.stop.load(Ordering::SeqCst),
            precision: self.config.precision,
            loss_scale: self.position.loss_scaler.map_or(1.0, |s| s.scale),
            shard: self.config.shard,
            offload_activations: self.config.offload.activations_on_host(),
        };
        let recorded = record_step(&inputs, self.optimizer.as_mut(), mine, self.micro_batch, lr);
        let recorded = match recorded {
            Ok(r) => r,
            Err(e) => {
                self.each_hook(|hook, cx| hook.step_failed(cx));
                return Err(Failure::Step(step, e));
            }
        };
        let known = recorded.known();
        for line in &known.recoveries {
            self.log.push(line.clone());
        }
        let loss_scale = self.position.loss_scaler.map(|s| s.scale);
        let before = (self.position, self.micro_batch, self.agreed_stop);
        // A pending f16 step's overflow comes with its read-back: until then the scaler moves
        // on as after a step without one, silently (`complete_step` logs a growth once the
        // read-back confirms it, or puts the scaler back and backs off).
        let mut grew_from = None;
        match (recorded.is_pending(), self.position.loss_scaler.as_mut()) {
            (true, Some(scaler)) => {
                let from = scaler.scale;
                if scaler.update(false) == ScaleChange::Grew {
                    grew_from = Some((from, scaler.scale));
                }
            }
            _ => {
                if let Err(e) = self.update_loss_scale(step, known.overflow.as_deref()) {
                    self.each_hook(|hook, cx| hook.step_failed(cx));
                    return Err(Failure::Step(step, e));
                }
            }
        }
        // Some rank was asked to stop: every rank stops after this same step.
        self.agreed_stop = known.stop;
        self.note_allocation(step, known.allocation);
        self.micro_batch = known.micro_batch;
        let epoch = self.position.epoch;
        self.position.step = step;
        self.position.sample_in_epoch += indices.len();
        if self.position.sample_in_epoch >= self.train.len() {
            self.position.epoch += 1;
            self.position.sample_in_epoch = 0;
        }
        self.position.rng_state = rng_state();
        self.position.micro_batch = self.micro_batch;
        if let Err(error) = self.check_step(step) {
            // The update is in; a pending one counts only if its read-back says so (else it
            // was skipped on the device, and the step is refused as it would have been).
            if let Err(e) = recorded.finish(self.optimizer.as_mut()) {
                (self.position, self.micro_batch, self.agreed_stop) = before;
                return Err(Failure::Step(step, e));
            }
            return Err(Failure::Checked(error));
        }
        // The memory figures of this step, before another begins.
        let stats = self.gpu.with_allocator(|a| a.stats().clone());
        Ok(Begun {
            grew_from,
            stats,
            step,
            epoch,
            lr,
            loss_scale,
            ranks,
            start,
            data_wait_ms: taken.wait.as_secs_f64() * 1e3,
            before,
            recorded,
        })
    }

    /// Completes a begun step: its read-back (waited for when it is still on its way), then its
    /// report. A step whose read-back fails or refuses it (a loss or gradient not finite) puts
    /// the position back to before it and drops the step begun after it, whose update the
    /// device skipped too ([`crate::step::Recorded::finish`]).
    pub(crate) fn complete_step(
        &mut self,
        begun: Begun,
    ) -> std::result::Result<StepReport, Failure> {
        let step = begun.step;
        let pending = begun.recorded.is_pending();
        let result = match begun.recorded.finish(self.optimizer.as_mut()) {
            Ok(result) => result,
            Err(e) => {
                if let Some(ahead) = self.ahead.take() {
                    drop(ahead);
                    self.each_hook(|hook, cx| hook.step_failed(cx));
                }
                self.deferred = None;
                (self.position, self.micro_batch, self.agreed_stop) = begun.before;
                if e.is_timeout() {
                    // The update was recorded before the read-back that timed out: whether
                    // the device ran it is not known, so no state is saved as this step's
                    // predecessor.
                    self.unconfirmed_update = Some(step);
                }
                self.each_hook(|hook, cx| hook.step_failed(cx));
                return Err(Failure::Step(step, e));
            }
        };
        self.unconfirmed_update = None;
        if pending && result.overflow.is_some() {
            // GradScaler's skipped step, found in the read-back. The step begun after it ran
            // with the scale the overflow changes, and the device skipped its update too: it
            // runs again from the position after this step.
            if let Some(ahead) = self.ahead.take() {
                (self.position, self.micro_batch, self.agreed_stop) = ahead.before;
                drop(ahead);
                self.each_hook(|hook, cx| hook.step_failed(cx));
            }
            self.deferred = None;
            self.position.loss_scaler = begun.before.0.loss_scaler;
            if let Err(e) = self.update_loss_scale(step, result.overflow.as_deref()) {
                (self.position, self.micro_batch, self.agreed_stop) = begun.before;
                self.each_hook(|hook, cx| hook.step_failed(cx));
                return Err(Failure::Step(step, e));
            }
        } else if let Some((from, to)) = begun.grew_from {
            self.note_growth(step, from, to);
        }
        let stats = begun.stats;
        // Ahead of time, step k+1 began before step k completed: a step's time runs from the
        // previous step's end (the rate steps finish at), or its own start when later.
        let start = match self.last_completed {
            Some(end) if end > begun.start => end,
            _ => begun.start,
        };
        let now = Instant::now();
        self.last_completed = Some(now);
        let step_ms = now.duration_since(start).as_secs_f64() * 1e3;
        self.each_hook(|hook, cx| hook.after_step(cx, step, step_ms));
        if self.recent_losses.len() == LOSS_WINDOW {
            self.recent_losses.pop_front();
        }
        self.recent_losses.push_back(result.loss);
        let loss_mean = self.recent_losses.iter().sum::<f32>() / self.recent_losses.len() as f32;
        Ok(StepReport {
            step,
            epoch: begun.epoch,
            loss: result.loss,
            loss_mean,
            lr: begun.lr,
            grad_norm: result.grad_norm,
            loss_scale: begun.loss_scale,
            skipped: result.overflow.is_some(),
            samples: result.samples,
            micro_batch: result.micro_batch,
            micro_batches: result.micro_batches,
            step_ms,
            samples_per_s: result.samples as f64 / (step_ms / 1e3).max(1e-9),
            allocated_bytes: stats.allocated_bytes,
            reserved_bytes: stats.reserved_bytes,
            peak_allocated_bytes: stats.peak_allocated_bytes,
            peak_reserved_bytes: stats.peak_reserved_bytes,
            fragmentation: stats.fragmentation,
            ranks: begun.ranks,
            allreduce_bytes: result.allreduce_bytes,
            allreduce_ms: result.allreduce_ms,
            data_wait_ms: begun.data_wait_ms,
            phases: PhasePeak::of(&stats),
            device_losses: 0,
            host_heap: crate::host_memory::heap(),
            resident_bytes: crate::host_memory::resident_bytes(),
        })
    }

    /// Moves the loss scaler on after step `step` (whose gradients overflowed when
    /// `overflow` names the first parameter): a skipped step is logged; an overflow at scale 1
    /// is [`Error::LossScaleExhausted`]. Nothing to do in f32.
    fn update_loss_scale(&mut self, step: u64, overflow: Option<&str>) -> Result<()> {
        let Some(scaler) = self.position.loss_scaler.as_mut() else {
            return Ok(());
        };
        let from = scaler.scale;
        let line = match scaler.update(overflow.is_some()) {
            ScaleChange::Kept => return Ok(()),
            ScaleChange::Exhausted => {
                return Err(Error::LossScaleExhausted {
                    step,
                    first_parameter: overflow.filter(|p| !p.is_empty()).map(str::to_string),
                    skipped: scaler.skipped_steps,
                });
            }
            ScaleChange::Skipped => format!(
                "step {step}: {} at loss scale {from}; update skipped, loss scale now {} ({} \
                 skipped so far)",
                match overflow {
                    Some(p) if !p.is_empty() => format!("gradients overflowed (first: {p})"),
                    _ => "the loss was not finite".to_string(),
                },
                scaler.scale,
                scaler.skipped_steps
            ),
            ScaleChange::Grew => {
                let to = scaler.scale;
                self.note_growth(step, from, to);
                return Ok(());
            }
        };
        self.gpu.with_allocator(|a| a.mark(&line));
        self.log.push(line);
        Ok(())
    }

    /// Logs the loss scale's growth after step `step` from `from` to `to`.
    fn note_growth(&mut self, step: u64, from: f32, to: f32) {
        let line = format!(
            "step {step}: {GROWTH_INTERVAL} steps without overflow; loss scale {from} -> {to}"
        );
        self.gpu.with_allocator(|a| a.mark(&line));
        self.log.push(line);
    }
}
