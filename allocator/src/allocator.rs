//! [`BufferAllocator`]: best fit over every free block, segment policy, budget, statistics.
//!
//! The segment policy (when segments are created and released) lives in `segment_policy.rs`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::block::{Block, BlockSlab, NIL, Used};
use crate::free_index::{Fit, FreeIndex, FreeKey, align_up};
use crate::segment_table::SegmentTable;
use crate::stats::LabelTable;
use crate::{
    AllocError, Allocation, AllocationId, AllocatorConfig, Request, Result, SegmentId,
    SegmentSource, Stats, Trace, TraceEvent, TraceEventKind,
};

/// A remainder of at least this many granules behind a placed block is split off as a free block;
/// a smaller one stays with the allocation (its usable size grows, and the extra bytes count as
/// internal waste in [`Stats::waste_bytes`]).
///
/// Trade-off: with every nonzero remainder split off, free blocks of one to three granules piled
/// up (about 450 of them at 10k live blocks) and their size classes cost most of the index work of
/// an allocate+free pair; keeping them whole cuts instructions per pair by about 9% and cache
/// misses by 12%, and wastes less than four granules (1 KiB at 256 B) per allocation, which is
/// returned on free. Alignment padding in front is always split off.
pub(crate) const MIN_SPLIT_REMAINDER_GRANULES: u64 = 4;

/// Gives each allocator a distinct id, so a handle from another allocator is recognised.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// A best-fit sub-allocator of the memory of segments that a [`SegmentSource`] provides.
/// See the crate documentation for the policy.
pub struct BufferAllocator<S: SegmentSource> {
    pub(crate) source: S,
    /// Normalised (see [`AllocatorConfig`]); `budget_bytes` changes with `set_budget`.
    pub(crate) config: AllocatorConfig,
    /// Distinct from every other allocator's; stamped on each [`Allocation`].
    pub(crate) instance: u64,
    /// Every live segment; each block names its segment's slot here.
    pub(crate) segments: SegmentTable<S::Segment>,
    /// `(shared, id)` of every segment with no used block; dedicated ones sort first.
    pub(crate) empty_segments: BTreeSet<(bool, SegmentId)>,
    pub(crate) blocks: BlockSlab,
    /// Exactly the free blocks of live segments.
    pub(crate) free: FreeIndex,
    pub(crate) labels: LabelTable,
    pub(crate) stats: Stats,
    pub(crate) trace: Trace,
    /// The next allocation's sequence number.
    next_sequence: u64,
    /// The next segment's id; ids are never reused.
    pub(crate) next_segment: u32,
}

impl<S: SegmentSource> BufferAllocator<S> {
    /// An allocator with no segments yet; `config` is normalised (see [`AllocatorConfig`]).
    pub fn new(source: S, config: AllocatorConfig) -> Self {
        let config = config.normalised();
        Self {
            source,
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            segments: SegmentTable::default(),
            empty_segments: BTreeSet::new(),
            blocks: BlockSlab::default(),
            free: FreeIndex::new(config.granule_bytes),
            config,
            labels: LabelTable::default(),
            stats: Stats::default(),
            trace: Trace::default(),
            next_sequence: 0,
            next_segment: 0,
        }
    }

    /// Hands out a block of at least `request.size_bytes` at an offset aligned to
    /// `request.alignment`: the best-fitting free block, or a new segment (see the module policy).
    ///
    /// # Errors
    /// [`AllocError::ZeroSize`], [`AllocError::BadAlignment`], [`AllocError::TooLarge`], or
    /// [`AllocError::OutOfMemory`] when neither a free block nor a new segment is possible.
    pub fn allocate(&mut self, request: Request<'_>) -> Result<Allocation> {
        let granule = self.config.granule_bytes;
        if request.size_bytes == 0 {
            return Err(AllocError::ZeroSize {
                category: request.category,
                label: request.label.to_owned(),
            });
        }
        let alignment = match request.alignment {
            0 | 1 => granule,
            alignment if alignment.is_power_of_two() => alignment.max(granule),
            alignment => {
                return Err(AllocError::BadAlignment {
                    alignment,
                    label: request.label.to_owned(),
                });
            }
        };
        let size_bytes = match request.size_bytes.checked_next_multiple_of(granule) {
            Some(size) if size <= self.config.max_segment_bytes => size,
            _ => {
                return Err(AllocError::TooLarge {
                    requested_bytes: request.size_bytes,
                    max_segment_bytes: self.config.max_segment_bytes,
                    label: request.label.to_owned(),
                });
            }
        };
        let fit = match self.free.best_fit(size_bytes, alignment) {
            Some(fit) if !self.would_waste_empty_dedicated(&fit.key, size_bytes) => fit,
            found => match self.grow(size_bytes, &request) {
                Ok(key) => Fit::of_key(key),
                // The source refused; the block that fitted is still there unless it was released.
                Err(error) => match found {
                    Some(fit) if self.free.contains(&fit.key) => fit,
                    _ => return Err(error),
                },
            },
        };
        Ok(self.place(fit, size_bytes, alignment, &request))
    }

