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

mod errors;
mod placement;
mod segments;
mod views;
