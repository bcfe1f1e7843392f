//! A lost device is not a lost run. A driver reset, a watchdog (Windows' TDR after about 2 s of
//! one submission) or an out-of-memory the driver turns into a loss makes every later call on the
//! device fail with `DeviceLost`. The trainer then opens a new device ([`Gpu::reopen`], or what
//! [`Trainer::set_reopen`] gives), builds the model and the optimizer on it, restores the last
//! good state and runs the steps since that state again, on the same data (the data order is a
//! function of the seed and the position; dropout's masks of the random state in the position),
//! so the finished run equals an undisturbed one bit for bit.
//!
//! The last good state is a `HostSnapshot`: the parameters, the optimizer state and the
//! position read back into host memory before a step when [`TrainConfig::snapshot_every`] says
//! (by default when two minutes have passed since the last), and after every checkpoint saved
//! (the same bytes, read once). With snapshots off, the last checkpoint this trainer saved or
//! resumed from is read from disk instead. After [`TrainConfig::max_device_losses`] losses in a
//! row with no new step finished between them, the run stops with the loss as before.
//! Data-parallel runs do not recover (every rank would have to go back to the same step): a
//! lost device ends them, with the last checkpoint on disk.
//!
//! [`TrainConfig::snapshot_every`]: crate::TrainConfig::snapshot_every
//! [`TrainConfig::max_device_losses`]: crate::TrainConfig::max_device_losses

use std::collections::VecDeque;
use std::path::Path;
use std::time::Instant;

use plimsoll_autograd::Gpu;
use plimsoll_nn::state::LoadedState;

use crate::checkpoint_io::{self, LoadChecks, RunPosition};
use crate::config::{AllocatorMode, Precision, SnapshotEvery};
use crate::error::{Error, Result};
use crate::metrics::StepReport;
use crate::trainer::Trainer;

/// The training state kept in host memory for device-loss recovery (see the module docs).
pub(crate) struct HostSnapshot {
    /// What a checkpoint of this state holds ([`checkpoint_io::host_state`]).
    pub(crate) state: LoadedState,
    /// A second copy of the same tensors, which the next snapshot is read into before the two
    /// swap ([`checkpoint_io::refresh_host_state`]): a snapshot read only in part (a device lost
    /// while reading) leaves `state` whole, and a run that keeps snapshots allocates its host
    /// memory for them once, at the first, instead of a new copy every two minutes. `None`
    /// while it is being read into.
    pub(crate) spare: Option<LoadedState>,
    /// The step it holds.
    pub(crate) step: u64,
    /// The trainer's recent losses then, so the running mean goes on unchanged.
    pub(crate) recent_losses: VecDeque<f32>,
    /// The checkpointing and plan then (a new plan may have changed them since; the micro-batch
    /// is in the state's position): the steps run again as they ran. Children per checkpointed
    /// segment.
    pub(crate) segment_len: usize,
    /// The memory plan then.
    pub(crate) plan: Option<crate::plan::MemoryPlan>,
    /// When it was taken.
    pub(crate) taken: Instant,
}

/// Opens the device a run goes on with after its device was lost, given the lost one.
pub type Reopen = Box<dyn FnMut(&Gpu) -> plimsoll_kernels_wgsl::Result<Gpu>>;

/// The default [`Reopen`]: [`Gpu::reopen`].
pub(crate) fn default_reopen() -> Reopen {
    Box::new(|lost: &Gpu| lost.reopen())
}

impl Trainer {
    /// Sets how a new device is opened after this trainer's device was lost (by default
    /// [`Gpu::reopen`]: the same options, budget and deadlines). Tests and harnesses that lose
    /// the device on purpose use it.
    pub fn set_reopen(&mut self, reopen: Reopen) {
        self.reopen = reopen;
    }

    /// Device losses this run recovered from so far (see the module docs).
    pub fn device_losses(&self) -> u64 {
        self.device_losses
    }

    /// Whether this run keeps state to recover from a lost device at all.
    fn recovers(&self) -> bool {
        self.config.max_device_losses > 0 && self.collective.ranks() == 1
    }

    /// Whether host snapshots are kept (recovery on, snapshots not off).
    pub(crate) fn snapshots_kept(&self) -> bool {
        self.recovers() && self.config.snapshot_every != SnapshotEvery::Off
    }

    /// Whether [`Trainer::keep_snapshot_if_due`] would take a snapshot now.
    pub(crate) fn snapshot_due(&self) -> bool {
        if !self.snapshots_kept() {
            return false;
        }
        match (&self.snapshot, self.config.snapshot_every) {
            (_, SnapshotEvery::Off) => false,
            (None, _) => true,
            (Some(s), SnapshotEvery::Steps(n)) => {
                self.position.step >= s.step.saturating_add(n.max(1))
            }
            (Some(s), SnapshotEvery::Interval(every)) => {
                s.taken.elapsed() >= every && self.position.step > s.step
            }
        }
    }

