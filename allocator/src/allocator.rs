//! [`BufferAllocator`]: best fit over every free block, segment policy, budget, statistics.
//!
//! The segment policy (when segments are created and released) lives in `segment_policy.rs`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::block::{BlockSlab, NIL};
use crate::free_index::{Fit, FreeIndex, align_up};
use crate::segment_table::SegmentTable;
use crate::stats::LabelTable;
use crate::{
    AllocError, Allocation, AllocationId, AllocatorConfig, Request, Result, SegmentId,
    SegmentSource, Stats, Trace, TraceEvent, TraceEventKind,
};

/// The remainder behind a placed block of `size` granules is split off as a free block when it is
/// at least `MIN_SPLIT_REMAINDER_GRANULES` and at least `size >> KEPT_REMAINDER_SHIFT` (1/16 of
/// the placed size); a smaller one stays with the allocation (its usable size grows, and the extra
/// bytes count as internal waste in [`Stats::waste_bytes`] until the block is freed). Alignment
/// padding in front is always split off.
///
/// Trade-off, measured with `cargo xtask bench allocator` (10k live blocks, sizes log-uniform
/// 256 B to 4 MiB): with every remainder split off, slivers pile up as free blocks and cost most of
/// the index work of an allocate+free pair. Splitting only remainders of four granules or more took
/// the pair from 171 to about 145 ns; adding the 1/16 rule took it to about 115 ns and cut free
/// blocks at steady state from 1,855 to 541, with waste at 1.4% of allocated bytes and reserved
/// over requested bytes falling from 1.18 to 1.09 (fewer slivers strand less memory). The cost is
/// at most 1/16 of an allocation's size (plus under four granules) held as waste while it lives,
/// the rounding that TLSF-style allocators accept too.
pub(crate) const MIN_SPLIT_REMAINDER_GRANULES: u64 = 4;

/// See [`MIN_SPLIT_REMAINDER_GRANULES`]: remainders under `size >> KEPT_REMAINDER_SHIFT` stay.
pub(crate) const KEPT_REMAINDER_SHIFT: u32 = 4;

/// Whether a remainder of `remainder` granules behind a placed block of `size` granules is split
/// off (see [`MIN_SPLIT_REMAINDER_GRANULES`]).
#[inline]
pub(crate) fn splits_off(size: u64, remainder: u64) -> bool {
    remainder >= MIN_SPLIT_REMAINDER_GRANULES.max(size >> KEPT_REMAINDER_SHIFT)
}

/// Gives each allocator a distinct id, so a handle from another allocator is recognised.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// A best-fit sub-allocator of the memory of segments that a [`SegmentSource`] provides.
/// See the crate documentation for the policy.
pub struct BufferAllocator<S: SegmentSource> {
    pub(crate) source: S,
    /// Normalised (see [`AllocatorConfig`]); `budget_bytes` changes with `set_budget`.
    pub(crate) config: AllocatorConfig,
    /// log2 of `config.granule_bytes`: blocks count in granules, statistics in bytes.
    pub(crate) granule_log2: u32,
    /// Distinct from every other allocator's; stamped on each [`Allocation`].
    pub(crate) instance: u64,
    /// Every live segment; each block names its segment's slot here.
    pub(crate) segments: SegmentTable<S::Segment>,
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
    /// Planned steps (`step_plan.rs`), when on.
    pub(crate) planner: Option<Box<crate::step_plan::StepPlanner>>,
    /// The most bytes ever reserved (never reset): empty segments stay cached while the
    /// reserved bytes, with a new segment, stay within it (`segment_policy.rs`).
    pub(crate) high_water_bytes: u64,
}

