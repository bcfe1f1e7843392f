//! Blocks (byte ranges of a segment) in a slab.
//!
//! Convention: a segment's blocks form a doubly linked list in address order whose first block
//! always sits at offset 0 and keeps its slab index for the segment's whole life (merges keep the
//! left block, splits keep the left part), so a segment can name its first block once.

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
///
/// Why aligned to 64 bytes: the fields take 64, and a free touches the freed block and both its
/// neighbours at random places in the slab; aligned, each of them is one cache line, not two.
#[derive(Clone, Debug)]
#[repr(align(64))]
pub(crate) struct Block {
    pub segment: SegmentId,
    /// Slot of its segment in `BufferAllocator::segments`.
    pub segment_slot: u32,
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
    /// The caller's last-use tag of these bytes (see [`crate::BufferAllocator::free_with_tag`]):
    /// the maximum over every byte of the block, so merges take the larger tag and splits copy it.
    /// 0 for a new segment's memory.
    pub tag: u64,
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
    #[inline]
    pub fn insert(&mut self, block: Block) -> u32 {
        if let Some(index) = self.vacant.pop() {
            self.slots[index as usize] = block;
            index
        } else {
            self.slots.push(block);
            (self.slots.len() - 1) as u32
        }
    }

    #[inline]
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

// One block, one cache line (see `Block`).
const _: () = assert!(std::mem::size_of::<Block>() == 64);
