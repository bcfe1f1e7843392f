//! The trainer's files: resuming from a checkpoint, saving one (`latest` and `best`), and
//! exporting the model for PyTorch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::checkpoint_io;
use crate::config::{CheckpointPolicy, Precision, TrainConfig};
use plimsoll_kernels_wgsl::Error as KernelError;
use plimsoll_nn::state::LoadedState;

use crate::error::{Error, Result};
use crate::task::Evaluation;
use crate::trainer::Trainer;

impl Trainer {
    /// Continues from the checkpoint at `path` (parameters, optimizer state, position). A
    /// checkpoint that does not fit (another model, another data seed, non-finite values, no
    /// optimizer state) is an error that leaves the trainer as it was.
    pub fn resume(&mut self, path: &Path) -> Result<()> {
        self.resume_with(path, false)
    }

    /// [`Trainer::resume`]; with `reset_optimizer`, the optimizer's saved state is not loaded
    /// (and a checkpoint without one is accepted): it starts afresh. A micro-batch given in the
    /// configuration wins over the checkpoint's; otherwise the checkpoint's (which out-of-memory
    /// recovery may have lowered) is kept.
    pub fn resume_with(&mut self, path: &Path, reset_optimizer: bool) -> Result<()> {
        let checks = checkpoint_io::LoadChecks {
            expected_seed: Some(self.config.seed),
            reset_optimizer,
        };
        let mut position = checkpoint_io::load(
            &self.gpu,
            path,
            &self.saved_tensors(),
            self.optimizer.as_mut(),
            checks,
        )?;
        let micro_batch = self.config.micro_batch.unwrap_or(position.micro_batch);
        // This rank's largest shard of a batch: a run saved on fewer ranks may have used a
        // larger micro-batch than a rank now has samples.
        let largest =
            crate::collective::largest_shard(self.config.effective_batch, self.collective.ranks());
        self.micro_batch = micro_batch.clamp(1, largest);
        position.micro_batch = self.micro_batch;
        // An f16 run goes on with the saved loss scale (a checkpoint of an f32 run has none:
        // the scaler starts afresh); an f32 run scales nothing.
        position.loss_scaler = match self.config.precision {
            Precision::F16 => Some(position.loss_scaler.unwrap_or_default()),
            Precision::F32 => None,
        };
        self.position = position;
        self.last_saved = Some((position.step, path.to_path_buf()));
        self.plan_resumed()?;
        let scale = match position.loss_scaler {
            Some(s) => format!(", loss scale {}", s.scale),
            None => String::new(),
        };
        self.note(format!(
            "resumed from {} at step {}{scale}{}",
            path.display(),
            position.step,
            if reset_optimizer {
                " with a fresh optimizer (--reset-optimizer)"
            } else {
                ""
            }
        ));
        Ok(())
    }

