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

/// The bit of `Block::slot_bits` that marks a used block.
const USED_BIT: u32 = 1 << 31;
/// Where a used block keeps its category (3 bits) and the log2 of its alignment (6 bits) in
/// `Block::slot_bits`, above the slot.
const CATEGORY_SHIFT: u32 = 22;
const ALIGNMENT_SHIFT: u32 = 25;
const SLOT_MASK: u32 = (1 << CATEGORY_SHIFT) - 1;

/// Segment slots stay below this (4,194,304 live segments), so a slot, the used flag and what a
/// used block holds share one word.
pub(crate) const MAX_SEGMENT_SLOTS: u32 = 1 << CATEGORY_SHIFT;

/// One granule range `[offset, offset + size)` of a segment.
///
/// Why a used block keeps its label, category and alignment inside these 32 bytes (in the words a
/// free block uses for its segment id and tag): kept in a table beside the slab, they cost a store
/// to a line no other step of the allocation touches, a cache miss that the allocation's result
/// then waited for (about 3 ns of a 107 ns allocate+free pair in `cargo xtask bench allocator`).
/// What a used block does not keep: its requested size and its segment id, which its
/// [`crate::Allocation`] carries (and `free` trusts once the sequence number has proved the handle
/// genuine).
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
    /// The slot of its segment in `BufferAllocator::segments` (below [`MAX_SEGMENT_SLOTS`]); for
    /// a used block also `USED_BIT`, its category and the log2 of its alignment.
    slot_bits: u32,
    /// Free: its segment's id. Used: its interned label id.
    owner: u32,
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
            slot_bits: slot & SLOT_MASK,
            owner: segment.0,
            word: tag,
        }
    }

    /// Whether the block is used; a free block is in the free index and never has a free
    /// neighbour.
    #[inline]
    pub fn is_used(&self) -> bool {
        self.slot_bits & USED_BIT != 0
    }

    /// The slot of its segment.
    #[inline]
    pub fn segment_slot(&self) -> u32 {
        self.slot_bits & SLOT_MASK
    }

    /// Sets the slot of its segment (below [`MAX_SEGMENT_SLOTS`]) of a free block.
    pub fn set_segment_slot(&mut self, slot: u32) {
        self.slot_bits = slot & SLOT_MASK;
    }

    /// The id of its segment. Only meaningful for a free block: a used one holds its label
    /// there, and its segment is the one its slot names.
    #[inline]
    pub fn segment(&self) -> SegmentId {
        SegmentId(self.owner)
    }

    /// Marks the block used by allocation `sequence`, with what it holds.
    #[inline]
    pub fn set_used(&mut self, sequence: u64, label: u32, category: Category, alignment_log2: u32) {
        self.slot_bits = USED_BIT
            | ((alignment_log2 & 63) << ALIGNMENT_SHIFT)
            | ((category.index() as u32 & 7) << CATEGORY_SHIFT)
            | self.segment_slot();
        self.owner = label;
        self.word = sequence;
    }

    /// Marks the block free, in segment `segment`, with tag `tag`.
    #[inline]
    pub fn set_free(&mut self, segment: SegmentId, tag: u64) {
        self.slot_bits = self.segment_slot();
        self.owner = segment.0;
        self.word = tag;
    }

    /// A used block's interned label id.
    pub fn label(&self) -> u32 {
        self.owner
    }

    /// A used block's category.
    pub fn category(&self) -> Category {
        let index = ((self.slot_bits >> CATEGORY_SHIFT) & 7) as usize;
        Category::ALL[index % Category::ALL.len()]
    }

    /// The log2 of a used block's alignment in bytes.
    pub fn alignment_log2(&self) -> u32 {
        (self.slot_bits >> ALIGNMENT_SHIFT) & 63
    }

    /// A free block's address as one number, ordered as (segment, offset).
    #[inline]
    pub fn address(&self) -> u64 {
        (u64::from(self.owner) << 32) | u64::from(self.offset)
    }
}

/// Blocks in a `Vec` indexed by `u32`, with a list of vacant slots for reuse.
#[derive(Debug, Default)]
pub(crate) struct BlockSlab {
    /// Every slot; vacant ones are marked free, hold stale data and are listed in `vacant`.
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
        self.slots[index as usize].slot_bits = 0;
        self.vacant.push(index);
    }

    /// The block at `index`, or `None` if the index was never handed out. A vacant slot is
    /// returned too (marked free); callers check liveness through the used flag and the sequence
    /// number.
    #[inline]
    pub fn get(&self, index: u32) -> Option<&Block> {
        self.slots.get(index as usize)
    }

    /// The block at `index`, mutably, as [`Self::get`].
    #[inline]
    pub fn get_mut(&mut self, index: u32) -> Option<&mut Block> {
        self.slots.get_mut(index as usize)
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
