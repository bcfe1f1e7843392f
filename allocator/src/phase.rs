//! Phases of a training step, so that peaks and trace events say where in the step they happened.

use serde::Serialize;

/// Where in a training step the allocator is (set by the trainer with
/// [`crate::BufferAllocator::set_phase`]). Statistics keep a peak per phase and the trace stamps
/// every event with the phase it happened in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Outside the phases below (set-up, loading, between steps).
    #[default]
    Other,
    /// Forward passes of the step.
    Forward,
    /// Backward passes of the step.
    Backward,
    /// The optimizer's update (gradient clipping included).
    Optimizer,
    /// Evaluation (no gradients).
    Evaluation,
}

impl Phase {
    /// Every phase, in declaration order (the order of [`Phase::index`]).
    pub const ALL: [Phase; 5] = [
        Phase::Other,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::Evaluation,
    ];

    /// The lower-case name used in reports and JSON, e.g. `"backward"`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Other => "other",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Evaluation => "evaluation",
        }
    }

    /// The position of this phase in [`Phase::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The peaks of one phase since the last `reset_peaks` (all 0 for a phase not entered since).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PhaseStats {
    /// Highest allocated bytes while in the phase (the bytes live when it began included).
    pub peak_allocated_bytes: u64,
    /// Highest reserved bytes while in the phase.
    pub peak_reserved_bytes: u64,
    /// Highest allocated bytes of each category while in the phase, in the order of
    /// [`crate::Category::ALL`].
    pub peak_category_bytes: [u64; 7],
}
