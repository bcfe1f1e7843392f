//! The device: adapter choice, device creation with the adapter's own limits, the error handler and
//! the device-lost callback that are always installed, and the [`Gpu`] handle everything else hangs
//! off.
//!
//! Adapter choice: the one named by [`GpuOptions::adapter`] (or the `PLIMSOLL_ADAPTER` environment
//! variable), matched as a backend (`vulkan`, `metal`, `dx12`, `gl`), a device type (`discrete`,
//! `integrated`, `cpu`) or a case-insensitive substring of the adapter name; otherwise the first
//! discrete GPU, then integrated, then CPU (Mesa's lavapipe), then anything else.
//!
//! Dropping the last clone of a [`Gpu`] (and of its buffers) never blocks past
//! [`Gpu::drop_deadline`]: unfinished GPU work makes the drop leak the device with a warning
//! rather than hang (policy in [`crate::fence`]). The teardown runs on a helper thread: see
//! [`crate::teardown`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use plimsoll_allocator::BufferAllocator;

use crate::error::{Error, Result};
use crate::fence::{self, Deadlines, FenceState};
use crate::memory::{self, WgpuSegments};
use crate::pipeline::PipelineCache;
use crate::recorder::Batch;
use crate::teardown::TeardownGate;

/// Loop iterations per shader invocation after which Mesa's llvmpipe/lavapipe stops looping.
const LAVAPIPE_LOOP_LIMIT: u64 = 65_535;

/// The environment variable that names an adapter (same syntax as [`GpuOptions::adapter`]).
pub const ADAPTER_ENV: &str = "PLIMSOLL_ADAPTER";

/// How to open a [`Gpu`].
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Backend (`vulkan`), device type (`discrete`, `integrated`, `cpu`) or adapter-name substring.
    /// `None`: the best adapter (discrete, then integrated, then CPU).
    pub adapter: Option<String>,
    /// Memory budget in bytes. `None`: [`memory::default_budget_bytes`] for the adapter's type.
    /// Set it lower to simulate a small GPU.
    pub memory_budget_bytes: Option<u64>,
    /// Deadline of the calls that take none. `None`: [`fence::DEFAULT_DEADLINE`].
    pub default_deadline: Option<Duration>,
    /// How long dropping the last clone waits for the GPU before leaking the device.
    /// `None`: [`fence::DEFAULT_DROP_DEADLINE`].
    pub drop_deadline: Option<Duration>,
    /// Most submissions in flight (at least 1). `None`: 1 on a CPU adapter (lavapipe runs one
    /// submission at a time and its submit blocks behind it), 2 on a GPU.
    pub max_submissions_in_flight: Option<usize>,
    /// Size of the shared segments small requests are packed into (the allocator's
    /// `small_segment_bytes`, clamped to the device's limits). `None`: the allocator's default,
    /// 2 MiB. Smaller values make a small model create segments as it runs, which
    /// fault-injection tests use.
    pub small_segment_bytes: Option<u64>,
    /// The largest buffer a kernel may bind, in bytes, when smaller than the adapter's
    /// `max_storage_buffer_binding_size` (rounded down to the block alignment). `None`: the
    /// adapter's. Simulates an adapter with a smaller limit: tests of what the plan does at a
    /// tensor past one binding use it on small models.
    pub max_binding_bytes: Option<u64>,
    /// How launchers over many tensors (AdamW's update, the read-back's sums of squares) record
    /// them. `None`: [`crate::kernels::TensorLaunches::chosen`]'s choice for the adapter. Tests
    /// set it to run the multi-tensor path of a GPU on lavapipe.
    pub tensor_launches: Option<crate::kernels::TensorLaunches>,
    /// Dispatches after which the open batch is submitted by itself (at least 1). `None`:
    /// [`crate::recorder::AUTO_FLUSH_DISPATCHES`] on a CPU adapter, where one submission runs
    /// at a time on the host's own cores; [`crate::recorder::GPU_SUBMIT_EVERY`] on a GPU, so
    /// the device starts on a step's first kernels while the host records the rest.
    pub submit_every: Option<u32>,
}