    /// After a resume (or a lost device's restore) loaded optimizer state, plans again where the
    /// run plans: a new run's plan creates that state in step 1's update, while a resume
    /// allocated it before step 1 (each entry uploaded, then copied), which leaves the allocator
    /// another layout, and so other peaks. The dry runs now load it as the resume did
    /// from where the run goes on ([`crate::TrainConfig::resumed_at`]): the run's micro-batch and
    /// checkpointing first (a model that is not micro-batch invariant goes on as it trained),
    /// then, when they no longer fit, the whole search. When nothing fits, the run keeps its
    /// choice and says so (out-of-memory recovery halves the micro-batch where a step needs it).
    pub(crate) fn plan_resumed(&mut self) -> Result<()> {
        let Some(was) = &self.plan else {
            return Ok(());
        };
        if !self.config.needs_plan() || self.optimizer.step_count() == 0 {
            return Ok(());
        }
        let was_peak = was.predicted_peak_reserved_bytes;
        let mut per_rank = self.config.clone();
        per_rank.effective_batch =
            crate::collective::largest_shard(self.config.effective_batch, self.collective.ranks());
        per_rank.resumed_at = Some(crate::config::ResumePoint {
            step: self.position.step,
            epoch: self.position.epoch,
            sample_in_epoch: self.position.sample_in_epoch,
        });
        let replan = |config: &TrainConfig| {
            crate::plan::replan(
                &self.gpu,
                self.recipe.as_ref(),
                self.train.as_ref(),
                self.test.as_deref(),
                config,
            )
        };
        let same = TrainConfig {
            micro_batch: Some(self.micro_batch),
            checkpointing: match self.segment_len {
                0 => CheckpointPolicy::None,
                k => CheckpointPolicy::EveryBlocks(k),
            },
            ..per_rank.clone()
        };
        let replanned = match replan(&same) {
            Ok(kept) => Ok(kept),
            Err(Error::BudgetTooSmall { .. } | Error::TensorTooLarge { .. }) => replan(&per_rank),
            Err(e) => Err(e),
        };
        match replanned {
            Ok(new) => {
                let fmt = plimsoll_allocator::format_bytes;
                let line = match new.micro_batch == self.micro_batch
                    && new.segment_len == self.segment_len
                {
                    true => format!(
                        "planned again for the resumed optimizer state (loaded before step 1): \
                         the run's choice still fits, predicted peak {} reserved (was {})",
                        fmt(new.predicted_peak_reserved_bytes),
                        fmt(was_peak)
                    ),
                    false => format!(
                        "planned again for the resumed optimizer state (loaded before step 1): \
                         the run's choice no longer fits\n{new}"
                    ),
                };
                self.note(line);
                self.micro_batch = new.micro_batch;
                self.segment_len = new.segment_len;
                self.position.micro_batch = new.micro_batch;
                self.plan = Some(new);
            }
            Err(Error::BudgetTooSmall { .. } | Error::TensorTooLarge { .. }) => self.note(
                "planned again for the resumed optimizer state (loaded before step 1): nothing \
                 fits the budget now; the run keeps its choice (out-of-memory recovery halves \
                 the micro-batch where a step needs it)"
                    .to_string(),
            ),
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Whether the optimizer keeps one rank's rows of the state (`--shard` on several ranks):
    /// a checkpoint then gathers every rank's ([`crate::zero::gathered_state`]).
    fn sharded(&self) -> bool {
        self.optimizer.row_shard().is_some() && self.collective.ranks() > 1
    }

    /// The state a checkpoint holds. A sharded run gathers every rank's rows of the optimizer
    /// state first (every rank calls this at the same point of the run); rank 0 gets the
    /// state, the others `None`.
    fn checkpoint_state(&self) -> Result<Option<LoadedState>> {
        let params = self.saved_tensors();
        if !self.sharded() {
            let state =
                checkpoint_io::host_state(&params, self.optimizer.as_ref(), &self.position)?;
            return Ok(Some(state));
        }
        let deadline = self.config.save_deadline.max(self.config.fence_deadline);
        let gathered = crate::zero::gathered_state(
            self.optimizer.as_ref(),
            self.collective.as_ref(),
            deadline,
        )?;
        gathered
            .map(|host| {
                checkpoint_io::host_state_with(
                    &params,
                    self.optimizer.as_ref(),
                    host,
                    &self.position,
                )
            })
            .transpose()
    }

    /// Saves a checkpoint of the current state if a checkpoint directory is configured (a
    /// sharded run's other ranks send their rows of the optimizer state to rank 0, which saves).
    pub fn save_checkpoint(&mut self) -> Result<Option<PathBuf>> {
        self.state_known()?;
        if self.config.checkpoint_dir.is_none() && !self.sharded() {
            return Ok(None);
        }
        let state = self.checkpoint_state()?;
        let (Some(dir), Some(state)) = (self.config.checkpoint_dir.clone(), state) else {
            return Ok(None);
        };
        let path =
            checkpoint_io::save_host(&dir, checkpoint_io::LATEST, &state, self.position.step)?;
        // The same bytes are the state a lost device goes on from.
        if self.snapshots_kept() {
            self.keep_snapshot(state);
        }
        self.note(format!(
            "saved checkpoint at step {} to {}",
            self.position.step,
            path.display()
        ));
        self.last_saved = Some((self.position.step, path.clone()));
        Ok(Some(path))
    }

    /// Where the last good state is on disk, for a message: the step the last checkpoint this
    /// trainer saved (or resumed from) holds, or that there is none.
    fn on_disk(&self) -> String {
        match &self.last_saved {
            Some((step, path)) => {
                format!("the checkpoint at {} holds step {step}", path.display())
            }
            None => "no checkpoint was saved or resumed by this trainer".to_string(),
        }
    }

    /// Saves the trainer's state, which is the last good state (`good_step`) because an update
    /// is all or nothing, before giving up on `error`. The save waits for the GPU at most the
    /// fence deadline (so giving up takes at most twice the deadline; after a timeout, dropping
    /// the device waits for stalled work at most one deadline more); when the device is lost
    /// or the save fails, the log says so and which step the checkpoint on disk holds. Without
    /// a checkpoint directory it does nothing.
    pub(crate) fn save_last_good(&mut self, good_step: u64, error: &Error) -> Option<PathBuf> {
        self.config.checkpoint_dir.as_ref()?;
        let deadline = self.gpu.default_deadline();
        let limit = self.config.save_deadline.min(self.config.fence_deadline);
        if error.is_timeout() {
            // The GPU is stalled: dropping the device waits for it at most one deadline more.
            let drop = self.gpu.drop_deadline().min(self.config.fence_deadline);
            self.gpu.set_drop_deadline(drop);
        }
        if self.sharded() {
            // The other ranks hold the rest of the optimizer state, and one of them (or this
            // one) failed: the last checkpoint they saved together is the last good state.
            let line = format!(
                "the optimizer state is divided among the ranks (--shard), so this rank alone \
                 cannot save it; {}",
                self.on_disk()
            );
            self.note(line);
            return None;
        }
        if let Some(step) = self.unconfirmed_update {
            let line = format!(
                "step {step}'s update was recorded before its read-back timed out, so the state \
                 on the device may or may not include it; it is not saved as step {good_step}'s; {}",
                self.on_disk()
            );
            self.note(line);
            return None;
        }
        if good_step == 0 && self.last_saved.is_none() {
            self.note(
                "nothing to save: no step had finished (the model was as the seed made it)"
                    .to_string(),
            );
            return None;
        }
        if let Some((saved, path)) = &self.last_saved
            && *saved > self.position.step
        {
            // A state that went back to an earlier step (a device-loss recovery that failed)
            // never replaces a later one on disk.
            let line = format!(
                "the state now (step {}) is older than the checkpoint at {} (step {saved}); \
                 that checkpoint is kept",
                self.position.step,
                path.display()
            );
            self.note(line);
            return None;
        }
        let lost = matches!(error.kernel_error(), Some(KernelError::DeviceLost { .. }))
            || self.gpu.check_alive().is_err();
        if lost {
            let line = format!(
                "the device is lost, so the last good state (step {good_step}) cannot be read; \
                 {}",
                self.on_disk()
            );
            self.note(line);
            return None;
        }
        self.gpu.set_default_deadline(limit);
        let saved = self.save_checkpoint();
        self.gpu.set_default_deadline(deadline);
        match saved {
            Ok(path) => path,
            Err(e) => {
                let line = format!(
                    "could not save the last good state (step {good_step}): {}; {}",
                    e.to_string().lines().next().unwrap_or_default(),
                    self.on_disk()
                );
                self.note(line);
                None
            }
        }
    }

    /// Gives up on `step` with `error` after [`Trainer::save_last_good`] (the state before the
    /// step). A timeout becomes [`Error::StepTimeout`], naming where the state went; other
    /// errors are returned as they are (the log names the checkpoint).
    pub(crate) fn give_up(&mut self, step: u64, mut error: Error) -> Error {
        // The timeline of a failing step is the one worth having (it shows the out-of-memory).
        self.each_hook(|hook, cx| hook.finish(cx, step));
        let saved = self.save_last_good(step.saturating_sub(1), &error);
        if let Error::RanksUnresponsive(u) = &mut error {
            u.saved.clone_from(&saved);
            return error;
        }
        if error.is_timeout() {
            return Error::StepTimeout {
                step,
                deadline_ms: self.gpu.default_deadline().as_millis() as u64,
                saved,
                source: Box::new(error),
            };
        }
        error
    }

    /// Writes the model alone to `path` for PyTorch: the [`crate::task::Model::state_dict`] names and
    /// layouts, F32, `{"format": "pt"}` metadata as `safetensors.torch.save_file` writes
    /// (`load_state_dict(safetensors.torch.load_file(path), strict=True)` reads it). Atomic, and
    /// refused before writing when its file system lacks the room
    /// ([`checkpoint_io::write_checked`]).
    pub fn export_model(&self, path: &Path) -> Result<()> {
        self.state_known()?;
        let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let entries = self.model.export_entries()?;
        let bytes = plimsoll_nn::state::serialize_host(
            path,
            entries.iter().map(|(n, t)| (n, t)),
            &metadata,
        )?;
        checkpoint_io::write_checked(path, &bytes, self.position.step)?;
        // Hugging Face's `config.json` beside it, for `from_pretrained` on the folder.
        if let Some(config) = self.model.export_config() {
            let config_path = path.with_file_name("config.json");
            let text = serde_json::to_string_pretty(&config).map_err(|e| {
                Error::invalid("config.json", format!("cannot be written as JSON: {e}"))
            })?;
            plimsoll_nn::state::write_atomic(&config_path, text.as_bytes())?;
        }
        Ok(())
    }

    /// Starts from the weights in `path` (`--init-from`): a `model.safetensors` in either export
    /// layout ([`crate::task::Model::import_state`]) or a checkpoint's parameters. Every name and
    /// shape is checked before any value is written ([`plimsoll_nn::state::load_into`]: missing,
    /// unexpected and mis-shaped entries are errors that name them); the optimizer and the
    /// position start afresh.
    pub fn init_from(&mut self, path: &Path) -> Result<()> {
        let mut loaded = plimsoll_nn::state::load(path)?;
        // A Plimsoll checkpoint keeps the parameters under a prefix beside the optimizer's.
        let prefix = checkpoint_io::PARAM_PREFIX;
        if loaded.tensors.keys().any(|k| k.starts_with(prefix)) {
            loaded = loaded.strip_prefix(prefix);
        }
        let loaded = self.model.import_state(loaded)?;
        // The parameters and the buffers (BatchNorm's running statistics), as an export holds them.
        let tensors = self.saved_tensors();
        let wanted: Vec<(String, Vec<usize>)> = (tensors.iter())
            .map(|(n, t)| (n.clone(), t.shape().to_vec()))
            .collect();
        let loaded = crate::task::regroup_tables(loaded, &wanted);
        plimsoll_nn::state::load_into(&tensors, &loaded)?;
        self.note(format!(
            "initialised the model's {} tensors from {}",
            tensors.len(),
            path.display()
        ));
        Ok(())
    }

    /// Records `evaluation` if its loss is the lowest so far and then, with a checkpoint
    /// directory, saves the state as `best.safetensors`. A failed save leaves the previous best.
    pub(crate) fn keep_if_best(&mut self, evaluation: &Evaluation) -> Result<()> {
        let loss = evaluation.loss;
        if !loss.is_finite() || self.position.best_eval_loss.is_some_and(|b| b <= loss) {
            return Ok(());
        }
        let previous = self.position.best_eval_loss.replace(loss);
        if self.config.checkpoint_dir.is_none() && !self.sharded() {
            return Ok(());
        }
        let saved = self.checkpoint_state().and_then(|state| {
            match (self.config.checkpoint_dir.as_ref(), state) {
                (Some(dir), Some(state)) => {
                    let step = self.position.step;
                    checkpoint_io::save_host(dir, checkpoint_io::BEST, &state, step).map(Some)
                }
                _ => Ok(None),
            }
        });
        match saved {
            Ok(None) => Ok(()),
            Ok(Some(path)) => {
                self.note(format!(
                    "evaluation loss {loss:.4} is the lowest so far; saved {}",
                    path.display()
                ));
                Ok(())
            }
            Err(e) => {
                self.position.best_eval_loss = previous;
                Err(e)
            }
        }
    }
}
