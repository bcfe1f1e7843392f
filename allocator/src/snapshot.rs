//! A full picture of the allocator: every segment and block.

use serde::Serialize;

use crate::{Category, SegmentId, Stats};

/// One block of a segment.
#[derive(Clone, Debug, Serialize)]
pub struct BlockSnapshot {
    /// Byte offset in the segment.
    pub offset: u64,
    /// Bytes in the block.
    pub size_bytes: u64,
    /// Whether the block is free.
    pub free: bool,
    /// The allocation's sequence number (used blocks only).
    pub sequence: Option<u64>,
    /// The allocation's category (used blocks only).
    pub category: Option<Category>,
    /// The allocation's label (used blocks only).
    pub label: Option<String>,
}

/// One segment and its blocks in address order; the blocks tile `[0, size_bytes)`.
#[derive(Clone, Debug, Serialize)]
pub struct SegmentSnapshot {
    /// The segment's id.
    pub id: SegmentId,
    /// Bytes in the segment.
    pub size_bytes: u64,
    /// Whether it holds shared small blocks (otherwise it was sized to one request).
    pub shared: bool,
    /// Its blocks, in address order.
    pub blocks: Vec<BlockSnapshot>,
}

/// Every segment and block, with the statistics, at one moment.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// The budget on reserved bytes.
    pub budget_bytes: u64,
    /// Segments in id order.
    pub segments: Vec<SegmentSnapshot>,
    /// The statistics at that moment.
    pub stats: Stats,
}

impl Snapshot {
    /// The snapshot as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl<S: crate::SegmentSource> crate::BufferAllocator<S> {
    /// Every segment (in id order) and block (in address order), with the statistics.
    pub fn snapshot(&self) -> Snapshot {
        let mut entries: Vec<_> = self.segments.iter().map(|(_, entry)| entry).collect();
        entries.sort_unstable_by_key(|entry| entry.id);
        let segments = entries
            .into_iter()
            .map(|entry| {
                let id = entry.id;
                let mut blocks = Vec::new();
                let mut index = entry.first_block;
                while index != crate::block::NIL {
                    let block = &self.blocks[index];
                    let used = block.is_used();
                    blocks.push(BlockSnapshot {
                        offset: self.bytes(block.offset),
                        size_bytes: self.bytes(block.size),
                        free: !used,
                        sequence: used.then_some(block.word),
                        category: used.then(|| block.category()),
                        label: used.then(|| self.labels.name(block.label()).to_owned()),
                    });
                    index = block.next;
                }
                SegmentSnapshot {
                    id,
                    size_bytes: entry.size_bytes,
                    shared: entry.shared,
                    blocks,
                }
            })
            .collect();
        Snapshot {
            budget_bytes: self.config.budget_bytes,
            segments,
            stats: self.stats(),
        }
    }
}

/// The allocator's state as far as it decides where future requests go: the budget, every
/// segment (in id order, named by rank, since ids only grow and order is all best fit uses),
/// its size, kind and pin, and its blocks in address order (offset, size, and for a used block
/// its category and label), plus the installed step plan, the high-water mark and the order in
/// which empty segments would be released. Two allocators with equal layouts
/// answer the same sequence of requests and frees identically, so a training step that starts
/// and ends at the same layout is a fixed point: every later step like it repeats it, peaks
/// included. The memory plan uses this to replay a run until its allocator stops changing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout(Vec<u64>);

impl<S: crate::SegmentSource> crate::BufferAllocator<S> {
    /// The allocator's [`Layout`] now, in one walk over its blocks.
    pub fn layout(&self) -> Layout {
        let mut entries: Vec<_> = self.segments.iter().map(|(_, entry)| entry).collect();
        entries.sort_unstable_by_key(|entry| entry.id);
        let plan = self.step_plan_stats();
        let mut words = vec![
            self.config.budget_bytes,
            self.high_water_bytes,
            plan.plans_built,
            plan.arena_bytes,
            plan.planned_requests,
            entries.len() as u64,
        ];
        // The empty segments in the order they would be released (by position in `entries`).
        for id in self.segments.empty_ids() {
            let position = entries.binary_search_by_key(&id, |entry| entry.id);
            words.push(position.map_or(u64::MAX - 1, |p| p as u64));
        }
        words.push(u64::MAX);
        for entry in entries {
            words.push(entry.size_bytes);
            words.push(u64::from(entry.shared) | (u64::from(entry.pinned) << 1));
            let mut index = entry.first_block;
            while index != crate::block::NIL {
                let block = &self.blocks[index];
                let used = if block.is_used() {
                    1 | (u64::from(block.label()) << 8) | ((block.category() as u64) << 1)
                } else {
                    0
                };
                words.push((u64::from(block.offset) << 32) | u64::from(block.size));
                words.push(used);
                index = block.next;
            }
            words.push(u64::MAX);
        }
        Layout(words)
    }
}