    /// Gives a block back; it merges at once with free neighbours. The segment stays cached.
    ///
    /// # Errors
    /// [`AllocError::UnknownAllocation`] if `allocation` comes from another allocator or was
    /// already freed; nothing changes then.
    pub fn free(&mut self, allocation: Allocation) -> Result<()> {
        let mut index = allocation.block;
        let used = self.check_live(&allocation)?;
        let segment_id = self.blocks[index].segment;
        let segment_slot = self.blocks[index].segment_slot;
        let size_bytes = self.blocks[index].size_bytes;
        let offset = self.blocks[index].offset;
        self.blocks[index].used = None;
        self.stats
            .on_free(used.category, size_bytes, used.requested_bytes);
        self.labels.on_free(used.label, size_bytes);

        let prev = self.blocks[index].prev;
        if prev != NIL && self.blocks[prev].used.is_none() {
            self.free.remove(&FreeKey::of(prev, &self.blocks[prev]));
            self.absorb_next(prev);
            index = prev;
        }
        let next = self.blocks[index].next;
        if next != NIL && self.blocks[next].used.is_none() {
            self.free.remove(&FreeKey::of(next, &self.blocks[next]));
            self.absorb_next(index);
        }
        self.free.insert(FreeKey::of(index, &self.blocks[index]));

        if let Some(entry) = self.segments.get_mut(segment_slot) {
            entry.used_blocks -= 1;
            if entry.used_blocks == 0 {
                self.empty_segments.insert((entry.shared, segment_id));
            }
        }
        self.refresh_free_stats();
        let labels = &self.labels;
        self.trace.record(|event| TraceEvent {
            event,
            kind: TraceEventKind::Free,
            allocation: Some(allocation.id),
            segment: Some(segment_id),
            offset,
            size_bytes,
            category: Some(used.category),
            label: Some(labels.name(used.label).to_owned()),
        });
        Ok(())
    }

    /// Like [`BufferAllocator::free`], and marks the freed bytes with `tag` (the largest of it and
    /// the tag they already had). The allocator only keeps tags: a free block's tag is the largest
    /// over its bytes (merges take the larger, splits copy it), and each [`Allocation`] carries the
    /// tag of the bytes it got ([`Allocation::tag`]). kernels-wgsl tags with the serial of the last
    /// batch that used the bytes, so a new buffer knows whether unsubmitted work still touches them.
    ///
    /// # Errors
    /// As [`BufferAllocator::free`].
    pub fn free_with_tag(&mut self, allocation: Allocation, tag: u64) -> Result<()> {
        self.check_live(&allocation)?;
        let block = &mut self.blocks[allocation.block];
        block.tag = block.tag.max(tag);
        self.free(allocation)
    }

    /// The used block `allocation` names, if it is live and from this allocator.
    #[inline]
    fn check_live(&self, allocation: &Allocation) -> Result<Used> {
        match self
            .blocks
            .get(allocation.block)
            .and_then(|block| block.used)
        {
            Some(used)
                if used.sequence == allocation.id.0 && allocation.instance == self.instance =>
            {
                Ok(used)
            }
            _ => Err(AllocError::UnknownAllocation { id: allocation.id }),
        }
    }

    /// The source's handle of segment `id`, if it is live.
    pub fn segment(&self, id: SegmentId) -> Option<&S::Segment> {
        let slot = self.segments.slot_of(id)?;
        self.segments.get(slot).map(|entry| &entry.segment)
    }

    /// The segment source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The segment source, mutably (e.g. to reach the device it wraps).
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// The configuration in force (normalised).
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Changes the cap on reserved bytes. If reserved memory is above the new budget, empty cached
    /// segments are released; live blocks never move, so reserved memory may stay above the
    /// budget until they are freed (no new segment is created meanwhile).
    pub fn set_budget(&mut self, budget_bytes: u64) {
        self.config.budget_bytes = budget_bytes;
        if self.stats.reserved_bytes > budget_bytes {
            self.release_empty_segments(false);
        }
    }

    /// The cap on reserved bytes.
    pub fn budget_bytes(&self) -> u64 {
        self.config.budget_bytes
    }

    /// Releases every segment with no live block; returns the bytes released.
    pub fn empty_cache(&mut self) -> u64 {
        self.release_empty_segments(false)
    }

    /// The statistics (kept up to date by every operation).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Sets every peak (total, per category, per label) to the current value.
    pub fn reset_peaks(&mut self) {
        self.stats.reset_peaks();
        self.labels.reset_peaks();
    }

