//! Statistics kept in O(1) per operation, and the table of interned labels.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use serde::Serialize;

use crate::{Category, Phase, PhaseStats};

/// Current and peak bytes of one category.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CategoryStats {
    /// Bytes in live allocations of this category (usable sizes).
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` since creation or the last `reset_peaks`.
    pub peak_allocated_bytes: u64,
    /// Bytes asked for by live allocations of this category.
    pub requested_bytes: u64,
    /// Live allocations of this category.
    pub live_allocations: u64,
}

/// The allocator's statistics, as [`crate::BufferAllocator::stats`] returns them. Every field is
/// current and costs O(1): the counters are kept by each operation, and the free-memory fields
/// (`waste_bytes`, `free_bytes`, `largest_free_bytes`, `fragmentation`, `free_blocks`) are
/// derived when the statistics are read, from those counters and the free index (which keeps the
/// largest free block). `check_invariants` recomputes them all from scratch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    /// Bytes in live allocations: the sum of their usable sizes.
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` since creation or the last `reset_peaks`.
    pub peak_allocated_bytes: u64,
    /// Bytes in segments (what the device holds for us); capped by the budget.
    pub reserved_bytes: u64,
    /// Highest `reserved_bytes` since creation or the last `reset_peaks`.
    pub peak_reserved_bytes: u64,
    /// Bytes asked for by live allocations (before rounding).
    pub requested_bytes: u64,
    /// Highest `requested_bytes` since creation or the last `reset_peaks`.
    pub peak_requested_bytes: u64,
    /// Internal waste: `allocated_bytes - requested_bytes`, from rounding to the granule and from
    /// remainders too small to split off (under four granules or under 1/16 of the block, which
    /// stay with it).
    /// (Alignment padding is split off as a free block, so it shows as free, not waste.)
    pub waste_bytes: u64,
    /// Free bytes inside reserved segments: `reserved_bytes - allocated_bytes`.
    pub free_bytes: u64,
    /// The largest free block.
    pub largest_free_bytes: u64,
    /// `1 - largest_free_bytes / free_bytes`; 0 when nothing is free.
    pub fragmentation: f64,
    /// Per category, in the order of [`Category::ALL`].
    pub categories: [CategoryStats; 7],
    /// Live allocations.
    pub live_allocations: u64,
    /// Free blocks.
    pub free_blocks: u64,
    /// Live segments.
    pub segments: u64,
    /// Successful allocations since creation.
    pub allocations: u64,
    /// Frees since creation.
    pub frees: u64,
    /// Block splits (alignment padding or a remainder split off).
    pub splits: u64,
    /// Merges of a freed block with a free neighbour.
    pub merges: u64,
    /// Segments created.
    pub segments_created: u64,
    /// Segments released.
    pub segments_released: u64,
    /// Out-of-memory errors returned.
    pub out_of_memory_errors: u64,
    /// Times the allocator released its empty cached segments and tried again (budget full or the
    /// source refused).
    pub retries_after_releasing_cache: u64,
    /// The phase set last ([`crate::BufferAllocator::set_phase`]).
    pub phase: Phase,
    /// Peaks per phase, in the order of [`Phase::ALL`], since creation or the last `reset_peaks`.
    pub phases: [PhaseStats; 5],
    /// The peaks since creation, which `reset_peaks` does not reset (a trainer resets the
    /// peaks at every step, so that a step's are its own; a run's summary shows these).
    pub lifetime: LifetimePeaks,
}

/// The highest values since the allocator was created. `reset_peaks` folds the peaks into them
/// before it resets, and [`crate::BufferAllocator::stats`] folds in the current ones, so they
/// cost nothing per allocation.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LifetimePeaks {
    /// Highest `allocated_bytes`.
    pub allocated_bytes: u64,
    /// Highest `reserved_bytes`.
    pub reserved_bytes: u64,
    /// Highest `requested_bytes`.
    pub requested_bytes: u64,
    /// Highest `allocated_bytes` per category, in the order of [`Category::ALL`].
    pub category_allocated_bytes: [u64; 7],
}

impl LifetimePeaks {
    /// These peaks with `stats`' current peaks folded in.
    fn with(mut self, stats: &Stats) -> Self {
        self.allocated_bytes = self.allocated_bytes.max(stats.peak_allocated_bytes);
        self.reserved_bytes = self.reserved_bytes.max(stats.peak_reserved_bytes);
        self.requested_bytes = self.requested_bytes.max(stats.peak_requested_bytes);
        for (peak, category) in self
            .category_allocated_bytes
            .iter_mut()
            .zip(&stats.categories)
        {
            *peak = (*peak).max(category.peak_allocated_bytes);
        }
        self
    }
}

impl Stats {
    /// The statistics of one category.
    pub fn category(&self, category: Category) -> &CategoryStats {
        &self.categories[category.index()]
    }

