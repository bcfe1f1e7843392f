//! Learning-rate schedules: [`LrSchedule::Constant`] and [`LrSchedule::WarmupCosine`] (linear
//! warm-up, then cosine decay to a floor).

/// A learning rate as a function of the (0-based) step number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LrSchedule {
    /// The same rate at every step.
    Constant {
        /// The rate.
        lr: f32,
    },
    /// Linear warm-up from `peak_lr / warmup_steps` at step 0 to `peak_lr` at step
    /// `warmup_steps - 1`; then cosine decay from `peak_lr` at step `warmup_steps` to `min_lr` at
    /// step `total_steps`; `min_lr` after that.
    WarmupCosine {
        /// The rate at the end of the warm-up.
        peak_lr: f32,
        /// Steps of linear warm-up (0: none).
        warmup_steps: u64,
        /// The step at which the decay reaches `min_lr`.
        total_steps: u64,
        /// The floor.
        min_lr: f32,
    },
}

impl LrSchedule {
    /// The rate for step `step` (0-based: the first optimizer step is step 0).
    ///
    /// Warm-up: `peak * (step + 1) / warmup`. Decay: with
    /// `progress = (step - warmup) / (total - warmup)` clamped to `[0, 1]`,
    /// `min + (peak - min) * (1 + cos(pi * progress)) / 2`.
    pub fn lr_at(&self, step: u64) -> f32 {
        match *self {
            LrSchedule::Constant { lr } => lr,
            LrSchedule::WarmupCosine {
                peak_lr,
                warmup_steps,
                total_steps,
                min_lr,
            } => {
                if step < warmup_steps {
                    return (f64::from(peak_lr) * (step + 1) as f64 / warmup_steps as f64) as f32;
                }
                if step >= total_steps {
                    return min_lr;
                }
                let span = total_steps.saturating_sub(warmup_steps).max(1) as f64;
                let progress = ((step - warmup_steps) as f64 / span).clamp(0.0, 1.0);
                let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                (f64::from(min_lr) + (f64::from(peak_lr) - f64::from(min_lr)) * cosine) as f32
            }
        }
    }
}
