//! Planned steps: record a training step's allocations, place them offline
//! ([`crate::arena_plan`]), and replay the placement on the steps that follow, so that each
//! allocation of a repeating step lands at an offset chosen with every lifetime known: no
//! fragmentation, and reserved memory close to the most bytes the step ever has live.
//!
//! The mechanism, in order:
//! - [`BufferAllocator::set_step_planning`] turns it on. From then on the caller brackets each
//!   step with [`BufferAllocator::begin_step`] and [`BufferAllocator::end_step`]; the allocator
//!   records the step's requests (size, alignment, category) and their lifetimes in events.
//! - When a step's requests equal the previous step's (the shape has become the normal one) and
//!   no plan for that shape is installed, `end_step` builds a plan at that quiet point: it first
//!   releases empty segments, then places the step's blocks into the free ranges of the segments
//!   that remain and, for what does not fit there, into one new *arena* segment; the segments a
//!   plan uses are pinned (never released as empty) while it is installed.
//! - Replaying, the k-th request of a step takes the k-th planned offset, found by walking the
//!   segment's blocks in address order and split out exactly; a block that an allocation outliving
//!   the plan's assumptions still covers is not touched, and that one request falls back to best
//!   fit. A request that differs from the plan (the last partial batch, a halved micro-batch)
//!   makes the rest of the step *depart*: it all goes to best fit, which also uses the free space
//!   of the planned segments. Two equal departing steps in a row become the new plan.
//! - Replayed blocks are ordinary blocks: statistics, traces, snapshots and the host/GPU ordering
//!   tag (a block takes the tag of the free block it is carved from) are the same as best fit's.
//!
//! Allocations made outside `begin_step`/`end_step` (model construction, evaluation) are neither
//! recorded nor planned.

use std::collections::HashMap;

use crate::arena_plan::{self, Lifetime, Region, STEP_END};
use crate::block::NIL;
use crate::stats::FxBuild;
use crate::{
    Allocation, AllocationId, BufferAllocator, Category, Request, SegmentId, SegmentSource,
};

/// One request as the plan matches it: rounded size and alignment in granules, category.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    size: u32,
    alignment: u32,
    category: Category,
}

/// A planned request: its shape and where it goes.
#[derive(Clone, Copy, Debug)]
struct Planned {
    shape: Shape,
    /// `None`: best fit (a block that outlives the step while its previous step's twin is still
    /// live when it is allocated, so no one offset serves every step).
    segment: Option<SegmentId>,
    /// In granules.
    offset: u32,
}

/// What a step asked for, in order, with each block's lifetime in the step's events.
#[derive(Debug, Default)]
struct Recording {
    shapes: Vec<Shape>,
    lifetimes: Vec<Lifetime>,
    /// The allocations of this step that are still live, by id, with their index.
    live: HashMap<AllocationId, usize, FxBuild>,
    /// Allocations and frees so far.
    events: u32,
    /// `(request index, event)`: when the block that the previous step's request of that index
    /// allocated, and that outlived it, was freed in this step.
    twins_freed: Vec<(usize, u32)>,
}

/// The counters of planned steps, for reports and the bench.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StepPlanStats {
    /// Plans built (a new plan replaces the one before).
    pub plans_built: u64,
    /// Steps whose every request took its planned offset.
    pub steps_replayed: u64,
    /// Steps with a request that differed from the plan (the rest of such a step used best fit).
    pub steps_departed: u64,
    /// Requests that took their planned offset.
    pub placed: u64,
    /// Requests that matched the plan but found their offset still covered, and used best fit.
    pub fell_back: u64,
    /// The installed plan's new arena segment, in bytes (0: none, or no plan).
    pub arena_bytes: u64,
    /// The installed plan's requests.
    pub planned_requests: u64,
    /// The installed plan's most bytes live at once over the step's requests (the lower bound of
    /// any placement of them).
    pub planned_max_live_bytes: u64,
}

/// How a step ended, as [`BufferAllocator::end_step`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// Planning is off, or the step was outside `begin_step`.
    NotPlanning,
    /// No plan yet (or the step differs from the plan); the step was recorded.
    Recorded,
    /// Every request took its planned offset except `fell_back` of them.
    Replayed {
        /// Requests that used best fit because their planned bytes were still covered.
        fell_back: u64,
    },
    /// The step's request number `at` differed from the plan; the rest used best fit.
    Departed {
        /// Index of the first request that differed.
        at: u64,
    },
    /// A plan was built from this step and is installed for the next.
    Planned {
        /// The new arena segment's size in bytes (0: the existing free ranges held everything).
        arena_bytes: u64,
        /// The most bytes the step's requests have live at once.
        max_live_bytes: u64,
    },
    /// A plan was built but its arena could not be created (budget or device); best fit goes on.
    ArenaRefused {
        /// The arena the plan needed, in bytes.
        arena_bytes: u64,
    },
}

