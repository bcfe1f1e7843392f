//! Where segments come from.

use crate::SegmentId;

/// Creates and releases the real memory behind segments (in Plimsoll, `wgpu::Buffer`s).
///
/// The allocator calls it only when no free block fits (create) or when it gives cached memory
/// back (release); it never calls `release_segment` on a segment that holds a live allocation.
pub trait SegmentSource {
    /// The handle to one segment's memory.
    type Segment;
    /// Why a segment could not be created.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Creates a segment of exactly `size_bytes`; may fail (e.g. device out of memory).
    fn create_segment(
        &mut self,
        id: SegmentId,
        size_bytes: u64,
    ) -> Result<Self::Segment, Self::Error>;
    /// Releases a segment that holds no live allocation.
    fn release_segment(&mut self, id: SegmentId, segment: Self::Segment);
}
