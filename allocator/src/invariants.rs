//! The invariant checker: recomputes everything from the blocks and compares.

use crate::allocator::splits_off;
use crate::block::NIL;
use crate::stats::fragmentation;
use crate::{Category, SegmentSource, Stats};

impl<S: SegmentSource> crate::BufferAllocator<S> {
    /// Checks every invariant, recomputing every statistic from scratch: blocks tile each segment
    /// exactly and are linked consistently, no two free blocks are neighbours, offsets honour their
    /// alignment, the free index holds exactly the free blocks, and [`Stats`] and the label table
    /// equal their recomputation (the requested-byte figures, which only the handles know, are
    /// checked by [`Self::check_handles`]). O(n); meant for tests.
    ///
    /// # Errors
    /// A description of the first broken invariant.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut expected = Stats::default();
        let mut label_bytes = vec![0u64; self.labels.entries.len()];
        let mut free_count = 0usize;
        let mut block_count = 0usize;
        let mut largest = 0u64;
        for (slot, entry) in self.segments.iter() {
            let id = entry.id;
            if self.segments.slot_of(id) != Some(slot) {
                return Err(format!("{id:?}: slot {slot} missing from the id map"));
            }
            let mut index = entry.first_block;
            let mut prev = NIL;
            let mut end = 0u64;
            let mut prev_free = false;
            let mut used_blocks = 0u32;
            while index != NIL {
                let block = self
                    .blocks
                    .get(index)
                    .ok_or(format!("{id:?}: block {index} out of slab"))?;
                block_count += 1;
                // A used block holds its label where a free one holds its segment id.
                if (!block.is_used() && block.segment() != id)
                    || block.segment_slot() != slot
                    || block.prev != prev
                    || u64::from(block.offset) != end
                {
                    return Err(format!(
                        "{id:?}: block {index} misplaced: {block:?}, expected offset {end}, prev {prev}"
                    ));
                }
                if block.size == 0 {
                    return Err(format!("{id:?}: block {index} is empty: {block:?}"));
                }
                let size_bytes = self.bytes(block.size);
                if !block.is_used() {
                    if prev_free {
                        return Err(format!("{id:?}: free block {index} follows a free block"));
                    }
                    if !self.free.contains(index, &self.blocks) {
                        return Err(format!(
                            "{id:?}: free block {index} missing from the free index"
                        ));
                    }
                    free_count += 1;
                    largest = largest.max(size_bytes);
                    expected.free_bytes += size_bytes;
                } else {
                    if self.free.contains(index, &self.blocks) {
                        return Err(format!("{id:?}: used block {index} in the free index"));
                    }
                    if !self
                        .bytes(block.offset)
                        .is_multiple_of(1u64 << block.alignment_log2())
                    {
                        return Err(format!("{id:?}: block {index} breaks its alignment"));
                    }
                    used_blocks += 1;
                    expected.allocated_bytes += size_bytes;
                    expected.live_allocations += 1;
                    let category = &mut expected.categories[block.category().index()];
                    category.allocated_bytes += size_bytes;
                    category.live_allocations += 1;
                    match label_bytes.get_mut(block.label() as usize) {
                        Some(bytes) => *bytes += size_bytes,
                        None => return Err(format!("{id:?}: block {index} has no label")),
                    }
                }
                prev_free = !block.is_used();
                end += size_bytes >> self.granule_log2;
                prev = index;
                index = block.next;
            }
            if end << self.granule_log2 != entry.size_bytes {
                return Err(format!(
                    "{id:?}: blocks end at {end}, segment holds {}",
                    entry.size_bytes
                ));
            }
            // A pinned segment (used by a step plan) is never listed, empty or not.
            if (used_blocks == 0 && !entry.pinned) != self.segments.is_listed_empty(slot) {
                return Err(format!(
                    "{id:?}: {used_blocks} used blocks, but the empty list says otherwise"
                ));
            }
            expected.reserved_bytes += entry.size_bytes;
        }
        if free_count != self.free.len() || block_count != self.blocks.live_count() {
            return Err(format!(
                "free index holds {} (expected {free_count}), slab holds {} (expected {block_count})",
                self.free.len(),
                self.blocks.live_count()
            ));
        }
        let listed = self.segments.empty_ids();
        if listed.iter().any(|&id| self.segments.slot_of(id).is_none()) {
            return Err("empty list names a released segment".into());
        }
        let empty = self
            .segments
            .iter()
            .filter(|&(slot, _)| self.segments.is_listed_empty(slot))
            .count();
        if listed.len() != empty {
            return Err(format!(
                "empty lists hold {} segments, {empty} are marked listed",
                listed.len()
            ));
        }
        let stats = &self.stats();
        let pairs = [
            ("allocated", stats.allocated_bytes, expected.allocated_bytes),
            ("reserved", stats.reserved_bytes, expected.reserved_bytes),
            ("free", stats.free_bytes, expected.free_bytes),
            (
                "free index total",
                self.free.total() << self.granule_log2,
                expected.free_bytes,
            ),
            ("largest free", stats.largest_free_bytes, largest),
            (
                "live allocations",
                stats.live_allocations,
                expected.live_allocations,
            ),
            ("free blocks", stats.free_blocks, free_count as u64),
            ("segments", stats.segments, self.segments.len() as u64),
            (
                "live = allocations - frees",
                stats.live_allocations,
                stats.allocations - stats.frees,
            ),
            (
                "segments = created - released",
                stats.segments,
                stats.segments_created - stats.segments_released,
            ),
        ];
        for (name, kept, recomputed) in pairs {
            if kept != recomputed {
                return Err(format!("stat {name}: kept {kept}, recomputed {recomputed}"));
            }
        }
        if stats.fragmentation != fragmentation(expected.free_bytes, largest) {
            return Err(format!("fragmentation {} is stale", stats.fragmentation));
        }
        if stats.peak_allocated_bytes < stats.allocated_bytes
            || stats.peak_reserved_bytes < stats.reserved_bytes
            || stats.peak_requested_bytes < stats.requested_bytes
        {
            return Err("a peak is below its current value".into());
        }
        for category in Category::ALL {
            let (kept, recomputed) = (stats.category(category), expected.category(category));
            if kept.allocated_bytes != recomputed.allocated_bytes
                || kept.live_allocations != recomputed.live_allocations
                || kept.peak_allocated_bytes < kept.allocated_bytes
            {
                return Err(format!(
                    "category {category}: kept {kept:?}, recomputed {recomputed:?}"
                ));
            }
        }
        for (entry, bytes) in self.labels.entries.iter().zip(label_bytes) {
            if entry.allocated_bytes != bytes || entry.peak_allocated_bytes < bytes {
                return Err(format!(
                    "label '{}': kept {}, recomputed {bytes}",
                    entry.name, entry.allocated_bytes
                ));
            }
        }
        Ok(())
    }

    /// Checks what only the live handles know, given every live handle of this allocator: each
    /// names a live used block with its segment, offset and size; each is its rounded request plus
    /// at most a remainder too small to split off; and the requested-byte statistics (total and
    /// per category) and the waste equal their sums over the handles. Meant for tests, beside
    /// [`Self::check_invariants`].
    ///
    /// # Errors
    /// A description of the first mismatch.
    #[doc(hidden)]
    pub fn check_handles(&self, live: &[crate::Allocation]) -> Result<(), String> {
        let granule = self.config.granule_bytes;
        let mut requested = 0u64;
        let mut per_category = [0u64; Category::ALL.len()];
        for allocation in live {
            let block = self
                .blocks
                .get(allocation.block)
                .filter(|block| {
                    block.is_used()
                        && block.word == allocation.id.0
                        && allocation.instance == self.instance
                })
                .ok_or(format!("{allocation:?} is not live"))?;
            let slot_id = self
                .segments
                .get(block.segment_slot())
                .map(|entry| entry.id);
            if slot_id != Some(allocation.segment)
                || self.bytes(block.offset) != allocation.offset
                || self.bytes(block.size) != allocation.size_bytes
                || block.category() != allocation.category
                || block.label() != allocation.label
            {
                return Err(format!("{allocation:?} disagrees with its block {block:?}"));
            }
            let rounded = allocation.requested_bytes.div_ceil(granule);
            let size = u64::from(block.size);
            if allocation.requested_bytes > allocation.size_bytes
                || splits_off(rounded, size - rounded)
            {
                return Err(format!(
                    "{allocation:?}: size {} for request {}",
                    allocation.size_bytes, allocation.requested_bytes
                ));
            }
            requested += allocation.requested_bytes;
            per_category[allocation.category.index()] += allocation.requested_bytes;
        }
        let stats = self.stats();
        if stats.requested_bytes != requested
            || stats.waste_bytes != stats.allocated_bytes - requested
            || stats.live_allocations != live.len() as u64
        {
            return Err(format!(
                "requested {} (handles say {requested}), waste {}, live {} (handles {})",
                stats.requested_bytes,
                stats.waste_bytes,
                stats.live_allocations,
                live.len()
            ));
        }
        for category in Category::ALL {
            let kept = stats.category(category).requested_bytes;
            if kept != per_category[category.index()] {
                return Err(format!(
                    "category {category}: requested {kept}, handles say {}",
                    per_category[category.index()]
                ));
            }
        }
        Ok(())
    }
}
