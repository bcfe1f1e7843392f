//! Recording and batched submission.
//!
//! Launchers call [`Gpu::dispatch`], which records into the device's one open batch: one command
//! encoder, one compute pass per run of dispatches (a copy, e.g. for a read-back, ends the pass).
//! [`Gpu::flush`] submits the batch and returns its [`Fence`]; a batch also goes out by itself
//! once it holds [`Gpu::submit_every`] dispatches or, under a bound on one submission's GPU
//! time, when the next dispatch would take its estimate past it ([`crate::pacing`]), both at the
//! next dispatch and never inside [`Gpu::atomically`], and before a read-back.
//!
//! Submission is bounded (policy and cost in [`crate::fence`]): every submit goes through
//! `lock_for_submit`, which, while [`Gpu::max_submissions_in_flight`] submissions are in flight,
//! releases the batch lock and waits for the oldest one within the caller's deadline. A timeout
//! there leaves the batch open and unsubmitted (a later flush sends it) and is an
//! [`Error::Timeout`] naming the submission that was still running.
//!
//! Params (uniforms): each dispatch's `Params` bytes are appended to a per-batch bump arena in host
//! memory, one slot of `PARAMS_BYTES` rounded up to `min_uniform_buffer_offset_alignment`. The
//! arena is backed by uniform "chunk" buffers of [`CHUNK_BYTES`] that live as long as the device;
//! at submit the used bytes are written with one `queue.write_buffer` per chunk, which wgpu runs
//! before the batch's commands (and after every earlier submission, so reusing chunks across
//! batches is safe). Each dispatch binds its slot by dynamic offset, so bind groups depend only on
//! (storage-binding count, chunk, segments) and are cached: no bind group is created on the hot
//! path once the segments exist.
//!
//! Host/GPU ordering (the `write_buffer` hazard, docs/wgpu.md §4). Invariant: *no
//! `queue.write_buffer` can overtake recorded-but-unsubmitted work on the same bytes.* wgpu runs a
//! `write_buffer` before every command of the next submit, so only host writes can overtake; GPU
//! work recorded later in the same batch runs after earlier work on the same bytes (wgpu inserts
//! the barriers between dispatches and copies). So a freed block may be reused *at once* by later
//! recorded work, and only an upload must wait. How:
//! - every [`DeviceBuffer`](crate::DeviceBuffer) remembers the serial of the last batch that recorded a use of it
//!   (`last_used_batch`, stored under the batch lock at each dispatch);
//! - a dropped buffer goes back to the allocator at once, tagged with that serial
//!   (`BufferAllocator::free_with_tag`); the allocator keeps, per free block, the largest tag over
//!   its bytes (merges take the max, splits copy it), and a new buffer starts with the tag of the
//!   bytes it got as its `last_used_batch`: it counts as used by every batch its bytes were;
//! - an upload ([`Gpu::write`]) into a buffer whose `last_used_batch` is the open batch's serial
//!   submits the batch first (under the batch lock, so nothing is recorded in between).
//!
//! Serials only grow, and a batch's serial changes when it is submitted, so a stale tag (an older
//! serial) never forces a submit. Tags are conservative: a block merged with bytes the open batch
//! used makes an upload into any part of it submit first, which costs a submit, never correctness.
//! A segment whose last block is freed may be released while the open batch still binds it: wgpu
//! keeps a dropped buffer alive for recorded work (see [`crate::memory`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::device::{Gpu, Shared};
use crate::error::{Error, Result};
use crate::fence::{Fence, wait_fence};
use crate::pipeline::{Kernel, PARAMS_BYTES, scoped};
use crate::profile::ProfileMode;
use crate::slice::DeviceSlice;

/// On a CPU adapter a batch is submitted by itself after this many dispatches (bounds the work
/// behind one fence; [`Gpu::submit_every`]).
pub const AUTO_FLUSH_DISPATCHES: u32 = 1024;
/// On a GPU a batch is submitted by itself after this many dispatches ([`Gpu::submit_every`]):
/// the device runs a step's first kernels while the host records the next ones, instead of
/// idling until the whole forward and backward are recorded (a step's one read-back submits
/// them; not measured on a GPU yet).
pub const GPU_SUBMIT_EVERY: u32 = 64;
/// Size of one uniform chunk buffer.
pub const CHUNK_BYTES: u64 = 64 * 1024;