    /// Keeps a [`HostSnapshot`] of the state now (before a step) when one is due: read into
    /// the last snapshot's spare copy, or, the first time, read and copied once (the host
    /// memory for both is checked then). A snapshot that cannot be taken is a note, not an
    /// error: the run goes on with the one it had (a device lost while reading is found by the
    /// step that follows).
    pub(crate) fn keep_snapshot_if_due(&mut self) {
        if !self.snapshot_due() {
            return;
        }
        let spare = self.snapshot.as_mut().and_then(|s| s.spare.take());
        let taken = match spare {
            Some(spare) => self.refresh_snapshot(spare),
            None => self.first_snapshot(),
        };
        match taken {
            Ok(()) => {}
            Err(e) if !self.snapshot_refused => {
                self.snapshot_refused = true;
                let line = format!(
                    "step {}: the training state was not kept in host memory ({}); a lost \
                     device goes on from {} (--snapshot-every)",
                    self.position.step + 1,
                    e.to_string().lines().next().unwrap_or_default(),
                    match &self.snapshot {
                        Some(s) => format!("the snapshot of step {}", s.step),
                        None => "the last checkpoint saved, if any".to_string(),
                    }
                );
                self.note(line);
            }
            Err(_) => {}
        }
    }

    /// The first snapshot of this trainer (or one after a refresh failed): the state read into
    /// new host memory, and a copy of it as the spare the next one is read into.
    fn first_snapshot(&mut self) -> Result<()> {
        let elements: u64 = self
            .params
            .iter()
            .map(|(_, t)| t.numel() as u64)
            .chain(self.optimizer.state().iter().map(|(_, t)| t.numel() as u64))
            .sum();
        crate::host::check(
            "a snapshot of the training state (two copies: the one kept and the one the next \
             is read into)",
            elements.saturating_mul(2),
            4,
        )?;
        let state = checkpoint_io::host_state(
            &self.saved_tensors(),
            self.optimizer.as_ref(),
            &self.position,
        )?;
        let spare = state.clone();
        self.keep_snapshot(state);
        if let Some(s) = self.snapshot.as_mut() {
            s.spare = Some(spare);
        }
        Ok(())
    }

    /// A snapshot read into `spare`, the last one's second copy, which then becomes the
    /// snapshot (and the last one the spare). A spare of other tensors is dropped and the
    /// snapshot taken as the first one is.
    fn refresh_snapshot(&mut self, mut spare: LoadedState) -> Result<()> {
        let same = checkpoint_io::refresh_host_state(
            &mut spare,
            &self.saved_tensors(),
            self.optimizer.as_ref(),
            &self.position,
        )?;
        if !same {
            drop(spare);
            return self.first_snapshot();
        }
        self.keep_snapshot(spare);
        Ok(())
    }

    /// Keeps `state` (of the current position) as the snapshot to recover from; the one it
    /// replaces becomes the spare the next snapshot is read into.
    pub(crate) fn keep_snapshot(&mut self, state: LoadedState) {
        let spare = self.snapshot.take().map(|s| s.state);
        self.snapshot = Some(HostSnapshot {
            state,
            spare,
            step: self.position.step,
            recent_losses: self.recent_losses.clone(),
            segment_len: self.segment_len,
            plan: self.plan.clone(),
            taken: Instant::now(),
        });
    }

    /// Whether `error` is a device loss this run can go on from.
    pub(crate) fn recoverable(&self, error: &Error) -> bool {
        error.is_device_lost() && self.recovers()
    }

    /// Goes on after `error`, a lost device: a new device, the last good state restored, the
    /// steps since replayed up to the position before the loss (see the module docs). Another
    /// loss while doing so starts again, up to the configured losses in a row. Returns the
    /// error to give up with when the run cannot go on.
    pub(crate) fn recover_device(
        &mut self,
        mut error: Error,
    ) -> std::result::Result<Option<StepReport>, Error> {
        let target = self.position.step;
        loop {
            self.losses_in_a_row += 1;
            let what = error
                .to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            let max = self.config.max_device_losses;
            if self.losses_in_a_row > max {
                self.note(format!(
                    "the device was lost {} times in a row without a new step finished (the \
                     most a run goes on from is {max}: --max-device-losses); the run stops",
                    self.losses_in_a_row
                ));
                return Err(error);
            }
            self.device_losses += 1;
            let (from, source) = match self.reopen_and_restore() {
                Ok(restored) => restored,
                Err(e) if self.recoverable(&e) => {
                    error = e;
                    continue;
                }
                Err(e) => {
                    self.note(format!(
                        "after step {target} the device was lost ({what}), and the run could \
                         not go on on a new one: {}",
                        e.to_string().lines().next().unwrap_or_default()
                    ));
                    return Err(e);
                }
            };
            let again = match from < target {
                true => format!("; running steps {}..={target} again", from + 1),
                false => String::new(),
            };
            self.note(format!(
                "after step {target} the device was lost ({what}); going on with a new device \
                 ({}) from step {from} ({source}){again} (device loss {} in a row of at most \
                 {max})",
                self.gpu.adapter().name,
                self.losses_in_a_row,
            ));
            let mut failed = None;
            let mut last = None;
            while self.position.step < target {
                match self.attempt_step(false) {
                    Ok(report) => last = Some(report),
                    Err(f) => {
                        failed = Some(f.into_error());
                        break;
                    }
                }
            }
            match failed {
                None => return Ok(last),
                Some(e) if self.recoverable(&e) => error = e,
                Some(e) => return Err(e),
            }
        }
    }

