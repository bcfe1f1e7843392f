//! The index of free blocks: segregated size classes (as in TLSF and `offset-allocator`) with a
//! bitmap of the non-empty ones, and inside each class the blocks in address order, so best fit
//! stays *exact*. Sizes and offsets are in granules, as in [`Block`].
//!
//! Why exact classes: every size below `EXACT_CLASSES` granules (16 MiB at 256 B) has a class of
//! its own, so all blocks of such a class have the same size and the best fit in it is simply
//! its lowest address that satisfies the alignment; with the default alignment (the granule) that
//! is the class's *head*. Larger sizes fall into `SUB_CLASSES` classes per power of two, ordered
//! by (size, segment, offset); they hold only blocks of 16 MiB or more (at 256 B granules), which
//! are few.
//!
//! Why an exact class is a [`Head`] of 16 bytes: there are 65,536 of them, nearly all empty or
//! holding one block, and an allocate+free pair touches four to six of them at random. A head names
//! the class's lowest-address block and its address; the class's other blocks (if any) sit in an
//! ordered *pool*, which exists only while the class holds two blocks or more, and most pools hold
//! one key inline. As 32-byte ordered sets with no heap buffer for one key, the classes spanned
//! 2 MiB, as large as this machine's L2 cache; the heads of the sizes in use span far less.
//!
//! Why a three-level bitmap: there are 65,792 classes, and the next non-empty class at or above a
//! size, or the last one (the largest free block), is still three word scans away.
//!
//! Why it is still exact: classes partition sizes in increasing order, and each class is ordered
//! by (size, segment, offset). Every block in a class above the request's own class is larger than
//! the request, so the first block that fits in the first class that has one is the best fit (ties
//! to the lowest address come first in its order); only a request's own sub-divided class needs a
//! range search from the requested size.

use crate::block::{Block, BlockSlab, NIL};
use crate::class_bitmap::{ClassBitmap, MAX_CLASSES};
use crate::class_set::{ClassSet, UNKNOWN_POSITION};

/// Sizes below this many granules each have a class of their own (16 MiB at 256 B granules).
const EXACT_BITS: u32 = 16;
const EXACT_CLASSES: usize = 1 << EXACT_BITS;
/// Classes per power of two above the exact range.
const SUB_CLASS_BITS: u32 = 4;
const SUB_CLASSES: usize = 1 << SUB_CLASS_BITS;
/// Enough classes for any `u32` size in granules (exponents up to 31).
const CLASSES: usize = EXACT_CLASSES + (32 - EXACT_BITS as usize) * SUB_CLASSES;
const _: () = assert!(CLASSES <= MAX_CLASSES);

/// A block in an exact class's pool: ordered by address (see [`Block::address`]), then by slab
/// index (which never decides, since no two free blocks share an address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PoolKey {
    address: u64,
    block: u32,
}

impl PoolKey {
    fn of(index: u32, block: &Block) -> Self {
        Self {
            address: block.address(),
            block: index,
        }
    }

    /// The offset in granules (the low half of the address).
    fn offset(&self) -> u32 {
        self.address as u32
    }
}

/// A block in a class above the exact range: ordered by size, then address, then slab index, so
/// the first key at or above a size is the best fit with ties to the lowest address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RangedKey {
    size: u32,
    address: u64,
    block: u32,
}

impl RangedKey {
    fn of(index: u32, block: &Block) -> Self {
        Self {
            size: block.size,
            address: block.address(),
            block: index,
        }
    }

    /// The smallest key of size `size`.
    fn first_of_size(size: u32) -> Self {
        Self {
            size,
            address: 0,
            block: 0,
        }
    }
}

/// One exact class: `block` is the slab index of its lowest-address block (`NIL` when the class is
/// empty) and `address` that block's address, and `pool` the index in `FreeIndex::pools` of the set
/// of its other blocks (`NIL` when it has none). Invariant: a pool is never empty, and every key in
/// it is above the head's address. The address is kept so that adding a block to a non-empty class
/// compares addresses without reading the head block (a likely cache miss).
#[derive(Clone, Copy, Debug)]
struct Head {
    block: u32,
    pool: u32,
    address: u64,
}

const EMPTY_HEAD: Head = Head {
    block: NIL,
    pool: NIL,
    address: 0,
};

/// A free block that [`FreeIndex::best_fit`] found: its slab index and size in granules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fit {
    pub index: u32,
    pub size: u32,
}