/// The state of planned steps (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct StepPlanner {
    /// Inside `begin_step` .. `end_step`.
    in_step: bool,
    recording: Recording,
    /// The previous step's shapes (to see a shape repeat).
    previous: Vec<Shape>,
    /// The previous step's blocks that outlived it, by id, with their request index.
    survivors: HashMap<AllocationId, usize, FxBuild>,
    /// The shapes of the last step whose plan's arena was refused: not planned again (each try
    /// releases the cached segments), until the steps change shape.
    refused: Vec<Shape>,
    plan: Vec<Planned>,
    /// Segments pinned by the installed plan.
    pinned: Vec<SegmentId>,
    /// The next request's index in the step.
    cursor: usize,
    departed_at: Option<usize>,
    fell_back: u64,
    stats: StepPlanStats,
}

impl StepPlanner {
    /// Called for every allocation of the allocator while planning is on.
    pub(crate) fn on_allocate(&mut self, allocation: &Allocation, shape_size: u32, alignment: u32) {
        if !self.in_step {
            return;
        }
        let recording = &mut self.recording;
        let index = recording.shapes.len();
        recording.shapes.push(Shape {
            size: shape_size,
            alignment,
            category: allocation.category,
        });
        recording.lifetimes.push(Lifetime {
            size: u64::from(shape_size),
            alignment: u64::from(alignment),
            start: recording.events,
            end: STEP_END,
        });
        recording.live.insert(allocation.id, index);
        recording.events += 1;
    }

    /// Called for every free while planning is on.
    pub(crate) fn on_free(&mut self, id: AllocationId) {
        if !self.in_step {
            return;
        }
        let recording = &mut self.recording;
        if let Some(index) = recording.live.remove(&id) {
            recording.lifetimes[index].end = recording.events;
        } else if let Some(index) = self.survivors.remove(&id) {
            recording.twins_freed.push((index, recording.events));
        }
        recording.events += 1;
    }
}

impl<S: SegmentSource> BufferAllocator<S> {
    /// Turns planned steps on or off (see the module documentation). Either way the installed
    /// plan (if any) is dropped and its segments unpinned, and what was recorded is forgotten:
    /// on starts afresh, as a new run should.
    pub fn set_step_planning(&mut self, on: bool) {
        self.clear_step_plan();
        self.planner = on.then(Box::default);
    }

    /// Whether planned steps are on.
    pub fn step_planning(&self) -> bool {
        self.planner.is_some()
    }

    /// The counters of planned steps (all zero when planning is off).
    pub fn step_plan_stats(&self) -> StepPlanStats {
        self.planner
            .as_ref()
            .map(|planner| planner.stats)
            .unwrap_or_default()
    }

    /// Drops the installed plan (if any) and unpins its segments; recording goes on, so the plan
    /// is rebuilt once a step shape repeats. The trainer calls this before retrying a step that
    /// ran out of memory, so that an empty arena can be released for the retry.
    pub fn clear_step_plan(&mut self) {
        let Some(planner) = self.planner.as_mut() else {
            return;
        };
        planner.plan.clear();
        planner.stats.arena_bytes = 0;
        planner.stats.planned_requests = 0;
        planner.stats.planned_max_live_bytes = 0;
        let pinned = std::mem::take(&mut planner.pinned);
        for id in pinned {
            self.unpin_segment(id);
        }
    }

    /// Starts a step: its requests are recorded and, with a plan installed, replayed. With a plan
    /// installed, empty segments it does not use (left by an evaluation between steps) are
    /// released first: the plan has room for the whole step.
    pub fn begin_step(&mut self) {
        let Some(planner) = self.planner.as_mut() else {
            return;
        };
        if !planner.plan.is_empty() {
            self.release_empty_segments(false);
        }
        let Some(planner) = self.planner.as_mut() else {
            return;
        };
        planner.in_step = true;
        planner.recording = Recording::default();
        planner.cursor = 0;
        planner.departed_at = None;
        planner.fell_back = 0;
    }