impl GpuOptions {
    /// Default options, with `adapter` taken from `PLIMSOLL_ADAPTER` when it is set and non-empty.
    pub fn from_env() -> Self {
        let adapter = std::env::var(ADAPTER_ENV)
            .ok()
            .filter(|s| !s.trim().is_empty());
        GpuOptions {
            adapter,
            ..GpuOptions::default()
        }
    }
}

/// Whether the cooperative-matrix matmul (`matmul_coop.wgsl`) can run on `adapter` with
/// `features` (see [`AdapterSummary::cooperative_matmul`]).
fn cooperative_matmul(adapter: &wgpu::Adapter, features: wgpu::Features) -> bool {
    use wgpu::CooperativeScalarType as T;
    let needed = wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    let info = adapter.get_info();
    features.contains(needed)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == T::F16
                && p.cr_type == T::F32
        })
}

/// The token for wgpu's experimental features, given only when `features` holds one
/// (`EXPERIMENTAL_COOPERATIVE_MATRIX`, for the tensor-core matmul).
#[allow(unsafe_code)]
fn experimental(features: wgpu::Features) -> wgpu::ExperimentalFeatures {
    if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        // SAFETY: wgpu asks the caller to accept that its experimental APIs may have bugs. The
        // one experimental feature requested is cooperative matrices; the only shader using it
        // (`matmul_coop.wgsl`) keeps every load in workgroup memory it has staged, inside
        // bounds, and is tested against the f64 reference on every adapter that has it.
        unsafe { wgpu::ExperimentalFeatures::enabled() }
    } else {
        wgpu::ExperimentalFeatures::disabled()
    }
}

/// What we tell users about the adapter in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// Adapter name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// Backend, e.g. Vulkan.
    pub backend: wgpu::Backend,
    /// Discrete, integrated, CPU, ...
    pub device_type: wgpu::DeviceType,
    /// Driver name and version as reported.
    pub driver: String,
    /// Whether matmuls of 16-bit operands can run on cooperative matrices (tensor cores): the
    /// device has `EXPERIMENTAL_COOPERATIVE_MATRIX`, `SUBGROUP` and `SHADER_F16`, the adapter
    /// offers 16×16×16 f16 × f16 → f32 in subgroup scope, and its subgroups are 32 lanes (what
    /// `matmul_coop.wgsl` is written for). See `kernels::matmul` and [`Gpu::matmul_path`].
    pub cooperative_matmul: bool,
    /// The smallest and largest subgroup sizes (lanes) where the device has wgpu's `SUBGROUP`
    /// feature, which the row kernels' subgroup-per-row layout needs
    /// ([`crate::kernels::RowLayout::SubgroupPerRow`]); `None` without it. Lavapipe: 8 and 8
    /// on a host with 256-bit vectors; NVIDIA: 32 and 32.
    pub subgroup_sizes: Option<(u32, u32)>,
}

impl std::fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({:?}, {:?}, {})",
            self.name, self.backend, self.device_type, self.driver
        )
    }
}

/// How the reason of a loss that [`crate::fault`] injected begins.
pub(crate) const INJECTED: &str = "injected fault";

/// Device health, shared with wgpu's callbacks (which may run on any wgpu call).
#[derive(Debug, Default)]
pub(crate) struct Health {
    lost: AtomicBool,
    /// Marked lost by something other than an injected fault (see [`INJECTED`]).
    lost_for_real: AtomicBool,
    reason: Mutex<Option<String>>,
    uncaptured: Mutex<Vec<String>>,
}

