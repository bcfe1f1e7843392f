//! Named scenarios with hand-worked expectations. Each ends by freeing everything and allocating a
//! whole segment at offset 0: proof that every free merged back.
#![allow(clippy::unwrap_used)]

use plimsoll_allocator::{
    AllocError, Allocation, AllocatorConfig, BufferAllocator, Category, OomCause, OutOfMemory,
    Request, SimulatedSource,
};

const KIB: u64 = 1024;
/// Every test segment is 64 KiB: requests up to 64 KiB share segments of that size.
const SEGMENT: u64 = 64 * KIB;

fn config(budget_bytes: u64) -> AllocatorConfig {
    AllocatorConfig {
        budget_bytes,
        max_segment_bytes: 1024 * KIB,
        small_segment_bytes: SEGMENT,
        small_request_max_bytes: SEGMENT,
        granule_bytes: 256,
    }
}

fn new_allocator(budget_bytes: u64) -> BufferAllocator<SimulatedSource> {
    BufferAllocator::new(SimulatedSource::unlimited(), config(budget_bytes))
}

fn alloc(allocator: &mut BufferAllocator<SimulatedSource>, size_bytes: u64) -> Allocation {
    let allocation = allocator
        .allocate(Request::new(size_bytes, Category::Activation, "test"))
        .unwrap();
    allocator.check_invariants().unwrap();
    allocation
}

fn free(allocator: &mut BufferAllocator<SimulatedSource>, allocation: Allocation) {
    allocator.free(allocation).unwrap();
    allocator.check_invariants().unwrap();
}

fn oom(error: AllocError) -> OutOfMemory {
    match error {
        AllocError::OutOfMemory(report) => *report,
        other => panic!("expected out-of-memory, got {other:?}"),
    }
}

/// Frees `live`, then proves every segment is one free block again: a whole segment lands at
/// offset 0 without creating a segment.
fn finish(mut allocator: BufferAllocator<SimulatedSource>, live: Vec<Allocation>) {
    for allocation in live {
        free(&mut allocator, allocation);
    }
    let stats = allocator.stats().clone();
    assert_eq!(stats.allocated_bytes, 0);
    assert_eq!(
        stats.free_blocks, stats.segments,
        "one free block per segment"
    );
    assert_eq!(
        stats.fragmentation,
        if stats.segments > 1 {
            stats.fragmentation
        } else {
            0.0
        }
    );
    if stats.segments > 0 {
        let largest = allocator.largest_free_bytes();
        let whole = alloc(&mut allocator, largest);
        assert_eq!(whole.offset(), 0);
        assert_eq!(allocator.stats().segments_created, stats.segments_created);
        free(&mut allocator, whole);
    }
}

#[test]
fn best_fit_is_chosen_over_first_fit() {
    let mut allocator = new_allocator(u64::MAX);
    // [a 4K][g 1K][b 2K][g 1K][tail]: free a and b; a 2K request fits both holes.
    let a = alloc(&mut allocator, 4 * KIB);
    let guard1 = alloc(&mut allocator, KIB);
    let b = alloc(&mut allocator, 2 * KIB);
    let guard2 = alloc(&mut allocator, KIB);
    free(&mut allocator, a);
    free(&mut allocator, b);
    let chosen = alloc(&mut allocator, 2 * KIB);
    assert_eq!(
        chosen.offset(),
        5 * KIB,
        "best fit takes the 2K hole, not the first (4K) hole"
    );
    finish(allocator, vec![guard1, guard2, chosen]);
}

#[test]
fn best_fit_ties_go_to_the_lowest_address() {
    let mut allocator = new_allocator(u64::MAX);
    let a = alloc(&mut allocator, 2 * KIB);
    let guard1 = alloc(&mut allocator, KIB);
    let b = alloc(&mut allocator, 2 * KIB);
    let guard2 = alloc(&mut allocator, KIB);
    free(&mut allocator, b);
    free(&mut allocator, a);
    let chosen = alloc(&mut allocator, 2 * KIB);
    assert_eq!(chosen.offset(), 0);
    finish(allocator, vec![guard1, guard2, chosen]);
}