    /// Ends a step begun with [`BufferAllocator::begin_step`]: counts it, and builds a plan from
    /// it when its shape repeats the previous step's and no plan for it is installed. Call it
    /// where nothing of the step is live any more but what outlives every step.
    pub fn end_step(&mut self) -> StepOutcome {
        let Some(planner) = self.planner.as_mut().filter(|planner| planner.in_step) else {
            return StepOutcome::NotPlanning;
        };
        planner.in_step = false;
        let mut recording = std::mem::take(&mut planner.recording);
        planner.survivors = std::mem::take(&mut recording.live).into_iter().collect();
        let matches_plan = !planner.plan.is_empty()
            && planner.departed_at.is_none()
            && planner.cursor == planner.plan.len();
        let outcome = if matches_plan {
            planner.stats.steps_replayed += 1;
            StepOutcome::Replayed {
                fell_back: planner.fell_back,
            }
        } else if let Some(at) = planner.departed_at.or_else(|| {
            (!planner.plan.is_empty()).then_some(planner.cursor.min(planner.plan.len()))
        }) {
            planner.stats.steps_departed += 1;
            StepOutcome::Departed { at: at as u64 }
        } else {
            StepOutcome::Recorded
        };
        let repeats = recording.shapes == planner.previous && !recording.shapes.is_empty();
        let replan = repeats && !matches_plan && recording.shapes != planner.refused;
        planner.previous = recording.shapes.clone();
        if replan {
            return self.build_plan(&recording);
        }
        outcome
    }

    /// Places `recording` and installs the plan (see the module documentation).
    fn build_plan(&mut self, recording: &Recording) -> StepOutcome {
        self.clear_step_plan();
        self.release_empty_segments(false);
        // The free ranges of the segments that remain, in granules.
        let mut regions = Vec::new();
        let mut region_segments = Vec::new();
        for (_, entry) in self.segments.iter() {
            let mut index = entry.first_block;
            while index != NIL {
                let block = &self.blocks[index];
                if !block.is_used() {
                    regions.push(Region {
                        start: u64::from(block.offset),
                        size: u64::from(block.size),
                    });
                    region_segments.push(entry.id);
                }
                index = block.next;
            }
        }
        // A block that outlives the step holds its offset over the whole next step too, until its
        // twin of that step is allocated there: planned from event 0 when the previous twin was
        // freed before it is allocated, left to best fit otherwise.
        let mut lifetimes = Vec::with_capacity(recording.lifetimes.len());
        let mut planned_index = Vec::with_capacity(recording.lifetimes.len());
        for (index, lifetime) in recording.lifetimes.iter().enumerate() {
            let mut lifetime = *lifetime;
            if lifetime.end == STEP_END {
                let twin_freed = recording
                    .twins_freed
                    .iter()
                    .find(|&&(twin, _)| twin == index)
                    .map(|&(_, event)| event);
                if twin_freed.is_none_or(|event| event > lifetime.start) {
                    planned_index.push(None);
                    continue;
                }
                lifetime.start = 0;
            }
            planned_index.push(Some(lifetimes.len()));
            lifetimes.push(lifetime);
        }
        let placement = arena_plan::place(&lifetimes, &regions);
        let arena_bytes = placement.arena_size << self.granule_log2;
        let arena = if arena_bytes == 0 {
            None
        } else {
            match self.create_planned_segment(arena_bytes) {
                Some(id) => Some(id),
                None => {
                    if let Some(planner) = self.planner.as_mut() {
                        planner.refused = recording.shapes.clone();
                    }
                    return StepOutcome::ArenaRefused { arena_bytes };
                }
            }
        };
        let mut plan = Vec::with_capacity(recording.shapes.len());
        let mut pinned = Vec::new();
        for (shape, planned) in recording.shapes.iter().zip(&planned_index) {
            let spot = planned.and_then(|index| placement.placements.get(index));
            let (segment, offset) = match (spot, arena) {
                (Some(spot), _) => match (spot.region, arena) {
                    (Some(region), _) => (Some(region_segments[region]), spot.offset),
                    (None, arena) => (arena, spot.offset),
                },
                (None, _) => (None, 0),
            };
            if let Some(segment) = segment
                && !pinned.contains(&segment)
            {
                pinned.push(segment);
            }
            plan.push(Planned {
                shape: *shape,
                segment,
                offset: offset as u32,
            });
        }
        for &id in &pinned {
            self.pin_segment(id);
        }
        let max_live_bytes = placement.max_live << self.granule_log2;
        let Some(planner) = self.planner.as_mut() else {
            return StepOutcome::NotPlanning;
        };
        planner.stats.plans_built += 1;
        planner.stats.arena_bytes = arena_bytes;
        planner.stats.planned_requests = plan.len() as u64;
        planner.stats.planned_max_live_bytes = max_live_bytes;
        planner.plan = plan;
        planner.pinned = pinned;
        StepOutcome::Planned {
            arena_bytes,
            max_live_bytes,
        }
    }

