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
