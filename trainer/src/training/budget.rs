//! The run's memory budget follows the device: the driver's own figure lowers it where the
//! driver reports one, and a budget that falls below the plan's peak (or grows while the plan had
//! to split the batch) makes the run plan again at the next step boundary.

use crate::error::{Error, Result};
use crate::trainer::Trainer;

impl Trainer {
    /// A budget that follows the device: when the device's memory budget
    /// ([`crate::Gpu::memory_budget_bytes`], which [`crate::Gpu::set_memory_budget`] changes, e.g. when
    /// another process takes memory) has fallen below the plan's predicted peak, or grown past
    /// the budget it was planned for while the plan could not take the whole batch without
    /// checkpointing, the run plans again at this step boundary (the same model: the choice of
    /// variant stays) and goes on with the new micro-batch and checkpointing, saying so. Only
    /// where the run plans (no `--micro-batch` and no fixed checkpointing given); when nothing
    /// fits the new budget it says so and keeps its choice (out-of-memory recovery then halves
    /// the micro-batch step by step).
    pub(crate) fn follow_budget(&mut self, step: u64) -> Result<()> {
        self.follow_driver_budget();
        let Some(plan) = &self.plan else {
            return Ok(());
        };
        let budget = self.gpu.memory_budget_bytes();
        let was = plan.budget_bytes;
        let best_already = plan.micro_batch >= plan.effective_batch && plan.segment_len == 0;
        let shrank_below = budget < plan.predicted_peak_reserved_bytes;
        let grew = budget > was && !best_already;
        if budget == was || !self.config.needs_plan() || !(shrank_below || grew) {
            return Ok(());
        }
        let mut per_rank = self.config.clone();
        per_rank.effective_batch =
            crate::collective::largest_shard(self.config.effective_batch, self.collective.ranks());
        let fmt = plimsoll_allocator::format_bytes;
        let replanned = crate::plan::replan(
            &self.gpu,
            self.recipe.as_ref(),
            self.train.as_ref(),
            self.test.as_deref(),
            &per_rank,
        );
        match replanned {
            Ok(new) => {
                self.note(format!(
                    "the memory budget changed from {} to {} before step {step}: planned again, \
                     {}, checkpointing {} (predicted peak {}, was {})",
                    fmt(was),
                    fmt(budget),
                    crate::plan::micro_batches_in_words(per_rank.effective_batch, new.micro_batch),
                    crate::plan::segment_name(new.segment_len),
                    fmt(new.predicted_peak_reserved_bytes),
                    fmt(plan.predicted_peak_reserved_bytes),
                ));
                self.micro_batch = new.micro_batch;
                self.segment_len = new.segment_len;
                self.position.micro_batch = new.micro_batch;
                self.plan = Some(new);
            }
            Err(Error::BudgetTooSmall { .. } | Error::TensorTooLarge { .. }) => {
                self.note(format!(
                    "the memory budget changed from {} to {} before step {step}, and no \
                     micro-batch or checkpointing fits it; the run keeps its choice \
                     (out-of-memory recovery halves the micro-batch where a step needs it)",
                    fmt(was),
                    fmt(budget)
                ));
                if let Some(p) = self.plan.as_mut() {
                    p.budget_bytes = budget;
                }
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Where the driver reports what this process may use ([`crate::Gpu::device_memory`]): the
    /// device's budget becomes the run's own budget or [`crate::plan::DRIVER_SHARE`] of the driver's,
    /// whichever is less, so another process taking memory lowers it (and giving it back
    /// raises it again) before [`Trainer::follow_budget`] compares it with the plan.
    fn follow_driver_budget(&mut self) {
        let Some(memory) = self.gpu.device_memory() else {
            return;
        };
        let now = self.gpu.memory_budget_bytes();
        // A budget someone else set (Gpu::set_memory_budget) since is the run's own from now.
        if now != self.driver_set.unwrap_or(self.run_budget) {
            self.run_budget = now;
            self.driver_set = None;
        }
        let allowed = crate::plan::driver_budget(self.run_budget, memory.budget_bytes);
        // Moves of under 1/64 are noise (the driver's own figure moves with every buffer).
        if allowed.abs_diff(now) > now / 64 {
            self.gpu.set_memory_budget(allowed);
            self.driver_set = Some(allowed);
        }
    }
}