    /// While planning: a parameter or optimizer-state request gets a segment of its own, of
    /// exactly its size (`None`: another category, or the budget or the source refused, and best
    /// fit goes on). Why: such blocks outlive every step, and a plan cannot move them; in a
    /// shared segment, beside a step's blocks, they would leave holes that every later step's
    /// plan must work around (on mlp-bench, 2.9 MB of slack that no placement could fill).
    pub(crate) fn allocate_in_own_segment(
        &mut self,
        size: u32,
        alignment: u64,
        alignment_granules: u32,
        request: &Request<'_>,
    ) -> Option<Allocation> {
        if !matches!(
            request.category,
            Category::Parameter | Category::OptimizerState
        ) {
            return None;
        }
        let size_bytes = self.bytes(size);
        let id = self.create_planned_segment(size_bytes)?;
        let slot = self.segments.slot_of(id)?;
        let index = self.segments.get(slot)?.first_block;
        let fit = crate::free_index::Fit { index, size };
        Some(self.place(fit, size, alignment, alignment_granules, request))
    }

    /// Creates a segment of `size_bytes` (the plan's arena, or a persistent block's own) within the
    /// budget; `None` if the budget or the source refuses (nothing changes then).
    fn create_planned_segment(&mut self, size_bytes: u64) -> Option<SegmentId> {
        let fits = self
            .stats
            .reserved_bytes
            .checked_add(size_bytes)
            .is_some_and(|total| total <= self.config.budget_bytes);
        if !fits
            || size_bytes > self.config.max_segment_bytes
            || self.segments.len() >= crate::block::MAX_SEGMENT_SLOTS as usize
        {
            return None;
        }
        let id = SegmentId(self.next_segment);
        let segment = self.source.create_segment(id, size_bytes).ok()?;
        self.next_segment += 1;
        self.add_segment(id, segment, size_bytes, false);
        Some(id)
    }

    fn pin_segment(&mut self, id: SegmentId) {
        if let Some(slot) = self.segments.slot_of(id) {
            self.segments.set_pinned(slot, true);
        }
    }

    fn unpin_segment(&mut self, id: SegmentId) {
        let Some(slot) = self.segments.slot_of(id) else {
            return;
        };
        self.segments.set_pinned(slot, false);
        let first = self.segments.get(slot).map(|entry| entry.first_block);
        if let Some(first) = first {
            let block = &self.blocks[first];
            if !block.is_used() && block.next == NIL {
                self.segments.list_empty(slot);
            }
        }
    }

    /// The planned allocation for the step's next request, if a plan is being replayed and the
    /// request matches it; advances the step's cursor and notes a departure.
    #[inline]
    pub(crate) fn replay(
        &mut self,
        size: u32,
        alignment: u64,
        alignment_granules: u32,
        request: &Request<'_>,
    ) -> Option<Allocation> {
        let planner = self.planner.as_mut()?;
        if !planner.in_step || planner.plan.is_empty() || planner.departed_at.is_some() {
            return None;
        }
        let index = planner.cursor;
        planner.cursor += 1;
        let shape = Shape {
            size,
            alignment: alignment_granules,
            category: request.category,
        };
        let Some(planned) = planner
            .plan
            .get(index)
            .copied()
            .filter(|p| p.shape == shape)
        else {
            planner.departed_at = Some(index);
            return None;
        };
        let segment = planned.segment?;
        let placed = self.place_at(segment, planned.offset, size, alignment, request);
        if let Some(planner) = self.planner.as_mut() {
            if placed.is_some() {
                planner.stats.placed += 1;
            } else {
                planner.fell_back += 1;
                planner.stats.fell_back += 1;
            }
        }
        placed
    }

    /// Carves exactly `[offset, offset + size)` (granules) out of segment `id` if one free block
    /// covers it; `None` otherwise (nothing changes then). Walks the segment's blocks in address
    /// order: a planned segment holds about as many blocks as the step has live.
    fn place_at(
        &mut self,
        id: SegmentId,
        offset: u32,
        size: u32,
        alignment: u64,
        request: &Request<'_>,
    ) -> Option<Allocation> {
        let slot = self.segments.slot_of(id)?;
        let mut index = self.segments.get(slot)?.first_block;
        while index != NIL && self.blocks[index].offset + self.blocks[index].size <= offset {
            index = self.blocks[index].next;
        }
        let block = self.blocks.get(index)?;
        let end = u64::from(offset) + u64::from(size);
        if block.is_used()
            || block.offset > offset
            || u64::from(block.offset) + u64::from(block.size) < end
        {
            return None;
        }
        self.free.remove(index, &self.blocks);
        let spanned_segment = block.prev & block.next == NIL;
        let front = offset - block.offset;
        if front > 0 {
            let before = index;
            index = self.split_after(before, front);
            self.free.insert(before, &self.blocks);
        }
        if self.blocks[index].size > size {
            let tail = self.split_after(index, size);
            self.free.insert(tail, &self.blocks);
        }
        Some(self.mark_used(index, spanned_segment, alignment, request))
    }
}
