//! The segment policy: when segments are created and released, and when a request is out of
//! memory. Why reserved memory stays close to allocated memory:
//! - A request of at most `small_request_max_bytes` (after rounding) that finds no free block gets a
//!   new shared segment of `small_segment_bytes`; a larger request gets a *dedicated* segment of
//!   exactly its rounded size, so a big tensor never strands the tail of a big segment.
//! - Before a new segment is created, every empty dedicated segment is released: it cannot serve
//!   this request (best fit already failed), and keeping it would grow reserved memory beyond what
//!   is in use. A request for a dedicated segment releases the empty *shared* segments too, for the
//!   same reason; a small request keeps them cached, since they serve the next small request at
//!   once. Trade-off: a loop whose sizes vary may create and release a device buffer per large
//!   tensor (or per emptied shared segment) per step instead of reusing a cached one.
//! - Likewise, a request does not split an empty dedicated segment if that would leave more than
//!   `small_request_max_bytes` unused: the segment is released and one sized to the request is
//!   created. (Should the source then refuse, the request still takes the old block if it remains.)
//! - When the budget does not allow the new segment, a small request falls back to a segment sized
//!   to it. When the source refuses a segment, every empty cached segment is released and creation
//!   is tried once more with the exact size (counted in `retries_after_releasing_cache`). Only then is the request an out-of-memory error, and the allocator is unchanged by
//!   it except for the released cache.

use crate::block::{Block, MAX_SEGMENT_SLOTS, NIL};
use crate::free_index::Fit;
use crate::segment_table::SegmentEntry;
use crate::stats::fragmentation;
use crate::trace::{TraceEvent, TraceEventKind};
use crate::{
    AllocError, BufferAllocator, OomCause, OutOfMemory, Request, Result, SegmentId, SegmentSource,
    Stats,
};

impl<S: SegmentSource> BufferAllocator<S> {
    /// Finds room for `size_bytes` when no free block fits: a new segment, after releasing cache as
    /// the module policy says. Returns the key of the new segment's one free block.
    pub(crate) fn grow(&mut self, size_bytes: u64, request: &Request<'_>) -> Result<u32> {
        let shared = size_bytes <= self.config.small_request_max_bytes;
        let preferred = if shared {
            self.config.small_segment_bytes
        } else {
            size_bytes
        };
        // A large request releases every empty segment (none can serve it: best fit failed); a
        // small one keeps empty shared segments cached for the next small request.
        self.release_empty_segments(shared);
        let fits = |stats: &Stats, bytes: u64, budget: u64| {
            stats
                .reserved_bytes
                .checked_add(bytes)
                .is_some_and(|total| total <= budget)
        };
        // No empty segment that could matter is left: a large request released them all, and a
        // small one would have fit any empty shared segment.
        let budget = self.config.budget_bytes;
        let (segment_bytes, shared) = if fits(&self.stats, preferred, budget) {
            (preferred, shared)
        } else if fits(&self.stats, size_bytes, budget) {
            (size_bytes, false)
        } else {
            let cause = if size_bytes > budget {
                OomCause::NeverFits
            } else if self.free_bytes() >= size_bytes {
                OomCause::Fragmented
            } else {
                OomCause::BudgetFull
            };
            return Err(self.out_of_memory(request, cause));
        };
        if self.segments.len() >= MAX_SEGMENT_SLOTS as usize {
            let cause = OomCause::SourceFailed {
                message: format!("the allocator holds {MAX_SEGMENT_SLOTS} segments, its limit"),
            };
            return Err(self.out_of_memory(request, cause));
        }
        let id = SegmentId(self.next_segment);
        let created = match self.source.create_segment(id, segment_bytes) {
            Ok(segment) => Ok((segment, segment_bytes, shared)),
            Err(_) => {
                self.release_empty_segments(false);
                self.stats.retries_after_releasing_cache += 1;
                self.source
                    .create_segment(id, size_bytes)
                    .map(|segment| (segment, size_bytes, false))
            }
        };
        match created {
            Ok((segment, segment_bytes, shared)) => {
                self.next_segment += 1;
                Ok(self.add_segment(id, segment, segment_bytes, shared))
            }
            Err(error) => {
                let cause = OomCause::SourceFailed {
                    message: error.to_string(),
                };
                Err(self.out_of_memory(request, cause))
            }
        }
    }

