//! What watches a step without taking part in it: the memory timeline ([`crate::timeline`]),
//! the kernel profile ([`crate::profiling`]) and the after-step leak check ([`crate::leak`]).
//! Each is a [`StepHook`]; the [`Trainer`](crate::Trainer) holds them in one [`Hooks`] and calls
//! them, in that order, at the same points of every step. A hook sees the device, the
//! configuration and the log through a [`HookContext`], never the model or the optimizer.

use plimsoll_autograd::Gpu;

use crate::config::TrainConfig;
use crate::error::Error;
use crate::leak::LeakCheck;
use crate::profiling::Profiling;
use crate::timeline::Recording;

/// What a hook may use: the device, the configuration, the run's position and the log.
pub(crate) struct HookContext<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) config: &'a TrainConfig,
    /// What the run keeps in host memory on purpose, as planned.
    pub(crate) host: crate::timeline::HostBytes,
    /// Steps finished so far (the run's position; a step that failed is not counted).
    pub(crate) steps_done: u64,
    log: &'a mut Vec<String>,
}

impl<'a> HookContext<'a> {
    pub(crate) fn new(
        gpu: &'a Gpu,
        config: &'a TrainConfig,
        host: crate::timeline::HostBytes,
        steps_done: u64,
        log: &'a mut Vec<String>,
    ) -> HookContext<'a> {
        HookContext {
            gpu,
            config,
            host,
            steps_done,
            log,
        }
    }

    /// Adds a line to the trainer's log.
    pub(crate) fn note(&mut self, line: String) {
        self.log.push(line);
    }
}

/// Why a hook's check stopped the run after a step's update.
pub(crate) enum CheckFailure {
    /// The check could not run (the device failed): the state after the step is the good one,
    /// and the trainer saves it before giving up.
    Device(Error),
    /// The check ran and refuses the step (a leak under `--leak-check error`).
    Refused(Error),
}

/// An observer of the steps. Every method does nothing unless a hook says otherwise.
pub(crate) trait StepHook {
    /// Before step `step` runs.
    fn before_step(&mut self, _cx: &mut HookContext<'_>, _step: u64) {}

    /// After step `step`'s update (the position has moved on), inside the step's time.
    fn check_step(&mut self, _cx: &mut HookContext<'_>, _step: u64) -> Result<(), CheckFailure> {
        Ok(())
    }

    /// After step `step`, which took `step_ms`.
    fn after_step(&mut self, _cx: &mut HookContext<'_>, _step: u64, _step_ms: f64) {}

    /// After step `step` and its evaluation, if one was due ([`crate::Trainer::run`] only).
    fn after_evaluation(&mut self, _cx: &mut HookContext<'_>, _step: u64) {}

    /// A step failed (before or in [`StepHook::check_step`]): drop what it began.
    fn step_failed(&mut self, _cx: &mut HookContext<'_>) {}

    /// The run ends, or gives up at `step`: write what was recorded.
    fn finish(&mut self, _cx: &mut HookContext<'_>, _step: u64) {}
}

/// The trainer's hooks.
#[derive(Debug, Default)]
pub(crate) struct Hooks {
    /// The memory timeline being recorded, and the last one finished.
    pub(crate) timeline: Recording,
    /// Kernel profiles of the configured steps.
    pub(crate) profiling: Profiling,
    pub(crate) leak: LeakCheck,
}

impl Hooks {
    /// Every hook, in the order they are called.
    pub(crate) fn each(&mut self) -> [&mut dyn StepHook; 3] {
        [&mut self.timeline, &mut self.profiling, &mut self.leak]
    }
}