/// One kernel launch, as built by a launcher.
#[derive(Debug, Clone, Copy)]
pub struct Dispatch<'a> {
    /// The kernel.
    pub kernel: &'a Kernel,
    /// WGSL `override` constants (part of the pipeline cache key).
    pub overrides: &'a [(&'a str, f64)],
    /// The `Params` struct as bytes (`bytemuck::bytes_of`), at most [`PARAMS_BYTES`].
    pub params: &'a [u8],
    /// Slices for `@binding(1..=N)`, in order; each binds its buffer's whole segment (the
    /// shader adds [`DeviceSlice::index`], which the launcher puts in `params`).
    pub buffers: &'a [DeviceSlice<'a>],
    /// Other slices in the bound segments that the shader reaches (a multi-tensor launch binds
    /// each segment once for all its tensors): marked as used by the batch like `buffers`, so
    /// that an upload into one, or into its bytes after it is freed, cannot overtake the launch.
    pub also_uses: &'a [DeviceSlice<'a>],
    /// Workgroup counts (see [`crate::kernels::grid_1d`]).
    pub workgroups: [u32; 3],
    /// What the launch computes and moves, for the profiler's GFLOP/s and GB/s (zeros: unknown).
    pub work: Work,
}

/// The work of one launch, as its launcher knows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    /// Floating-point operations (a multiply-add counts 2); 0 where not the point of the kernel.
    pub flops: u64,
    /// Bytes read and written.
    pub bytes: u64,
}

impl Work {
    /// Bytes alone: every element of `slices` read or written once (4-byte elements).
    pub fn of_slices(slices: &[DeviceSlice<'_>]) -> Work {
        Work {
            flops: 0,
            bytes: slices.iter().map(|s| s.len().saturating_mul(4)).sum(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BindKey {
    storage_bindings: u32,
    chunk: usize,
    segments: SmallVec<[u64; 6]>,
}

/// The open batch. Lives in [`Shared`] behind a mutex (lock order: batch, then memory).
pub(crate) struct Batch {
    /// Serial the next submission will carry (starts at 1).
    pub(crate) serial: u64,
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    dispatches: u32,
    /// The estimated GPU time of what is recorded, in ns, and its kernels ([`crate::pacing`]).
    estimated_ns: u64,
    stems: Vec<crate::pacing::WorkKey>,
    label: Option<String>,
    params: Vec<u8>,
    slot_bytes: u64,
    chunks: Vec<wgpu::Buffer>,
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    released_segments: Option<Arc<Mutex<Vec<u64>>>>,
    /// Inside [`Gpu::atomically`]: no automatic submission, so the section can be discarded.
    pub(crate) hold: bool,
    /// Profiling state while [`Gpu::begin_profile`] is on (see [`crate::profile`]).
    pub(crate) profile: Option<crate::profile::ProfileState>,
}

impl Batch {
    pub(crate) fn new(limits: &wgpu::Limits) -> Self {
        let align = u64::from(limits.min_uniform_buffer_offset_alignment).max(1);
        Batch {
            serial: 1,
            encoder: None,
            pass: None,
            dispatches: 0,
            estimated_ns: 0,
            stems: Vec::new(),
            label: None,
            params: Vec::new(),
            slot_bytes: PARAMS_BYTES.div_ceil(align) * align,
            chunks: Vec::new(),
            bind_groups: HashMap::new(),
            released_segments: None,
            hold: false,
            profile: None,
        }
    }

    pub(crate) fn set_released_segments(&mut self, released: Arc<Mutex<Vec<u64>>>) {
        self.released_segments = Some(released);
    }

    /// Whether anything is recorded and not yet submitted.
    pub(crate) fn is_open(&self) -> bool {
        self.encoder.is_some()
    }

    pub(crate) fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("plimsoll batch"),
            })
        })
    }