impl Health {
    /// Marks the device lost (first reason wins).
    pub(crate) fn mark_lost(&self, reason: String) {
        if !reason.starts_with(INJECTED) {
            self.lost_for_real.store(true, Ordering::SeqCst);
        }
        self.lost.store(true, Ordering::SeqCst);
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert(reason);
        }
    }

    /// Whether the device is marked lost by an injected fault (and by nothing else).
    #[cfg(all(feature = "fault-injection", debug_assertions))]
    pub(crate) fn lost_by_injected_fault(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
            && self.reason.lock().is_ok_and(|r| {
                r.as_deref()
                    .is_some_and(|r| r.starts_with("injected fault"))
            })
    }

    /// Clears the mark [`crate::fault`] set (see [`crate::Gpu::revive_after_injected_loss`]).
    #[cfg(all(feature = "fault-injection", debug_assertions))]
    pub(crate) fn clear_injected_loss(&self) {
        if let Ok(mut r) = self.reason.lock() {
            *r = None;
        }
        self.lost.store(false, Ordering::SeqCst);
    }

    /// `Err(DeviceLost)` once the device is lost.
    pub(crate) fn check(&self) -> Result<()> {
        if !self.lost.load(Ordering::SeqCst) {
            return Ok(());
        }
        let reason = self
            .reason
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .unwrap_or_else(|| "unknown".to_string());
        Err(Error::DeviceLost { reason })
    }
}

/// Everything one device owns. Lock order, where more than one is taken: `batch` then `memory`.
/// Its drop waits for the GPU within the drop deadline, then leaks rather than blocks.
pub(crate) struct Shared {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) summary: AdapterSummary,
    pub(crate) limits: wgpu::Limits,
    pub(crate) health: Arc<Health>,
    /// Alignment of every block's offset and size ([`memory::block_alignment`]).
    pub(crate) block_alignment: u64,
    /// Largest block: `max_storage_buffer_binding_size` (also the segment size cap).
    pub(crate) max_block_bytes: u64,
    pub(crate) memory: Mutex<BufferAllocator<WgpuSegments>>,
    pub(crate) batch: Mutex<Batch>,
    /// Fault-injection counters (they count only with the `fault-injection` feature).
    pub(crate) faults: Arc<crate::fault::Faults>,
    pub(crate) fences: FenceState,
    pub(crate) pipelines: PipelineCache,
    pub(crate) deadlines: Deadlines,
    /// At least 1: submissions allowed in flight before a submit waits for the oldest.
    pub(crate) max_in_flight: usize,
    /// Whether [`Gpu::begin_profile`] is on (checked before touching the batch's profile).
    pub(crate) profiling: AtomicBool,
    /// Whether 16-bit conversions take the packed path although the device has `SHADER_F16`
    /// ([`Gpu::set_f16_path`]).
    pub(crate) f16_packed: AtomicBool,
    /// Whether 16-bit matmuls stay off the cooperative matrices although the adapter has them
    /// ([`Gpu::set_cooperative_matmul`]).
    pub(crate) coop_off: AtomicBool,
    /// Products of fewer 128×128 blocks of C than this split their k across workgroups
    /// ([`Gpu::set_split_k_below`]).
    pub(crate) split_k_below: std::sync::atomic::AtomicU64,
    /// A planning device ([`Gpu::planning_twin`]): nothing is dispatched, written or read.
    pub(crate) planning: bool,
    /// Pipelines asked for by this device's planning twins ([`Gpu::compile_wanted`]).
    pub(crate) wanted: Arc<crate::pipeline::Wanted>,
    /// What the device was opened with ([`Gpu::reopen`] opens another the same way).
    pub(crate) options: GpuOptions,
    /// The bound on one submission's GPU time and the rates that estimate it.
    pub(crate) pacing: Arc<crate::pacing::Pacing>,
    /// Must stay the last field: fields drop in declaration order, and this one lets the teardown
    /// thread go only once every other field has dropped (see `crate::teardown`).
    pub(crate) teardown: TeardownGate,
}

/// What a device is made of before its allocator, batch and caches (see [`Shared::assemble`]).
pub(crate) struct Parts {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) summary: AdapterSummary,
    pub(crate) limits: wgpu::Limits,
    pub(crate) health: Arc<Health>,
    pub(crate) block_alignment: u64,
    pub(crate) max_block_bytes: u64,
    pub(crate) budget: u64,
    /// The allocator's small-segment size ([`GpuOptions::small_segment_bytes`]).
    pub(crate) small_segment_bytes: Option<u64>,
    pub(crate) deadlines: Deadlines,
    pub(crate) max_in_flight: usize,
    /// A planning device ([`Gpu::planning_twin`]): stand-in segments, no GPU work.
    pub(crate) planning: bool,
    /// Where the pipelines a planning device's launches ask for are noted: shared by a device
    /// and its planning twins ([`Gpu::compile_wanted`]).
    pub(crate) wanted: Arc<crate::pipeline::Wanted>,
    /// What the device was opened with.
    pub(crate) options: GpuOptions,
}

