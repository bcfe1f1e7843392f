//! Device memory: wgpu buffers as the allocator's segments, sizes and alignment taken from the
//! device limits, and the default memory budget.
//!
//! Segments are capped at `max_storage_buffer_binding_size`, so every segment (and therefore every
//! block in it) can be bound whole; kernels bind whole segments and receive element offsets in their
//! params. A single request over that cap is refused with [`crate::Error::TooLarge`].
//!
//! Budget: wgpu 30 exposes no heap size (only `generate_allocator_report`, which counts what is
//! allocated). So the default is:
//! - CPU adapters (lavapipe) and integrated GPUs, whose memory is system memory:
//!   [`HOST_SHARE_PERCENT`] % of `MemAvailable` from `/proc/meminfo` (lavapipe never reports OOM,
//!   it commits lazily; past real memory the Linux OOM killer strikes, not an error);
//! - discrete and other GPUs: [`DISCRETE_FALLBACK_BYTES`], a size every current discrete GPU has.
//!   Raise it with [`crate::GpuOptions::memory_budget_bytes`] or [`crate::Gpu::set_memory_budget`].
//!
//! The instance also sets wgpu's `memory_budget_thresholds.for_resource_creation` so that drivers
//! with `VK_EXT_memory_budget` refuse a segment (a typed OutOfMemory) instead of losing the device.
//!
//! A refused segment: [`WgpuSegments::create_segment`] creates the buffer inside OutOfMemory and
//! Validation error scopes; a caught error becomes a [`SegmentError`], which the allocator turns
//! (after releasing its cache and retrying) into `OutOfMemory` with cause `SourceFailed`, and the
//! device stays usable. Lavapipe never refuses (it commits lazily), so tests drive that path with
//! the hidden [`Gpu::set_device_memory_cap`]: past the cap, the segment is *requested from wgpu*
//! with an impossible size, and wgpu's own refusal travels the same error scopes a real OOM does.

use std::sync::{Arc, Mutex};

use plimsoll_allocator::{AllocatorConfig, SegmentId, SegmentSource};

use crate::device::Gpu;

/// Share of `MemAvailable` used as the default budget on CPU and integrated adapters.
pub const HOST_SHARE_PERCENT: u64 = 50;
/// Default budget on discrete GPUs, whose memory size wgpu 30 does not expose.
pub const DISCRETE_FALLBACK_BYTES: u64 = 2 << 30;
/// Budget used when `/proc/meminfo` cannot be read.
const HOST_FALLBACK_BYTES: u64 = 1 << 30;
/// Usage of every segment: bound as storage, copied from (read-back) and to (uploads).
pub const SEGMENT_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// `MemAvailable` in bytes, from `/proc/meminfo` (Linux only).
pub fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The default memory budget for an adapter of this type (see the module docs).
pub fn default_budget_bytes(device_type: wgpu::DeviceType) -> u64 {
    match device_type {
        wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu => host_available_bytes()
            .map(|b| b / 100 * HOST_SHARE_PERCENT)
            .unwrap_or(HOST_FALLBACK_BYTES),
        _ => DISCRETE_FALLBACK_BYTES,
    }
}

/// Alignment (and size granule) of every block: `min_storage_buffer_offset_alignment`, at least
/// 256 bytes (the allocator's default granule; keeps small tensors from sharing cache lines).
pub(crate) fn block_alignment(limits: &wgpu::Limits) -> u64 {
    u64::from(limits.min_storage_buffer_offset_alignment)
        .max(256)
        .next_power_of_two()
}

/// The largest segment: the binding limit (and the buffer limit), rounded down to `alignment`.
pub(crate) fn max_segment_bytes(limits: &wgpu::Limits, alignment: u64) -> u64 {
    let cap = limits
        .max_buffer_size
        .min(limits.max_storage_buffer_binding_size);
    cap / alignment * alignment
}

/// Allocator settings derived from the device limits; nothing hard-coded but the small-segment
/// policy (`small_segment`, or the allocator's default), which is clamped to the limits.
pub(crate) fn allocator_config(
    budget: u64,
    max_segment: u64,
    alignment: u64,
    small_segment: Option<u64>,
) -> AllocatorConfig {
    let d = AllocatorConfig::default();
    let granule = alignment;
    let small_segment = small_segment
        .unwrap_or(d.small_segment_bytes)
        .clamp(granule, max_segment.max(granule));
    AllocatorConfig {
        budget_bytes: budget,
        max_segment_bytes: max_segment,
        small_segment_bytes: small_segment,
        small_request_max_bytes: d.small_request_max_bytes.min(small_segment),
        granule_bytes: granule,
    }
}

/// One segment: a wgpu buffer and a serial unique for the device's lifetime (segment ids may be
/// reused by the allocator; cached bind groups are keyed by `uid`).
#[derive(Debug)]
pub struct Segment {
    /// The buffer (usage [`SEGMENT_USAGE`]); on a planning device a 4-byte stand-in.
    pub buffer: wgpu::Buffer,
    /// Unique per device, never reused.
    pub uid: u64,
    /// The segment's size (the buffer's, except on a planning device).
    pub size_bytes: u64,
}

