//! Timing kernels: [`Gpu::begin_profile`] .. [`Gpu::end_profile`] gives every dispatch recorded in
//! between its GPU time and the CPU's record, submit, wait and read-back spans.
//!
//! How a dispatch is timed depends on the adapter ([`ProfileMode`]): timestamps written inside
//! the compute pass before and after it (`TIMESTAMP_QUERY_INSIDE_PASSES`); or, with timestamps
//! only at pass boundaries (`TIMESTAMP_QUERY`), one pass per dispatch whose begin and end
//! timestamps time it; or, with no timestamps, on the CPU: each dispatch submitted alone and
//! waited for (which times submission and waiting too, and serialises the work: the mode says
//! so). Timestamps are resolved into a small buffer per batch and read back at
//! [`Gpu::end_profile`], within its deadline; the query sets and those buffers are created
//! outside the allocator (16 KiB per batch while profiling) and are not in its statistics.
//!
//! Off, the cost is one relaxed atomic load per dispatch, submit and wait. GPU timestamps are
//! placed on the CPU's clock by the one offset that puts no kernel before its submission
//! (the largest `submit time - first timestamp` over the submissions).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::device::{Gpu, Shared};
use crate::error::{Error, Result};
use crate::fence::{CallbackSlot, Fence, wait_callback, wait_fence};
use crate::recorder::{Batch, Work};

/// Timestamp queries per batch (wgpu allows 4096 per query set): two per dispatch.
pub const QUERIES_PER_BATCH: u32 = 4096;

/// How dispatches are timed (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileMode {
    /// GPU timestamps around each dispatch inside the pass.
    InsidePasses,
    /// One compute pass per dispatch, timed by its begin and end timestamps.
    PerPass,
    /// No GPU timestamps: each dispatch submitted alone and waited for, timed on the CPU.
    Cpu,
}

impl ProfileMode {
    /// What the mode measures, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            ProfileMode::InsidePasses => "GPU timestamps around each dispatch",
            ProfileMode::PerPass => "GPU timestamps, one compute pass per dispatch",
            ProfileMode::Cpu => {
                "CPU-side timing (the adapter has no timestamp queries): each dispatch \
                 submitted alone and waited for, so times include submission and waiting"
            }
        }
    }
}

/// One timed dispatch.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KernelTiming {
    /// The kernel's stem (e.g. `matmul`).
    pub stem: &'static str,
    /// Start and end, in ns since [`Gpu::begin_profile`] (on the CPU's clock, see the module docs).
    pub start_ns: u64,
    /// End, as `start_ns`.
    pub end_ns: u64,
    /// What the launcher says it computes and moves.
    pub flops: u64,
    /// Bytes read and written.
    pub bytes: u64,
    /// The submission it went out in.
    pub submission: u64,
}

/// One span of CPU work around the GPU.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuSpan {
    /// `record`, `submit`, `wait` or `read-back`.
    pub name: &'static str,
    /// What it concerned (the submission's or buffer's label).
    pub label: String,
    /// Start, in ns since [`Gpu::begin_profile`].
    pub start_ns: u64,
    /// End.
    pub end_ns: u64,
}

/// What [`Gpu::end_profile`] returns.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Profile {
    /// How dispatches were timed.
    pub mode: ProfileMode,
    /// Every timed dispatch, in submission order.
    pub kernels: Vec<KernelTiming>,
    /// The CPU's spans.
    pub cpu: Vec<CpuSpan>,
    /// Dispatches that could not be timed (more than [`QUERIES_PER_BATCH`] / 2 in one batch, or
    /// inside [`Gpu::atomically`] in CPU mode).
    pub untimed_dispatches: u64,
    /// Wall time from begin to end.
    pub wall_ns: u64,
}