impl<S: SegmentSource> BufferAllocator<S> {
    /// An allocator with no segments yet; `config` is normalised (see [`AllocatorConfig`]).
    pub fn new(source: S, config: AllocatorConfig) -> Self {
        let config = config.normalised();
        Self {
            source,
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            segments: SegmentTable::default(),
            blocks: BlockSlab::default(),
            free: FreeIndex::default(),
            granule_log2: config.granule_bytes.trailing_zeros(),
            config,
            labels: LabelTable::default(),
            stats: Stats::default(),
            trace: Trace::default(),
            next_sequence: 0,
            next_segment: 0,
            planner: None,
            high_water_bytes: 0,
        }
    }

    /// The error [`BufferAllocator::allocate`] gives for `request` when the budget is full,
    /// counted and traced as one, without allocating: how fault injection makes an allocation
    /// fail exactly as a real one does.
    pub fn refuse(&mut self, request: &Request<'_>) -> AllocError {
        self.out_of_memory(request, crate::OomCause::BudgetFull)
    }

    /// Hands out a block of at least `request.size_bytes` at an offset aligned to
    /// `request.alignment`: the best-fitting free block, or a new segment (see the module policy).
    ///
    /// # Errors
    /// [`AllocError::ZeroSize`], [`AllocError::BadAlignment`], [`AllocError::TooLarge`], or
    /// [`AllocError::OutOfMemory`] when neither a free block nor a new segment is possible.
    pub fn allocate(&mut self, request: Request<'_>) -> Result<Allocation> {
        let granule = self.config.granule_bytes;
        // One test for the three ways a request is malformed: a size of 0 (which wraps), a size
        // above the largest segment, an alignment that is not 0, 1 or a power of two. `reject`
        // says which.
        if request.size_bytes.wrapping_sub(1) >= self.config.max_segment_bytes
            || request.alignment & request.alignment.wrapping_sub(1) != 0
        {
            return Err(self.reject(&request));
        }
        let alignment = request.alignment.max(granule);
        // The granule is a power of two and `max_segment_bytes` a multiple of it (see
        // `AllocatorConfig`), so rounding with a mask cannot overflow or pass the largest segment.
        let size_bytes = (request.size_bytes + (granule - 1)) & !(granule - 1);
        // `max_segment_bytes` holds at most `u32::MAX` granules (see `AllocatorConfig`).
        let size = self.granules(size_bytes);
        // At least one: the alignment is at least the granule.
        let alignment_granules = self.granules(alignment);
        if self.planner.is_some() {
            return self.allocate_planning(size, alignment, alignment_granules, &request);
        }
        self.allocate_best_fit(size, size_bytes, alignment, alignment_granules, &request)
    }

    /// [`BufferAllocator::allocate`] while planned steps are on: the planned offset when the step
    /// replays a plan, best fit otherwise, and the request recorded either way.
    #[inline(never)]
    fn allocate_planning(
        &mut self,
        size: u32,
        alignment: u64,
        alignment_granules: u32,
        request: &Request<'_>,
    ) -> Result<Allocation> {
        let allocation = match self.replay(size, alignment, alignment_granules, request) {
            Some(allocation) => allocation,
            None => {
                let size_bytes = self.bytes(size);
                let own =
                    self.allocate_in_own_segment(size, alignment, alignment_granules, request);
                match own {
                    Some(allocation) => allocation,
                    None => self.allocate_best_fit(
                        size,
                        size_bytes,
                        alignment,
                        alignment_granules,
                        request,
                    )?,
                }
            }
        };
        if let Some(planner) = self.planner.as_mut() {
            planner.on_allocate(&allocation, size, alignment_granules);
        }
        Ok(allocation)
    }

    /// Best fit for `size` granules (`size_bytes`) at `alignment`, or a new segment.
    #[inline]
    pub(crate) fn allocate_best_fit(
        &mut self,
        size: u32,
        size_bytes: u64,
        alignment: u64,
        alignment_granules: u32,
        request: &Request<'_>,
    ) -> Result<Allocation> {
        let found = self.free.best_fit(size, alignment_granules);
        let fit = match found {
            Some(fit) if !self.would_waste_empty_dedicated(fit, size_bytes) => fit,
            found => match self.grow(size_bytes, request) {
                Ok(index) => Fit {
                    index,
                    size: self.blocks[index].size,
                },
                // The source refused; the block that fitted is still there unless it was released.
                Err(error) => match found {
                    Some(fit) if self.free.contains(fit.index, &self.blocks) => fit,
                    _ => return Err(error),
                },
            },
        };
        Ok(self.place(fit, size, alignment, alignment_granules, request))
    }