    /// Ends the compute pass (before a copy is recorded).
    pub(crate) fn end_pass(&mut self) {
        self.pass = None;
    }

    /// Drops the recorded, unsubmitted work (the device is going away; nobody can read it).
    pub(crate) fn discard(&mut self) {
        self.pass = None;
        self.encoder = None;
        self.dispatches = 0;
        self.estimated_ns = 0;
        self.stems.clear();
        self.label = None;
        self.params.clear();
        if let Some(profile) = self.profile.as_mut() {
            profile.discard_open();
        }
    }

    fn evict_released(&mut self) {
        let Some(released) = &self.released_segments else {
            return;
        };
        let uids: Vec<u64> = match released.lock() {
            Ok(mut r) if !r.is_empty() => std::mem::take(&mut *r),
            _ => return,
        };
        self.bind_groups
            .retain(|k, _| !k.segments.iter().any(|s| uids.contains(s)));
    }
}

impl Gpu {
    /// Dispatches after which the open batch is submitted by itself
    /// ([`GpuOptions::submit_every`](crate::GpuOptions::submit_every), else
    /// [`AUTO_FLUSH_DISPATCHES`] on a CPU adapter and [`GPU_SUBMIT_EVERY`] on a GPU).
    pub fn submit_every(&self) -> u32 {
        let shared = &*self.shared;
        let default = match shared.summary.device_type {
            wgpu::DeviceType::Cpu => AUTO_FLUSH_DISPATCHES,
            _ => GPU_SUBMIT_EVERY,
        };
        shared.options.submit_every.unwrap_or(default).max(1)
    }