/// Every free block, by size class. Invariant: holds exactly the free blocks of live segments,
/// each under its current size and address (so a block leaves the index before either changes);
/// `len` and `total` are their count and the sum of their sizes.
#[derive(Debug)]
pub(crate) struct FreeIndex {
    /// `heads[c]` is exact class `c` (the blocks of `c` granules, `c` below `EXACT_CLASSES`). A
    /// fixed array (1 MiB, of which only the lines of sizes in use are ever touched), so a class
    /// indexes it with no bounds check and no growth check.
    heads: Box<[Head; EXACT_CLASSES]>,
    /// The pools that heads name; vacant ones are `Empty` and listed in `vacant_pools`.
    pools: Vec<ClassSet<PoolKey>>,
    vacant_pools: Vec<u32>,
    /// `ranged[c - EXACT_CLASSES]` holds exactly the keys whose size maps to class `c` (see
    /// `class_of`); class order follows size order.
    ranged: Vec<ClassSet<RangedKey>>,
    /// Class `c` is set exactly when it holds a block.
    non_empty: ClassBitmap,
    len: usize,
    /// Sum of the sizes held, in granules.
    total: u64,
    /// The size of the largest block held, 0 when none (read twice per allocate+free pair, so
    /// kept rather than recomputed).
    largest: u32,
}

impl Default for FreeIndex {
    fn default() -> Self {
        let heads = match vec![EMPTY_HEAD; EXACT_CLASSES]
            .into_boxed_slice()
            .try_into()
        {
            Ok(heads) => heads,
            Err(_) => unreachable!("the boxed slice has exactly EXACT_CLASSES heads"),
        };
        Self {
            heads,
            pools: Vec::new(),
            vacant_pools: Vec::new(),
            ranged: Vec::new(),
            non_empty: ClassBitmap::default(),
            len: 0,
            total: 0,
            largest: 0,
        }
    }
}

impl FreeIndex {
    /// The class of a size in granules: exact below `EXACT_CLASSES`, then `SUB_CLASSES` classes
    /// per power of two (the top `SUB_CLASS_BITS` bits after the leading one). Monotonic in size.
    #[inline]
    fn class_of(size: u32) -> usize {
        if size < EXACT_CLASSES as u32 {
            return size as usize;
        }
        let exponent = 31 - size.leading_zeros();
        let mantissa = (size >> (exponent - SUB_CLASS_BITS)) as usize & (SUB_CLASSES - 1);
        EXACT_CLASSES + (exponent - EXACT_BITS) as usize * SUB_CLASSES + mantissa
    }

    /// Adds free block `index` of `blocks` under its current size and address. Why
    /// `inline(always)`: it has three callers on the allocate+free path, and out of line its
    /// register saves cost about 8 instructions per pair.
    #[inline(always)]
    pub fn insert(&mut self, index: u32, blocks: &BlockSlab) {
        let block = &blocks[index];
        let size = block.size;
        let class = Self::class_of(size);
        let inserted = if class < EXACT_CLASSES {
            self.insert_exact(class, index, block)
        } else {
            let ranged = class - EXACT_CLASSES;
            if ranged >= self.ranged.len() {
                self.ranged.resize_with(ranged + 1, ClassSet::default);
            }
            let set = &mut self.ranged[ranged];
            let was_empty = set.is_empty();
            let inserted = set.insert(RangedKey::of(index, block));
            if inserted && was_empty {
                self.non_empty.set(class);
            }
            inserted
        };
        if inserted {
            self.total += u64::from(size);
            self.len += 1;
            self.largest = self.largest.max(size);
        }
    }

    /// Adds `block` (slab index `index`) to exact class `class`; false if it was already there.
    #[inline(always)]
    fn insert_exact(&mut self, class: usize, index: u32, block: &Block) -> bool {
        let class = class % EXACT_CLASSES;
        let head = self.heads[class];
        let incoming = PoolKey::of(index, block);
        if head.block == NIL {
            self.heads[class] = Head {
                block: index,
                pool: NIL,
                address: incoming.address,
            };
            self.non_empty.set(class);
            return true;
        }
        if head.block == index {
            return false;
        }
        let current = PoolKey {
            address: head.address,
            block: head.block,
        };
        // The lower address heads the class; the other goes to the pool. Which one is lower is a
        // coin toss, so select without a branch.
        let incoming_lower = incoming < current;
        let new_head = std::hint::select_unpredictable(incoming_lower, incoming, current);
        let pooled = std::hint::select_unpredictable(incoming_lower, current, incoming);
        let pool = if head.pool == NIL {
            self.new_pool()
        } else {
            head.pool
        };
        if !self.pools[pool as usize].insert(pooled) {
            if head.pool == NIL {
                self.vacant_pools.push(pool);
            }
            return false;
        }
        self.heads[class] = Head {
            block: new_head.block,
            pool,
            address: new_head.address,
        };
        true
    }

