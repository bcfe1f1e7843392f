//! The ordered set of free keys inside one size class of the free index.
//!
//! Why two shapes: a class usually holds a handful of blocks, and for that few a binary search
//! over a sorted `Vec` plus a memmove costs a fraction of a B-tree's generic node walk. A
//! class that grows past `MAX_SORTED` keys (many free blocks of one size, such as one-granule
//! slivers) becomes a `BTreeSet`, so no operation moves more than `MAX_SORTED` keys and every one
//! stays O(log n); it turns back only below `MIN_TREE`, so a class hovering around the threshold
//! does not convert back and forth.
//!
//! Why the `Vec` is kept in *decreasing* order: best fit nearly always takes the smallest key of a
//! class, and at the end of a `Vec` that is a pop, with no memmove.
//!
//! Why `Empty` and `One`: most sets hold one key, and a key stored inline costs no heap buffer, so
//! no second cache miss, on insert, best fit and removal. A set takes a `Vec` only at its second
//! key and keeps it (even empty) from then on, so a set hovering between one and two keys does not
//! allocate each time.

use std::collections::BTreeSet;

/// Most keys kept as a sorted `Vec`: a memmove of at most 4 KiB of 16-byte keys (one `rep movsb`)
/// costs less than a B-tree's node walk with a key comparison per step, at 10k live blocks.
const MAX_SORTED: usize = 256;
/// A tree with fewer keys turns back into a sorted `Vec`.
const MIN_TREE: usize = MAX_SORTED / 2;

/// Where [`ClassSet::find_first`] found a key, so that removing it needs no second search; only
/// a hint (checked before use), since the set may have changed meanwhile.
pub(crate) type Position = usize;

/// A position that never matches, so removal searches.
pub(crate) const UNKNOWN_POSITION: Position = usize::MAX;

/// Keys of one class; each key at most once.
#[derive(Debug, Default)]
pub(crate) enum ClassSet<K> {
    /// No key.
    #[default]
    Empty,
    /// Exactly one key, inline.
    One(K),
    /// Strictly *decreasing*; at most `MAX_SORTED` keys (possibly none: an emptied set keeps its
    /// buffer).
    Sorted(Vec<K>),
    /// At least `MIN_TREE` keys.
    Tree(BTreeSet<K>),
}

impl<K: Ord + Copy> ClassSet<K> {
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::One(_) => false,
            Self::Sorted(keys) => keys.is_empty(),
            Self::Tree(keys) => keys.is_empty(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::One(_) => 1,
            Self::Sorted(keys) => keys.len(),
            Self::Tree(keys) => keys.len(),
        }
    }

    /// Inserts `key`; false if it was already there.
    #[inline]
    pub fn insert(&mut self, key: K) -> bool {
        match self {
            Self::Empty => {
                *self = Self::One(key);
                true
            }
            Self::One(one) => {
                let one = *one;
                if one == key {
                    return false;
                }
                let mut keys = Vec::with_capacity(4);
                keys.extend(if one > key { [one, key] } else { [key, one] });
                *self = Self::Sorted(keys);
                true
            }
            Self::Sorted(keys) => {
                let index = keys.partition_point(|probe| *probe > key);
                if keys.get(index) == Some(&key) {
                    return false;
                }
                if keys.len() < MAX_SORTED {
                    keys.insert(index, key);
                } else {
                    let mut tree: BTreeSet<K> = keys.drain(..).collect();
                    tree.insert(key);
                    *self = Self::Tree(tree);
                }
                true
            }
            Self::Tree(keys) => keys.insert(key),
        }
    }

    /// Removes `key`, looking first at `position` (from `find_first`); false if it was not there.
    #[inline]
    pub fn remove_at(&mut self, position: Position, key: &K) -> bool {
        match self {
            Self::Empty => false,
            Self::One(one) => {
                if one != key {
                    return false;
                }
                *self = Self::Empty;
                true
            }
            Self::Sorted(keys) => {
                let index = if keys.get(position) == Some(key) {
                    position
                } else {
                    match keys.binary_search_by(|probe| key.cmp(probe)) {
                        Ok(index) => index,
                        Err(_) => return false,
                    }
                };
                // The smallest key (the usual best fit) is last: a pop, no call to `Vec::remove`.
                if index + 1 == keys.len() {
                    keys.pop();
                } else {
                    keys.remove(index);
                }
                // An emptied `Vec` is kept with its capacity: the free index reuses emptied sets
                // (pools), and giving the buffer back cost a `free` and a `malloc` per reuse.
                true
            }
            Self::Tree(keys) => {
                let removed = keys.remove(key);
                if keys.len() < MIN_TREE {
                    *self = Self::Sorted(std::mem::take(keys).into_iter().rev().collect());
                }
                removed
            }
        }
    }

    pub fn contains(&self, key: &K) -> bool {
        match self {
            Self::Empty => false,
            Self::One(one) => one == key,
            Self::Sorted(keys) => keys.binary_search_by(|probe| key.cmp(probe)).is_ok(),
            Self::Tree(keys) => keys.contains(key),
        }
    }

    /// The smallest key and its position.
    #[inline]
    pub fn first(&self) -> Option<(K, Position)> {
        match self {
            Self::Empty => None,
            Self::One(one) => Some((*one, 0)),
            Self::Sorted(keys) => Some((*keys.last()?, keys.len() - 1)),
            Self::Tree(keys) => Some((*keys.first()?, UNKNOWN_POSITION)),
        }
    }

    /// The largest key.
    pub fn last(&self) -> Option<&K> {
        match self {
            Self::Empty => None,
            Self::One(one) => Some(one),
            Self::Sorted(keys) => keys.first(),
            Self::Tree(keys) => keys.last(),
        }
    }

    /// The smallest key at or above `start` (every key if `None`) for which `accept` holds, with
    /// its position. O(log n + k) for k keys rejected.
    pub fn find_first(
        &self,
        start: Option<K>,
        mut accept: impl FnMut(&K) -> bool,
    ) -> Option<(K, Position)> {
        match self {
            Self::Empty => None,
            Self::One(one) => {
                (start.is_none_or(|start| *one >= start) && accept(one)).then_some((*one, 0))
            }
            Self::Sorted(keys) => {
                let end = start.map_or(keys.len(), |start| {
                    keys.partition_point(|probe| *probe >= start)
                });
                (0..end)
                    .rev()
                    .find(|&index| accept(&keys[index]))
                    .map(|index| (keys[index], index))
            }
            Self::Tree(keys) => {
                let found = match start {
                    Some(start) => keys.range(start..).find(|key| accept(key)),
                    None => keys.iter().find(|key| accept(key)),
                };
                found.map(|key| (*key, UNKNOWN_POSITION))
            }
        }
    }

    /// Calls `visit` on every key at or above `start` (every key if `None`).
    pub fn for_each_from(&self, start: Option<K>, mut visit: impl FnMut(&K)) {
        match self {
            Self::Empty => {}
            Self::One(one) => {
                if start.is_none_or(|start| *one >= start) {
                    visit(one);
                }
            }
            Self::Sorted(keys) => {
                let end = start.map_or(keys.len(), |start| {
                    keys.partition_point(|probe| *probe >= start)
                });
                keys[..end].iter().for_each(&mut visit);
            }
            Self::Tree(keys) => match start {
                Some(start) => keys.range(start..).for_each(visit),
                None => keys.iter().for_each(visit),
            },
        }
    }
}