    /// Records one dispatch into the open batch (see the module docs). Fails on a bad kernel
    /// (validation), a params struct over [`PARAMS_BYTES`], or a lost device; and with
    /// [`Error::Timeout`] (nothing recorded) when a full batch must go out first and the GPU does
    /// not make room within [`Gpu::default_deadline`].
    pub fn dispatch(&self, d: Dispatch<'_>) -> Result<()> {
        let start = Instant::now();
        let shared = &*self.shared;
        shared.health.check()?;
        if d.params.len() as u64 > PARAMS_BYTES
            || d.buffers.len() != d.kernel.storage_bindings as usize
        {
            return Err(Error::InvalidArgument {
                op: d.kernel.stem,
                message: format!(
                    "{} params bytes (max {PARAMS_BYTES}), {} buffers for {} bindings",
                    d.params.len(),
                    d.buffers.len(),
                    d.kernel.storage_bindings
                ),
            });
        }
        if let Some(foreign) = d.buffers.iter().find(|b| !b.buffer().belongs_to(shared)) {
            return Err(Error::InvalidArgument {
                op: d.kernel.stem,
                message: format!(
                    "{:?} belongs to another device than the one recording the kernel: \
                     tensors of two Gpus cannot meet in one op; make them on one Gpu (or read \
                     one back and upload it to the other)",
                    foreign.buffer().label()
                ),
            });
        }
        if let Some(evicted) = d.buffers.iter().find(|b| !b.buffer().is_resident()) {
            return Err(Error::Evicted {
                label: evicted.buffer().label().to_string(),
                op: d.kernel.stem.to_string(),
            });
        }
        if shared.planning {
            // A planning device runs no kernel (see `crate::planning`); it notes the pipeline and
            // its Params, which the real device builds and warms up before the run's first step
            // (`Gpu::compile_wanted`).
            shared.wanted.note(d.kernel, d.overrides, d.params);
            return Ok(());
        }
        let (pipeline, bgl) = shared.pipelines.get(shared, d.kernel, d.overrides)?;
        let estimated = shared.pacing.estimate_ns(d.kernel.stem, d.work);
        let bound = shared.pacing.target_ns();
        // Full: too many dispatches, or (with a bound) this one would take the batch's
        // estimated GPU time past it.
        let every = self.submit_every();
        let full = |b: &Batch| {
            b.dispatches >= every
                || bound.is_some_and(|bound| {
                    b.dispatches > 0 && b.estimated_ns.saturating_add(estimated) > bound
                })
        };
        let mut batch = shared.batch();
        if full(&batch) && !batch.hold {
            drop(batch);
            let deadline = self.default_deadline();
            batch = lock_for_submit(shared, deadline)?;
            // Another thread may have entered `atomically` while this one waited.
            if full(&batch) && !batch.hold {
                if batch.dispatches < every {
                    shared.pacing.note_early_submission();
                }
                submit_locked(shared, &mut batch, None, deadline)?;
            }
        }
        batch.evict_released();

        let slot = batch.params.len() as u64 / batch.slot_bytes;
        let slots_per_chunk = CHUNK_BYTES / batch.slot_bytes;
        let chunk = (slot / slots_per_chunk) as usize;
        let dynamic_offset = ((slot % slots_per_chunk) * batch.slot_bytes) as u32;
        let mut bytes = d.params.to_vec();
        bytes.resize(batch.slot_bytes as usize, 0);
        while batch.chunks.len() <= chunk {
            let buffer = shared.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("plimsoll params chunk"),
                size: CHUNK_BYTES,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            batch.chunks.push(buffer);
        }
        let key = BindKey {
            storage_bindings: d.kernel.storage_bindings,
            chunk,
            segments: d.buffers.iter().map(|b| b.buffer().segment_uid()).collect(),
        };
        if !batch.bind_groups.contains_key(&key) {
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &batch.chunks[chunk],
                    offset: 0,
                    size: wgpu::BufferSize::new(PARAMS_BYTES),
                }),
            }];
            let segments = d
                .buffers
                .iter()
                .map(|b| b.buffer().resident(d.kernel.stem).map(|(s, _)| s))
                .collect::<Result<Vec<_>>>()?;
            entries.extend(segments.iter().zip(1u32..).map(|(segment, binding)| {
                wgpu::BindGroupEntry {
                    binding,
                    resource: segment.as_entire_binding(),
                }
            }));
            let group = scoped(&shared.device, "bind group", || {
                shared.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(d.kernel.stem),
                    layout: &bgl,
                    entries: &entries,
                })
            })?;
            batch.bind_groups.insert(key.clone(), group);
        }
        let group = batch.bind_groups.get(&key).cloned();
        let Some(group) = group else {
            return Err(Error::InvalidArgument {
                op: d.kernel.stem,
                message: "bind group vanished from the cache".to_string(),
            });
        };

        batch.params.extend_from_slice(&bytes);
        // Profiling (off: one relaxed load): the queries to write around this dispatch.
        let mut profile_mode = None;
        let mut query = None;
        if shared.profiling.load(Ordering::Relaxed)
            && let Some(profile) = batch.profile.as_mut()
        {
            profile_mode = Some(profile.mode);
            query = profile.before_dispatch(&shared.device);
        }
        let per_pass = profile_mode == Some(ProfileMode::PerPass) && query.is_some();
        if per_pass {
            batch.end_pass();
        }
        if batch.pass.is_none() {
            let Batch {
                encoder, profile, ..
            } = &mut *batch;
            let encoder = encoder.get_or_insert_with(|| {
                shared
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("plimsoll batch"),
                    })
            });
            let timestamp_writes = match (per_pass, query, profile.as_ref()) {
                (true, Some(q), Some(p)) => {
                    p.query_set()
                        .map(|query_set| wgpu::ComputePassTimestampWrites {
                            query_set,
                            beginning_of_pass_write_index: Some(q),
                            end_of_pass_write_index: Some(q + 1),
                        })
                }
                _ => None,
            };
            let pass = encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("plimsoll kernels"),
                    timestamp_writes,
                })
                .forget_lifetime();
            batch.pass = Some(pass);
        }
        let inside = profile_mode == Some(ProfileMode::InsidePasses);
        let Batch { pass, profile, .. } = &mut *batch;
        let query_set = profile.as_ref().and_then(|p| p.query_set());
        if let Some(pass) = pass.as_mut() {
            if let (true, Some(q), Some(qs)) = (inside, query, query_set) {
                pass.write_timestamp(qs, q);
            }
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[dynamic_offset]);
            let [x, y, z] = d.workgroups;
            pass.dispatch_workgroups(x, y, z);
            if let (true, Some(q), Some(qs)) = (inside, query, query_set) {
                pass.write_timestamp(qs, q + 1);
            }
        }
        if query.is_some()
            && let Some(profile) = batch.profile.as_mut()
        {
            profile.timed(d.kernel.stem, d.work);
        }
        if per_pass {
            batch.end_pass();
        }
        let serial = batch.serial;
        for b in d.buffers.iter().chain(d.also_uses) {
            b.buffer().last_used_batch.store(serial, Ordering::SeqCst);
        }
        batch.dispatches += 1;
        batch.estimated_ns = batch.estimated_ns.saturating_add(estimated);
        let key = (d.kernel.stem, crate::pacing::work_class(d.work));
        if !batch.stems.contains(&key) {
            batch.stems.push(key);
        }
        batch.label.get_or_insert_with(|| d.kernel.stem.to_string());
        drop(batch);
        if profile_mode == Some(ProfileMode::Cpu) {
            self.time_on_cpu(d.kernel.stem, d.work, start)?;
        }
        Ok(())
    }

    /// Runs `record` as one all-or-nothing unit of GPU work: the open batch is submitted first
    /// (within the default deadline), nothing `record` records is submitted automatically, and
    /// if it returns an error everything it recorded is discarded, so none of it ever runs. An
    /// optimizer update recorded this way either changes every parameter or none.
    ///
    /// `record` must not read back or flush: that submits its work so far, which a later error
    /// can no longer undo (only what it recorded after the last submission is discarded).
    pub fn atomically<T, E: From<Error>>(
        &self,
        label: &str,
        record: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        self.flush(label)?;
        self.shared.batch().hold = true;
        let result = record();
        let mut batch = self.shared.batch();
        batch.hold = false;
        if result.is_err() {
            // Everything open now was recorded by `record` (the batch was submitted before it).
            batch.discard();
        }
        result
    }

    /// Submits the open batch and returns its fence, within [`Gpu::default_deadline`] (see
    /// [`Gpu::flush_within`]).
    pub fn flush(&self, label: &str) -> Result<Fence> {
        self.flush_within(label, self.default_deadline())
    }

    /// Submits the open batch and returns its fence. With nothing recorded, returns the latest
    /// submission's fence (already complete if nothing was ever submitted). `label` names the
    /// submission in timeout reports (default: the first kernel's stem).
    ///
    /// When [`Gpu::max_submissions_in_flight`] submissions are in flight, first waits for the
    /// oldest; if it is still running after `deadline`, returns [`Error::Timeout`] naming it, and
    /// the batch stays open (a later flush submits it).
    pub fn flush_within(&self, label: &str, deadline: Duration) -> Result<Fence> {
        let shared = &*self.shared;
        shared.health.check()?;
        if !shared.batch().is_open() {
            return Ok(shared.fences.last());
        }
        let mut batch = lock_for_submit(shared, deadline)?;
        submit_locked(shared, &mut batch, Some(label), deadline)
    }
}