    /// A vacant (empty) pool's index, made if none is vacant.
    fn new_pool(&mut self) -> u32 {
        match self.vacant_pools.pop() {
            Some(pool) => pool,
            None => {
                self.pools.push(ClassSet::Empty);
                (self.pools.len() - 1) as u32
            }
        }
    }

    /// Removes free block `index` of `blocks`, under its current size and address; false if it
    /// was not there. Inlined for the same reason as `insert` (four callers on the path).
    #[inline(always)]
    pub fn remove(&mut self, index: u32, blocks: &BlockSlab) -> bool {
        let block = &blocks[index];
        let size = block.size;
        let class = Self::class_of(size);
        let removed = if class < EXACT_CLASSES {
            self.remove_exact(class, index, block)
        } else {
            match self.ranged.get_mut(class - EXACT_CLASSES) {
                Some(set) => {
                    let removed = set.remove_at(UNKNOWN_POSITION, &RangedKey::of(index, block));
                    if removed && set.is_empty() {
                        self.non_empty.clear(class);
                    }
                    removed
                }
                None => false,
            }
        };
        if removed {
            self.forget(size);
        }
        removed
    }

    /// Counts out a removed block of `size` granules: total, count, and the largest size if it
    /// was the largest.
    #[inline(always)]
    fn forget(&mut self, size: u32) {
        self.total -= u64::from(size);
        self.len -= 1;
        if size == self.largest {
            self.largest = self.find_largest();
        }
    }

    /// Removes the head of non-empty exact class `class` (`head` is `self.heads[class]`); the
    /// lowest address of its pool, if any, becomes the head.
    #[inline(always)]
    fn pop_head(&mut self, class: usize, head: Head) -> bool {
        let class = class % EXACT_CLASSES;
        if head.pool == NIL {
            self.heads[class] = EMPTY_HEAD;
            self.non_empty.clear(class);
            return true;
        }
        // The pool's lowest address becomes the head (a pop: pools keep it last).
        let pool = &mut self.pools[head.pool as usize];
        let Some((lowest, position)) = pool.first() else {
            return false;
        };
        pool.remove_at(position, &lowest);
        let pool_left = if pool.is_empty() {
            self.vacant_pools.push(head.pool);
            NIL
        } else {
            head.pool
        };
        self.heads[class] = Head {
            block: lowest.block,
            pool: pool_left,
            address: lowest.address,
        };
        true
    }

    /// Removes `fit`, which [`Self::best_fit`] just returned, without reading its block when it
    /// heads an exact class (the usual case), so the head's replacement is found while the block
    /// is still being fetched; otherwise as [`Self::remove`].
    #[inline(always)]
    pub fn take(&mut self, fit: Fit, blocks: &BlockSlab) -> bool {
        let class = fit.size as usize;
        if class < EXACT_CLASSES {
            let head = self.heads[class % EXACT_CLASSES];
            if head.block == fit.index && self.pop_head(class, head) {
                self.forget(fit.size);
                return true;
            }
        }
        self.remove(fit.index, blocks)
    }

    /// Removes `block` (slab index `index`) from exact class `class`; false if it was not there.
    #[inline(always)]
    fn remove_exact(&mut self, class: usize, index: u32, block: &Block) -> bool {
        let class = class % EXACT_CLASSES;
        let head = self.heads[class];
        if head.block == NIL {
            return false;
        }
        if head.block == index {
            return self.pop_head(class, head);
        }
        if head.pool == NIL {
            return false;
        }
        let pool = &mut self.pools[head.pool as usize];
        if !pool.remove_at(UNKNOWN_POSITION, &PoolKey::of(index, block)) {
            return false;
        }
        if pool.is_empty() {
            self.vacant_pools.push(head.pool);
            self.heads[class].pool = NIL;
        }
        true
    }

