//! Segments: the cache, the budget, dedicated segments and a failing source.

use super::*;

#[test]
fn empty_cache_releases_only_empty_segments() {
    let mut allocator = new_allocator(u64::MAX);
    let small = alloc(&mut allocator, KIB);
    let large = alloc(&mut allocator, 200 * KIB); // dedicated segment of exactly 200 KiB
    let kept = alloc(&mut allocator, 300 * KIB);
    assert_eq!(allocator.stats().reserved_bytes, SEGMENT + 500 * KIB);
    free(&mut allocator, small);
    free(&mut allocator, large);
    assert_eq!(allocator.empty_cache(), SEGMENT + 200 * KIB);
    allocator.check_invariants().unwrap();
    assert_eq!(allocator.stats().reserved_bytes, 300 * KIB);
    assert_eq!(allocator.source().live.len(), 1);
    assert_eq!(allocator.stats().segments_released, 2);
    finish(allocator, vec![kept]);
}

#[test]
fn budget_exhausted_then_satisfied_after_frees() {
    let mut allocator = new_allocator(2 * SEGMENT);
    let first = alloc(&mut allocator, SEGMENT);
    let second = alloc(&mut allocator, SEGMENT);
    let error = allocator
        .allocate(Request::new(KIB, Category::Activation, "third"))
        .unwrap_err();
    assert_eq!(oom(error).cause, OomCause::BudgetFull);
    allocator.check_invariants().unwrap();
    free(&mut allocator, first);
    let third = alloc(&mut allocator, KIB);
    assert_eq!(allocator.stats().out_of_memory_errors, 1);
    finish(allocator, vec![second, third]);
}

#[test]
fn empty_cache_is_released_before_a_large_segment_is_created() {
    // The budget holds two segments, both cached and empty: the large request needs both
    // released. It releases every empty segment before asking for its own (none could serve it),
    // so the budget is never hit and nothing has to be retried.
    let mut allocator = new_allocator(2 * SEGMENT);
    let a = alloc(&mut allocator, SEGMENT);
    let b = alloc(&mut allocator, SEGMENT);
    free(&mut allocator, a);
    free(&mut allocator, b);
    let large = alloc(&mut allocator, 2 * SEGMENT);
    assert_eq!(allocator.stats().segments_released, 2);
    assert_eq!(allocator.stats().retries_after_releasing_cache, 0);
    assert_eq!(allocator.stats().out_of_memory_errors, 0);
    assert_eq!(allocator.stats().reserved_bytes, 2 * SEGMENT);
    finish(allocator, vec![large]);
}

#[test]
fn empty_shared_segments_are_released_before_a_dedicated_one_is_created() {
    // Small requests (<= SEGMENT) share segments; once empty, a shared segment stays cached for
    // the next small request but is released when a large request needs a new segment.
    let mut allocator = new_allocator(u64::MAX);
    let small = alloc(&mut allocator, KIB);
    free(&mut allocator, small);
    assert_eq!(allocator.stats().reserved_bytes, SEGMENT);
    let again = alloc(&mut allocator, KIB); // served by the cached shared segment
    assert_eq!(allocator.stats().segments_created, 1);
    free(&mut allocator, again);
    let large = alloc(&mut allocator, 3 * SEGMENT);
    assert_eq!(allocator.stats().segments_released, 1);
    assert_eq!(allocator.stats().reserved_bytes, 3 * SEGMENT);
    finish(allocator, vec![large]);
}

#[test]
fn lowering_the_budget_at_run_time_applies_to_new_segments() {
    let mut allocator = new_allocator(u64::MAX);
    let a = alloc(&mut allocator, SEGMENT);
    allocator.set_budget(SEGMENT);
    assert_eq!(allocator.budget_bytes(), SEGMENT);
    let error = allocator
        .allocate(Request::new(KIB, Category::Input, "batch"))
        .unwrap_err();
    assert_eq!(oom(error).cause, OomCause::BudgetFull);
    allocator.set_budget(2 * SEGMENT);
    let b = alloc(&mut allocator, KIB);
    finish(allocator, vec![a, b]);
}

#[test]
fn source_failure_is_out_of_memory_and_leaves_the_allocator_intact() {
    let mut allocator = new_allocator(u64::MAX);
    let a = alloc(&mut allocator, SEGMENT);
    let cached = alloc(&mut allocator, 2 * SEGMENT);
    free(&mut allocator, cached);
    allocator.source_mut().fail_next_creations = 2;
    let error = allocator
        .allocate(Request::new(200 * KIB, Category::Activation, "refused"))
        .unwrap_err();
    let report = oom(error);
    assert!(
        matches!(report.cause, OomCause::SourceFailed { .. }),
        "{report:?}"
    );
    assert!(
        report
            .to_string()
            .contains("the device refused a new segment"),
        "{report}"
    );
    allocator.check_invariants().unwrap();
    assert_eq!(
        allocator.stats().reserved_bytes,
        SEGMENT,
        "the empty cache was released"
    );
    // One refusal: released cache, retried, succeeded.
    allocator.source_mut().fail_next_creations = 1;
    let b = alloc(&mut allocator, 200 * KIB);
    assert_eq!(allocator.stats().retries_after_releasing_cache, 2);
    finish(allocator, vec![a, b]);
}

