//! The live segments, in a slab indexed by slot, with a map from [`SegmentId`] to slot.
//!
//! Why a slab: every allocate and free touches its block's segment (the used-block count), and a
//! block names its segment's slot, so that is an array index instead of a hash lookup. Ids are
//! never reused (a long run creates and releases many dedicated segments), so they cannot index an
//! array themselves; the id map is touched only when a segment is created or released, and by the
//! public lookup by id.

use std::collections::HashMap;

use crate::SegmentId;
use crate::stats::FxBuild;

/// One segment owned by the allocator.
#[derive(Debug)]
pub(crate) struct SegmentEntry<T> {
    pub id: SegmentId,
    /// The source's handle.
    pub segment: T,
    /// A nonzero multiple of the granule; its blocks tile `[0, size_bytes)`.
    pub size_bytes: u64,
    /// Slab index of the block at offset 0 (stable for the segment's life).
    pub first_block: u32,
    /// Created for small requests (`small_segment_bytes`); otherwise sized to one request.
    pub shared: bool,
}

/// Live segments. Invariant: `slots_by_id[id] == slot` exactly when `slots[slot]` holds the
/// segment `id`; vacant slots are `None` and listed in `vacant`.
#[derive(Debug)]
pub(crate) struct SegmentTable<T> {
    slots: Vec<Option<SegmentEntry<T>>>,
    vacant: Vec<u32>,
    slots_by_id: HashMap<SegmentId, u32, FxBuild>,
}

impl<T> Default for SegmentTable<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            vacant: Vec::new(),
            slots_by_id: HashMap::default(),
        }
    }
}

impl<T> SegmentTable<T> {
    /// Adds a segment; returns its slot.
    pub fn insert(&mut self, entry: SegmentEntry<T>) -> u32 {
        let id = entry.id;
        let slot = match self.vacant.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(entry);
                slot
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as u32
            }
        };
        self.slots_by_id.insert(id, slot);
        slot
    }

    /// Removes the segment `id`, if live; returns its entry.
    pub fn remove(&mut self, id: SegmentId) -> Option<SegmentEntry<T>> {
        let slot = self.slots_by_id.remove(&id)?;
        self.vacant.push(slot);
        self.slots.get_mut(slot as usize)?.take()
    }

    /// The segment in `slot`, if live.
    pub fn get(&self, slot: u32) -> Option<&SegmentEntry<T>> {
        self.slots.get(slot as usize)?.as_ref()
    }

    /// The slot of segment `id`, if live.
    pub fn slot_of(&self, id: SegmentId) -> Option<u32> {
        self.slots_by_id.get(&id).copied()
    }

    /// Live segments.
    pub fn len(&self) -> usize {
        self.slots_by_id.len()
    }

    /// Every live segment with its slot, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &SegmentEntry<T>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, entry)| Some((slot as u32, entry.as_ref()?)))
    }
}