impl Shared {
    /// A device's shared state from its parts: the allocator over wgpu segments (stand-ins on a
    /// planning device), an empty batch, empty caches.
    pub(crate) fn assemble(p: Parts) -> Shared {
        let faults = Arc::new(crate::fault::Faults::new(Arc::clone(&p.health)));
        // A CPU adapter's few threads are busy with any product: splitting k only adds work.
        let split_k_below = match p.summary.device_type {
            wgpu::DeviceType::Cpu => 0,
            _ => crate::kernels::matmul::SPLIT_K_BELOW,
        };
        let pacing = Arc::new(crate::pacing::Pacing::new(
            p.summary.device_type,
            p.planning,
            p.deadlines.default_deadline(),
        ));
        let source = match p.planning {
            true => WgpuSegments::planning(p.device.clone(), Arc::clone(&faults)),
            false => WgpuSegments::new(p.device.clone(), Arc::clone(&faults)),
        };
        let mut batch = Batch::new(&p.limits);
        batch.set_released_segments(source.released());
        let allocator = BufferAllocator::new(
            source,
            memory::allocator_config(
                p.budget,
                p.max_block_bytes,
                p.block_alignment,
                p.small_segment_bytes,
            ),
        );
        Shared {
            device: p.device,
            queue: p.queue,
            summary: p.summary,
            limits: p.limits,
            health: p.health,
            block_alignment: p.block_alignment,
            max_block_bytes: p.max_block_bytes,
            memory: Mutex::new(allocator),
            batch: Mutex::new(batch),
            faults,
            fences: FenceState::default(),
            pipelines: PipelineCache::default(),
            deadlines: p.deadlines,
            max_in_flight: p.max_in_flight,
            profiling: AtomicBool::new(false),
            f16_packed: AtomicBool::new(false),
            coop_off: AtomicBool::new(false),
            split_k_below: std::sync::atomic::AtomicU64::new(split_k_below),
            planning: p.planning,
            wanted: p.wanted,
            pacing,
            options: p.options,
            teardown: TeardownGate::default(),
        }
    }

    pub(crate) fn memory(&self) -> MutexGuard<'_, BufferAllocator<WgpuSegments>> {
        // A panic while holding the lock leaves the allocator consistent enough to keep going.
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn batch(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A device and its queue, memory, fences, pipelines and open batch. Cheap to clone (an `Arc`);
/// every clone is the same device. Dropping the last clone (buffers hold one too) discards any
/// unsubmitted batch and waits for the GPU at most [`Gpu::drop_deadline`]; work still running
/// then is leaked with a warning on stderr, never waited for without a limit.
#[derive(Clone)]
pub struct Gpu {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("adapter", &self.shared.summary)
            .finish_non_exhaustive()
    }
}

fn describe(a: &wgpu::Adapter) -> String {
    let i = a.get_info();
    format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
}

fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::Cpu => 2,
        wgpu::DeviceType::VirtualGpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn matches(a: &wgpu::Adapter, wanted: &str) -> bool {
    let i = a.get_info();
    let w = wanted.trim().to_lowercase();
    let backend = format!("{:?}", i.backend).to_lowercase();
    let kind = match i.device_type {
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Other => "other",
    };
    w == backend || w == kind || i.name.to_lowercase().contains(&w)
}

impl Gpu {
    /// Opens the best adapter, or the one `PLIMSOLL_ADAPTER` names.
    pub fn new() -> Result<Gpu> {
        Gpu::with_options(GpuOptions::from_env())
    }

