//! Blocks (granule ranges of a segment) in a slab.
//!
//! Convention: a segment's blocks form a doubly linked list in address order whose first block
//! always sits at offset 0 and keeps its slab index for the segment's whole life (merges keep the
//! left block, splits keep the left part), so a segment can name its first block once.
//!
//! Why offsets and sizes are counted in granules, as `u32`: a [`Block`] then takes 32 bytes, two
//! per cache line, and an allocate+free pair touches four or five blocks at random places in the
//! slab. At 64 bytes per block, the slab of 10k live blocks plus the caller's handles no longer
//! fit this machine's 2 MiB L2 cache. The cost is a limit: a segment holds at most `u32::MAX`
//! granules (1 TiB at the default 256 B granule; `AllocatorConfig` caps `max_segment_bytes`).

use crate::{Category, SegmentId};

/// "No neighbour" in `Block::prev` / `Block::next`, and "no block" elsewhere.
pub(crate) const NIL: u32 = u32::MAX;

/// The bit of `Block::slot_used` that marks a used block.
const USED_BIT: u32 = 1 << 31;

/// Segment slots stay below this, so a slot and the used flag share a word.
pub(crate) const MAX_SEGMENT_SLOTS: u32 = USED_BIT;

/// What a used block holds besides its sequence number. Kept apart from the blocks (in
/// [`BlockSlab`]) because allocation writes it and only snapshots and the invariant checker read
/// it: `free` takes the same facts from the [`crate::Allocation`] it is given, once the sequence
/// number has proved that handle genuine.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UsedInfo {
    /// Bytes asked for; `<=` the block's size in bytes.
    pub requested_bytes: u64,
    /// Interned label id (index into the label table).
    pub label: u32,
    pub category: Category,
    /// log2 of the alignment asked for, in bytes; the block's offset is a multiple of it.
    pub alignment_log2: u8,
}

const NO_USE: UsedInfo = UsedInfo {
    requested_bytes: 0,
    label: 0,
    category: Category::Other,
    alignment_log2: 0,
};

/// One granule range `[offset, offset + size)` of a segment.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub(crate) struct Block {
    /// In granules.
    pub offset: u32,
    /// In granules; nonzero.
    pub size: u32,
    /// Slab index of the block just below, or `NIL` if this block starts the segment.
    /// When both exist, `prev.offset + prev.size == offset`.
    pub prev: u32,
    /// Slab index of the block just above, or `NIL` if this block ends the segment.
    pub next: u32,
    /// The slot of its segment in `BufferAllocator::segments`, with `USED_BIT` set when used.
    slot_used: u32,
    pub segment: SegmentId,
    /// Free: the caller's last-use tag of these bytes (see
    /// [`crate::BufferAllocator::free_with_tag`]), the maximum over every granule of the block, so
    /// merges take the larger tag and splits copy it; 0 for a new segment's memory. Used: the
    /// allocation's sequence number (its `AllocationId`).
    pub word: u64,
}

impl Block {
    /// A free block of `size` granules at `offset` with tag `tag`, not linked to neighbours.
    pub fn free(segment: SegmentId, slot: u32, offset: u32, size: u32, tag: u64) -> Self {
        Self {
            offset,
            size,
            prev: NIL,
            next: NIL,
            slot_used: slot,
            segment,
            word: tag,
        }
    }

    /// Whether the block is used; a free block is in the free index and never has a free
    /// neighbour.
    #[inline]
    pub fn is_used(&self) -> bool {
        self.slot_used & USED_BIT != 0
    }

    /// The slot of its segment.
    #[inline]
    pub fn segment_slot(&self) -> u32 {
        self.slot_used & !USED_BIT
    }

    /// Sets the slot of its segment (below [`MAX_SEGMENT_SLOTS`]), keeping the used flag.
    pub fn set_segment_slot(&mut self, slot: u32) {
        self.slot_used = (self.slot_used & USED_BIT) | (slot & !USED_BIT);
    }

    /// Marks the block used by allocation `sequence`.
    #[inline]
    pub fn set_used(&mut self, sequence: u64) {
        self.slot_used |= USED_BIT;
        self.word = sequence;
    }

    /// Marks the block free with tag `tag`.
    #[inline]
    pub fn set_free(&mut self, tag: u64) {
        self.slot_used &= !USED_BIT;
        self.word = tag;
    }

    /// The block's address as one number, ordered as (segment, offset).
    #[inline]
    pub fn address(&self) -> u64 {
        (u64::from(self.segment.0) << 32) | u64::from(self.offset)
    }
}

/// Blocks in a `Vec` indexed by `u32`, with a list of vacant slots for reuse, and the
/// [`UsedInfo`] of each used block in a parallel `Vec`.
#[derive(Debug, Default)]
pub(crate) struct BlockSlab {
    /// Every slot; vacant ones are marked free, hold stale data and are listed in `vacant`.
    slots: Vec<Block>,
    /// `used[i]` describes `slots[i]` while it is used; stale otherwise.
    used: Vec<UsedInfo>,
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
            self.used.push(NO_USE);
            (self.slots.len() - 1) as u32
        }
    }

    #[inline]
    pub fn remove(&mut self, index: u32) {
        self.slots[index as usize].set_free(0);
        self.vacant.push(index);
    }

    /// The block at `index`, or `None` if the index was never handed out. A vacant slot is
    /// returned too (marked free); callers check liveness through the used flag and the sequence
    /// number.
    #[inline]
    pub fn get(&self, index: u32) -> Option<&Block> {
        self.slots.get(index as usize)
    }

    /// What used block `index` holds (stale if it is free).
    pub fn used_info(&self, index: u32) -> &UsedInfo {
        &self.used[index as usize]
    }

    /// Records what used block `index` holds.
    #[inline]
    pub fn set_used_info(&mut self, index: u32, info: UsedInfo) {
        self.used[index as usize] = info;
    }

    pub fn live_count(&self) -> usize {
        self.slots.len() - self.vacant.len()
    }
}

impl std::ops::Index<u32> for BlockSlab {
    type Output = Block;
    #[inline]
    fn index(&self, index: u32) -> &Block {
        &self.slots[index as usize]
    }
}

impl std::ops::IndexMut<u32> for BlockSlab {
    #[inline]
    fn index_mut(&mut self, index: u32) -> &mut Block {
        &mut self.slots[index as usize]
    }
}

// Two blocks per cache line (see the module documentation).
const _: () = assert!(std::mem::size_of::<Block>() == 32);