#[test]
fn split_remainder_is_reused() {
    let mut allocator = new_allocator(u64::MAX);
    let hole = alloc(&mut allocator, 4 * KIB);
    let guard = alloc(&mut allocator, KIB);
    free(&mut allocator, hole);
    let first = alloc(&mut allocator, KIB);
    let second = alloc(&mut allocator, 3 * KIB);
    assert_eq!(
        (first.offset(), second.offset()),
        (0, KIB),
        "the 3K remainder of the 4K hole"
    );
    assert_eq!(allocator.stats().segments_created, 1);
    assert!(allocator.stats().splits >= 3);
    finish(allocator, vec![guard, first, second]);
}

/// Layout [a 1K][b 2K][c 4K][guard]; returns them.
fn three_and_guard(
    allocator: &mut BufferAllocator<SimulatedSource>,
) -> (Allocation, Allocation, Allocation, Allocation) {
    let a = alloc(allocator, KIB);
    let b = alloc(allocator, 2 * KIB);
    let c = alloc(allocator, 4 * KIB);
    let guard = alloc(allocator, KIB);
    (a, b, c, guard)
}

fn free_block_at(allocator: &BufferAllocator<SimulatedSource>, offset: u64) -> Option<u64> {
    let snapshot = allocator.snapshot();
    let block = snapshot.segments[0]
        .blocks
        .iter()
        .find(|block| block.offset == offset)?;
    block.free.then_some(block.size_bytes)
}

#[test]
fn coalesces_with_the_left_neighbour() {
    let mut allocator = new_allocator(u64::MAX);
    let (a, b, c, guard) = three_and_guard(&mut allocator);
    free(&mut allocator, a);
    let merges = allocator.stats().merges;
    free(&mut allocator, b); // b merges into a on its left
    assert_eq!(allocator.stats().merges, merges + 1);
    assert_eq!(free_block_at(&allocator, 0), Some(3 * KIB));
    finish(allocator, vec![c, guard]);
}

#[test]
fn coalesces_with_the_right_neighbour() {
    let mut allocator = new_allocator(u64::MAX);
    let (a, b, c, guard) = three_and_guard(&mut allocator);
    free(&mut allocator, b);
    let merges = allocator.stats().merges;
    free(&mut allocator, a); // b on its right merges in
    assert_eq!(allocator.stats().merges, merges + 1);
    assert_eq!(free_block_at(&allocator, 0), Some(3 * KIB));
    finish(allocator, vec![c, guard]);
}

#[test]
fn coalesces_with_both_neighbours() {
    let mut allocator = new_allocator(u64::MAX);
    let (a, b, c, guard) = three_and_guard(&mut allocator);
    free(&mut allocator, a);
    free(&mut allocator, c);
    let merges = allocator.stats().merges;
    free(&mut allocator, b);
    assert_eq!(allocator.stats().merges, merges + 2);
    assert_eq!(free_block_at(&allocator, 0), Some(7 * KIB));
    finish(allocator, vec![guard]);
}

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
fn alignment_splits_padding_in_front() {
    let mut allocator = new_allocator(u64::MAX);
    let first = alloc(&mut allocator, 256);
    let request = Request::new(KIB, Category::Parameter, "aligned").with_alignment(4 * KIB);
    let aligned = allocator.allocate(request).unwrap();
    allocator.check_invariants().unwrap();
    assert_eq!(aligned.offset(), 4 * KIB);
    assert_eq!(
        free_block_at(&allocator, 256),
        Some(4 * KIB - 256),
        "padding is a free block"
    );
    finish(allocator, vec![first, aligned]);
}