    /// Opens an adapter as `options` say. Fails with [`Error::NoAdapter`] (which says how to install
    /// lavapipe) when none matches.
    pub fn with_options(options: GpuOptions) -> Result<Gpu> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        // Where the driver has VK_EXT_memory_budget, refuse buffer creation near the real limit:
        // that turns into a typed OutOfMemory instead of a lost device.
        desc.memory_budget_thresholds = wgpu::MemoryBudgetThresholds {
            for_resource_creation: Some(95),
            for_device_loss: None,
        };
        let instance = wgpu::Instance::new(desc);
        // Primary backends first (no GL probing noise); everything only if they offer nothing.
        let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
        if adapters.is_empty() || options.adapter.as_deref().is_some_and(|a| a.trim() == "gl") {
            adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        }
        let available: Vec<String> = adapters.iter().map(describe).collect();
        let mut candidates: Vec<wgpu::Adapter> = match &options.adapter {
            Some(wanted) => adapters
                .into_iter()
                .filter(|a| matches(a, wanted))
                .collect(),
            None => adapters,
        };
        candidates.retain(|a| a.get_info().backend != wgpu::Backend::Noop);
        candidates.sort_by_key(|a| type_rank(a.get_info().device_type));
        let adapter = candidates.into_iter().next().ok_or(Error::NoAdapter {
            requested: options.adapter.clone(),
            available,
        })?;
        Gpu::open(adapter, &options)
    }