/// Locks the batch at a moment when a submit may go ahead: fewer than the device's maximum are in
/// flight. Until then waits for the oldest in-flight submission, with the lock released (others
/// keep recording), within `deadline`; past it, [`Error::Timeout`] naming that submission.
pub(crate) fn lock_for_submit(
    shared: &Shared,
    deadline: Duration,
) -> Result<MutexGuard<'_, Batch>> {
    let start = Instant::now();
    loop {
        let batch = shared.batch();
        let Some(oldest) = shared.fences.blocking_submit(shared.max_in_flight) else {
            return Ok(batch);
        };
        drop(batch);
        // Completion is in queue order, so once `oldest` is done there is room, unless another
        // thread submitted meanwhile: then loop and wait for the next one.
        let waited = Instant::now();
        wait_fence(shared, &oldest, start, deadline)?;
        // A profile counts it as waiting on the device, not as the host's own work.
        crate::profile::cpu_span(shared, "wait", oldest.label(), waited);
    }
}

/// Submits `batch` (caller holds its lock, normally from [`lock_for_submit`]): writes the params
/// chunks, finishes the encoder inside a validation scope, submits and records the fence. Keeps the in-flight bound even for a caller that locked the batch
/// directly, by waiting (lock held) within `deadline`; on a timeout nothing is submitted.
pub(crate) fn submit_locked(
    shared: &Shared,
    batch: &mut Batch,
    label: Option<&str>,
    deadline: Duration,
) -> Result<Fence> {
    batch.end_pass();
    if !batch.is_open() {
        return Ok(shared.fences.last());
    }
    #[cfg(all(feature = "fault-injection", debug_assertions))]
    if crate::fault::fires(shared, crate::fault::FaultPoint::Submission)? {
        // What waiting for room past the deadline gives: the batch stays unsubmitted.
        return Err(crate::fault::timeout(
            shared,
            &shared.fences.last(),
            deadline,
        ));
    }
    if let Some(oldest) = shared.fences.blocking_submit(shared.max_in_flight) {
        let waited = Instant::now();
        wait_fence(shared, &oldest, waited, deadline)?;
        // As `cpu_span`, into the batch whose lock this thread holds.
        if shared.profiling.load(Ordering::Relaxed)
            && let Some(state) = batch.profile.as_mut()
        {
            state.span("wait", oldest.label(), waited);
        }
    }
    let Some(mut encoder) = batch.encoder.take() else {
        return Ok(shared.fences.last());
    };
    let serial = batch.serial;
    batch.serial += 1;
    let dispatches = std::mem::take(&mut batch.dispatches);
    let estimated = std::mem::take(&mut batch.estimated_ns);
    let stems = std::mem::take(&mut batch.stems);
    let first = batch.label.take();
    let label = match (label, first) {
        (Some(l), Some(f)) => format!("{l} [{f}..]"),
        (Some(l), None) => l.to_string(),
        (None, Some(f)) => format!("{f}.. (auto)"),
        (None, None) => "batch".to_string(),
    };
    let profiled = match shared.profiling.load(Ordering::Relaxed) {
        true => crate::profile::before_submit(shared, batch, &mut encoder, &label),
        false => None,
    };
    let submit_start = Instant::now();
    for (chunk, bytes) in batch.params.chunks(CHUNK_BYTES as usize).enumerate() {
        if let Some(buffer) = batch.chunks.get(chunk) {
            shared.queue.write_buffer(buffer, 0, bytes);
        }
    }
    batch.params.clear();
    let completed = shared.fences.completed_handle();
    let pacing = Arc::clone(&shared.pacing);
    encoder.on_submitted_work_done(move || {
        completed.fetch_max(serial, Ordering::SeqCst);
        pacing.completed(serial);
    });
    shared.pacing.submitted(serial, estimated, stems);
    let context = format!("submission #{serial} {label}");
    let submitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        scoped(&shared.device, &context, || {
            let buffer = encoder.finish();
            shared.queue.submit([buffer])
        })
    }));
    let index = match submitted {
        Ok(Ok(index)) => index,
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            shared.health.mark_lost("queue.submit panicked".to_string());
            shared.health.check()?;
            return Err(Error::DeviceLost {
                reason: "queue.submit panicked".to_string(),
            });
        }
    };
    shared.health.check()?;
    let fence = Fence::new(serial, Some(index), &label);
    shared.fences.record(&fence, dispatches);
    if shared.profiling.load(Ordering::Relaxed) {
        if let Some(profile) = batch.profile.as_mut() {
            profile.span("submit", &label, submit_start);
        }
        if let Some(prepared) = profiled {
            crate::profile::after_submit(batch, &fence, prepared);
        }
    }
    Ok(fence)
}
