//! The small value types that name things: categories, segments, allocations.

use serde::Serialize;

/// What an allocation holds. Statistics are kept per category.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Model parameters (weights, biases).
    Parameter,
    /// Gradients of parameters.
    Gradient,
    /// Optimizer state (e.g. Adam moments).
    OptimizerState,
    /// Activations saved for backward.
    Activation,
    /// Short-lived scratch memory.
    Temporary,
    /// Input data (batches, targets).
    Input,
    /// Anything else.
    Other,
}

impl Category {
    /// Every category, in declaration order (the order of [`Category::index`]).
    pub const ALL: [Category; 7] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Temporary,
        Category::Input,
        Category::Other,
    ];

    /// The lower-case name used in reports and JSON, e.g. `"optimizer_state"`.
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Input => "input",
            Category::Other => "other",
        }
    }

    /// The position of this category in [`Category::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Names one segment of an allocator. Ids are never reused by the same allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SegmentId(pub u32);

/// An allocation's sequence number: unique per allocator, increasing in allocation order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct AllocationId(pub u64);