    fn open(adapter: wgpu::Adapter, options: &GpuOptions) -> Result<Gpu> {
        let info = adapter.get_info();
        let wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            | wgpu::Features::SUBGROUP
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        let features = adapter.features() & wanted;
        let summary = AdapterSummary {
            name: info.name.clone(),
            backend: info.backend,
            device_type: info.device_type,
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            cooperative_matmul: cooperative_matmul(&adapter, features),
            subgroup_sizes: features
                .contains(wgpu::Features::SUBGROUP)
                .then_some((info.subgroup_min_size, info.subgroup_max_size)),
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("plimsoll"),
            required_features: features,
            // The defaults are far below what adapters offer (256 MiB buffers, 256-byte alignment).
            required_limits: adapter.limits(),
            experimental_features: experimental(features),
            ..Default::default()
        }))
        .map_err(|e| Error::RequestDevice {
            adapter: summary.name.clone(),
            message: e.to_string(),
        })?;

        let health = Arc::new(Health::default());
        let h = Arc::clone(&health);
        // Without a handler wgpu panics on any error no scope caught; we log and keep going.
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut log) = h.uncaptured.lock()
                && log.len() < 64
            {
                log.push(e.to_string());
            }
        }));
        let h = Arc::clone(&health);
        // May run synchronously inside a failing wgpu call: keep it trivial.
        device.set_device_lost_callback(move |reason, message| {
            h.mark_lost(format!("{reason:?}: {message}"));
        });

        let limits = device.limits();
        let block_alignment = memory::block_alignment(&limits);
        let max_block_bytes = memory::max_segment_bytes(&limits, block_alignment).min(
            options
                .max_binding_bytes
                .map_or(u64::MAX, |b| (b / block_alignment).max(1) * block_alignment),
        );
        let budget = options
            .memory_budget_bytes
            .unwrap_or_else(|| memory::default_budget_bytes(summary.device_type));
        let max_in_flight = options
            .max_submissions_in_flight
            .unwrap_or(match info.device_type {
                wgpu::DeviceType::Cpu => 1,
                _ => 2,
            })
            .max(1);
        let shared = Shared::assemble(Parts {
            device,
            queue,
            summary,
            limits,
            health,
            block_alignment,
            max_block_bytes,
            budget,
            small_segment_bytes: options.small_segment_bytes,
            deadlines: Deadlines::new(
                options.default_deadline.unwrap_or(fence::DEFAULT_DEADLINE),
                options
                    .drop_deadline
                    .unwrap_or(fence::DEFAULT_DROP_DEADLINE),
            ),
            max_in_flight,
            planning: false,
            wanted: Arc::default(),
            options: options.clone(),
        });
        Ok(Gpu {
            shared: Arc::new(shared),
        })
    }

    /// Opens a new device the way this one was opened (its [`GpuOptions`], with its current
    /// memory budget, deadlines, 16-bit path and submission bound): what a run does once this device is lost
    /// (driver reset, watchdog). Nothing of this device is shared: the new one has its own
    /// allocator and compiles its pipelines again. Errors as [`Gpu::with_options`]'s.
    pub fn reopen(&self) -> Result<Gpu> {
        let mut options = self.shared.options.clone();
        options.memory_budget_bytes = Some(self.memory_budget_bytes());
        options.default_deadline = Some(self.default_deadline());
        options.drop_deadline = Some(self.drop_deadline());
        let gpu = Gpu::with_options(options)?;
        let packed = self.shared.f16_packed.load(Ordering::Relaxed);
        gpu.shared.f16_packed.store(packed, Ordering::Relaxed);
        let coop_off = self.shared.coop_off.load(Ordering::Relaxed);
        gpu.shared.coop_off.store(coop_off, Ordering::Relaxed);
        gpu.set_split_k_below(self.split_k_below());
        if self.shared.pacing.is_set_by_hand() {
            gpu.set_max_submission(self.max_submission());
        }
        Ok(gpu)
    }

    /// How many devices this process has leaked so far because their work was still running at
    /// the drop deadline (see [`Gpu::drop_deadline`]).
    pub fn leaked_devices() -> usize {
        crate::teardown::LEAKED_DEVICES.load(Ordering::SeqCst)
    }

    /// What the last device this process leaked was left doing ([`Gpu::leaked_devices`]), in a
    /// sentence: the library prints nothing itself.
    pub fn last_leak() -> Option<String> {
        crate::teardown::LAST_LEAK
            .lock()
            .ok()
            .and_then(|last| last.clone())
    }

    /// The adapter in use.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.shared.summary
    }

    /// Whether the adapter runs on the CPU (lavapipe, SwiftShader), where some kernels are
    /// chosen otherwise (measured there: [`crate::kernels::row_layout`], the chunked loss's
    /// transposed logits).
    pub fn is_cpu(&self) -> bool {
        self.shared.summary.device_type == wgpu::DeviceType::Cpu
    }

    /// The most loop iterations one shader invocation may run in total on this adapter, or `None`
    /// where there is no such limit. `Some(65_535)` on Mesa's llvmpipe/lavapipe, which silently
    /// stops a shader's loops after that many passes (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`;
    /// the rule is in the `kernels` module docs). Launchers whose loops could pass it refuse
    /// with [`Error::LoopLimit`].
    pub fn loop_iteration_limit(&self) -> Option<u64> {
        let s = &self.shared.summary;
        let names = format!("{} {}", s.name, s.driver).to_lowercase();
        (names.contains("llvmpipe") || names.contains("lavapipe")).then_some(LAVAPIPE_LOOP_LIMIT)
    }

    /// Pipelines built so far (each kernel and override set once).
    pub fn compiled_pipelines(&self) -> usize {
        self.shared.pipelines.len()
    }

    /// The device's limits (the adapter's own, not wgpu's low defaults).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.shared.limits
    }

    /// The features enabled on the device (a subset of SHADER_F16 and TIMESTAMP_QUERY).
    pub fn features(&self) -> wgpu::Features {
        self.shared.device.features()
    }

    /// The wgpu device, for code that needs raw access (benchmarks, diagnostics).
    pub fn device(&self) -> &wgpu::Device {
        &self.shared.device
    }

    /// The wgpu queue, for code that needs raw access. Writes through it bypass the ordering rules
    /// of [`crate::recorder`].
    pub fn queue(&self) -> &wgpu::Queue {
        &self.shared.queue
    }

    /// `Err(DeviceLost)` once the device is lost; every operation starts with this check.
    pub fn check_alive(&self) -> Result<()> {
        self.shared.health.check()
    }

    /// Errors wgpu raised outside any error scope since the last call (at most 64 are kept).
    pub fn take_uncaptured_errors(&self) -> Vec<String> {
        self.shared
            .health
            .uncaptured
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }

    /// Destroys the device on purpose (tests of the device-lost path). Work in flight still runs.
    pub fn destroy(&self) {
        self.shared
            .health
            .mark_lost("destroyed by Gpu::destroy".to_string());
        self.shared.device.destroy();
    }
}
