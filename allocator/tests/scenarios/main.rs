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
    assert_fragmentation_recomputed(allocator);
    allocation
}

fn free(allocator: &mut BufferAllocator<SimulatedSource>, allocation: Allocation) {
    allocator.free(allocation).unwrap();
    allocator.check_invariants().unwrap();
    assert_fragmentation_recomputed(allocator);
}

/// Recomputes fragmentation from the snapshot's blocks, by its definition in [`Stats`]
/// (`1 - largest free block / free bytes`, 0 when nothing is free), without the allocator's own
/// free-memory figures or its `fragmentation` function (which `check_invariants` also uses, so it
/// cannot catch a wrong formula), and compares it with what the statistics and
/// `BufferAllocator::fragmentation` report.
///
/// [`Stats`]: plimsoll_allocator::Stats
fn assert_fragmentation_recomputed(allocator: &BufferAllocator<SimulatedSource>) {
    let snapshot = allocator.snapshot();
    let free_sizes: Vec<u64> = snapshot
        .segments
        .iter()
        .flat_map(|segment| &segment.blocks)
        .filter(|block| block.free)
        .map(|block| block.size_bytes)
        .collect();
    let free_bytes: u64 = free_sizes.iter().sum();
    let largest = free_sizes.iter().copied().max().unwrap_or(0);
    let expected = if free_bytes == 0 {
        0.0
    } else {
        1.0 - largest as f64 / free_bytes as f64
    };
    let layout: Vec<(u64, Vec<(u64, bool)>)> = snapshot
        .segments
        .iter()
        .map(|s| {
            (
                s.size_bytes,
                s.blocks.iter().map(|b| (b.size_bytes, b.free)).collect(),
            )
        })
        .collect();
    assert_eq!(
        (snapshot.stats.free_bytes, snapshot.stats.largest_free_bytes),
        (free_bytes, largest),
        "free bytes and largest free block against the blocks {layout:?}"
    );
    assert_eq!(
        snapshot.stats.fragmentation, expected,
        "stats.fragmentation against 1 - {largest} / {free_bytes}, blocks {layout:?}"
    );
    assert_eq!(
        allocator.fragmentation(),
        expected,
        "fragmentation() against 1 - {largest} / {free_bytes}, blocks {layout:?}"
    );
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
    // Every segment is now one free block, so free = reserved and the largest free block is the
    // largest segment: fragmentation is 0 with one segment, and e.g. 1 - 64K / 128K = 0.5 with
    // two of 64K.
    assert_eq!(stats.free_bytes, stats.reserved_bytes);
    assert_fragmentation_recomputed(&allocator);
    if stats.segments > 0 {
        let largest = allocator.largest_free_bytes();
        let whole = alloc(&mut allocator, largest);
        assert_eq!(whole.offset(), 0);
        assert_eq!(allocator.stats().segments_created, stats.segments_created);
        free(&mut allocator, whole);
    }
}

mod errors;
mod placement;
mod segments;
mod views;