    /// The error for a request that `allocate` refused as malformed.
    #[cold]
    #[inline(never)]
    fn reject(&self, request: &Request<'_>) -> AllocError {
        let label = request.label.to_owned();
        if request.size_bytes == 0 {
            AllocError::ZeroSize {
                category: request.category,
                label,
            }
        } else if !(request.alignment <= 1 || request.alignment.is_power_of_two()) {
            AllocError::BadAlignment {
                alignment: request.alignment,
                label,
            }
        } else {
            AllocError::TooLarge {
                requested_bytes: request.size_bytes,
                max_segment_bytes: self.config.max_segment_bytes,
                label,
            }
        }
    }

    /// `bytes` (a multiple of the granule, at most `max_segment_bytes`) in granules.
    #[inline]
    pub(crate) fn granules(&self, bytes: u64) -> u32 {
        (bytes >> self.granule_log2) as u32
    }

    /// `granules` in bytes.
    #[inline]
    pub(crate) fn bytes(&self, granules: u32) -> u64 {
        u64::from(granules) << self.granule_log2
    }

    /// Gives a block back; it merges at once with free neighbours. The segment stays cached.
    ///
    /// # Errors
    /// [`AllocError::UnknownAllocation`] if `allocation` comes from another allocator or was
    /// already freed; nothing changes then.
    pub fn free(&mut self, allocation: Allocation) -> Result<()> {
        self.free_tagged(allocation, 0)
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
        self.free_tagged(allocation, tag)
    }

