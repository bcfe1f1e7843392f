//! The index of free blocks: segregated size classes (as in TLSF and `offset-allocator`) with a
//! bitmap of the non-empty ones, and inside each class an ordered set, so best fit stays *exact*.
//!
//! Why exact classes: every size up to `EXACT_CLASSES` granules (16 MiB at 256 B) has a class of
//! its own, so all blocks of such a class have the same size and the best fit in it is simply
//! its lowest address that satisfies the alignment; with the default alignment (the granule) that
//! is the class's first key, found in O(1), and `best_fit` hands back where it found it, so
//! `take` removes it without a second search. Those classes are ordered by address alone, a key
//! of (segment, offset) compared as one `u128`, not the four fields of a [`FreeKey`]. Larger
//! sizes fall into `SUB_CLASSES` classes per power of two, ordered by (size, segment, offset);
//! they hold only blocks of more than 16 MiB (at 256 B granules), which are few.
//!
//! Why a three-level bitmap: there are 66,304 classes, and the next non-empty class at or above a
//! size, or the last one (the largest free block), is still three word scans away.
//!
//! Why it is still exact: classes partition sizes in increasing order, and each class is ordered
//! by (size, segment, offset). Every block in a class above the request's own class is larger than
//! the request, so the first block that fits in the first class that has one is the best fit (ties
//! to the lowest address come first in its order); only a request's own sub-divided class needs a
//! range search from the requested size.

use crate::block::Block;
use crate::class_bitmap::{ClassBitmap, MAX_CLASSES};
use crate::class_set::{ClassSet, Position, UNKNOWN_POSITION};

/// Sizes below this many granules each have a class of their own (16 MiB at 256 B granules).
const EXACT_BITS: u32 = 16;
const EXACT_CLASSES: usize = 1 << EXACT_BITS;
/// Classes per power of two above the exact range.
const SUB_CLASS_BITS: u32 = 4;
const SUB_CLASSES: usize = 1 << SUB_CLASS_BITS;
/// Enough classes for any `u64` size in granules (exponents up to 63).
const CLASSES: usize = EXACT_CLASSES + (64 - EXACT_BITS as usize) * SUB_CLASSES;
const _: () = assert!(CLASSES <= MAX_CLASSES);

/// Key of a free block: ordered by size, then address (segment, offset), so the first key at or
/// above a size is the best fit with ties to the lowest address. `block` only rides along.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FreeKey {
    pub size_bytes: u64,
    pub segment: u32,
    pub offset: u64,
    pub block: u32,
}

impl FreeKey {
    pub fn of(index: u32, block: &Block) -> Self {
        Self {
            size_bytes: block.size_bytes,
            segment: block.segment.0,
            offset: block.offset,
            block: index,
        }
    }

    /// The smallest key of size `size_bytes`.
    fn first_of_size(size_bytes: u64) -> Self {
        Self {
            size_bytes,
            segment: 0,
            offset: 0,
            block: 0,
        }
    }

    fn address(&self) -> AddressKey {
        AddressKey {
            segment: self.segment,
            block: self.block,
            offset: self.offset,
        }
    }
}

/// Key of a free block in an exact class (where every block has the class's size): ordered and
/// compared by address (segment, offset) alone, as one `u128`, since no two free blocks share an
/// address; `block` only rides along. 16 bytes, so a class's sorted `Vec` moves little on insert.
#[derive(Clone, Copy, Debug)]
struct AddressKey {
    segment: u32,
    block: u32,
    offset: u64,
}

impl AddressKey {
    fn address(&self) -> u128 {
        (u128::from(self.segment) << 64) | u128::from(self.offset)
    }

    fn with_size(self, size_bytes: u64) -> FreeKey {
        FreeKey {
            size_bytes,
            segment: self.segment,
            offset: self.offset,
            block: self.block,
        }
    }
}

impl PartialEq for AddressKey {
    fn eq(&self, other: &Self) -> bool {
        self.address() == other.address()
    }
}

impl Eq for AddressKey {}

impl Ord for AddressKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.address().cmp(&other.address())
    }
}

