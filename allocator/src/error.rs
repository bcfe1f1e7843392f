//! The allocator's one error type.

use std::fmt;

use crate::{AllocationId, Category, format_bytes};

/// Result of allocator operations.
pub type Result<T> = std::result::Result<T, AllocError>;

/// Everything that can go wrong when allocating or freeing.
#[derive(thiserror::Error, Debug)]
pub enum AllocError {
    /// No free block fits and no segment could be added; the report says why and what to do.
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemory>),
    /// A request for zero bytes.
    #[error(
        "zero-byte request ({category}, '{label}'); every allocation must hold at least one byte"
    )]
    ZeroSize {
        /// The request's category.
        category: Category,
        /// The request's label.
        label: String,
    },
    /// An alignment that is not a power of two.
    #[error("alignment {alignment} of '{label}' is not a power of two")]
    BadAlignment {
        /// The alignment asked for.
        alignment: u64,
        /// The request's label.
        label: String,
    },
    /// A request larger than the largest segment the device allows.
    #[error(
        "'{label}' asked for {} but the largest segment is {}; split the tensor or raise the device's buffer limits",
        format_bytes(*requested_bytes),
        format_bytes(*max_segment_bytes)
    )]
    TooLarge {
        /// Bytes asked for.
        requested_bytes: u64,
        /// The configured largest segment.
        max_segment_bytes: u64,
        /// The request's label.
        label: String,
    },
    /// The allocation was not made by this allocator, or was already freed.
    #[error("allocation #{} is unknown to this allocator (foreign or already freed)", id.0)]
    UnknownAllocation {
        /// The id carried by the handle.
        id: AllocationId,
    },
}

/// Why an allocation failed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum OomCause {
    /// The request is larger than the whole budget: no amount of freeing helps.
    NeverFits,
    /// Enough memory is free in total, but no single free block is large enough.
    Fragmented,
    /// The budget is used up by live allocations.
    BudgetFull,
    /// The segment source (the device) refused to create a segment, even after the cache was
    /// released.
    SourceFailed {
        /// The source's error message.
        message: String,
    },
}

/// The full report of a failed allocation: what was asked, the state of memory, the largest holders
/// and a hint. Its `Display` is one message a user can act on.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OutOfMemory {
    /// Bytes asked for.
    pub requested_bytes: u64,
    /// The request's category.
    pub category: Category,
    /// The request's label.
    pub label: String,
    /// Bytes in live allocations.
    pub allocated_bytes: u64,
    /// Bytes in segments.
    pub reserved_bytes: u64,
    /// The budget on reserved bytes.
    pub budget_bytes: u64,
    /// Free bytes inside reserved segments.
    pub free_bytes: u64,
    /// The largest free block.
    pub largest_free_bytes: u64,
    /// `1 - largest_free / free` (0 when nothing is free).
    pub fragmentation: f64,
    /// The five largest holders by label, largest first: (label, bytes).
    pub top_holders: Vec<(String, u64)>,
    /// Why it failed.
    pub cause: OomCause,
}

impl OutOfMemory {
    /// The report without its hint: what was asked and the state of memory, for a caller whose
    /// own message gives the advice that fits its situation (the hint speaks of training steps).
    pub fn state(&self) -> String {
        struct State<'a>(&'a OutOfMemory);
        impl fmt::Display for State<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write_state(f)
            }
        }
        State(self).to_string()
    }

    fn write_state(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let budget = if self.budget_bytes == u64::MAX {
            "no budget".to_owned()
        } else {
            format!("a {} budget", format_bytes(self.budget_bytes))
        };
        write!(
            f,
            "out of memory: asked for {} ({}, '{}'); {} allocated, {} reserved of {}; {} free but the largest free block is {} (fragmentation {:.2}).",
            format_bytes(self.requested_bytes),
            self.category,
            self.label,
            format_bytes(self.allocated_bytes),
            format_bytes(self.reserved_bytes),
            budget,
            format_bytes(self.free_bytes),
            format_bytes(self.largest_free_bytes),
            self.fragmentation,
        )?;
        if !self.top_holders.is_empty() {
            f.write_str(" Largest holders: ")?;
            for (index, (label, bytes)) in self.top_holders.iter().enumerate() {
                let separator = if index == 0 { "" } else { ", " };
                write!(f, "{separator}'{label}' {}", format_bytes(*bytes))?;
            }
            f.write_str(".")?;
        }
        Ok(())
    }
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_state(f)?;
        f.write_str(" Hint: ")?;
        match &self.cause {
            OomCause::NeverFits => write!(
                f,
                "the request can never fit the budget of {}; raise --memory-budget or split the tensor (smaller micro-batch).",
                format_bytes(self.budget_bytes)
            ),
            OomCause::Fragmented => write!(
                f,
                "fragmented: {} free but the largest block is {}; free long-lived blocks earlier, allocate persistent state first, or reduce the micro-batch.",
                format_bytes(self.free_bytes),
                format_bytes(self.largest_free_bytes)
            ),
            OomCause::BudgetFull => f.write_str(
                "budget full: live allocations use it all; reduce the micro-batch, enable checkpointing, free tensors sooner, or raise --memory-budget.",
            ),
            OomCause::SourceFailed { message } => write!(
                f,
                "the device refused a new segment ({message}) even after the cache was released; the device has less memory than the budget: lower --memory-budget or reduce the micro-batch.",
            ),
        }
    }
}

impl std::error::Error for OutOfMemory {}

impl From<OutOfMemory> for AllocError {
    fn from(report: OutOfMemory) -> Self {
        AllocError::OutOfMemory(Box::new(report))
    }
}