    /// Frees `allocation`; its bytes get the larger of `tag` and the tag they had when allocated.
    #[inline]
    fn free_tagged(&mut self, allocation: Allocation, tag: u64) -> Result<()> {
        let mut index = allocation.block;
        let instance = self.instance;
        let Some(block) = self.blocks.get_mut(index).filter(|block| {
            block.is_used() && block.word == allocation.id.0 && allocation.instance == instance
        }) else {
            return Err(AllocError::UnknownAllocation { id: allocation.id });
        };
        // The handle is genuine (its sequence number matches the used block), so its category,
        // label and requested size are the ones recorded when it was allocated.
        let segment_slot = block.segment_slot();
        // A used block keeps its label where a free one keeps its segment id: the handle says
        // which segment it is in.
        let segment_id = allocation.segment;
        let (offset, size) = (block.offset, block.size);
        block.set_free(segment_id, tag.max(allocation.tag));
        if let Some(planner) = self.planner.as_mut() {
            planner.on_free(allocation.id);
        }
        let size_bytes = self.bytes(size);
        self.stats
            .on_free(allocation.category, size_bytes, allocation.requested_bytes);
        self.labels.on_free(allocation.label, size_bytes);

        // Both neighbours are read before either merge, so their cache misses overlap.
        let (prev, next) = (self.blocks[index].prev, self.blocks[index].next);
        let prev_free = prev != NIL && !self.blocks[prev].is_used();
        let next_free = next != NIL && !self.blocks[next].is_used();
        if next_free {
            self.free.remove(next, &self.blocks);
            self.absorb_next(index);
        }
        if prev_free {
            self.free.remove(prev, &self.blocks);
            self.absorb_next(prev);
            index = prev;
        }
        self.free.insert(index, &self.blocks);
        // A segment is empty exactly when one free block spans it, so only the free that empties
        // it reads its entry.
        let merged = &self.blocks[index];
        // Both links are `NIL` (all ones) exactly when their AND is: one branch, not two.
        if merged.prev & merged.next == NIL {
            self.segments.list_empty(segment_slot);
        }
        let labels = &self.labels;
        let offset = u64::from(offset) << self.granule_log2;
        self.trace.record(|event| TraceEvent {
            event,
            kind: TraceEventKind::Free,
            allocation: Some(allocation.id),
            segment: Some(segment_id),
            offset,
            size_bytes,
            category: Some(allocation.category),
            label: Some(labels.name(allocation.label).to_owned()),
            time_ns: 0,
            step: 0,
            phase: crate::Phase::Other,
        });
        Ok(())
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

    /// Releases every segment with no live block, and lowers the high-water mark within which
    /// empty segments stay cached to what stays reserved (`segment_policy.rs`: from here the
    /// allocator caches as a fresh one holding these segments would); returns the bytes
    /// released.
    pub fn empty_cache(&mut self) -> u64 {
        let released = self.release_empty_segments(false);
        self.high_water_bytes = self.stats.reserved_bytes;
        released
    }

    /// The high-water mark: the most bytes reserved since the allocator was made or its cache
    /// last emptied ([`BufferAllocator::empty_cache`]). Empty segments stay cached while a new
    /// segment would keep reserved bytes within it.
    pub fn high_water_bytes(&self) -> u64 {
        self.high_water_bytes
    }

    /// The statistics: counters kept by every operation, and the free-memory figures derived now
    /// from them and the free index (all O(1)).
    pub fn stats(&self) -> Stats {
        self.stats
            .with_free_fields(self.largest_free_bytes(), self.free.len() as u64)
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
        let free_bytes = self.free.total() << self.granule_log2;
        if free_bytes == 0 {
            return 0.0;
        }
        let granule = self.config.granule_bytes;
        let size = size_bytes.max(1).div_ceil(granule);
        let Ok(size) = u32::try_from(size) else {
            return 0.0;
        };
        let usable = self.free.granules_in_blocks_of_at_least(size) << self.granule_log2;
        usable as f64 / free_bytes as f64
    }

    /// The largest free block in reserved memory.
    pub fn largest_free_bytes(&self) -> u64 {
        self.bytes(self.free.largest())
    }

    /// `1 - largest free block / free bytes`; 0 when nothing is free.
    pub fn fragmentation(&self) -> f64 {
        crate::stats::fragmentation(self.free_bytes(), self.largest_free_bytes())
    }

    /// Free bytes inside reserved segments.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.stats.reserved_bytes - self.stats.allocated_bytes
    }

    /// Sets how many events the trace keeps (oldest dropped first); 0 turns recording off.
    pub fn set_trace_capacity(&mut self, max_events: usize) {
        self.trace.set_capacity(max_events);
    }

    /// The recorded events.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Enters `phase` of training step `step`: from now on allocations count towards that
    /// phase's peaks ([`Stats::phases`]) and trace events carry the step and phase. Recorded in
    /// the trace as a [`TraceEventKind::Phase`] event.
    pub fn set_phase(&mut self, step: u64, phase: crate::Phase) {
        self.stats.enter_phase(phase);
        self.trace.set_context(step, phase);
        self.trace.record(|event| TraceEvent {
            event,
            kind: TraceEventKind::Phase,
            allocation: None,
            segment: None,
            offset: 0,
            size_bytes: 0,
            category: None,
            label: Some(phase.name().to_owned()),
            time_ns: 0,
            step,
            phase,
        });
    }

    /// Records `note` in the trace (a [`TraceEventKind::Mark`]), e.g. "recovered: micro-batch 64
    /// -> 32"; nothing when recording is off.
    pub fn mark(&mut self, note: &str) {
        self.trace.record(|event| TraceEvent {
            event,
            kind: TraceEventKind::Mark,
            allocation: None,
            segment: None,
            offset: 0,
            size_bytes: 0,
            category: None,
            label: Some(note.to_owned()),
            time_ns: 0,
            step: 0,
            phase: crate::Phase::Other,
        });
    }