/// Why wgpu refused a segment (inside the allocator's `OutOfMemory { cause: SourceFailed }`).
#[derive(Debug, thiserror::Error)]
#[error("wgpu refused a {size_bytes}-byte buffer: {message}")]
pub struct SegmentError {
    /// Requested size.
    pub size_bytes: u64,
    /// wgpu's message.
    pub message: String,
}

/// [`SegmentSource`] over wgpu buffers. Creation runs inside OutOfMemory and Validation error
/// scopes, so a refusal is an `Err`, never an uncaptured error.
#[derive(Debug)]
pub struct WgpuSegments {
    device: wgpu::Device,
    next_uid: u64,
    /// Bytes of the segments created and not yet released.
    live_bytes: u64,
    /// Test hook: segments that would take `live_bytes` past this are refused by wgpu.
    device_memory_cap_bytes: Option<u64>,
    /// Uids of released segments, drained by the recorder to evict its bind groups.
    released: Arc<Mutex<Vec<u64>>>,
    /// A planning device's: segments are 4-byte stand-ins (see [`crate::Gpu::planning_twin`]).
    planning: bool,
    /// The device's fault-injection counters.
    #[cfg_attr(
        not(all(feature = "fault-injection", debug_assertions)),
        allow(dead_code)
    )]
    faults: Arc<crate::fault::Faults>,
}

impl WgpuSegments {
    pub(crate) fn new(device: wgpu::Device, faults: Arc<crate::fault::Faults>) -> Self {
        WgpuSegments {
            device,
            next_uid: 0,
            live_bytes: 0,
            device_memory_cap_bytes: None,
            released: Arc::new(Mutex::new(Vec::new())),
            faults,
            planning: false,
        }
    }

    /// A source for a planning device: every segment is a 4-byte stand-in buffer.
    pub(crate) fn planning(device: wgpu::Device, faults: Arc<crate::fault::Faults>) -> Self {
        WgpuSegments {
            planning: true,
            ..WgpuSegments::new(device, faults)
        }
    }

    pub(crate) fn released(&self) -> Arc<Mutex<Vec<u64>>> {
        Arc::clone(&self.released)
    }
}

impl SegmentSource for WgpuSegments {
    type Segment = Segment;
    type Error = SegmentError;

    fn create_segment(&mut self, id: SegmentId, size_bytes: u64) -> Result<Segment, SegmentError> {
        let label = format!("plimsoll segment {}", id.0);
        let over_cap = self
            .device_memory_cap_bytes
            .filter(|cap| self.live_bytes.saturating_add(size_bytes) > *cap);
        // An injected fault is refused the same way, by wgpu.
        #[cfg(all(feature = "fault-injection", debug_assertions))]
        let injected = self.faults.hit_or_lose(crate::fault::FaultPoint::Segment);
        #[cfg(not(all(feature = "fault-injection", debug_assertions)))]
        let injected = false;
        // Over the simulated cap, ask for more than any buffer may hold: wgpu itself refuses.
        let wgpu_size = match (over_cap.is_some() || injected, self.planning) {
            (true, _) => self.device.limits().max_buffer_size.saturating_add(1 << 20),
            (false, true) => 4,
            (false, false) => size_bytes,
        };
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&label),
            size: wgpu_size,
            usage: SEGMENT_USAGE,
            mapped_at_creation: false,
        });
        // Pop in reverse order; on native the futures are already resolved.
        let v = pollster::block_on(validation.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o.or(v) {
            buffer.destroy();
            let simulated = match over_cap {
                Some(cap) => format!(" (simulated device memory cap of {cap} bytes)"),
                None if injected => " (injected fault)".to_string(),
                None => String::new(),
            };
            return Err(SegmentError {
                size_bytes,
                message: format!("{e}{simulated}"),
            });
        }
        self.live_bytes += size_bytes;
        self.next_uid += 1;
        Ok(Segment {
            buffer,
            uid: self.next_uid,
            size_bytes,
        })
    }

    fn release_segment(&mut self, _id: SegmentId, segment: Segment) {
        self.live_bytes = self.live_bytes.saturating_sub(segment.size_bytes);
        if let Ok(mut r) = self.released.lock() {
            r.push(segment.uid);
        }
        // Dropped, not destroyed: wgpu keeps it alive for in-flight work, and `destroy` would
        // block behind a polling thread (docs/wgpu.md pitfall 4).
        drop(segment);
    }
}

impl Gpu {
    /// The memory budget in bytes (reserved segment bytes may not exceed it).
    pub fn memory_budget_bytes(&self) -> u64 {
        self.shared.memory().budget_bytes()
    }

