//! The ordered set of free keys inside one size class of the free index.
//!
//! Why two shapes: a class usually holds a handful of blocks (a median of about ten with 10k live
//! blocks), and for that few a binary search over a sorted `Vec` plus a short memmove costs a
//! fraction of a B-tree's generic node walk. A class that grows past `MAX_SORTED` keys (many free
//! blocks of one size) becomes a `BTreeSet`, so no operation moves more than `MAX_SORTED` keys and
//! every one stays O(log n); it turns back only below `MIN_TREE`, so a class hovering around the
//! threshold does not convert back and forth.

use std::collections::BTreeSet;
use std::collections::btree_set;
use std::ops::Bound;

use crate::free_index::FreeKey;

/// Most keys kept as a sorted `Vec` (a memmove of at most 64 x 24 bytes).
const MAX_SORTED: usize = 64;
/// A tree with fewer keys turns back into a sorted `Vec`.
const MIN_TREE: usize = MAX_SORTED / 2;

/// Free keys of one class in (size, segment, offset) order; each key at most once.
#[derive(Debug)]
pub(crate) enum ClassSet {
    /// Strictly increasing; at most `MAX_SORTED` keys.
    Sorted(Vec<FreeKey>),
    /// At least `MIN_TREE` keys.
    Tree(BTreeSet<FreeKey>),
}

impl Default for ClassSet {
    fn default() -> Self {
        Self::Sorted(Vec::new())
    }
}

impl ClassSet {
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Sorted(keys) => keys.is_empty(),
            Self::Tree(keys) => keys.is_empty(),
        }
    }

    /// Inserts `key`; false if it was already there.
    pub fn insert(&mut self, key: FreeKey) -> bool {
        match self {
            Self::Sorted(keys) => {
                let index = keys.partition_point(|probe| *probe < key);
                if keys.get(index) == Some(&key) {
                    return false;
                }
                if keys.len() < MAX_SORTED {
                    keys.insert(index, key);
                } else {
                    let mut tree: BTreeSet<FreeKey> = keys.drain(..).collect();
                    tree.insert(key);
                    *self = Self::Tree(tree);
                }
                true
            }
            Self::Tree(keys) => keys.insert(key),
        }
    }

    /// Removes `key`; false if it was not there.
    pub fn remove(&mut self, key: &FreeKey) -> bool {
        match self {
            Self::Sorted(keys) => match keys.binary_search(key) {
                Ok(index) => {
                    keys.remove(index);
                    true
                }
                Err(_) => false,
            },
            Self::Tree(keys) => {
                let removed = keys.remove(key);
                if keys.len() < MIN_TREE {
                    *self = Self::Sorted(std::mem::take(keys).into_iter().collect());
                }
                removed
            }
        }
    }

    pub fn contains(&self, key: &FreeKey) -> bool {
        match self {
            Self::Sorted(keys) => keys.binary_search(key).is_ok(),
            Self::Tree(keys) => keys.contains(key),
        }
    }

    pub fn last(&self) -> Option<&FreeKey> {
        match self {
            Self::Sorted(keys) => keys.last(),
            Self::Tree(keys) => keys.last(),
        }
    }

    /// The keys at or above `start`, in order.
    pub fn iter_from(&self, start: FreeKey) -> ClassIter<'_> {
        match self {
            Self::Sorted(keys) => {
                ClassIter::Sorted(keys[keys.partition_point(|probe| *probe < start)..].iter())
            }
            Self::Tree(keys) => {
                ClassIter::Tree(keys.range((Bound::Included(start), Bound::Unbounded)))
            }
        }
    }

    /// Every key, in order.
    pub fn iter(&self) -> ClassIter<'_> {
        match self {
            Self::Sorted(keys) => ClassIter::Sorted(keys.iter()),
            Self::Tree(keys) => ClassIter::Tree(keys.range(..)),
        }
    }
}

/// An in-order iterator over (part of) a [`ClassSet`].
pub(crate) enum ClassIter<'a> {
    Sorted(std::slice::Iter<'a, FreeKey>),
    Tree(btree_set::Range<'a, FreeKey>),
}

impl Iterator for ClassIter<'_> {
    type Item = FreeKey;

    fn next(&mut self) -> Option<FreeKey> {
        match self {
            Self::Sorted(keys) => keys.next().copied(),
            Self::Tree(keys) => keys.next().copied(),
        }
    }
}