    /// Carves `size` granules at `alignment` bytes out of free block `fit` (best fit found it),
    /// splitting off alignment padding in front and any remainder behind as free blocks.
    pub(crate) fn place(
        &mut self,
        fit: Fit,
        size: u32,
        alignment: u64,
        alignment_granules: u32,
        request: &Request<'_>,
    ) -> Allocation {
        self.free.take(fit, &self.blocks);
        let mut index = fit.index;
        // A free block that spans its segment is the segment's only block: the segment was empty.
        let spanned_segment = self.blocks[index].prev & self.blocks[index].next == NIL;
        let offset = self.blocks[index].offset;
        let padding =
            (align_up(u64::from(offset), u64::from(alignment_granules)) - u64::from(offset)) as u32;
        if padding > 0 {
            let front = index;
            index = self.split_after(front, padding);
            self.free.insert(front, &self.blocks);
        }
        let remainder = self.blocks[index].size - size;
        if splits_off(u64::from(size), u64::from(remainder)) {
            let tail = self.split_after(index, size);
            self.free.insert(tail, &self.blocks);
        }
        self.mark_used(index, spanned_segment, alignment, request)
    }

    /// Makes block `index` (carved out of the free index, its remainders already split off) the
    /// used block of `request`: statistics, label, trace, and the handle. `spanned_segment` says
    /// whether the block it came from was its segment's only block (the segment was empty).
    pub(crate) fn mark_used(
        &mut self,
        index: u32,
        spanned_segment: bool,
        alignment: u64,
        request: &Request<'_>,
    ) -> Allocation {
        let label = self.labels.intern(request.label);
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let block = &mut self.blocks[index];
        let tag = block.word;
        let (segment, segment_slot) = (block.segment(), block.segment_slot());
        block.set_used(
            sequence,
            label,
            request.category,
            alignment.trailing_zeros(),
        );
        let (offset, usable) = (block.offset, block.size);
        if spanned_segment {
            self.segments.unlist_empty(segment_slot);
        }
        let (offset, usable_bytes) = (self.bytes(offset), self.bytes(usable));
        self.stats
            .on_allocate(request.category, usable_bytes, request.size_bytes);
        self.labels.on_allocate(label, usable_bytes);
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
            time_ns: 0,
            step: 0,
            phase: crate::Phase::Other,
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
            label,
            tag,
        }
    }

    /// Splits block `index` (not in the free index) so that it keeps its first `keep` granules;
    /// returns the slab index of the new block holding the rest (free, not yet indexed).
    #[inline]
    pub(crate) fn split_after(&mut self, index: u32, keep: u32) -> u32 {
        let block = &self.blocks[index];
        let mut rest = *block;
        rest.offset = block.offset + keep;
        rest.size = block.size - keep;
        rest.prev = index;
        // A free block's tag is copied; a used one would carry its sequence number, but only free
        // blocks are split.
        rest.set_free(block.segment(), block.word);
        let next = rest.next;
        let rest_index = self.blocks.insert(rest);
        if next != NIL {
            self.blocks[next].prev = rest_index;
        }
        let block = &mut self.blocks[index];
        block.size = keep;
        block.next = rest_index;
        self.stats.splits += 1;
        rest_index
    }

    /// Merges the block after `index` into it (both free and out of the free index) and frees its
    /// slot; the merged block keeps the larger tag.
    #[inline]
    fn absorb_next(&mut self, index: u32) {
        let next = self.blocks[index].next;
        let absorbed = self.blocks[next];
        let after = absorbed.next;
        let block = &mut self.blocks[index];
        block.size += absorbed.size;
        block.word = block.word.max(absorbed.word);
        block.next = after;
        if after != NIL {
            self.blocks[after].prev = index;
        }
        self.blocks.remove(next);
        self.stats.merges += 1;
    }
}