impl PartialOrd for AddressKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A best fit found by [`FreeIndex::best_fit`], with where it was found, so that
/// [`FreeIndex::take`] removes it without a second search.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fit {
    pub key: FreeKey,
    class: usize,
    position: Position,
}

impl Fit {
    /// A fit known only by its key (removal then searches).
    pub fn of_key(key: FreeKey) -> Self {
        Self {
            key,
            class: usize::MAX,
            position: UNKNOWN_POSITION,
        }
    }
}

/// Every free block, by size class. Invariant: holds exactly the free blocks of live segments;
/// `len` and `total_bytes` are their count and the sum of their sizes.
#[derive(Debug)]
pub(crate) struct FreeIndex {
    /// log2 of the granule; classes are computed on sizes in granules.
    granule_log2: u32,
    /// `exact[c]` holds exactly the blocks of `c` granules (class `c`, below `EXACT_CLASSES`).
    /// Grown on demand, so an allocator with small segments stays small.
    exact: Vec<ClassSet<AddressKey>>,
    /// `ranged[c - EXACT_CLASSES]` holds exactly the keys whose size maps to class `c` (see
    /// `class_of`); class order follows size order.
    ranged: Vec<ClassSet<FreeKey>>,
    /// Class `c` is set exactly when it holds a block.
    non_empty: ClassBitmap,
    len: usize,
    total_bytes: u64,
    /// The size of the largest block held, 0 when none (read twice per allocate+free pair, so
    /// kept rather than recomputed).
    largest_bytes: u64,
}

impl FreeIndex {
    /// An empty index for sizes that are multiples of `granule_bytes` (a power of two).
    pub fn new(granule_bytes: u64) -> Self {
        Self {
            granule_log2: granule_bytes.trailing_zeros(),
            exact: Vec::new(),
            ranged: Vec::new(),
            non_empty: ClassBitmap::default(),
            len: 0,
            total_bytes: 0,
            largest_bytes: 0,
        }
    }

    /// The class of a size: exact below `EXACT_CLASSES` granules, then `SUB_CLASSES` classes per
    /// power of two (the top `SUB_CLASS_BITS` bits after the leading one). Monotonic in size.
    #[inline]
    fn class_of(&self, size_bytes: u64) -> usize {
        let granules = size_bytes >> self.granule_log2;
        if granules < EXACT_CLASSES as u64 {
            return granules as usize;
        }
        let exponent = 63 - granules.leading_zeros();
        let mantissa = (granules >> (exponent - SUB_CLASS_BITS)) as usize & (SUB_CLASSES - 1);
        EXACT_CLASSES + (exponent - EXACT_BITS) as usize * SUB_CLASSES + mantissa
    }

    /// Adds a free block. Why `inline(always)`: it has three callers on the allocate+free path,
    /// and out of line its register saves cost about 8 instructions per pair.
    #[inline(always)]
    pub fn insert(&mut self, key: FreeKey) {
        let class = self.class_of(key.size_bytes);
        let (was_empty, inserted) = if class < EXACT_CLASSES {
            if class >= self.exact.len() {
                self.exact.resize_with(class + 1, ClassSet::default);
            }
            let set = &mut self.exact[class];
            (set.is_empty(), set.insert(key.address()))
        } else {
            let ranged = class - EXACT_CLASSES;
            if ranged >= self.ranged.len() {
                self.ranged.resize_with(ranged + 1, ClassSet::default);
            }
            let set = &mut self.ranged[ranged];
            (set.is_empty(), set.insert(key))
        };
        if inserted {
            self.total_bytes += key.size_bytes;
            self.len += 1;
            self.largest_bytes = self.largest_bytes.max(key.size_bytes);
            // Only a class's first key changes the bitmap; skipping it spares three stores.
            if was_empty {
                self.non_empty.set(class);
            }
        }
    }

    pub fn remove(&mut self, key: &FreeKey) {
        self.take(&Fit::of_key(*key));
    }

