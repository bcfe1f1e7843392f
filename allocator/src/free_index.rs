//! The index of free blocks: segregated size classes (as in TLSF and `offset-allocator`) with a
//! bitmap of the non-empty ones, and inside each class an ordered set, so best fit stays *exact*.
//!
//! Why classes: one ordered set over every free block costs a deep B-tree walk with a four-field
//! comparison per level on each insert, remove and search, four to six times per allocate+free
//! pair. Classes split that set into many small ones (usually a single B-tree leaf), and a bitmap
//! finds the next non-empty class in a few instructions.
//!
//! Why it is still exact: classes partition sizes in increasing order, and each class is ordered
//! by (size, segment, offset). Every block in a class above the request's own class is larger than
//! the request, so the smallest block of the first non-empty class above it is the best fit (ties
//! to the lowest address come first in its order); only the request's own class needs a range
//! search from the requested size.

use crate::block::Block;
use crate::class_set::ClassSet;

/// Classes per power of two above the exact range; sizes (in granules) below this many each have
/// a class of their own. 16 keeps classes small (a few blocks each in a training loop) while the
/// bitmap stays 16 words.
const SUB_CLASS_BITS: u32 = 4;
const SUB_CLASSES: usize = 1 << SUB_CLASS_BITS;
/// Enough classes for any `u64` size in granules (exponents up to 63).
const CLASSES: usize = (64 - SUB_CLASS_BITS as usize + 1) * SUB_CLASSES;
const WORDS: usize = CLASSES.div_ceil(64);

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
}

/// Every free block, by size class. Invariant: holds exactly the free blocks of live segments;
/// `len` and `total_bytes` are their count and the sum of their sizes.
#[derive(Debug)]
pub(crate) struct FreeIndex {
    /// log2 of the granule; classes are computed on sizes in granules.
    granule_log2: u32,
    /// `classes[c]` holds exactly the keys whose size maps to class `c` (see `class_of`); class
    /// order follows size order, so concatenating the classes gives (size, segment, offset) order.
    classes: Vec<ClassSet>,
    /// Bit `c % 64` of word `c / 64` is set exactly when `classes[c]` is non-empty.
    non_empty: [u64; WORDS],
    /// Bit `w` is set exactly when `non_empty[w] != 0`.
    non_empty_words: u64,
    len: usize,
    total_bytes: u64,
}

impl FreeIndex {
    /// An empty index for sizes that are multiples of `granule_bytes` (a power of two).
    pub fn new(granule_bytes: u64) -> Self {
        Self {
            granule_log2: granule_bytes.trailing_zeros(),
            classes: (0..CLASSES).map(|_| ClassSet::default()).collect(),
            non_empty: [0; WORDS],
            non_empty_words: 0,
            len: 0,
            total_bytes: 0,
        }
    }

    /// The class of a size: exact below `SUB_CLASSES` granules, then `SUB_CLASSES` classes per
    /// power of two (the top `SUB_CLASS_BITS` bits after the leading one). Monotonic in size.
    fn class_of(&self, size_bytes: u64) -> usize {
        let granules = size_bytes >> self.granule_log2;
        if granules < SUB_CLASSES as u64 {
            return granules as usize;
        }
        let exponent = 63 - granules.leading_zeros();
        let mantissa = (granules >> (exponent - SUB_CLASS_BITS)) as usize & (SUB_CLASSES - 1);
        (exponent - SUB_CLASS_BITS + 1) as usize * SUB_CLASSES + mantissa
    }

    /// The first non-empty class at or above `class`.
    fn next_non_empty(&self, class: usize) -> Option<usize> {
        let word = class / 64;
        if word >= WORDS {
            return None;
        }
        let bits = self.non_empty[word] & (u64::MAX << (class % 64));
        if bits != 0 {
            return Some(word * 64 + bits.trailing_zeros() as usize);
        }
        let words = self.non_empty_words & (u64::MAX << word << 1);
        if words == 0 {
            return None;
        }
        let word = words.trailing_zeros() as usize;
        Some(word * 64 + self.non_empty[word].trailing_zeros() as usize)
    }

