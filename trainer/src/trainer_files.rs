//! The trainer's files: resuming from a checkpoint, saving one (`latest` and `best`), and
//! exporting the model for PyTorch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::checkpoint_io;
use crate::error::Result;
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
            &self.params,
            self.optimizer.as_mut(),
            checks,
        )?;
        let micro_batch = self.config.micro_batch.unwrap_or(position.micro_batch);
        self.micro_batch = micro_batch.clamp(1, self.config.effective_batch);
        position.micro_batch = self.micro_batch;
        self.position = position;
        self.note(format!(
            "resumed from {} at step {}{}",
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

    /// Saves a checkpoint of the current state if a checkpoint directory is configured.
    pub fn save_checkpoint(&mut self) -> Result<Option<PathBuf>> {
        let Some(dir) = self.config.checkpoint_dir.clone() else {
            return Ok(None);
        };
        let path = checkpoint_io::save(
            &dir,
            checkpoint_io::LATEST,
            &self.params,
            self.optimizer.as_ref(),
            &self.position,
        )?;
        self.note(format!(
            "saved checkpoint at step {} to {}",
            self.position.step,
            path.display()
        ));
        Ok(Some(path))
    }

    /// Writes the model alone to `path` for PyTorch: the [`Model::state_dict`] names and
    /// layouts, F32, `{"format": "pt"}` metadata as `safetensors.torch.save_file` writes
    /// (`load_state_dict(safetensors.torch.load_file(path), strict=True)` reads it). Atomic.
    pub fn export_model(&self, path: &Path) -> Result<()> {
        let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        plimsoll_nn::state::save(path, &self.model.state_dict(), &metadata)?;
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
        let Some(dir) = self.config.checkpoint_dir.clone() else {
            return Ok(());
        };
        let saved = checkpoint_io::save(
            &dir,
            checkpoint_io::BEST,
            &self.params,
            self.optimizer.as_ref(),
            &self.position,
        );
        match saved {
            Ok(path) => {
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