    /// Removes the block that `best_fit` found (or any key, through [`Fit::of_key`]).
    #[inline]
    pub fn take(&mut self, fit: &Fit) {
        let key = &fit.key;
        let class = self.class_of(key.size_bytes);
        let position = if class == fit.class {
            fit.position
        } else {
            UNKNOWN_POSITION
        };
        let (removed, now_empty) = if class < EXACT_CLASSES {
            match self.exact.get_mut(class) {
                Some(set) => (set.remove_at(position, &key.address()), set.is_empty()),
                None => (false, false),
            }
        } else {
            match self.ranged.get_mut(class - EXACT_CLASSES) {
                Some(set) => (set.remove_at(position, key), set.is_empty()),
                None => (false, false),
            }
        };
        if removed {
            self.total_bytes -= key.size_bytes;
            self.len -= 1;
            if now_empty {
                self.non_empty.clear(class);
            }
            if key.size_bytes == self.largest_bytes {
                self.largest_bytes = self.find_largest_bytes();
            }
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The largest free block's size, 0 when none. O(1).
    pub fn largest_bytes(&self) -> u64 {
        self.largest_bytes
    }

    /// The largest free block's size, found from the bitmap: O(1), plus one B-tree descent in a
    /// class above the exact range.
    fn find_largest_bytes(&self) -> u64 {
        match self.non_empty.last() {
            None => 0,
            Some(class) if class < EXACT_CLASSES => (class as u64) << self.granule_log2,
            Some(class) => self.ranged[class - EXACT_CLASSES]
                .last()
                .map_or(0, |key| key.size_bytes),
        }
    }

    /// The best fit: the smallest free block that holds `size_bytes` at an offset aligned to
    /// `alignment` (a power of two, at least the granule), ties to the lowest address.
    ///
    /// Cost: O(1) bitmap scans plus, per class visited, O(log n) plus the blocks whose offset
    /// leaves too little room after aligning; any block of at least `size + alignment - granule`
    /// fits, so with the default alignment (the granule) the first candidate always fits.
    pub fn best_fit(&self, size_bytes: u64, alignment: u64) -> Option<Fit> {
        let own_class = self.class_of(size_bytes);
        let any_fits = alignment >> self.granule_log2 <= 1;
        let mut next = self.non_empty.next_at_or_after(own_class);
        while let Some(class) = next {
            if class < EXACT_CLASSES {
                let class_bytes = (class as u64) << self.granule_log2;
                let set = &self.exact[class];
                let found = if any_fits {
                    set.first()
                } else {
                    set.find_first(None, |key| {
                        let offset = key.offset;
                        align_up(offset, alignment) + size_bytes <= offset + class_bytes
                    })
                };
                if let Some((key, position)) = found {
                    let key = key.with_size(class_bytes);
                    return Some(Fit {
                        key,
                        class,
                        position,
                    });
                }
            } else {
                let start = (class == own_class).then(|| FreeKey::first_of_size(size_bytes));
                let found = self.ranged[class - EXACT_CLASSES].find_first(start, |key| {
                    align_up(key.offset, alignment) + size_bytes <= key.offset + key.size_bytes
                });
                if let Some((key, position)) = found {
                    return Some(Fit {
                        key,
                        class,
                        position,
                    });
                }
            }
            next = self.non_empty.next_at_or_after(class + 1);
        }
        None
    }

    /// Sum of the sizes of free blocks of at least `size_bytes`. O(log n + k).
    pub fn bytes_in_blocks_of_at_least(&self, size_bytes: u64) -> u64 {
        let own_class = self.class_of(size_bytes);
        let mut total = 0;
        let mut next = self.non_empty.next_at_or_after(own_class);
        while let Some(class) = next {
            if class < EXACT_CLASSES {
                total += self.exact[class].len() as u64 * ((class as u64) << self.granule_log2);
            } else {
                let start = (class == own_class).then(|| FreeKey::first_of_size(size_bytes));
                self.ranged[class - EXACT_CLASSES]
                    .for_each_from(start, |key| total += key.size_bytes);
            }
            next = self.non_empty.next_at_or_after(class + 1);
        }
        total
    }

    pub fn contains(&self, key: &FreeKey) -> bool {
        let class = self.class_of(key.size_bytes);
        if class < EXACT_CLASSES {
            self.exact
                .get(class)
                .is_some_and(|set| set.contains(&key.address()))
        } else {
            self.ranged
                .get(class - EXACT_CLASSES)
                .is_some_and(|set| set.contains(key))
        }
    }
}

/// `offset` rounded up to `alignment` (a power of two).
pub(crate) fn align_up(offset: u64, alignment: u64) -> u64 {
    (offset + alignment - 1) & !(alignment - 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::{BTreeSet, HashSet};

    use super::*;

    /// splitmix64, so the test replays the same actions every run.
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The reference: one ordered set, searched from the requested size (the old index).
    fn reference_best_fit(keys: &BTreeSet<FreeKey>, size: u64, alignment: u64) -> Option<FreeKey> {
        keys.range(FreeKey::first_of_size(size)..)
            .find(|key| align_up(key.offset, alignment) + size <= key.offset + key.size_bytes)
            .copied()
    }

    #[test]
    fn classes_cover_sizes_in_order() {
        let index = FreeIndex::new(256);
        let mut previous = 0;
        for granules in (1..100_000u64).chain([u64::MAX >> 8]) {
            let class = index.class_of(granules * 256);
            assert!(
                class >= previous && class < CLASSES,
                "{granules} -> {class}"
            );
            previous = class;
        }
    }

    /// Random inserts, removes and searches against the reference, with sizes skewed so that some
    /// classes grow past the sorted-`Vec` limit and turn into trees and back.
    #[test]
    fn best_fit_matches_one_ordered_set() {
        let granule = 256;
        let mut state = 7;
        let mut index = FreeIndex::new(granule);
        let mut reference = BTreeSet::new();
        let mut addresses = HashSet::new();
        for step in 0..100_000u32 {
            let roll = next(&mut state);
            let size = granule
                * match roll % 4 {
                    0 => 1 + roll % 3,
                    1 => 1 + (roll >> 8) % 64,
                    _ => 1 + (roll >> 8) % (1 << ((roll >> 40) % 20)),
                };
            if roll % 7 < 4 {
                let key = FreeKey {
                    size_bytes: size,
                    segment: (next(&mut state) % 8) as u32,
                    offset: granule * (next(&mut state) % 64),
                    block: step,
                };
                // Free blocks never share an address (blocks tile their segments).
                if addresses.insert((key.size_bytes, key.segment, key.offset)) {
                    index.insert(key);
                    reference.insert(key);
                }
            } else if let Some(&key) = reference
                .range(FreeKey::first_of_size(size)..)
                .next()
                .or(reference.first())
            {
                index.remove(&key);
                reference.remove(&key);
                addresses.remove(&(key.size_bytes, key.segment, key.offset));
            }
            let alignment = granule << (next(&mut state) % 4);
            let fit = index.best_fit(size, alignment);
            assert_eq!(
                fit.map(|fit| fit.key),
                reference_best_fit(&reference, size, alignment),
                "step {step}: size {size}, alignment {alignment}"
            );
            // Sometimes take what was found, as `place` does (removal by position).
            if let Some(fit) = fit.filter(|_| step.is_multiple_of(5)) {
                index.take(&fit);
                reference.remove(&fit.key);
                addresses.remove(&(fit.key.size_bytes, fit.key.segment, fit.key.offset));
            }
            assert_eq!(index.len(), reference.len());
            assert_eq!(
                index.largest_bytes(),
                reference.last().map_or(0, |key| key.size_bytes)
            );
            if step % 1000 == 0 {
                let at_least: u64 = reference
                    .range(FreeKey::first_of_size(size)..)
                    .map(|key| key.size_bytes)
                    .sum();
                assert_eq!(index.bytes_in_blocks_of_at_least(size), at_least);
                assert_eq!(
                    index.total_bytes(),
                    reference.iter().map(|key| key.size_bytes).sum::<u64>()
                );
            }
        }
    }
}
