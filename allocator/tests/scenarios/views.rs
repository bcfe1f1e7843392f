//! What the allocator reports: statistics, fragmentation, snapshots, traces and tags.

use super::*;

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