/// The remainder rule at its boundaries: a remainder splits off only when it is at least four
/// granules and at least 1/16 of the rounded request; otherwise it stays with the allocation and
/// counts as waste until the allocation is freed.
#[test]
fn small_remainders_stay_with_the_allocation() {
    const GRANULE: u64 = 256;
    // (hole in granules, request in granules, whether the rest splits off)
    let cases = [
        (67, 64, false),   // 3 granules: under four
        (68, 64, true),    // 4 granules: four, and 64/16 = 4
        (169, 160, false), // 9 granules: under 160/16 = 10
        (170, 160, true),  // 10 granules: exactly 1/16
        (5, 1, true),      // 4 granules behind a one-granule request
    ];
    for (hole, request, splits) in cases {
        let mut allocator = new_allocator(u64::MAX);
        let front = alloc(&mut allocator, hole * GRANULE);
        let guard = alloc(&mut allocator, GRANULE);
        free(&mut allocator, front);
        let placed = alloc(&mut allocator, request * GRANULE);
        assert_eq!(placed.offset(), 0, "the hole is the best fit");
        let expected_size = if splits { request } else { hole };
        assert_eq!(
            placed.size_bytes(),
            expected_size * GRANULE,
            "hole {hole}, request {request}"
        );
        assert_eq!(
            allocator.stats().waste_bytes,
            (expected_size - request) * GRANULE
        );
        assert_eq!(
            free_block_at(&allocator, request * GRANULE),
            splits.then_some((hole - request) * GRANULE)
        );
        finish(allocator, vec![guard, placed]);
    }
}

#[test]
fn rounding_waste_is_counted() {
    let mut allocator = new_allocator(u64::MAX);
    let odd = alloc(&mut allocator, 1000);
    assert_eq!(odd.size_bytes(), 1024);
    assert_eq!(odd.requested_bytes(), 1000);
    assert_eq!(allocator.stats().waste_bytes, 24);
    finish(allocator, vec![odd]);
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
fn double_free_and_foreign_allocations_are_caught() {
    let mut allocator = new_allocator(u64::MAX);
    let mut other = new_allocator(u64::MAX);
    let a = alloc(&mut allocator, KIB);
    let guard = alloc(&mut allocator, KIB);
    let copy = a.duplicate_for_misuse_test();
    free(&mut allocator, a);
    let error = allocator.free(copy).unwrap_err();
    assert!(
        matches!(error, AllocError::UnknownAllocation { .. }),
        "{error:?}"
    );
    allocator.check_invariants().unwrap();
    // A stale handle whose block slot was reused by a new allocation is still caught.
    let reuse = alloc(&mut allocator, KIB);
    let stale = reuse.duplicate_for_misuse_test();
    free(&mut allocator, reuse);
    let reuse2 = alloc(&mut allocator, KIB);
    assert!(allocator.free(stale).is_err());
    let foreign = alloc(&mut other, KIB);
    let error = allocator.free(foreign).unwrap_err();
    assert!(matches!(error, AllocError::UnknownAllocation { .. }));
    allocator.check_invariants().unwrap();
    finish(allocator, vec![guard, reuse2]);
}

#[test]
fn bad_requests_are_errors() {
    let mut allocator = new_allocator(u64::MAX);
    let zero = allocator.allocate(Request::new(0, Category::Other, "zero"));
    assert!(matches!(zero, Err(AllocError::ZeroSize { .. })));
    let odd = allocator.allocate(Request::new(KIB, Category::Other, "odd").with_alignment(24));
    assert!(matches!(
        odd,
        Err(AllocError::BadAlignment { alignment: 24, .. })
    ));
    let huge = allocator.allocate(Request::new(2048 * KIB, Category::Other, "huge"));
    assert!(matches!(huge, Err(AllocError::TooLarge { .. })));
    let overflow = allocator.allocate(Request::new(u64::MAX, Category::Other, "overflow"));
    assert!(matches!(overflow, Err(AllocError::TooLarge { .. })));
    allocator.check_invariants().unwrap();
    finish(allocator, vec![]);
}

#[test]
fn oom_message_never_fits() {
    let mut allocator = new_allocator(2 * SEGMENT);
    let held = alloc(&mut allocator, 4 * KIB);
    let error = allocator
        .allocate(Request::new(
            256 * KIB,
            Category::Activation,
            "linear3.forward",
        ))
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("out of memory: asked for 256.0 KiB (activation, 'linear3.forward')"),
        "{message}"
    );
    assert!(
        message.contains("4.0 KiB allocated, 64.0 KiB reserved of a 128.0 KiB budget"),
        "{message}"
    );
    assert!(
        message.contains("can never fit the budget of 128.0 KiB"),
        "{message}"
    );
    assert!(message.contains("'test' 4.0 KiB"), "{message}");
    assert_eq!(oom(error).cause, OomCause::NeverFits);
    finish(allocator, vec![held]);
}