impl Profile {
    /// The longest GPU time of one submission: from its first timed kernel's start to its last
    /// one's end, in ns, with the submission's serial (`None` without timed kernels). In CPU
    /// mode each dispatch is its own submission.
    pub fn longest_submission(&self) -> Option<(u64, u64)> {
        let mut spans: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        for k in &self.kernels {
            let e = spans.entry(k.submission).or_insert((k.start_ns, k.end_ns));
            e.0 = e.0.min(k.start_ns);
            e.1 = e.1.max(k.end_ns);
        }
        spans
            .into_iter()
            .map(|(serial, (start, end))| (serial, end.saturating_sub(start)))
            .max_by_key(|&(_, ns)| ns)
    }
}

struct Pending {
    fence: Fence,
    submitted_ns: u64,
    entries: Vec<(&'static str, Work)>,
    read: wgpu::Buffer,
    mapped: Arc<CallbackSlot<std::result::Result<(), String>>>,
}

/// Profiling state, inside the batch (its lock guards it; it drops with the batch on the
/// teardown thread, as wgpu objects must).
pub(crate) struct ProfileState {
    pub(crate) mode: ProfileMode,
    started: Instant,
    period_ns: f64,
    query_set: Option<wgpu::QuerySet>,
    /// Queries written in the open batch.
    queries: u32,
    /// The open batch's timed dispatches.
    entries: Vec<(&'static str, Work)>,
    /// When the first dispatch of the open batch was recorded.
    record_started: Option<u64>,
    pending: Vec<Pending>,
    cpu: Vec<CpuSpan>,
    cpu_kernels: Vec<KernelTiming>,
    untimed: u64,
}

impl ProfileState {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Before recording a dispatch: the query indices to write around it (GPU modes), creating
    /// the batch's query set on first use; `None` when it cannot be timed.
    pub(crate) fn before_dispatch(&mut self, device: &wgpu::Device) -> Option<u32> {
        if self.record_started.is_none() {
            self.record_started = Some(self.now_ns());
        }
        if self.mode == ProfileMode::Cpu {
            return None;
        }
        if self.queries + 2 > QUERIES_PER_BATCH {
            self.untimed += 1;
            return None;
        }
        if self.query_set.is_none() {
            self.query_set = Some(device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("plimsoll profile"),
                ty: wgpu::QueryType::Timestamp,
                count: QUERIES_PER_BATCH,
            }));
        }
        let first = self.queries;
        self.queries += 2;
        Some(first)
    }

    /// Forgets the open batch's timings (the batch was discarded, its work never runs).
    pub(crate) fn discard_open(&mut self) {
        self.entries.clear();
        self.queries = 0;
        self.query_set = None;
        self.record_started = None;
    }

    pub(crate) fn query_set(&self) -> Option<&wgpu::QuerySet> {
        self.query_set.as_ref()
    }

    pub(crate) fn timed(&mut self, stem: &'static str, work: Work) {
        self.entries.push((stem, work));
    }

    pub(crate) fn span(&mut self, name: &'static str, label: &str, start: Instant) {
        let start_ns = u64::try_from(start.saturating_duration_since(self.started).as_nanos())
            .unwrap_or(u64::MAX);
        let end_ns = self.now_ns();
        self.cpu.push(CpuSpan {
            name,
            label: label.to_string(),
            start_ns,
            end_ns,
        });
    }
}

