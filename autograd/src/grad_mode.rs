//! Gradient mode (per thread): [`no_grad`] turns recording off until its guard drops; the
//! checkpoint mechanism uses the same switch. Also the per-thread random state that seeds
//! dropout, which a checkpoint saves and restores so a recomputed segment draws the same masks.

use std::cell::Cell;

use plimsoll_kernels_wgsl::random::SplitMix64;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static RNG_STATE: Cell<u64> = const { Cell::new(0x005E_ED0F_D1CE) };
    static RECOMPUTING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is running a checkpointed segment again during backward
/// ([`crate::checkpoint()`]): a module that updates state in its forward (BatchNorm's running
/// statistics) leaves it alone then, so a checkpointed step updates it once, as a plain step.
pub fn is_recomputing() -> bool {
    RECOMPUTING.with(Cell::get)
}

/// Marks this thread as recomputing ([`is_recomputing`]) until the guard drops.
pub(crate) fn recomputing() -> RecomputeGuard {
    RecomputeGuard {
        previous: RECOMPUTING.with(|r| r.replace(true)),
    }
}

/// Restores the previous [`is_recomputing`] when dropped.
#[derive(Debug)]
pub(crate) struct RecomputeGuard {
    previous: bool,
}

impl Drop for RecomputeGuard {
    fn drop(&mut self) {
        RECOMPUTING.with(|r| r.set(self.previous));
    }
}

/// Whether ops on this thread record a graph (true unless a [`NoGradGuard`] is alive).
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Restores the previous gradient mode when dropped.
#[must_use = "recording resumes as soon as the guard is dropped"]
#[derive(Debug)]
pub struct NoGradGuard {
    previous: bool,
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

/// Turns recording off on this thread until the guard drops: ops record no node and save
/// nothing, and their outputs are allocated as `Temporary`.
pub fn no_grad() -> NoGradGuard {
    let previous = GRAD_ENABLED.with(|g| g.replace(false));
    NoGradGuard { previous }
}

/// Turns recording on (inside a [`no_grad`] region) until the guard drops.
pub fn enable_grad() -> NoGradGuard {
    let previous = GRAD_ENABLED.with(|g| g.replace(true));
    NoGradGuard { previous }
}

/// Seeds this thread's random state (dropout masks drawn with [`crate::Tensor::dropout`]).
pub fn manual_seed(seed: u64) {
    RNG_STATE.with(|s| s.set(seed));
}

/// This thread's random state (saved by checkpoints so recomputation repeats dropout masks).
pub fn rng_state() -> u64 {
    RNG_STATE.with(Cell::get)
}

/// Restores a state returned by [`rng_state`].
pub fn set_rng_state(state: u64) {
    RNG_STATE.with(|s| s.set(state));
}

/// Draws the next 64-bit seed from this thread's random state (one SplitMix64 step).
pub fn next_seed() -> u64 {
    RNG_STATE.with(|s| {
        let mut rng = SplitMix64::new(s.get());
        let seed = rng.next_u64();
        s.set(rng.state());
        seed
    })
}