#[test]
fn oom_message_fragmented() {
    let mut allocator = new_allocator(SEGMENT);
    // 16 blocks of 4K fill the one segment; freeing every other one leaves 8 holes of 4K:
    // 32K free, largest 4K, fragmentation 1 - 4/32 = 0.875.
    let mut blocks: Vec<Allocation> = (0..16).map(|_| alloc(&mut allocator, 4 * KIB)).collect();
    let mut kept = Vec::new();
    for (index, block) in blocks.drain(..).enumerate() {
        if index % 2 == 0 {
            free(&mut allocator, block)
        } else {
            kept.push(block)
        }
    }
    let error = allocator
        .allocate(Request::new(8 * KIB, Category::Gradient, "w2.grad"))
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("32.0 KiB allocated, 64.0 KiB reserved of a 64.0 KiB budget"),
        "{message}"
    );
    assert!(
        message.contains("fragmented: 32.0 KiB free but the largest block is 4.0 KiB"),
        "{message}"
    );
    let report = oom(error);
    assert_eq!(report.cause, OomCause::Fragmented);
    assert_eq!(report.fragmentation, 0.875);
    assert_eq!(report.top_holders, vec![("test".to_owned(), 32 * KIB)]);
    finish(allocator, kept);
}

#[test]
fn oom_message_budget_full() {
    let mut allocator = new_allocator(SEGMENT);
    let held = alloc(&mut allocator, 60 * KIB);
    let error = allocator
        .allocate(Request::new(8 * KIB, Category::Input, "batch"))
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("asked for 8.0 KiB (input, 'batch')"),
        "{message}"
    );
    assert!(
        message.contains("4.0 KiB free but the largest free block is 4.0 KiB"),
        "{message}"
    );
    assert!(message.contains("budget full"), "{message}");
    assert_eq!(oom(error).cause, OomCause::BudgetFull);
    finish(allocator, vec![held]);
}

