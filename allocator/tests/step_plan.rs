//! Planned steps: the offline placement against its own checker and the live-bytes lower bound
//! over random lifetimes, and a replayed step against the same step under best fit.
#![allow(clippy::unwrap_used)]

use plimsoll_allocator::arena_plan::{self, Lifetime, Region, STEP_END};
use plimsoll_allocator::{
    Allocation, AllocatorConfig, BufferAllocator, Category, Request, SimulatedSource, StepOutcome,
};
use proptest::prelude::*;

const GRANULE: u64 = 256;

fn config() -> AllocatorConfig {
    AllocatorConfig {
        budget_bytes: u64::MAX,
        max_segment_bytes: 64 << 20,
        small_segment_bytes: 2 << 20,
        small_request_max_bytes: 1 << 20,
        granule_bytes: GRANULE,
    }
}

/// Random lifetimes: `(size, alignment log2, start, length or None for the step's end)`.
fn lifetimes() -> impl Strategy<Value = Vec<Lifetime>> {
    proptest::collection::vec(
        (
            1u64..200,
            0u32..4,
            0u32..300,
            proptest::option::weighted(0.9, 1u32..120),
        ),
        1..120,
    )
    .prop_map(|raw| {
        // Distinct event numbers, as a recorded step has: event 2i allocates block i.
        raw.into_iter()
            .enumerate()
            .map(|(index, (size, alignment_log2, _, length))| Lifetime {
                size,
                alignment: 1 << alignment_log2,
                start: 2 * index as u32,
                end: length.map_or(STEP_END, |length| 2 * index as u32 + 2 * length - 1),
            })
            .collect()
    })
}

fn regions() -> impl Strategy<Value = Vec<Region>> {
    proptest::collection::vec((0u64..64, 1u64..400), 0..4).prop_map(|raw| {
        raw.into_iter()
            .map(|(start, size)| Region { start, size })
            .collect()
    })
}

