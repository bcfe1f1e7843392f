//! The live segments, in a slab indexed by slot, with a map from [`SegmentId`] to slot.
//!
//! Why a slab: a block names its segment's slot, so reaching a block's segment is an array index
//! instead of a hash lookup. Ids are never reused (a long run creates and releases many dedicated
//! segments), so they cannot index an array themselves; the id map is touched only when a segment
//! is created or released, and by the public lookup by id.
//!
//! The empty segments (one free block spanning the segment) are kept in two intrusive lists, one of
//! dedicated and one of shared segments, in the order they became empty: a segment joins or leaves
//! its list in O(1) whenever a free empties it or an allocation lands in it, which happens on about
//! every seventh allocate+free pair of the allocator benchmark (every dedicated segment), where an
//! ordered set cost a B-tree insert and remove each time.

use std::collections::HashMap;

use crate::SegmentId;
use crate::block::NIL;
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
    /// Used by an installed step plan (`step_plan.rs`): never listed empty, so never released.
    pub pinned: bool,
    /// Whether the segment is in its empty list, and its neighbours there (slots, or `NIL`).
    listed: bool,
    empty_prev: u32,
    empty_next: u32,
}

impl<T> SegmentEntry<T> {
    /// A segment entry, not in any empty list.
    pub fn new(id: SegmentId, segment: T, size_bytes: u64, first_block: u32, shared: bool) -> Self {
        Self {
            id,
            segment,
            size_bytes,
            first_block,
            shared,
            pinned: false,
            listed: false,
            empty_prev: NIL,
            empty_next: NIL,
        }
    }
}

/// Live segments. Invariant: `slots_by_id[id] == slot` exactly when `slots[slot]` holds the
/// segment `id`; vacant slots are `None` and listed in `vacant`. `empty_first[shared]` and
/// `empty_last[shared]` are the ends of the list of live segments with that `shared` flag whose
/// `listed` is set, linked through `empty_prev` / `empty_next`.
#[derive(Debug)]
pub(crate) struct SegmentTable<T> {
    slots: Vec<Option<SegmentEntry<T>>>,
    vacant: Vec<u32>,
    slots_by_id: HashMap<SegmentId, u32, FxBuild>,
    empty_first: [u32; 2],
    empty_last: [u32; 2],
}

impl<T> Default for SegmentTable<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            vacant: Vec::new(),
            slots_by_id: HashMap::default(),
            empty_first: [NIL; 2],
            empty_last: [NIL; 2],
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

    /// Removes the segment `id`, if live (and from its empty list); returns its entry.
    pub fn remove(&mut self, id: SegmentId) -> Option<SegmentEntry<T>> {
        let slot = *self.slots_by_id.get(&id)?;
        self.unlist_empty(slot);
        self.slots_by_id.remove(&id);
        self.vacant.push(slot);
        self.slots.get_mut(slot as usize)?.take()
    }

    /// Appends the segment in `slot` to its empty list (no change if it is listed or not live).
    pub fn list_empty(&mut self, slot: u32) {
        let Some(entry) = self.get(slot) else {
            return;
        };
        if entry.listed || entry.pinned {
            return;
        }
        let list = usize::from(entry.shared);
        let last = self.empty_last[list];
        if let Some(Some(entry)) = self.slots.get_mut(slot as usize) {
            entry.listed = true;
            entry.empty_prev = last;
            entry.empty_next = NIL;
        }
        match self.slots.get_mut(last as usize) {
            Some(Some(previous)) => previous.empty_next = slot,
            _ => self.empty_first[list] = slot,
        }
        self.empty_last[list] = slot;
    }

    /// Pins or unpins the segment in `slot`; pinning takes it out of its empty list, and the
    /// caller lists an unpinned empty segment again.
    pub fn set_pinned(&mut self, slot: u32, pinned: bool) {
        if pinned {
            self.unlist_empty(slot);
        }
        if let Some(Some(entry)) = self.slots.get_mut(slot as usize) {
            entry.pinned = pinned;
        }
    }

    /// Takes the segment in `slot` out of its empty list (no change if it is not listed).
    pub fn unlist_empty(&mut self, slot: u32) {
        let Some(entry) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if !entry.listed {
            return;
        }
        entry.listed = false;
        let (list, prev, next) = (
            usize::from(entry.shared),
            entry.empty_prev,
            entry.empty_next,
        );
        match self.slots.get_mut(prev as usize) {
            Some(Some(previous)) => previous.empty_next = next,
            _ => self.empty_first[list] = next,
        }
        match self.slots.get_mut(next as usize) {
            Some(Some(following)) => following.empty_prev = prev,
            _ => self.empty_last[list] = prev,
        }
    }

    /// The first empty segment (the one empty the longest) of the dedicated (`shared` false) or
    /// shared list.
    pub fn first_empty(&self, shared: bool) -> Option<SegmentId> {
        self.get(self.empty_first[usize::from(shared)])
            .map(|entry| entry.id)
    }

    /// Whether the segment in `slot` is in its empty list.
    pub fn is_listed_empty(&self, slot: u32) -> bool {
        self.get(slot).is_some_and(|entry| entry.listed)
    }

    /// Every listed empty segment, dedicated ones first, each list in order.
    pub fn empty_ids(&self) -> Vec<SegmentId> {
        let mut ids = Vec::new();
        for list in 0..2 {
            let mut slot = self.empty_first[list];
            while let Some(entry) = self.get(slot) {
                ids.push(entry.id);
                slot = entry.empty_next;
            }
        }
        ids
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