#[test]
fn large_requests_get_dedicated_segments_and_empty_ones_are_released_first() {
    let mut allocator = new_allocator(u64::MAX);
    let a = alloc(&mut allocator, 100 * KIB);
    assert_eq!(allocator.stats().reserved_bytes, 100 * KIB);
    free(&mut allocator, a);
    // 200K cannot use the cached 100K segment: it is released before the new one is made.
    let b = alloc(&mut allocator, 200 * KIB);
    assert_eq!(allocator.stats().reserved_bytes, 200 * KIB);
    assert_eq!(allocator.stats().peak_reserved_bytes, 200 * KIB);
    assert_eq!(allocator.stats().segments_released, 1);
    finish(allocator, vec![b]);
}

/// One "training step": activations kept until the step's backward (live memory growing to the
/// step's peak), each made beside a temporary that alternates between a small and a large
/// dedicated size, then freed in reverse beside a gradient of half its size. Returns the
/// segments the step created.
fn varying_step(allocator: &mut BufferAllocator<SimulatedSource>) -> u64 {
    let before = allocator.stats().segments_created;
    let mut kept = Vec::new();
    for layer in 0..6u64 {
        let temporary = alloc(
            allocator,
            if layer % 2 == 0 { 192 * KIB } else { 768 * KIB },
        );
        kept.push(alloc(allocator, 128 * KIB + layer * 16 * KIB));
        free(allocator, temporary);
    }
    while let Some(activation) = kept.pop() {
        let gradient = alloc(allocator, activation.size_bytes() / 2 + KIB);
        free(allocator, activation);
        free(allocator, gradient);
    }
    allocator.stats().segments_created - before
}

#[test]
fn below_the_high_water_mark_empty_segments_stay_cached() {
    // A 500K peak sets the mark. Then 100K and 200K tensors alternate, one live at a time: the
    // 200K one's growth keeps the cached 100K segment (100K + 200K is within the mark), so
    // every later request takes a cached segment of its own size and nothing more is created.
    // (Releasing every empty segment at each growth, the policy before, created a segment at
    // every request: the 200K growth released the 100K segment, and the 100K request would
    // not split the empty 200K one.)
    let mut allocator = new_allocator(u64::MAX);
    let peak = alloc(&mut allocator, 500 * KIB);
    free(&mut allocator, peak);
    assert_eq!(allocator.high_water_bytes(), 500 * KIB);
    for _ in 0..4 {
        let small = alloc(&mut allocator, 100 * KIB);
        free(&mut allocator, small);
        let large = alloc(&mut allocator, 200 * KIB);
        free(&mut allocator, large);
    }
    // The 500K segment, then one of 100K (the 500K one released for it: 600K would pass the
    // mark) and one of 200K.
    assert_eq!(allocator.stats().segments_created, 3);
    assert_eq!(allocator.stats().segments_released, 1);
    assert_eq!(allocator.stats().reserved_bytes, 300 * KIB);
    assert_eq!(allocator.stats().peak_reserved_bytes, 500 * KIB);
    // Emptying the cache releases them and lowers the mark to what stays reserved.
    allocator.empty_cache();
    assert_eq!(allocator.stats().reserved_bytes, 0);
    assert_eq!(allocator.high_water_bytes(), 0);
    finish(allocator, Vec::new());
}

#[test]
fn a_repeated_step_of_varying_sizes_creates_fewer_segments_after_the_first() {
    let mut allocator = new_allocator(u64::MAX);
    let first = varying_step(&mut allocator);
    let peak = allocator.stats().peak_reserved_bytes;
    let later: Vec<u64> = (0..4).map(|_| varying_step(&mut allocator)).collect();
    assert!(
        later.iter().all(|&n| 2 * n < first),
        "{first} then {later:?}"
    );
    assert_eq!(allocator.stats().peak_reserved_bytes, peak);
    finish(allocator, Vec::new());
}

#[test]
fn cached_segments_give_way_to_the_budget() {
    // The budget holds the first step's peak: later steps still fit, the cached empty segments
    // released (oldest first) whenever a new one would pass the budget, so no request fails.
    let mut probe = new_allocator(u64::MAX);
    varying_step(&mut probe);
    let peak = probe.stats().peak_reserved_bytes;
    let mut allocator = new_allocator(peak);
    for _ in 0..4 {
        varying_step(&mut allocator);
    }
    assert_eq!(allocator.stats().out_of_memory_errors, 0);
    assert!(allocator.stats().peak_reserved_bytes <= peak);
    finish(allocator, Vec::new());
}
