//! Best fit, splitting, coalescing, alignment and rounding.

use super::*;

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