#[test]
fn usable_fraction_and_fragmentation_on_a_hand_built_layout() {
    let mut allocator = new_allocator(u64::MAX);
    // [a 4K][g 4K][b 8K][g 4K][c 12K][g 32K] in one 64K segment; free a, b, c.
    // Free: 4K + 8K + 12K = 24K, largest 12K -> fragmentation = 1 - 12/24 = 0.5.
    // usable_fraction(8K) = (8K + 12K) / 24K = 5/6; (1 byte) = 1; (12K) = 12/24; (13K) = 0.
    let a = alloc(&mut allocator, 4 * KIB);
    let g1 = alloc(&mut allocator, 4 * KIB);
    let b = alloc(&mut allocator, 8 * KIB);
    let g2 = alloc(&mut allocator, 4 * KIB);
    let c = alloc(&mut allocator, 12 * KIB);
    let g3 = alloc(&mut allocator, 32 * KIB);
    assert_eq!(allocator.fragmentation(), 0.0, "nothing free");
    assert_eq!(allocator.usable_fraction(KIB), 0.0);
    for block in [a, b, c] {
        free(&mut allocator, block);
    }
    assert_eq!(allocator.largest_free_bytes(), 12 * KIB);
    assert_eq!(allocator.fragmentation(), 0.5);
    assert!((allocator.usable_fraction(8 * KIB) - 5.0 / 6.0).abs() < 1e-12);
    assert_eq!(allocator.usable_fraction(1), 1.0);
    assert_eq!(allocator.usable_fraction(12 * KIB), 0.5);
    assert_eq!(allocator.usable_fraction(13 * KIB), 0.0);
    finish(allocator, vec![g1, g2, g3]);
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

#[test]
fn statistics_per_category_labels_and_peaks() {
    let mut allocator = new_allocator(u64::MAX);
    let w = allocator
        .allocate(Request::new(4 * KIB, Category::Parameter, "w"))
        .unwrap();
    let x = allocator
        .allocate(Request::new(8 * KIB, Category::Activation, "x"))
        .unwrap();
    let stats = allocator.stats();
    assert_eq!(stats.category(Category::Parameter).allocated_bytes, 4 * KIB);
    assert_eq!(
        stats.category(Category::Activation).peak_allocated_bytes,
        8 * KIB
    );
    free(&mut allocator, x);
    assert_eq!(
        allocator
            .stats()
            .category(Category::Activation)
            .peak_allocated_bytes,
        8 * KIB
    );
    allocator.reset_peaks();
    assert_eq!(allocator.stats().peak_allocated_bytes, 4 * KIB);
    assert_eq!(
        allocator
            .stats()
            .category(Category::Activation)
            .peak_allocated_bytes,
        0
    );
    let summary = allocator.summary();
    assert_eq!(summary.top_labels[0].label, "w");
    let table = summary.to_string();
    assert!(
        table.contains("parameter") && table.contains("4.0 KiB"),
        "{table}"
    );
    finish(allocator, vec![w]);
}

#[test]
fn snapshot_and_trace_export_json() {
    let mut allocator = new_allocator(u64::MAX);
    allocator.set_trace_capacity(3);
    let a = allocator
        .allocate(Request::new(KIB, Category::Input, "batch"))
        .unwrap();
    let b = alloc(&mut allocator, KIB);
    free(&mut allocator, b);
    let json = allocator.snapshot().to_json();
    assert!(
        json.contains("\"label\":\"batch\"") && json.contains("\"category\":\"input\""),
        "{json}"
    );
    let trace = allocator.trace();
    assert_eq!(trace.recorded, 4, "segment create, 2 allocations, 1 free");
    assert_eq!(trace.events.len(), 3, "bounded to its capacity");
    assert!(trace.to_json().contains("\"kind\":\"free\""));
    finish(allocator, vec![a]);
}

/// Tags: an allocation carries the tag its bytes were freed with; a merge keeps the larger tag, a
/// split copies it, plain `free` keeps the tag the bytes had, and new memory has tag 0.
#[test]
fn free_with_tag_marks_the_bytes_for_their_next_holder() {
    let mut allocator = new_allocator(SEGMENT);
    let a = alloc(&mut allocator, KIB);
    let b = alloc(&mut allocator, KIB);
    let c = alloc(&mut allocator, KIB);
    assert_eq!((a.tag(), b.tag(), c.tag()), (0, 0, 0), "new memory");
    let (a_offset, b_offset) = (a.offset(), b.offset());
    allocator.free_with_tag(a, 7).unwrap();
    allocator.check_invariants().unwrap();
    let a2 = alloc(&mut allocator, KIB);
    assert_eq!((a2.offset(), a2.tag()), (a_offset, 7), "a's bytes, a's tag");
    allocator.free(a2).unwrap();
    allocator.free_with_tag(b, 5).unwrap();
    allocator.check_invariants().unwrap();
    // a's and b's bytes merged: the larger tag covers both halves of any split.
    let first = alloc(&mut allocator, KIB);
    let second = alloc(&mut allocator, KIB);
    assert_eq!((first.offset(), second.offset()), (a_offset, b_offset));
    assert_eq!((first.tag(), second.tag()), (7, 7));
    // A smaller tag never lowers the bytes' tag.
    allocator.free_with_tag(first, 3).unwrap();
    let again = alloc(&mut allocator, KIB);
    assert_eq!(again.tag(), 7);
    // The tail of the segment was never tagged until c's tag merges into it.
    allocator.free_with_tag(c, 9).unwrap();
    let tail = alloc(&mut allocator, 4 * KIB);
    assert_eq!(tail.tag(), 9);
    finish(allocator, vec![again, second, tail]);
}
