//! The handle of one live allocation.

use crate::{AllocationId, Category, SegmentId};

/// One live allocation. It is not `Clone`: [`crate::BufferAllocator::free`] consumes it, so a
/// double free does not compile in ordinary code; the allocator still checks every handle.
#[derive(Debug)]
pub struct Allocation {
    /// Sequence number; equals the `sequence` of the used block it names.
    pub(crate) id: AllocationId,
    /// The id of the allocator instance that made it (catches foreign handles).
    pub(crate) instance: u64,
    /// Index of its block in the allocator's block slab.
    pub(crate) block: u32,
    pub(crate) segment: SegmentId,
    /// Aligned offset; a multiple of the request's alignment.
    pub(crate) offset: u64,
    /// Usable bytes; at least `requested_bytes`, a multiple of the granule (the rounded request plus
    /// any remainder too small to split off).
    pub(crate) size_bytes: u64,
    pub(crate) requested_bytes: u64,
    pub(crate) category: Category,
    /// Interned label id (index into the allocator's label table).
    pub(crate) label: u32,
    /// The last-use tag of the bytes it got (see [`crate::BufferAllocator::free_with_tag`]).
    pub(crate) tag: u64,
}

impl Allocation {
    /// The allocation's sequence number (unique per allocator).
    pub fn id(&self) -> AllocationId {
        self.id
    }
    /// The segment that holds it.
    pub fn segment(&self) -> SegmentId {
        self.segment
    }
    /// Aligned byte offset inside the segment.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Usable bytes at `offset`: at least the requested size; the size rounded to the granule, plus
    /// any remainder of the free block too small to split off (under four granules, or under 1/16
    /// of the rounded request).
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    /// Bytes asked for.
    pub fn requested_bytes(&self) -> u64 {
        self.requested_bytes
    }
    /// What the memory holds.
    pub fn category(&self) -> Category {
        self.category
    }
    /// The largest last-use tag that earlier holders of these bytes were freed with (see
    /// [`crate::BufferAllocator::free_with_tag`]); 0 if they never were.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// A second handle to the same allocation. It exists only so tests can prove that a double
    /// free is caught; never use it otherwise.
    #[doc(hidden)]
    pub fn duplicate_for_misuse_test(&self) -> Allocation {
        Allocation { ..*self }
    }
}