    /// The last non-empty class.
    fn last_non_empty(&self) -> Option<usize> {
        let word = 63usize.checked_sub(self.non_empty_words.leading_zeros() as usize)?;
        Some(word * 64 + 63 - self.non_empty[word].leading_zeros() as usize)
    }

    pub fn insert(&mut self, key: FreeKey) {
        let class = self.class_of(key.size_bytes);
        if self.classes[class].insert(key) {
            self.total_bytes += key.size_bytes;
            self.len += 1;
            self.non_empty[class / 64] |= 1 << (class % 64);
            self.non_empty_words |= 1 << (class / 64);
        }
    }

    pub fn remove(&mut self, key: &FreeKey) {
        let class = self.class_of(key.size_bytes);
        let set = &mut self.classes[class];
        if set.remove(key) {
            self.total_bytes -= key.size_bytes;
            self.len -= 1;
            if set.is_empty() {
                let word = &mut self.non_empty[class / 64];
                *word &= !(1 << (class % 64));
                if *word == 0 {
                    self.non_empty_words &= !(1 << (class / 64));
                }
            }
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The largest free block's size, 0 when none. O(1) plus one B-tree descent in a class.
    pub fn largest_bytes(&self) -> u64 {
        self.last_non_empty()
            .and_then(|class| self.classes[class].last())
            .map_or(0, |key| key.size_bytes)
    }

    /// The best fit: the smallest free block that holds `size_bytes` at an offset aligned to
    /// `alignment` (a power of two, at least the granule), ties to the lowest address.
    ///
    /// Cost: O(log n) plus the blocks in `[size, size + alignment - granule)` whose offset leaves
    /// too little room after aligning; any block of at least `size + alignment - granule` fits,
    /// so with the default alignment (the granule) the first candidate always fits.
    pub fn best_fit(&self, size_bytes: u64, alignment: u64) -> Option<FreeKey> {
        let fits = |key: &FreeKey| {
            align_up(key.offset, alignment) + size_bytes <= key.offset + key.size_bytes
        };
        let class = self.class_of(size_bytes);
        if let Some(key) = self.classes[class]
            .iter_from(FreeKey::first_of_size(size_bytes))
            .find(fits)
        {
            return Some(key);
        }
        let mut next = self.next_non_empty(class + 1);
        while let Some(class) = next {
            if let Some(key) = self.classes[class].iter().find(fits) {
                return Some(key);
            }
            next = self.next_non_empty(class + 1);
        }
        None
    }

    /// Sum of the sizes of free blocks of at least `size_bytes`. O(log n + k).
    pub fn bytes_in_blocks_of_at_least(&self, size_bytes: u64) -> u64 {
        let class = self.class_of(size_bytes);
        let mut total: u64 = self.classes[class]
            .iter_from(FreeKey::first_of_size(size_bytes))
            .map(|key| key.size_bytes)
            .sum();
        let mut next = self.next_non_empty(class + 1);
        while let Some(class) = next {
            total += self.classes[class]
                .iter()
                .map(|key| key.size_bytes)
                .sum::<u64>();
            next = self.next_non_empty(class + 1);
        }
        total
    }

    pub fn contains(&self, key: &FreeKey) -> bool {
        self.classes[self.class_of(key.size_bytes)].contains(key)
    }
}

/// `offset` rounded up to `alignment` (a power of two).
pub(crate) fn align_up(offset: u64, alignment: u64) -> u64 {
    (offset + alignment - 1) & !(alignment - 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;

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
                index.insert(key);
                reference.insert(key);
            } else if let Some(&key) = reference
                .range(FreeKey::first_of_size(size)..)
                .next()
                .or(reference.first())
            {
                index.remove(&key);
                reference.remove(&key);
            }
            let alignment = granule << (next(&mut state) % 4);
            assert_eq!(
                index.best_fit(size, alignment),
                reference_best_fit(&reference, size, alignment),
                "step {step}: size {size}, alignment {alignment}"
            );
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