    /// The peaks of one phase.
    pub fn phase(&self, phase: Phase) -> &PhaseStats {
        &self.phases[phase.index()]
    }

    /// Enters `phase`: its peaks take in the bytes live now.
    pub(crate) fn enter_phase(&mut self, phase: Phase) {
        self.phase = phase;
        let entry = &mut self.phases[phase.index()];
        entry.peak_allocated_bytes = entry.peak_allocated_bytes.max(self.allocated_bytes);
        entry.peak_reserved_bytes = entry.peak_reserved_bytes.max(self.reserved_bytes);
        for (peak, category) in entry.peak_category_bytes.iter_mut().zip(&self.categories) {
            *peak = (*peak).max(category.allocated_bytes);
        }
    }

    /// Keeps the current phase's reserved peak (after a segment was created).
    #[inline]
    pub(crate) fn on_reserve(&mut self) {
        self.peak_reserved_bytes = self.peak_reserved_bytes.max(self.reserved_bytes);
        let entry = &mut self.phases[self.phase.index()];
        entry.peak_reserved_bytes = entry.peak_reserved_bytes.max(self.reserved_bytes);
    }

    /// These counters with the free-memory fields derived: `largest_free_bytes` and `free_blocks`
    /// as the free index reports them, the rest from the counters.
    pub(crate) fn with_free_fields(&self, largest_free_bytes: u64, free_blocks: u64) -> Self {
        let free_bytes = self.reserved_bytes - self.allocated_bytes;
        Self {
            waste_bytes: self.allocated_bytes - self.requested_bytes,
            free_bytes,
            largest_free_bytes,
            fragmentation: fragmentation(free_bytes, largest_free_bytes),
            free_blocks,
            lifetime: self.lifetime.with(self),
            ..self.clone()
        }
    }

    #[inline]
    pub(crate) fn on_allocate(&mut self, category: Category, size_bytes: u64, requested: u64) {
        self.allocated_bytes += size_bytes;
        self.requested_bytes += requested;
        self.live_allocations += 1;
        self.allocations += 1;
        self.peak_allocated_bytes = self.peak_allocated_bytes.max(self.allocated_bytes);
        self.peak_requested_bytes = self.peak_requested_bytes.max(self.requested_bytes);
        let entry = &mut self.categories[category.index()];
        entry.allocated_bytes += size_bytes;
        entry.requested_bytes += requested;
        entry.live_allocations += 1;
        entry.peak_allocated_bytes = entry.peak_allocated_bytes.max(entry.allocated_bytes);
        let category_bytes = entry.allocated_bytes;
        let phase = &mut self.phases[self.phase.index()];
        phase.peak_allocated_bytes = phase.peak_allocated_bytes.max(self.allocated_bytes);
        let peak = &mut phase.peak_category_bytes[category.index()];
        *peak = (*peak).max(category_bytes);
    }

    #[inline]
    pub(crate) fn on_free(&mut self, category: Category, size_bytes: u64, requested: u64) {
        self.allocated_bytes -= size_bytes;
        self.requested_bytes -= requested;
        self.live_allocations -= 1;
        self.frees += 1;
        let entry = &mut self.categories[category.index()];
        entry.allocated_bytes -= size_bytes;
        entry.requested_bytes -= requested;
        entry.live_allocations -= 1;
    }

    pub(crate) fn reset_peaks(&mut self) {
        self.lifetime = self.lifetime.with(self);
        self.peak_allocated_bytes = self.allocated_bytes;
        self.peak_reserved_bytes = self.reserved_bytes;
        self.peak_requested_bytes = self.requested_bytes;
        for entry in &mut self.categories {
            entry.peak_allocated_bytes = entry.allocated_bytes;
        }
        self.phases = Default::default();
        self.enter_phase(self.phase);
    }
}

/// `1 - largest / free`, 0 when nothing is free.
pub(crate) fn fragmentation(free_bytes: u64, largest_free_bytes: u64) -> f64 {
    if free_bytes == 0 {
        0.0
    } else {
        1.0 - largest_free_bytes as f64 / free_bytes as f64
    }
}

