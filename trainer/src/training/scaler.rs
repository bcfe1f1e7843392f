//! Dynamic loss scaling for `--precision f16`, with PyTorch's `torch.amp.GradScaler` rules:
//! the loss is multiplied by the scale before backward, the gradients are divided by it before
//! clipping and the update (inside the fused update's gradient scale: no pass of its own), and
//! the scale adapts:
//! - it starts at [`INITIAL_SCALE`] (2^16);
//! - a step that overflows is skipped, no update and no optimizer step, and the scale is halved
//!   ([`BACKOFF`]). Overflow is the `nonfinite` kernel's flag, computed on the device over the
//!   loss and the gradients' partial sums of squares and read back with them in the step's one
//!   read-back: the loss is not finite (an activation beyond f16's 65504 became infinite in the
//!   forward), or a gradient's sum of squares is not finite (a NaN or an infinity, or a scaled
//!   gradient so large that its squares overflow f32, |g| around 1.8e19 and up, where the norm
//!   clipping needs would be infinite);
//! - after [`GROWTH_INTERVAL`] steps in a row without one, it doubles ([`GROWTH`]), up to
//!   [`MAX_SCALE`].
//!
//! What differs from PyTorch, and why. Here activations, matmul inputs and the elementwise ops
//! between them are f16, but gradients are computed and kept in f32, so the scale does not guard
//! them against underflow as it does for PyTorch's f16 gradients. What the scaler does here is GradScaler's other half: a step whose
//! forward or backward overflows is skipped instead of applied, with the same schedule. The
//! scale stops growing at [`MAX_SCALE`] (PyTorch has no cap; its f16 gradients overflow
//! themselves long before): without a cap, an f32 gradient's squares would overflow after about
//! 47 growths and skip one update every [`GROWTH_INTERVAL`] steps for nothing.
//!
//! A step that overflows when the scale is already 1 is an error, naming the first parameter
//! whose gradient is not finite (none when only the loss is): no scale helps.

use serde::Serialize;

/// The scale a run starts with (PyTorch's `init_scale`).
pub const INITIAL_SCALE: f32 = 65536.0;
/// Steps in a row without overflow before the scale doubles (PyTorch's `growth_interval`).
pub const GROWTH_INTERVAL: u32 = 2000;
/// The factor after [`GROWTH_INTERVAL`] good steps (PyTorch's `growth_factor`).
pub const GROWTH: f32 = 2.0;
/// The factor after an overflow (PyTorch's `backoff_factor`).
pub const BACKOFF: f32 = 0.5;
/// The largest scale (2^24; see the module docs).
pub const MAX_SCALE: f32 = 16_777_216.0;

/// The scaler's state: saved in checkpoints, so a resumed run continues with it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossScaler {
    /// The scale the next step's loss is multiplied by.
    pub scale: f32,
    /// Steps in a row without overflow since the scale last changed (PyTorch's growth tracker).
    pub good_steps: u32,
    /// Steps skipped for an overflow over the whole run.
    pub skipped_steps: u64,
}

impl Default for LossScaler {
    fn default() -> Self {
        LossScaler {
            scale: INITIAL_SCALE,
            good_steps: 0,
            skipped_steps: 0,
        }
    }
}

/// What the scaler did after a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScaleChange {
    /// The update ran; the scale is unchanged.
    Kept,
    /// The update ran and was the [`GROWTH_INTERVAL`]-th good step in a row: the scale doubled.
    Grew,
    /// The gradients overflowed: the update was skipped and the scale halved.
    Skipped,
    /// The gradients overflowed at a scale of 1 or less: nothing left to lower.
    Exhausted,
}

/// The loss scale of a run's first step: [`INITIAL_SCALE`] in f16, 1 in f32 (no scaling).
pub fn first_scale(precision: crate::config::Precision) -> f32 {
    match precision {
        crate::config::Precision::F16 => INITIAL_SCALE,
        crate::config::Precision::F32 => 1.0,
    }
}

impl LossScaler {
    /// Moves the state on after a step whose gradients overflowed (`overflow`) or not.
    pub fn update(&mut self, overflow: bool) -> ScaleChange {
        if overflow {
            if self.scale <= 1.0 {
                return ScaleChange::Exhausted;
            }
            self.scale *= BACKOFF;
            self.good_steps = 0;
            self.skipped_steps += 1;
            return ScaleChange::Skipped;
        }
        self.good_steps += 1;
        if self.good_steps < GROWTH_INTERVAL {
            return ScaleChange::Kept;
        }
        // As PyTorch: the tracker restarts at the interval even when the scale cannot grow.
        self.good_steps = 0;
        let grown = self.scale * GROWTH;
        match grown <= MAX_SCALE {
            true => {
                self.scale = grown;
                ScaleChange::Grew
            }
            false => ScaleChange::Kept,
        }
    }
}