/// What [`before_submit`] hands to [`after_submit`]: submit time, the timed dispatches, the
/// buffer their timestamps land in, and its map callback's slot.
pub(crate) type Prepared = (
    u64,
    Vec<(&'static str, Work)>,
    wgpu::Buffer,
    Arc<CallbackSlot<std::result::Result<(), String>>>,
);

/// At submit, before the encoder is finished: resolves the batch's timestamps into a buffer
/// mapped when the submission completes. Returns what to register once the serial is known.
pub(crate) fn before_submit(
    shared: &Shared,
    batch: &mut Batch,
    encoder: &mut wgpu::CommandEncoder,
    label: &str,
) -> Option<Prepared> {
    let state = batch.profile.as_mut()?;
    if let Some(started) = state.record_started.take() {
        let now = state.now_ns();
        state.cpu.push(CpuSpan {
            name: "record",
            label: label.to_string(),
            start_ns: started,
            end_ns: now,
        });
    }
    let entries = std::mem::take(&mut state.entries);
    let queries = std::mem::take(&mut state.queries);
    let query_set = state.query_set.take()?;
    if entries.is_empty() || queries == 0 {
        return None;
    }
    let bytes = u64::from(queries) * 8;
    let resolve = shared.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("plimsoll profile resolve"),
        size: bytes,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let read = shared.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("plimsoll profile read"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    encoder.resolve_query_set(&query_set, 0..queries, &resolve, 0);
    encoder.copy_buffer_to_buffer(&resolve, 0, &read, 0, bytes);
    let mapped = CallbackSlot::new();
    let slot = Arc::clone(&mapped);
    encoder.map_buffer_on_submit(&read, wgpu::MapMode::Read, .., move |r| {
        slot.set(r.map_err(|e| e.to_string()));
    });
    let now = state.now_ns();
    Some((now, entries, read, mapped))
}

/// After a submit that [`before_submit`] prepared: remembers its read-back.
pub(crate) fn after_submit(batch: &mut Batch, fence: &Fence, prepared: Prepared) {
    let (submitted_ns, entries, read, mapped) = prepared;
    if let Some(state) = batch.profile.as_mut() {
        state.pending.push(Pending {
            fence: fence.clone(),
            submitted_ns,
            entries,
            read,
            mapped,
        });
    }
}

/// Records a CPU span when profiling (one relaxed load when not).
pub(crate) fn cpu_span(shared: &Shared, name: &'static str, label: &str, start: Instant) {
    if !shared.profiling.load(Ordering::Relaxed) {
        return;
    }
    if let Some(state) = shared.batch().profile.as_mut() {
        state.span(name, label, start);
    }
}

impl Gpu {
    /// Starts timing every dispatch (see the module docs); `mode` `None` picks the best the
    /// adapter has. Returns the mode used.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if profiling is already on or `mode` needs a feature the
    /// device lacks; [`Error::Timeout`] if the open batch cannot be submitted first.
    pub fn begin_profile(&self, mode: Option<ProfileMode>) -> Result<ProfileMode> {
        let features = self.shared.device.features();
        let inside = features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);
        let timestamps = features.contains(wgpu::Features::TIMESTAMP_QUERY);
        let best = if inside {
            ProfileMode::InsidePasses
        } else if timestamps {
            ProfileMode::PerPass
        } else {
            ProfileMode::Cpu
        };
        let mode = mode.unwrap_or(best);
        let available = match mode {
            ProfileMode::InsidePasses => inside,
            ProfileMode::PerPass => timestamps,
            ProfileMode::Cpu => true,
        };
        if !available {
            return Err(Error::InvalidArgument {
                op: "begin_profile",
                message: format!(
                    "{mode:?} needs timestamp queries this device lacks; use {best:?}"
                ),
            });
        }
        // Work recorded before belongs to nobody's profile.
        self.flush("before profiling")?;
        let mut batch = self.shared.batch();
        if batch.profile.is_some() {
            return Err(Error::InvalidArgument {
                op: "begin_profile",
                message: "profiling is already on; call end_profile first".to_string(),
            });
        }
        batch.profile = Some(ProfileState {
            mode,
            started: Instant::now(),
            period_ns: f64::from(self.shared.queue.get_timestamp_period()),
            query_set: None,
            queries: 0,
            entries: Vec::new(),
            record_started: None,
            pending: Vec::new(),
            cpu: Vec::new(),
            cpu_kernels: Vec::new(),
            untimed: 0,
        });
        self.shared.profiling.store(true, Ordering::SeqCst);
        Ok(mode)
    }

    /// Whether a profile is being recorded.
    pub fn is_profiling(&self) -> bool {
        self.shared.profiling.load(Ordering::Relaxed)
    }

    /// Times one dispatch on the CPU (CPU mode): submits it alone and waits, within the
    /// default deadline. Called by `dispatch` after recording, with no lock held.
    pub(crate) fn time_on_cpu(&self, stem: &'static str, work: Work, start: Instant) -> Result<()> {
        if self.shared.batch().hold {
            if let Some(state) = self.shared.batch().profile.as_mut() {
                state.untimed += 1;
            }
            return Ok(());
        }
        let fence = self.flush(stem)?;
        self.wait(&fence, self.default_deadline())?;
        let mut batch = self.shared.batch();
        if let Some(state) = batch.profile.as_mut() {
            let start_ns = u64::try_from(start.saturating_duration_since(state.started).as_nanos())
                .unwrap_or(u64::MAX);
            let end_ns = state.now_ns();
            state.cpu_kernels.push(KernelTiming {
                stem,
                start_ns,
                end_ns,
                flops: work.flops,
                bytes: work.bytes,
                submission: fence.serial(),
            });
        }
        Ok(())
    }

    /// Stops profiling: submits what is open, waits for every profiled submission and reads its
    /// timestamps, all within `deadline`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if profiling is off; [`Error::Timeout`] past `deadline`
    /// (profiling is off afterwards either way); [`Error::Map`] if a timestamp read fails.
    pub fn end_profile(&self, deadline: Duration) -> Result<Profile> {
        let start = Instant::now();
        let flushed = self.flush_within("end of profile", deadline);
        self.shared.profiling.store(false, Ordering::SeqCst);
        let state = self.shared.batch().profile.take();
        let Some(state) = state else {
            return Err(Error::InvalidArgument {
                op: "end_profile",
                message: "profiling is off; call begin_profile first".to_string(),
            });
        };
        flushed?;
        let wall_ns = state.now_ns();
        let mut kernels = state.cpu_kernels;
        // The offset that puts no kernel before its submission.
        let mut resolved = Vec::new();
        let mut offset: Option<f64> = None;
        for p in &state.pending {
            wait_fence(&self.shared, &p.fence, start, deadline)?;
            wait_callback(&self.shared, &p.fence, &p.mapped, start, deadline)?.map_err(
                |message| Error::Map {
                    label: "profile timestamps".to_string(),
                    message,
                },
            )?;
            let ticks: Vec<u64> = {
                let view = p
                    .read
                    .slice(..)
                    .get_mapped_range()
                    .map_err(|e| Error::Map {
                        label: "profile timestamps".to_string(),
                        message: e.to_string(),
                    })?;
                bytemuck::pod_collect_to_vec(&view)
            };
            p.read.unmap();
            let ns: Vec<f64> = ticks.iter().map(|&t| t as f64 * state.period_ns).collect();
            if let Some(&first) = ns.first() {
                let candidate = p.submitted_ns as f64 - first;
                offset = Some(offset.map_or(candidate, |o: f64| o.max(candidate)));
            }
            resolved.push((p, ns));
        }
        let offset = offset.unwrap_or(0.0);
        for (p, ns) in resolved {
            for (i, (stem, work)) in p.entries.iter().enumerate() {
                let (Some(&a), Some(&b)) = (ns.get(2 * i), ns.get(2 * i + 1)) else {
                    continue;
                };
                kernels.push(KernelTiming {
                    stem,
                    start_ns: (a + offset).max(0.0) as u64,
                    end_ns: (b.max(a) + offset).max(0.0) as u64,
                    flops: work.flops,
                    bytes: work.bytes,
                    submission: p.fence.serial(),
                });
            }
        }
        Ok(Profile {
            mode: state.mode,
            kernels,
            cpu: state.cpu,
            untimed_dispatches: state.untimed,
            wall_ns,
        })
    }
}