    pub(crate) fn out_of_memory(&mut self, request: &Request<'_>, cause: OomCause) -> AllocError {
        self.stats.out_of_memory_errors += 1;
        let stats = &self.stats;
        let (free_bytes, largest_free_bytes) = (self.free_bytes(), self.largest_free_bytes());
        let report = OutOfMemory {
            requested_bytes: request.size_bytes,
            category: request.category,
            label: request.label.to_owned(),
            allocated_bytes: stats.allocated_bytes,
            reserved_bytes: stats.reserved_bytes,
            budget_bytes: self.config.budget_bytes,
            free_bytes,
            largest_free_bytes,
            fragmentation: fragmentation(free_bytes, largest_free_bytes),
            top_holders: self.top_holders(5),
            cause,
        };
        self.trace.record(|event| TraceEvent {
            event,
            kind: TraceEventKind::OutOfMemory,
            allocation: None,
            segment: None,
            offset: 0,
            size_bytes: request.size_bytes,
            category: Some(request.category),
            label: Some(request.label.to_owned()),
            time_ns: 0,
            step: 0,
            phase: crate::Phase::Other,
        });
        report.into()
    }

    /// Whether taking free block `fit` for `size_bytes` would split an *empty dedicated* segment
    /// and leave more than `small_request_max_bytes` unused, while the budget allows a segment
    /// sized to the request once it is released. Such a segment is released and the request gets a
    /// segment sized to it instead (see the module policy).
    #[inline]
    pub(crate) fn would_waste_empty_dedicated(&self, fit: Fit, size_bytes: u64) -> bool {
        // The fit's size decides first, so the usual small fit never reads its block here.
        let block_bytes = self.bytes(fit.size);
        if block_bytes - size_bytes <= self.config.small_request_max_bytes
            || (self.stats.reserved_bytes - block_bytes).saturating_add(size_bytes)
                > self.config.budget_bytes
        {
            return false;
        }
        let block = &self.blocks[fit.index];
        block.prev == NIL
            && block.next == NIL
            && self
                .segments
                .get(block.segment_slot())
                .is_some_and(|entry| !entry.shared && !entry.pinned)
    }

    /// The `count` labels holding the most bytes, largest first.
    pub(crate) fn top_holders(&self, count: usize) -> Vec<(String, u64)> {
        let top = self.labels.top(count);
        top.into_iter()
            .map(|entry| (entry.name.to_string(), entry.allocated_bytes))
            .collect()
    }

    pub(crate) fn add_segment(
        &mut self,
        id: SegmentId,
        segment: S::Segment,
        size_bytes: u64,
        shared: bool,
    ) -> u32 {
        let first_block = self
            .blocks
            .insert(Block::free(id, 0, 0, self.granules(size_bytes), 0));
        let slot = self.segments.insert(SegmentEntry::new(
            id,
            segment,
            size_bytes,
            first_block,
            shared,
        ));
        self.blocks[first_block].set_segment_slot(slot);
        self.free.insert(first_block, &self.blocks);
        self.segments.list_empty(slot);
        let stats = &mut self.stats;
        stats.reserved_bytes += size_bytes;
        stats.on_reserve();
        stats.segments += 1;
        stats.segments_created += 1;
        self.trace
            .record(|event| segment_event(event, TraceEventKind::SegmentCreate, id, size_bytes));
        first_block
    }

    /// Releases every empty segment, or only the empty dedicated ones; returns the bytes released.
    pub(crate) fn release_empty_segments(&mut self, dedicated_only: bool) -> u64 {
        let mut released = 0;
        for shared in [false, true] {
            if shared && dedicated_only {
                break;
            }
            while let Some(id) = self.segments.first_empty(shared) {
                // A listed segment is live, so this always releases it; the `else` only guards
                // the loop against an inconsistent table.
                let Some(bytes) = self.release_segment(id) else {
                    break;
                };
                released += bytes;
            }
        }
        released
    }

    /// Releases empty segment `id`; returns its size, or `None` if it was not live.
    fn release_segment(&mut self, id: SegmentId) -> Option<u64> {
        let entry = self.segments.remove(id)?;
        let first = entry.first_block;
        self.free.remove(first, &self.blocks);
        self.blocks.remove(first);
        let stats = &mut self.stats;
        stats.reserved_bytes -= entry.size_bytes;
        stats.segments -= 1;
        stats.segments_released += 1;
        let size_bytes = entry.size_bytes;
        self.source.release_segment(id, entry.segment);
        self.trace
            .record(|event| segment_event(event, TraceEventKind::SegmentRelease, id, size_bytes));
        Some(size_bytes)
    }
}

fn segment_event(event: u64, kind: TraceEventKind, id: SegmentId, size_bytes: u64) -> TraceEvent {
    TraceEvent {
        event,
        kind,
        allocation: None,
        segment: Some(id),
        offset: 0,
        size_bytes,
        category: None,
        label: None,
        time_ns: 0,
        step: 0,
        phase: crate::Phase::Other,
    }
}
