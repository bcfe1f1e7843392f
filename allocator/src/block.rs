//! Blocks (byte ranges of a segment) in a slab, and the index of free blocks by size.
//!
//! Convention: a segment's blocks form a doubly linked list in address order whose first block
//! always sits at offset 0 and keeps its slab index for the segment's whole life (merges keep the
//! left block, splits keep the left part), so a segment can name its first block once.

use std::collections::BTreeSet;
use std::ops::Bound;

use crate::{Category, SegmentId};

/// "No neighbour" in `Block::prev` / `Block::next`.
pub(crate) const NIL: u32 = u32::MAX;

/// What a used block holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Used {
    /// The allocation's sequence number (its `AllocationId`).
    pub sequence: u64,
    /// Bytes asked for; `<=` the block's size.
    pub requested_bytes: u64,
    /// Interned label id (index into the label table).
    pub label: u32,
    pub category: Category,
    /// log2 of the alignment asked for; the block's offset is a multiple of it.
    pub alignment_log2: u8,
}

/// One byte range `[offset, offset + size_bytes)` of a segment.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub segment: SegmentId,
    /// A multiple of the granule.
    pub offset: u64,
    /// A nonzero multiple of the granule.
    pub size_bytes: u64,
    /// Slab index of the block just below, or `NIL` if this block starts the segment.
    /// When both exist, `prev.offset + prev.size_bytes == offset`.
    pub prev: u32,
    /// Slab index of the block just above, or `NIL` if this block ends the segment.
    pub next: u32,
    /// `None` when free; a free block is in the free index and never has a free neighbour.
    pub used: Option<Used>,
}

/// Blocks in a `Vec` indexed by `u32`, with a list of vacant slots for reuse.
#[derive(Debug, Default)]
pub(crate) struct BlockSlab {
    /// Every slot; vacant ones hold stale data and are listed in `vacant`.
    slots: Vec<Block>,
    /// Indices of vacant slots; none of them is reachable from a segment.
    vacant: Vec<u32>,
}

impl BlockSlab {
    pub fn insert(&mut self, block: Block) -> u32 {
        if let Some(index) = self.vacant.pop() {
            self.slots[index as usize] = block;
            index
        } else {
            self.slots.push(block);
            (self.slots.len() - 1) as u32
        }
    }

    pub fn remove(&mut self, index: u32) {
        self.slots[index as usize].used = None;
        self.vacant.push(index);
    }

    /// The block at `index`, or `None` if the index was never handed out. A vacant slot is
    /// returned too; callers check liveness through `used` and the sequence number.
    pub fn get(&self, index: u32) -> Option<&Block> {
        self.slots.get(index as usize)
    }

    pub fn live_count(&self) -> usize {
        self.slots.len() - self.vacant.len()
    }
}

impl std::ops::Index<u32> for BlockSlab {
    type Output = Block;
    fn index(&self, index: u32) -> &Block {
        &self.slots[index as usize]
    }
}

impl std::ops::IndexMut<u32> for BlockSlab {
    fn index_mut(&mut self, index: u32) -> &mut Block {
        &mut self.slots[index as usize]
    }
}

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
}

/// Every free block, ordered by (size, segment, offset). Invariant: holds exactly the free blocks
/// of live segments, and `total_bytes` is the sum of their sizes.
#[derive(Debug, Default)]
pub(crate) struct FreeIndex {
    keys: BTreeSet<FreeKey>,
    total_bytes: u64,
}

impl FreeIndex {
    pub fn insert(&mut self, key: FreeKey) {
        self.total_bytes += key.size_bytes;
        self.keys.insert(key);
    }

    pub fn remove(&mut self, key: &FreeKey) {
        if self.keys.remove(key) {
            self.total_bytes -= key.size_bytes;
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn largest_bytes(&self) -> u64 {
        self.keys.last().map_or(0, |key| key.size_bytes)
    }

    /// The best fit: the smallest free block that holds `size_bytes` at an offset aligned to
    /// `alignment` (a power of two, at least the granule), ties to the lowest address.
    ///
    /// Cost: O(log n) plus the blocks in `[size, size + alignment - granule)` whose offset leaves
    /// too little room after aligning; any block of at least `size + alignment - granule` fits,
    /// so with the default alignment (the granule) the first candidate always fits.
    pub fn best_fit(&self, size_bytes: u64, alignment: u64) -> Option<FreeKey> {
        let start = FreeKey {
            size_bytes,
            segment: 0,
            offset: 0,
            block: 0,
        };
        self.keys
            .range((Bound::Included(start), Bound::Unbounded))
            .find(|key| {
                aligned_end(key.offset, alignment, size_bytes) <= key.offset + key.size_bytes
            })
            .copied()
    }

    /// Sum of the sizes of free blocks of at least `size_bytes`. O(log n + k).
    pub fn bytes_in_blocks_of_at_least(&self, size_bytes: u64) -> u64 {
        let start = FreeKey {
            size_bytes,
            segment: 0,
            offset: 0,
            block: 0,
        };
        self.keys
            .range((Bound::Included(start), Bound::Unbounded))
            .map(|key| key.size_bytes)
            .sum()
    }

    pub fn contains(&self, key: &FreeKey) -> bool {
        self.keys.contains(key)
    }
}

/// `offset` rounded up to `alignment` (a power of two).
pub(crate) fn align_up(offset: u64, alignment: u64) -> u64 {
    (offset + alignment - 1) & !(alignment - 1)
}

fn aligned_end(offset: u64, alignment: u64, size_bytes: u64) -> u64 {
    align_up(offset, alignment) + size_bytes
}
