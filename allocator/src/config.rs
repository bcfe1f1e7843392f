//! Configuration and requests.

use crate::Category;

/// Tunable limits and sizes of a [`crate::BufferAllocator`].
///
/// [`crate::BufferAllocator::new`] normalises the values: the granule becomes a power of two
/// (at least 1), and every other size is rounded up to the granule.
#[derive(Clone, Debug)]
pub struct AllocatorConfig {
    /// Cap on reserved bytes (the sum of segment sizes). Default `u64::MAX` (no cap); kernels-wgsl
    /// sets what the adapter allows. Changeable at run time with `set_budget`.
    pub budget_bytes: u64,
    /// Largest segment, and therefore largest allocation. Default 256 MiB (wgpu's default
    /// `max_buffer_size`); kernels-wgsl passes the device's limits. At most `u32::MAX` granules
    /// (1 TiB at the default granule): larger values are lowered to that.
    pub max_segment_bytes: u64,
    /// Size of the shared segments that small requests are packed into. Default 2 MiB.
    pub small_segment_bytes: u64,
    /// Requests (after rounding) up to this size share small segments; larger ones get a segment
    /// sized to them. Default 1 MiB.
    pub small_request_max_bytes: u64,
    /// Every size is rounded up to this power of two, and every offset is a multiple of it.
    /// Default 256 (wgpu's `min_storage_buffer_offset_alignment`). The rounding waste is counted
    /// in [`crate::Stats::waste_bytes`].
    pub granule_bytes: u64,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self {
            budget_bytes: u64::MAX,
            max_segment_bytes: 256 << 20,
            small_segment_bytes: 2 << 20,
            small_request_max_bytes: 1 << 20,
            granule_bytes: 256,
        }
    }
}

impl AllocatorConfig {
    /// The configuration with its invariants restored (see the type's documentation).
    pub(crate) fn normalised(mut self) -> Self {
        self.granule_bytes = self
            .granule_bytes
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << 63);
        let granule = self.granule_bytes;
        let round = |bytes: u64| bytes.max(granule).div_ceil(granule).saturating_mul(granule);
        // Blocks count granules in `u32` (see `block.rs`).
        let most = granule.saturating_mul(u64::from(u32::MAX));
        self.max_segment_bytes = round(self.max_segment_bytes).min(most);
        self.small_segment_bytes = round(self.small_segment_bytes).min(self.max_segment_bytes);
        self.small_request_max_bytes =
            round(self.small_request_max_bytes).min(self.small_segment_bytes);
        self
    }
}

/// One request for memory.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Bytes asked for; must be nonzero.
    pub size_bytes: u64,
    /// Power-of-two alignment of the offset inside the segment; 0 or 1 mean "the granule".
    /// Offsets are relative to the segment start, which is assumed suitably aligned.
    pub alignment: u64,
    /// What the memory holds.
    pub category: Category,
    /// Who holds it (an op or module name); statistics are kept per label.
    pub label: &'a str,
}

impl<'a> Request<'a> {
    /// A request with the default alignment (the granule).
    pub fn new(size_bytes: u64, category: Category, label: &'a str) -> Self {
        Self {
            size_bytes,
            alignment: 0,
            category,
            label,
        }
    }

    /// The same request with `alignment`.
    pub fn with_alignment(self, alignment: u64) -> Self {
        Self { alignment, ..self }
    }
}