    /// Runs `op`, going on after a lost device ([`Trainer::recover_device`]) and running it
    /// again: what an evaluation or a save between steps does.
    pub(crate) fn with_recovery<T>(
        &mut self,
        mut op: impl FnMut(&mut Trainer) -> Result<T>,
    ) -> Result<T> {
        loop {
            match op(self) {
                Err(e) if self.recoverable(&e) => {
                    self.recover_device(e)?;
                }
                done => return done,
            }
        }
    }

    /// A new device with the model and optimizer built on it and the last good state restored:
    /// the step restored and where it came from.
    fn reopen_and_restore(&mut self) -> Result<(u64, String)> {
        let gpu = (self.reopen)(&self.gpu)?;
        gpu.set_default_deadline(self.config.fence_deadline);
        let planned = self.config.allocator == AllocatorMode::Planned;
        gpu.with_allocator(|a| a.set_step_planning(planned));
        let (model, mut optimizer) =
            crate::task::build_for_run(self.recipe.as_ref(), &gpu, &self.config)?;
        // The parameters and the buffers, as a checkpoint holds them.
        let mut params = model.parameters();
        params.extend(model.buffers());
        let checks = LoadChecks {
            expected_seed: Some(self.config.seed),
            reset_optimizer: false,
        };
        let (mut position, source, kept) = match (&self.snapshot, &self.last_saved) {
            (Some(s), _) => {
                let origin = Path::new("the training state kept in host memory");
                let p = checkpoint_io::restore(
                    &gpu,
                    &s.state,
                    origin,
                    &params,
                    optimizer.as_mut(),
                    checks,
                )?;
                (
                    p,
                    "kept in host memory".to_string(),
                    Some((s.recent_losses.clone(), s.segment_len, s.plan.clone())),
                )
            }
            (None, Some((_, path))) => {
                let p = checkpoint_io::load(&gpu, path, &params, optimizer.as_mut(), checks)?;
                (p, format!("the checkpoint {}", path.display()), None)
            }
            (None, None) => {
                return Err(Error::invalid(
                    "device-loss recovery",
                    "no training state was kept in host memory (--snapshot-every off) and no \
                     checkpoint was saved; give --snapshot-every a number of steps",
                ));
            }
        };
        self.install(gpu, model, optimizer, &mut position);
        match kept {
            Some((losses, segment_len, plan)) => {
                self.recent_losses = losses;
                self.segment_len = segment_len;
                self.plan = plan;
            }
            // A checkpoint has no running losses: the mean starts again, as a resumed run's.
            None => self.recent_losses.clear(),
        }
        // The optimizer state came before the first step again, as in a resume.
        self.plan_resumed()?;
        Ok((position.step, source))
    }

    /// Makes `gpu`, `model` and `optimizer` (holding `position`'s state) the trainer's.
    fn install(
        &mut self,
        gpu: Gpu,
        model: Box<dyn crate::task::Model>,
        optimizer: Box<dyn plimsoll_nn::Optimizer>,
        position: &mut RunPosition,
    ) {
        // The micro-batch the state was kept with (out-of-memory recovery may have lowered it
        // below the configured one): the steps run again as they ran.
        self.micro_batch = position.micro_batch.clamp(1, self.config.effective_batch);
        position.micro_batch = self.micro_batch;
        position.loss_scaler = match self.config.precision {
            Precision::F16 => Some(position.loss_scaler.unwrap_or_default()),
            Precision::F32 => None,
        };
        // The lowest evaluation loss only falls: the evaluations since the state are not run
        // again, and best.safetensors holds theirs.
        position.best_eval_loss = match (position.best_eval_loss, self.position.best_eval_loss) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.params = model.parameters();
        self.model = model;
        self.optimizer = optimizer;
        self.gpu = gpu;
        self.position = *position;
        self.order_epoch = None;
    }
}
