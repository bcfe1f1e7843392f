//! A [`SegmentSource`] without a device, for tests, the demo and benchmarks.

use std::collections::BTreeMap;

use crate::{SegmentId, SegmentSource, format_bytes};

/// A pretend device: segments are just sizes, kept in a map so tests can see what is live.
#[derive(Clone, Debug)]
pub struct SimulatedSource {
    /// Bytes the pretend device holds; creating past it fails like a real out-of-memory.
    pub capacity_bytes: u64,
    /// The next this many creations fail regardless of capacity (to test failure paths).
    pub fail_next_creations: u32,
    /// Live segments and their sizes.
    pub live: BTreeMap<SegmentId, u64>,
    /// Segments created so far.
    pub created: u64,
    /// Segments released so far.
    pub released: u64,
}

impl SimulatedSource {
    /// A device of `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            fail_next_creations: 0,
            live: BTreeMap::new(),
            created: 0,
            released: 0,
        }
    }

    /// A device with no capacity limit.
    pub fn unlimited() -> Self {
        Self::new(u64::MAX)
    }

    /// Bytes in live segments.
    pub fn live_bytes(&self) -> u64 {
        self.live.values().sum()
    }
}

/// The pretend device refused a segment.
#[derive(Debug, thiserror::Error)]
#[error("simulated device cannot create a {} segment ({} of {} in use)", format_bytes(*requested_bytes), format_bytes(*live_bytes), format_bytes(*capacity_bytes))]
pub struct SimulatedDeviceFull {
    /// Size of the refused segment.
    pub requested_bytes: u64,
    /// Bytes already in segments.
    pub live_bytes: u64,
    /// The device's capacity.
    pub capacity_bytes: u64,
}

impl SegmentSource for SimulatedSource {
    /// The segment's size.
    type Segment = u64;
    type Error = SimulatedDeviceFull;

    fn create_segment(
        &mut self,
        id: SegmentId,
        size_bytes: u64,
    ) -> Result<u64, SimulatedDeviceFull> {
        let live_bytes = self.live_bytes();
        let fits = live_bytes
            .checked_add(size_bytes)
            .is_some_and(|total| total <= self.capacity_bytes);
        if self.fail_next_creations > 0 || !fits {
            self.fail_next_creations = self.fail_next_creations.saturating_sub(1);
            return Err(SimulatedDeviceFull {
                requested_bytes: size_bytes,
                live_bytes,
                capacity_bytes: self.capacity_bytes,
            });
        }
        self.live.insert(id, size_bytes);
        self.created += 1;
        Ok(size_bytes)
    }

    fn release_segment(&mut self, id: SegmentId, _segment: u64) {
        self.live.remove(&id);
        self.released += 1;
    }
}