    /// Sum of the sizes held, in granules.
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The largest free block's size in granules, 0 when none. O(1).
    pub fn largest(&self) -> u32 {
        self.largest
    }

    /// The largest free block's size, found from the bitmap: O(1), plus one B-tree descent in a
    /// class above the exact range.
    fn find_largest(&self) -> u32 {
        match self.non_empty.last() {
            None => 0,
            Some(class) if class < EXACT_CLASSES => class as u32,
            Some(class) => self.ranged[class - EXACT_CLASSES]
                .last()
                .map_or(0, |key| key.size),
        }
    }

    /// The best fit: the slab index of the smallest free block that holds `size` granules at an
    /// offset aligned to `alignment` granules (a power of two), ties to the lowest address.
    ///
    /// Cost: O(1) bitmap scans plus, per class visited, O(log n) plus the blocks whose offset
    /// leaves too little room after aligning; any block of at least `size + alignment - 1` fits,
    /// so with the default alignment (one granule) the first candidate always fits.
    #[inline]
    pub fn best_fit(&self, size: u32, alignment: u32) -> Option<Fit> {
        let own_class = Self::class_of(size);
        let fits = |offset: u32, block_size: u32| {
            align_up(u64::from(offset), u64::from(alignment)) + u64::from(size)
                <= u64::from(offset) + u64::from(block_size)
        };
        let mut next = self.non_empty.next_at_or_after(own_class);
        while let Some(class) = next {
            if class < EXACT_CLASSES {
                let head = self.heads[class % EXACT_CLASSES];
                let class_size = class as u32;
                if alignment <= 1 || fits(head.address as u32, class_size) {
                    return Some(Fit {
                        index: head.block,
                        size: class_size,
                    });
                }
                if head.pool != NIL
                    && let Some((key, _)) = self.pools[head.pool as usize]
                        .find_first(None, |key| fits(key.offset(), class_size))
                {
                    return Some(Fit {
                        index: key.block,
                        size: class_size,
                    });
                }
            } else {
                let start = (class == own_class).then(|| RangedKey::first_of_size(size));
                let found = self.ranged[class - EXACT_CLASSES]
                    .find_first(start, |key| fits(key.address as u32, key.size));
                if let Some((key, _)) = found {
                    return Some(Fit {
                        index: key.block,
                        size: key.size,
                    });
                }
            }
            next = self.non_empty.next_at_or_after(class + 1);
        }
        None
    }

    /// Sum of the sizes of free blocks of at least `size` granules, in granules. O(log n + k).
    pub fn granules_in_blocks_of_at_least(&self, size: u32) -> u64 {
        let own_class = Self::class_of(size);
        let mut total = 0;
        let mut next = self.non_empty.next_at_or_after(own_class);
        while let Some(class) = next {
            if class < EXACT_CLASSES {
                let head = self.heads[class % EXACT_CLASSES];
                let pooled = match head.pool {
                    NIL => 0,
                    pool => self.pools[pool as usize].len() as u64,
                };
                total += (1 + pooled) * class as u64;
            } else {
                let start = (class == own_class).then(|| RangedKey::first_of_size(size));
                self.ranged[class - EXACT_CLASSES]
                    .for_each_from(start, |key| total += u64::from(key.size));
            }
            next = self.non_empty.next_at_or_after(class + 1);
        }
        total
    }

    /// Whether block `index` of `blocks` is held under its current size and address.
    pub fn contains(&self, index: u32, blocks: &BlockSlab) -> bool {
        let Some(block) = blocks.get(index) else {
            return false;
        };
        let class = Self::class_of(block.size);
        if class < EXACT_CLASSES {
            let head = self.heads[class % EXACT_CLASSES];
            if head.block == NIL {
                return false;
            }
            head.block == index
                || (head.pool != NIL
                    && self.pools[head.pool as usize].contains(&PoolKey::of(index, block)))
        } else {
            self.ranged
                .get(class - EXACT_CLASSES)
                .is_some_and(|set| set.contains(&RangedKey::of(index, block)))
        }
    }
}

/// `offset` rounded up to `alignment` (a power of two).
pub(crate) fn align_up(offset: u64, alignment: u64) -> u64 {
    (offset + alignment - 1) & !(alignment - 1)
}

#[cfg(test)]
#[path = "free_index_tests.rs"]
mod tests;
