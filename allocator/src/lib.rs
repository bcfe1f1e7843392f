//! Plimsoll's device-memory sub-allocator: a best-fit allocator of byte ranges inside *segments*
//! (in practice one `wgpu::Buffer` each), with a budget on reserved bytes, per-category and
//! per-label accounting, fragmentation metrics, snapshots, a bounded event trace and an
//! out-of-memory error that says what to do next.
//!
//! It is pure `u64` offset arithmetic and knows nothing of wgpu: a [`SegmentSource`] creates and
//! releases the real segments, so the whole crate is tested without a device. It is not a
//! general-purpose heap: it never touches the memory it manages and never moves a live block.
//!
//! Main types: [`BufferAllocator`] (the allocator), [`Request`] and [`Allocation`] (what goes in
//! and comes out), [`AllocatorConfig`], [`Stats`], [`Snapshot`], [`Summary`], [`Trace`], and the
//! error type [`AllocError`] with its [`OutOfMemory`] report.
//!
//! Policy in one paragraph: sizes round up to a power-of-two granule; the smallest free block that
//! holds the request (with its alignment) wins, ties to the lowest address; a remainder splits off
//! when it is at least four granules and at least 1/16 of the request (a smaller one stays with the
//! allocation, counted as internal waste, so no sliver of free memory is indexed) and free
//! neighbours coalesce at once. Small requests share small segments, larger ones get a segment of
//! their own, sized to them. When no free block fits, empty dedicated
//! segments are released before a new segment is created (reserved memory tracks what is in use),
//! and when the budget or the device refuses, every empty cached segment is released and the
//! request is tried once more before an [`OutOfMemory`] error.

mod allocation;
mod allocator;
pub mod arena_plan;
mod block;
mod bytes;
mod category;
mod class_bitmap;
mod class_set;
mod config;
mod error;
mod free_index;
mod invariants;
mod phase;
mod segment_policy;
mod segment_table;
mod simulated;
mod snapshot;
mod source;
mod stats;
mod step_plan;
mod summary;
mod trace;

pub use allocation::Allocation;
pub use allocator::BufferAllocator;
pub use bytes::{format_bytes, format_bytes_at_least};
pub use category::{AllocationId, Category, SegmentId};
pub use config::{AllocatorConfig, Request};
pub use error::{AllocError, OomCause, OutOfMemory, Result};
pub use phase::{Phase, PhaseStats};
pub use simulated::{SimulatedDeviceFull, SimulatedSource};
pub use snapshot::{BlockSnapshot, Layout, SegmentSnapshot, Snapshot};
pub use source::SegmentSource;
pub use stats::{CategoryStats, LifetimePeaks, Stats};
pub use step_plan::{StepOutcome, StepPlanStats};
pub use summary::{LabelUsage, Summary};
pub use trace::{Trace, TraceEvent, TraceEventKind};
