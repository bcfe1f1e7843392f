//! The segment policy: when segments are created and released, and when a request is out of
//! memory. Why reserved memory stays close to allocated memory:
//! - A request of at most `small_request_max_bytes` (after rounding) that finds no free block gets a
//!   new shared segment of `small_segment_bytes`; a larger request gets a *dedicated* segment of
//!   exactly its rounded size, so a big tensor never strands the tail of a big segment.
//! - Empty segments stay cached within the allocator's *high-water mark*, the most bytes it has
//!   ever reserved: before a new segment is created, empty dedicated segments are released, the
//!   longest empty first, only while the reserved bytes with the new segment would pass the mark
//!   (or the budget). A request for a dedicated segment may release the empty *shared* segments
//!   too, after the dedicated ones; a small request keeps them cached, since they serve the next
//!   small request at once. The mark rises only when every empty segment that could go has
//!   gone, and a step whose sizes vary reuses the cached segments of the step before instead of
//!   creating and releasing a device buffer per large tensor: a 6-layer GPT of width 384 on
//!   lavapipe (batch 8, f16) created 46 segments (222 MiB) in its third step where releasing
//!   every empty segment at each growth had created 256 (1.26 GB), for a peak reserved of 366.7
//!   MiB against 354.3 (the layouts differ). [`BufferAllocator::empty_cache`] lowers the mark to
//!   what stays reserved; the trainer empties the cache before a run's model is built, as the
//!   memory plan's dry runs do, so the run allocates as planned.
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
        // Empty segments cannot serve this request (best fit failed): released while the new
        // segment would take reserved memory past the high-water mark, empty dedicated ones
        // first; a small request keeps empty shared segments cached for the next small one.
        self.release_empty_over(preferred, shared);
        let fits = |stats: &Stats, bytes: u64, budget: u64| {
            stats
                .reserved_bytes
                .checked_add(bytes)
                .is_some_and(|total| total <= budget)
        };
        // What empty segments are left keep reserved memory with `preferred` within the mark,
        // itself within the budget; a small request would have fit any empty shared segment.
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
        self.high_water_bytes = self.high_water_bytes.max(stats.reserved_bytes);
        stats.segments += 1;
        stats.segments_created += 1;
        self.trace
            .record(|event| segment_event(event, TraceEventKind::SegmentCreate, id, size_bytes));
        first_block
    }

    /// Releases empty segments, the dedicated ones first (and then, unless `dedicated_only`, the
    /// shared ones), each list longest empty first, while `new_bytes` more reserved bytes would
    /// pass the high-water mark or the budget. Returns the bytes released.
    pub(crate) fn release_empty_over(&mut self, new_bytes: u64, dedicated_only: bool) -> u64 {
        let cap = self.high_water_bytes.min(self.config.budget_bytes);
        self.release_empty_while(dedicated_only, |reserved| {
            reserved.saturating_add(new_bytes) > cap
        })
    }

    /// Releases every empty segment, or only the empty dedicated ones; returns the bytes released.
    pub(crate) fn release_empty_segments(&mut self, dedicated_only: bool) -> u64 {
        self.release_empty_while(dedicated_only, |_| true)
    }

    /// Releases empty segments (dedicated first, then shared unless `dedicated_only`; each list
    /// longest empty first) while `more(reserved bytes)` holds; returns the bytes released.
    fn release_empty_while(&mut self, dedicated_only: bool, more: impl Fn(u64) -> bool) -> u64 {
        let mut released = 0;
        for shared in [false, true] {
            if shared && dedicated_only {
                break;
            }
            while more(self.stats.reserved_bytes) {
                let Some(id) = self.segments.first_empty(shared) else {
                    break;
                };
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