/// Bytes held under one label.
#[derive(Clone, Debug)]
pub(crate) struct LabelEntry {
    pub name: Box<str>,
    /// Sum of the usable sizes of live allocations with this label.
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` since creation or the last `reset_peaks`.
    pub peak_allocated_bytes: u64,
    /// Highest `allocated_bytes` since creation (`reset_peaks` folds the peak in first).
    pub lifetime_peak_bytes: u64,
    /// Live allocations with this label.
    pub live_allocations: u64,
}

/// Interned labels: each distinct label string is stored once and named by its index, so a block
/// carries a `u32` and per-label accounting is an array update. Labels are never removed.
#[derive(Debug, Default)]
pub(crate) struct LabelTable {
    ids: HashMap<Box<str>, u32, BuildHasherDefault<FxHasher>>,
    /// Indexed by label id; `entries[ids[name]].name == name`.
    pub entries: Vec<LabelEntry>,
    /// The label looked up last (a training loop asks for the same label many times in a row).
    last: Option<u32>,
}

impl LabelTable {
    #[inline]
    pub fn intern(&mut self, label: &str) -> u32 {
        if let Some(id) = self.last
            && let Some(entry) = self.entries.get(id as usize)
            && same_bytes(entry.name.as_bytes(), label.as_bytes())
        {
            return id;
        }
        self.intern_slow(label)
    }

    /// `intern` when the label differs from the last one: a hash lookup, or a new entry.
    #[inline(never)]
    fn intern_slow(&mut self, label: &str) -> u32 {
        let id = match self.ids.get(label) {
            Some(&id) => id,
            None => {
                let id = self.entries.len() as u32;
                self.ids.insert(label.into(), id);
                self.entries.push(LabelEntry {
                    name: label.into(),
                    allocated_bytes: 0,
                    peak_allocated_bytes: 0,
                    lifetime_peak_bytes: 0,
                    live_allocations: 0,
                });
                id
            }
        };
        self.last = Some(id);
        id
    }

    pub fn name(&self, id: u32) -> &str {
        &self.entries[id as usize].name
    }

    #[inline]
    pub fn on_allocate(&mut self, id: u32, size_bytes: u64) {
        let entry = &mut self.entries[id as usize];
        entry.allocated_bytes += size_bytes;
        entry.live_allocations += 1;
        entry.peak_allocated_bytes = entry.peak_allocated_bytes.max(entry.allocated_bytes);
    }

    #[inline]
    pub fn on_free(&mut self, id: u32, size_bytes: u64) {
        let entry = &mut self.entries[id as usize];
        entry.allocated_bytes -= size_bytes;
        entry.live_allocations -= 1;
    }

    pub fn reset_peaks(&mut self) {
        for entry in &mut self.entries {
            entry.lifetime_peak_bytes = entry.lifetime_peak_bytes.max(entry.peak_allocated_bytes);
            entry.peak_allocated_bytes = entry.allocated_bytes;
        }
    }

    /// The `count` labels holding the most bytes now, largest first (ties by name).
    pub fn top(&self, count: usize) -> Vec<&LabelEntry> {
        let mut holders: Vec<&LabelEntry> = self
            .entries
            .iter()
            .filter(|entry| entry.allocated_bytes > 0)
            .collect();
        holders.sort_by(|a, b| {
            b.allocated_bytes
                .cmp(&a.allocated_bytes)
                .then(a.name.cmp(&b.name))
        });
        holders.truncate(count);
        holders
    }
}

/// Whether two byte strings are equal. Why not `==`: that calls `memcmp`, whose call and length
/// dispatch cost more than the comparison itself for a label of a few dozen bytes; this compares
/// up to 16 bytes with two (possibly overlapping) word loads per side, inline.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    match (a.first_chunk::<8>(), b.first_chunk::<8>()) {
        (Some(a_head), Some(b_head)) if a.len() <= 16 => {
            a_head == b_head && a.last_chunk::<8>() == b.last_chunk::<8>()
        }
        (Some(_), Some(_)) => a == b,
        // 4 to 7 bytes (short labels such as "bench"): two overlapping 4-byte words, no byte loop.
        _ => match (a.first_chunk::<4>(), b.first_chunk::<4>()) {
            (Some(a_head), Some(b_head)) => {
                a_head == b_head && a.last_chunk::<4>() == b.last_chunk::<4>()
            }
            _ => a.iter().zip(b).all(|(x, y)| x == y),
        },
    }
}

/// Builds [`FxHasher`]s, for maps with small keys.
pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;

/// The Fx hash (rustc's): a multiply-rotate per word, fast for short keys such as labels.
#[derive(Default)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, byte: u8) {
        self.add(u64::from(byte));
    }

    fn write_u32(&mut self, value: u32) {
        self.add(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

#[cfg(test)]
mod tests {
    use super::same_bytes;

    /// Every length from 0 to 40 against `==`, equal and with one byte changed at each place
    /// (the word-load paths cover 4..7, 8..16 and longer; below 4 bytes a loop).
    #[test]
    fn same_bytes_matches_equality() {
        let text: Vec<u8> = (0..40u8).map(|byte| b'a' + byte % 26).collect();
        for len in 0..text.len() {
            let a = &text[..len];
            assert!(same_bytes(a, a), "len {len}");
            assert!(!same_bytes(a, &text[..len.saturating_sub(1)]) || len == 0);
            for place in 0..len {
                let mut b = a.to_vec();
                b[place] ^= 1;
                assert!(!same_bytes(a, &b), "len {len}, byte {place}");
            }
        }
    }
}