    /// Sets the memory budget (lower it to simulate a small GPU). Already reserved memory stays.
    pub fn set_memory_budget(&self, budget_bytes: u64) {
        self.shared.memory().set_budget(budget_bytes);
    }

    /// Test hook: simulates a device with `cap_bytes` of memory (`None`: no cap), below the budget.
    /// A segment that would take the live segments past it is requested from wgpu with an
    /// impossible size, so wgpu refuses it through the real error-scope path (see the module
    /// docs) and the allocation fails with `OutOfMemory { cause: SourceFailed }`.
    #[doc(hidden)]
    pub fn set_device_memory_cap(&self, cap_bytes: Option<u64>) {
        self.shared.memory().source_mut().device_memory_cap_bytes = cap_bytes;
    }

    /// Releases cached empty segments back to wgpu; returns the bytes released.
    pub fn empty_cache(&self) -> u64 {
        self.shared.memory().empty_cache()
    }

    /// The allocator's statistics table (per category, reserved, peaks, fragmentation).
    pub fn memory_summary(&self) -> String {
        self.shared.memory().summary().to_string()
    }

    /// Runs `f` with the allocator locked (statistics, snapshots, traces). Do not allocate or drop
    /// [`crate::DeviceBuffer`]s inside `f`: that would deadlock.
    pub fn with_allocator<R>(
        &self,
        f: impl FnOnce(&mut plimsoll_allocator::BufferAllocator<WgpuSegments>) -> R,
    ) -> R {
        f(&mut self.shared.memory())
    }

    /// Largest block a kernel can bind, in bytes (`max_storage_buffer_binding_size`, aligned).
    pub fn max_buffer_bytes(&self) -> u64 {
        self.shared.max_block_bytes
    }

    /// Alignment of every block's offset in its segment, in bytes.
    pub fn block_alignment(&self) -> u64 {
        self.shared.block_alignment
    }
}

/// What the driver says of the device's own memory (its local heaps, all processes together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// How much the driver lets this process use, in bytes (`VK_EXT_memory_budget`'s budget
    /// summed over the device-local heaps): what the device has, less what other processes
    /// hold.
    pub budget_bytes: u64,
    /// How much this process uses now, in bytes (its usage over the same heaps).
    pub usage_bytes: u64,
}

impl crate::Gpu {
    /// The device's memory as its driver reports it now, where it can
    /// (`VK_EXT_memory_budget` on Vulkan, which NVIDIA's and AMD's drivers have); `None`
    /// elsewhere (lavapipe, Metal, DX12, GL). wgpu 30 has no query of its own
    /// (gfx-rs/wgpu#2447); this reads it through wgpu's Vulkan device.
    pub fn device_memory(&self) -> Option<DeviceMemory> {
        if self.shared.planning {
            return None;
        }
        vulkan_device_memory(&self.shared.device)
    }
}

/// Where wgpu has no Vulkan backend: nothing to ask.
#[cfg(not(any(windows, all(unix, not(any(target_os = "macos", target_os = "ios"))))))]
fn vulkan_device_memory(_device: &wgpu::Device) -> Option<DeviceMemory> {
    None
}

/// `VK_EXT_memory_budget` through wgpu-hal's Vulkan device, when the device enabled it and its
/// instance is Vulkan 1.1 or later (`vkGetPhysicalDeviceMemoryProperties2` is core there).
#[cfg(any(windows, all(unix, not(any(target_os = "macos", target_os = "ios")))))]
#[allow(unsafe_code)]
fn vulkan_device_memory(device: &wgpu::Device) -> Option<DeviceMemory> {
    use ash::vk;
    // SAFETY: the hal device is only read (its handles and extension list), and only while
    // `device` (which owns it) is alive; no wgpu state is changed through it.
    let hal = unsafe { device.as_hal::<wgpu::hal::api::Vulkan>() }?;
    if !hal
        .enabled_device_extensions()
        .contains(&ash::ext::memory_budget::NAME)
        || hal.shared_instance().instance_api_version() < vk::API_VERSION_1_1
    {
        return None;
    }
    let instance = hal.shared_instance().raw_instance();
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let memory = {
        let mut props = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: a valid physical device of this instance (1.1 or later, checked above), and
        // a properties chain that outlives the call.
        unsafe {
            instance.get_physical_device_memory_properties2(hal.raw_physical_device(), &mut props);
        }
        props.memory_properties
    };
    let heaps = memory.memory_heap_count.min(vk::MAX_MEMORY_HEAPS as u32) as usize;
    let local = |i: &usize| {
        memory.memory_heaps[*i]
            .flags
            .contains(vk::MemoryHeapFlags::DEVICE_LOCAL)
    };
    let sum = |values: &[u64]| (0..heaps).filter(local).map(|i| values[i]).sum::<u64>();
    Some(DeviceMemory {
        budget_bytes: sum(&budget.heap_budget),
        usage_bytes: sum(&budget.heap_usage),
    })
}