/// The naive oracle of the lower bound: live granules at every event, counted directly.
fn live_at_each_event(lifetimes: &[Lifetime]) -> u64 {
    let last = lifetimes.iter().map(|l| l.start).max().unwrap_or(0);
    (0..=last)
        .map(|time| {
            lifetimes
                .iter()
                .filter(|l| l.start <= time && time < l.end)
                .map(|l| l.size)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// No two blocks live at once share a granule, every block is aligned and inside its region,
    /// and the arena plus the regions it used hold at least the live bytes at every moment.
    #[test]
    fn a_placement_never_overlaps_live_blocks(lifetimes in lifetimes(), regions in regions()) {
        let plan = arena_plan::place(&lifetimes, &regions);
        prop_assert_eq!(arena_plan::check(&lifetimes, &regions, &plan), Ok(()));
        prop_assert_eq!(plan.max_live, live_at_each_event(&lifetimes));
        let region_total: u64 = regions.iter().map(|r| r.size).sum();
        prop_assert!(plan.arena_size + region_total >= plan.max_live);
        // With no regions the arena itself is bounded below by the live bytes, and above by
        // giving every block its own bytes (no reuse at all, plus alignment padding).
        if regions.is_empty() {
            prop_assert!(plan.arena_size >= plan.max_live);
            let no_reuse: u64 = lifetimes.iter().map(|l| l.size + l.alignment - 1).sum();
            prop_assert!(plan.arena_size <= no_reuse);
        }
    }
}

/// Blocks that never overlap in time share one offset: the arena is the largest block, the
/// lower bound.
#[test]
fn blocks_live_one_after_another_share_their_bytes() {
    let lifetimes: Vec<Lifetime> = (0..5)
        .map(|index| Lifetime {
            size: 10 + index,
            alignment: 1,
            start: 2 * index as u32,
            end: 2 * index as u32 + 1,
        })
        .collect();
    let plan = arena_plan::place(&lifetimes, &[]);
    assert_eq!(plan.arena_size, 14);
    assert_eq!(plan.max_live, 14);
    assert!(plan.placements.iter().all(|p| p.offset == 0));
}

/// A step shaped like a forward and backward pass: activations allocated in order, freed in
/// reverse, with temporaries between, and a block that outlives it until the next step begins
/// (as gradients do until they are cleared).
fn run_step(allocator: &mut BufferAllocator<SimulatedSource>, kept: &mut Vec<Allocation>) {
    for block in kept.drain(..) {
        allocator.free(block).unwrap();
    }
    let sizes = [
        96_000u64, 300_000, 5_000, 1_500_000, 40_000, 700_000, 2_600_000, 12_000,
    ];
    let mut activations = Vec::new();
    for (index, &size) in sizes.iter().enumerate() {
        let temporary = allocator
            .allocate(Request::new(size / 3 + 1, Category::Temporary, "tmp"))
            .unwrap();
        activations.push(
            allocator
                .allocate(Request::new(size, Category::Activation, "act"))
                .unwrap(),
        );
        allocator.free(temporary).unwrap();
        if index == 3 {
            kept.push(
                allocator
                    .allocate(Request::new(4096, Category::Other, "kept"))
                    .unwrap(),
            );
        }
    }
    while let Some(activation) = activations.pop() {
        let gradient = allocator
            .allocate(Request::new(
                activation.size_bytes() / 2 + 256,
                Category::Temporary,
                "grad",
            ))
            .unwrap();
        allocator.free(activation).unwrap();
        allocator.free(gradient).unwrap();
    }
}

/// Two steps record, the second repeats the first and builds the plan; the next steps replay
/// it exactly, with the allocator's invariants intact, and reserved memory over the steady
/// step's peak allocated no worse than best fit's.
#[test]
fn a_repeating_step_is_planned_then_replayed() {
    let mut planned = BufferAllocator::new(SimulatedSource::new(u64::MAX), config());
    planned.set_step_planning(true);
    let mut kept = Vec::new();
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        planned.begin_step();
        run_step(&mut planned, &mut kept);
        outcomes.push(planned.end_step());
        planned.check_invariants().unwrap();
        planned.check_handles(&kept).unwrap();
    }
    assert_eq!(outcomes[0], StepOutcome::Recorded);
    // The second step repeats the first: planned at its end.
    assert!(
        matches!(outcomes[1], StepOutcome::Planned { .. }),
        "{outcomes:?}"
    );
    for outcome in &outcomes[2..] {
        assert_eq!(
            *outcome,
            StepOutcome::Replayed { fell_back: 0 },
            "{outcomes:?}"
        );
    }
    let stats = planned.step_plan_stats();
    assert_eq!(stats.steps_replayed, 4);
    assert!(stats.placed > 0);

    // Steady state: peak reserved over peak allocated of one step, planned and best fit.
    planned.reset_peaks();
    planned.begin_step();
    run_step(&mut planned, &mut kept);
    assert_eq!(planned.end_step(), StepOutcome::Replayed { fell_back: 0 });
    let planned_stats = planned.stats();

    let mut best_fit = BufferAllocator::new(SimulatedSource::new(u64::MAX), config());
    let mut kept_best = Vec::new();
    for _ in 0..4 {
        run_step(&mut best_fit, &mut kept_best);
    }
    best_fit.reset_peaks();
    run_step(&mut best_fit, &mut kept_best);
    let best_stats = best_fit.stats();
    let ratio = |s: &plimsoll_allocator::Stats| {
        s.peak_reserved_bytes as f64 / s.peak_allocated_bytes as f64
    };
    assert!(
        ratio(&planned_stats) <= ratio(&best_stats) + 1e-9,
        "planned {} best fit {}",
        ratio(&planned_stats),
        ratio(&best_stats)
    );
}

/// A step that asks for something else departs: the rest of it uses best fit, nothing breaks,
/// and two such steps in a row become the new plan.
#[test]
fn a_step_that_departs_falls_back_and_a_new_shape_is_planned() {
    let mut allocator = BufferAllocator::new(SimulatedSource::new(u64::MAX), config());
    allocator.set_step_planning(true);
    let step = |allocator: &mut BufferAllocator<SimulatedSource>, size: u64| {
        allocator.begin_step();
        let a = allocator
            .allocate(Request::new(size, Category::Activation, "a"))
            .unwrap();
        let b = allocator
            .allocate(Request::new(size * 2, Category::Activation, "b"))
            .unwrap();
        allocator.free(a).unwrap();
        let c = allocator
            .allocate(Request::new(size, Category::Temporary, "c"))
            .unwrap();
        allocator.free(b).unwrap();
        allocator.free(c).unwrap();
        allocator.end_step()
    };
    assert_eq!(step(&mut allocator, 10_000), StepOutcome::Recorded);
    assert!(matches!(
        step(&mut allocator, 10_000),
        StepOutcome::Planned { .. }
    ));
    assert_eq!(
        step(&mut allocator, 10_000),
        StepOutcome::Replayed { fell_back: 0 }
    );
    assert_eq!(step(&mut allocator, 7_000), StepOutcome::Departed { at: 0 });
    allocator.check_invariants().unwrap();
    assert!(matches!(
        step(&mut allocator, 7_000),
        StepOutcome::Planned { .. }
    ));
    assert_eq!(
        step(&mut allocator, 7_000),
        StepOutcome::Replayed { fell_back: 0 }
    );
    allocator.check_invariants().unwrap();
    // Off: the plan's segments are unpinned, and emptying the cache releases everything.
    allocator.set_step_planning(false);
    allocator.empty_cache();
    assert_eq!(allocator.stats().reserved_bytes, 0);
}

/// A planned offset still covered by a block that outlived its plan is not touched: that request
/// falls back to best fit, and the two blocks never share a byte.
#[test]
fn a_covered_planned_offset_falls_back() {
    let mut allocator = BufferAllocator::new(SimulatedSource::new(u64::MAX), config());
    allocator.set_step_planning(true);
    let mut leftover = None;
    for round in 0..4 {
        allocator.begin_step();
        let a = allocator
            .allocate(Request::new(50_000, Category::Activation, "a"))
            .unwrap();
        if round == 3 {
            // Held across the step end: the next step's first request finds its offset covered.
            leftover = Some(a);
        } else {
            allocator.free(a).unwrap();
        }
        allocator.end_step();
    }
    let held = leftover.unwrap();
    allocator.begin_step();
    let a = allocator
        .allocate(Request::new(50_000, Category::Activation, "a"))
        .unwrap();
    assert_eq!(allocator.end_step(), StepOutcome::Replayed { fell_back: 1 });
    assert!(
        held.segment() != a.segment()
            || held.offset() + held.size_bytes() <= a.offset()
            || a.offset() + a.size_bytes() <= held.offset()
    );
    allocator.check_handles(&[held, a]).unwrap();
    allocator.check_invariants().unwrap();
}

/// One step's program: `(size in bytes, which earlier live block of the step to free after it)`.
fn program() -> impl Strategy<Value = Vec<(u64, Option<usize>)>> {
    proptest::collection::vec(
        (
            1u64..3_000_000,
            proptest::option::weighted(0.6, any::<usize>()),
        ),
        1..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A step program repeated with random departures (one request resized), allocations between
    /// steps (an evaluation), blocks that outlive their step, and budgets: after every step the
    /// allocator's invariants hold and no two live blocks share a byte.
    #[test]
    fn planned_steps_keep_every_invariant(
        program in program(),
        departures in proptest::collection::vec(proptest::option::weighted(0.2, (any::<usize>(), 1u64..500_000)), 12),
        between in proptest::collection::vec(proptest::option::weighted(0.3, 1u64..4_000_000), 12),
        keep_last in any::<bool>(),
        free_kept_after in 0usize..4,
    ) {
        let mut allocator = BufferAllocator::new(SimulatedSource::new(u64::MAX), config());
        allocator.set_step_planning(true);
        let mut kept: Vec<Allocation> = Vec::new();
        for (departure, between) in departures.iter().zip(&between) {
            allocator.begin_step();
            let mut live: Vec<Allocation> = Vec::new();
            for (index, &(size, free_pick)) in program.iter().enumerate() {
                // What the last step kept is freed early in this one: before its first request,
                // or after a few (so its twin may find the planned bytes still covered).
                if index == free_kept_after.min(program.len() - 1) {
                    for block in kept.drain(..) {
                        allocator.free(block).unwrap();
                    }
                }
                let size = match departure {
                    Some((at, size)) if at % program.len() == index => *size,
                    _ => size,
                };
                live.push(allocator.allocate(Request::new(size, Category::Activation, "x")).unwrap());
                if let Some(pick) = free_pick {
                    let pick = pick % live.len();
                    allocator.free(live.swap_remove(pick)).unwrap();
                }
            }
            if keep_last {
                kept.extend(live.pop());
            }
            for block in live.drain(..) {
                allocator.free(block).unwrap();
            }
            allocator.end_step();
            allocator.check_invariants().map_err(TestCaseError::fail)?;
            allocator.check_handles(&kept).map_err(TestCaseError::fail)?;
            if let Some(size) = between {
                kept.push(allocator.allocate(Request::new(*size, Category::Other, "eval")).unwrap());
                allocator.check_handles(&kept).map_err(TestCaseError::fail)?;
                if let Some(block) = kept.pop() {
                    allocator.free(block).unwrap();
                }
            }
        }
        let stats = allocator.step_plan_stats();
        // Two equal steps in a row always build a plan.
        let repeats = departures.windows(2).any(|pair| pair[0].is_none() && pair[1].is_none());
        prop_assert!(stats.plans_built >= 1 || !repeats, "{stats:?}");
    }
}

/// A plan whose arena cannot be created is refused once, said so, and not tried again on every
/// step (each try releases the cached segments first); best fit goes on with its cache.
#[test]
fn a_refused_arena_is_not_tried_again_every_step() {
    let mut allocator = BufferAllocator::new(SimulatedSource::new(u64::MAX), config());
    allocator.set_step_planning(true);
    let step = |allocator: &mut BufferAllocator<SimulatedSource>| {
        allocator.begin_step();
        let a = allocator
            .allocate(Request::new(3 << 20, Category::Activation, "a"))
            .unwrap();
        let b = allocator
            .allocate(Request::new(3 << 20, Category::Activation, "b"))
            .unwrap();
        allocator.free(a).unwrap();
        allocator.free(b).unwrap();
        allocator.end_step()
    };
    assert_eq!(step(&mut allocator), StepOutcome::Recorded);
    // The device refuses the arena (as a budget or a full device would).
    allocator.source_mut().fail_next_creations = 1;
    assert!(matches!(
        step(&mut allocator),
        StepOutcome::ArenaRefused { .. }
    ));
    // The next step makes its segments again with best fit; the ones after reuse them.
    assert_eq!(step(&mut allocator), StepOutcome::Recorded);
    let created = allocator.stats().segments_created;
    for _ in 0..3 {
        assert_eq!(step(&mut allocator), StepOutcome::Recorded);
    }
    assert_eq!(allocator.stats().segments_created, created);
    assert_eq!(allocator.step_plan_stats().plans_built, 0);
    allocator.check_invariants().unwrap();
}
