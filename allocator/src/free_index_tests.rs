//! Tests of the free index against one ordered set (the reference).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashSet};

use super::*;
use crate::SegmentId;

/// splitmix64, so the test replays the same actions every run.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A free block as the reference orders it: (size, segment, offset, slab index).
type Reference = BTreeSet<(u32, u32, u32, u32)>;

/// The reference: one ordered set, searched from the requested size.
fn reference_best_fit(keys: &Reference, size: u32, alignment: u32) -> Option<u32> {
    keys.range((size, 0, 0, 0)..)
        .find(|&&(block_size, _, offset, _)| {
            align_up(u64::from(offset), u64::from(alignment)) + u64::from(size)
                <= u64::from(offset) + u64::from(block_size)
        })
        .map(|&(_, _, _, index)| index)
}

#[test]
fn classes_cover_sizes_in_order() {
    let mut previous = 0;
    for size in (1..200_000u32).chain([u32::MAX / 3, u32::MAX - 1, u32::MAX]) {
        let class = FreeIndex::class_of(size);
        assert!(class >= previous && class < CLASSES, "{size} -> {class}");
        previous = class;
    }
}

/// Random inserts, removes and searches against the reference, with sizes skewed so that some
/// classes hold many blocks (their pools grow past the sorted-`Vec` limit and turn into trees
/// and back), others hover between zero, one and two, and some sizes lie above the exact
/// range.
#[test]
fn best_fit_matches_one_ordered_set() {
    let mut state = 7;
    let mut index = FreeIndex::default();
    let mut blocks = BlockSlab::default();
    let mut reference = Reference::new();
    let mut addresses = HashSet::new();
    for step in 0..100_000u32 {
        let roll = next(&mut state);
        let size = match roll % 5 {
            0 => 1 + roll % 3,
            1 => 1 + (roll >> 8) % 64,
            2 => (1 << 16) + (roll >> 8) % (1 << 18),
            _ => 1 + (roll >> 8) % (1 << ((roll >> 40) % 20)),
        } as u32;
        if roll % 7 < 4 {
            let segment = (next(&mut state) % 8) as u32;
            let offset = (next(&mut state) % 64) as u32;
            // Free blocks never share an address (blocks tile their segments).
            if addresses.insert((segment, offset)) {
                let block = blocks.insert(Block::free(SegmentId(segment), 0, offset, size, 0));
                assert!(!index.contains(block, &blocks));
                index.insert(block, &blocks);
                assert!(index.contains(block, &blocks));
                reference.insert((size, segment, offset, block));
            }
        } else if let Some(&key) = reference
            .range((size, 0, 0, 0)..)
            .next()
            .or(reference.first())
        {
            assert!(index.remove(key.3, &blocks));
            assert!(!index.contains(key.3, &blocks));
            assert!(!index.remove(key.3, &blocks));
            blocks.remove(key.3);
            reference.remove(&key);
            addresses.remove(&(key.1, key.2));
        }
        let alignment = 1 << (next(&mut state) % 4);
        let fit = index.best_fit(size, alignment);
        assert_eq!(
            fit.map(|fit| fit.index),
            reference_best_fit(&reference, size, alignment),
            "step {step}: size {size}, alignment {alignment}"
        );
        // Sometimes take what was found, as `place` does.
        if let Some(fit) = fit.filter(|_| step.is_multiple_of(5)) {
            let found = fit.index;
            let block = blocks[found];
            assert_eq!(fit.size, block.size);
            assert!(index.take(fit, &blocks));
            blocks.remove(found);
            reference.remove(&(block.size, block.segment().0, block.offset, found));
            addresses.remove(&(block.segment().0, block.offset));
        }
        assert_eq!(index.len(), reference.len());
        assert_eq!(
            index.largest(),
            reference.last().map_or(0, |&(size, ..)| size)
        );
        if step % 1000 == 0 {
            let at_least: u64 = reference
                .range((size, 0, 0, 0)..)
                .map(|&(size, ..)| u64::from(size))
                .sum();
            assert_eq!(index.granules_in_blocks_of_at_least(size), at_least);
            assert_eq!(
                index.total(),
                reference
                    .iter()
                    .map(|&(size, ..)| u64::from(size))
                    .sum::<u64>()
            );
        }
    }
}