    /// The fraction of free bytes that lie in blocks large enough for a request of `size_bytes`
    /// (rounded to the granule, default alignment); 0 when nothing is free. O(log n + k) for k
    /// blocks that large.
    pub fn usable_fraction(&self, size_bytes: u64) -> f64 {
        let free_bytes = self.free.total_bytes();
        if free_bytes == 0 {
            return 0.0;
        }
        let size_bytes = size_bytes
            .max(1)
            .next_multiple_of(self.config.granule_bytes);
        self.free.bytes_in_blocks_of_at_least(size_bytes) as f64 / free_bytes as f64
    }

    /// The largest free block in reserved memory.
    pub fn largest_free_bytes(&self) -> u64 {
        self.stats.largest_free_bytes
    }

    /// `1 - largest free block / free bytes`; 0 when nothing is free.
    pub fn fragmentation(&self) -> f64 {
        self.stats.fragmentation
    }

    /// Sets how many events the trace keeps (oldest dropped first); 0 turns recording off.
    pub fn set_trace_capacity(&mut self, max_events: usize) {
        self.trace.set_capacity(max_events);
    }

    /// The recorded events.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Carves `size_bytes` at `alignment` out of the free block `fit` (best fit found it), splitting
    /// off alignment padding in front and any remainder behind as free blocks.
    pub(crate) fn place(
        &mut self,
        fit: Fit,
        size_bytes: u64,
        alignment: u64,
        request: &Request<'_>,
    ) -> Allocation {
        self.free.take(&fit);
        let key = fit.key;
        let mut index = key.block;
        let padding = align_up(key.offset, alignment) - key.offset;
        if padding > 0 {
            index = self.split_after(index, padding);
            let front = FreeKey::of(key.block, &self.blocks[key.block]);
            self.free.insert(front);
        }
        let remainder = self.blocks[index].size_bytes - size_bytes;
        if remainder >= MIN_SPLIT_REMAINDER_GRANULES * self.config.granule_bytes {
            let tail = self.split_after(index, size_bytes);
            self.free.insert(FreeKey::of(tail, &self.blocks[tail]));
        }
        let label = self.labels.intern(request.label);
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let block = &mut self.blocks[index];
        block.used = Some(Used {
            sequence,
            requested_bytes: request.size_bytes,
            label,
            category: request.category,
            alignment_log2: alignment.trailing_zeros() as u8,
        });
        let (segment, offset, usable_bytes) = (block.segment, block.offset, block.size_bytes);
        let tag = block.tag;
        if let Some(entry) = self.segments.get_mut(block.segment_slot) {
            if entry.used_blocks == 0 {
                self.empty_segments.remove(&(entry.shared, segment));
            }
            entry.used_blocks += 1;
        }
        self.stats
            .on_allocate(request.category, usable_bytes, request.size_bytes);
        self.labels.on_allocate(label, usable_bytes);
        self.refresh_free_stats();
        let id = AllocationId(sequence);
        self.trace.record(|event| TraceEvent {
            event,
            kind: TraceEventKind::Allocate,
            allocation: Some(id),
            segment: Some(segment),
            offset,
            size_bytes: usable_bytes,
            category: Some(request.category),
            label: Some(request.label.to_owned()),
        });
        Allocation {
            id,
            instance: self.instance,
            block: index,
            segment,
            offset,
            size_bytes: usable_bytes,
            requested_bytes: request.size_bytes,
            category: request.category,
            tag,
        }
    }

    /// Splits block `index` (not in the free index) so that it keeps its first `keep_bytes`;
    /// returns the slab index of the new block holding the rest (free, not yet indexed).
    #[inline]
    fn split_after(&mut self, index: u32, keep_bytes: u64) -> u32 {
        let block = &self.blocks[index];
        let rest = Block {
            segment: block.segment,
            segment_slot: block.segment_slot,
            offset: block.offset + keep_bytes,
            size_bytes: block.size_bytes - keep_bytes,
            prev: index,
            next: block.next,
            used: None,
            tag: block.tag,
        };
        let next = rest.next;
        let rest_index = self.blocks.insert(rest);
        if next != NIL {
            self.blocks[next].prev = rest_index;
        }
        let block = &mut self.blocks[index];
        block.size_bytes = keep_bytes;
        block.next = rest_index;
        self.stats.splits += 1;
        rest_index
    }

    /// Merges the block after `index` into it (both out of the free index) and frees its slot.
    #[inline]
    fn absorb_next(&mut self, index: u32) {
        let next = self.blocks[index].next;
        let after = self.blocks[next].next;
        self.blocks[index].size_bytes += self.blocks[next].size_bytes;
        self.blocks[index].tag = self.blocks[index].tag.max(self.blocks[next].tag);
        self.blocks[index].next = after;
        if after != NIL {
            self.blocks[after].prev = index;
        }
        self.blocks.remove(next);
        self.stats.merges += 1;
    }

    pub(crate) fn refresh_free_stats(&mut self) {
        self.stats.largest_free_bytes = self.free.largest_bytes();
        self.stats.free_blocks = self.free.len() as u64;
        self.stats.refresh_fragmentation();
    }
}
