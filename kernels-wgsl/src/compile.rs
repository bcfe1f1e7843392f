//! Building a run's pipelines before its first step: [`Gpu::compile_kernels`] (every kernel),
//! [`Gpu::compile_wanted`] (those a planning twin's launches asked for, then one warm-up
//! dispatch each) and [`Gpu::compile_pipelines`] (on parallel threads).

use std::time::{Duration, Instant};

use crate::device::Gpu;
use crate::error::{Error, RecentSubmissions, Result};
use crate::fence::{PollOutcome, poll_device};
use crate::pipeline::{Compiled, PARAMS_BYTES, WantedPipeline, scoped};

/// Bytes of each scratch storage buffer of a warm-up (wgpu's runtime checks keep every access of
/// a kernel inside the buffers bound, whatever its `Params` say).
const SCRATCH_BYTES: u64 = 64 * 1024;

/// Longest single wait of the warm-up's poll loop (the deadline is checked between waits).
const POLL_SLICE: Duration = Duration::from_millis(50);

impl Gpu {
    /// Builds every pipeline the crate's launchers can ask for ([`crate::kernels::variants`]),
    /// skipping those the device cannot build ([`crate::Kernel::runs_with`]), on parallel threads
    /// ([`Gpu::compile_pipelines`]), and returns how many it built.
    pub fn compile_kernels(&self) -> Result<usize> {
        Ok(self
            .compile_pipelines(&every_variant(
                self.features(),
                self.adapter().cooperative_matmul,
            ))?
            .built)
    }

    /// Builds the pipelines this device's planning twins' launches asked for (a run's memory
    /// plan replays its steps and evaluation on twins: the kernels of every candidate it tried,
    /// the chosen one's included), on parallel threads; every kernel
    /// ([`Gpu::compile_kernels`]) when no twin asked for any.
    /// A run calls it before its first step, so pipeline creation (a driver's shader compile on
    /// a GPU) happens outside any step's deadline; a pipeline nobody foresaw is still built
    /// on first use.
    ///
    /// Then each of those pipelines is dispatched once per distinct `Params` a twin launched it
    /// with (at most 64 kept per pipeline), on a single workgroup over small scratch buffers (wgpu's runtime checks keep every
    /// access inside them; what the kernels write there is discarded), and waited for within
    /// `deadline`. Lavapipe compiles a shader to machine code only at a dispatch, specialised
    /// on some `Params` values (docs/wgpu.md §5.1), which would otherwise land in step 1 and
    /// count against its fence deadline.
    pub fn compile_wanted(&self, deadline: std::time::Duration) -> Result<Compiled> {
        let wanted = self.shared.wanted.take();
        if wanted.is_empty() {
            return self.compile_pipelines(&every_variant(
                self.features(),
                self.adapter().cooperative_matmul,
            ));
        }
        let compiled = self.compile_pipelines(&wanted)?;
        self.warm_up(&wanted, deadline)?;
        Ok(compiled)
    }

    /// Builds `pipelines` (those not built yet), split over up to
    /// `std::thread::available_parallelism()` threads (each with its own wgpu error scopes,
    /// which are per thread), skipping those the device cannot build ([`crate::Kernel::runs_with`]).
    pub fn compile_pipelines(&self, pipelines: &[WantedPipeline]) -> Result<Compiled> {
        let features = self.features();
        let todo: Vec<&WantedPipeline> = pipelines
            .iter()
            .filter(|w| w.kernel.runs_with(features))
            .collect();
        // Shader modules first, one per stem (cheap: parsing and validation), so the threads
        // below share them instead of each building its own.
        for w in &todo {
            self.shared.pipelines.module(&self.shared, &w.kernel)?;
        }
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(todo.len())
            .max(1);
        let chunk = todo.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let handles: Vec<_> = todo
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || -> Result<()> {
                        for w in part {
                            let overrides: Vec<(&str, f64)> =
                                w.overrides.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                            self.shared
                                .pipelines
                                .get(&self.shared, &w.kernel, &overrides)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            // Every thread joined before the first error is returned (a thread left unjoined
            // that had panicked would make the scope panic).
            let results: Vec<Result<()>> = handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Internal {
                            context: "compiling pipelines".to_string(),
                            message: "a compiling thread panicked".to_string(),
                        })
                    })
                })
                .collect();
            results.into_iter().collect::<Result<()>>()
        })?;
        Ok(Compiled {
            built: todo.len(),
            threads: todo.len().div_ceil(chunk).max(1),
        })
    }

    /// Dispatches each pipeline of `pipelines` once per recorded `Params`, on one workgroup,
    /// over storage buffers of its own (raw wgpu buffers, not the allocator's segments, so no
    /// tensor can be written whatever offsets the `Params` hold), in one submission, and waits
    /// for it within `deadline`.
    fn warm_up(&self, pipelines: &[WantedPipeline], deadline: Duration) -> Result<()> {
        let features = self.features();
        let runs: Vec<(&WantedPipeline, &Vec<u8>)> = pipelines
            .iter()
            .filter(|w| w.kernel.runs_with(features))
            // Only modules with wgpu's runtime checks: the Params are the twin's, so indices
            // may point past the scratch buffers, and only the checks keep them inside.
            .filter(|w| w.kernel.runtime_checks.is_on())
            .flat_map(|w| w.params.iter().map(move |p| (w, p)))
            .collect();
        if runs.is_empty() {
            return Ok(());
        }
        let shared = &*self.shared;
        let device = &shared.device;
        let most = runs
            .iter()
            .map(|(w, _)| w.kernel.storage_bindings)
            .max()
            .unwrap_or(0);
        let scratch: Vec<wgpu::Buffer> = scoped(device, "warm-up buffers", || {
            (0..most)
                .map(|_| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("plimsoll warm-up scratch"),
                        size: SCRATCH_BYTES,
                        usage: wgpu::BufferUsages::STORAGE,
                        mapped_at_creation: false,
                    })
                })
                .collect()
        })?;
        // Every run's Params at its own 256-byte slot (PARAMS_BYTES, the dynamic offset's
        // alignment on every adapter).
        let mut params = vec![0u8; runs.len() * PARAMS_BYTES as usize];
        for (slot, (_, p)) in params.chunks_mut(PARAMS_BYTES as usize).zip(&runs) {
            slot[..p.len()].copy_from_slice(p);
        }
        let uniform = scoped(device, "warm-up params", || {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("plimsoll warm-up params"),
                size: params.len() as u64,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        shared.queue.write_buffer(&uniform, 0, &params);
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("plimsoll warm-up"),
        });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("plimsoll warm-up"),
                timestamp_writes: None,
            });
            for (i, (w, _)) in runs.iter().enumerate() {
                let overrides: Vec<(&str, f64)> =
                    w.overrides.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                let (pipeline, layout) = shared.pipelines.get(shared, &w.kernel, &overrides)?;
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &uniform,
                        offset: 0,
                        size: wgpu::BufferSize::new(PARAMS_BYTES),
                    }),
                }];
                entries.extend(
                    scratch
                        .iter()
                        .take(w.kernel.storage_bindings as usize)
                        .zip(1u32..)
                        .map(|(b, binding)| wgpu::BindGroupEntry {
                            binding,
                            resource: b.as_entire_binding(),
                        }),
                );
                let group = scoped(device, "warm-up bind group", || {
                    device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("plimsoll warm-up"),
                        layout: &layout,
                        entries: &entries,
                    })
                })?;
                pass.set_pipeline(&pipeline);
                let offset = (i as u64 * PARAMS_BYTES) as u32;
                pass.set_bind_group(0, &group, &[offset]);
                pass.dispatch_workgroups(1, 1, 1);
            }
        }
        let index = scoped(device, "warm-up submit", || {
            shared.queue.submit([encoder.finish()])
        })?;
        let start = Instant::now();
        loop {
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Timeout {
                    label: "warm-up: the run's kernels, one workgroup each".to_string(),
                    serial: 0,
                    deadline_ms: deadline.as_millis() as u64,
                    recent: RecentSubmissions::default(),
                });
            }
            if poll_device(shared, Some(&index), left.min(POLL_SLICE))? == PollOutcome::Done {
                return Ok(());
            }
        }
    }
}

/// Every pipeline the launchers can ask for on a device with `features`
/// ([`crate::kernels::variants`]), with no `Params`.
fn every_variant(features: wgpu::Features, cooperative: bool) -> Vec<WantedPipeline> {
    crate::kernels::variants()
        .into_iter()
        .filter(|(kernel, _)| {
            kernel.runs_with(features) && (!crate::kernels::matmul::is_coop(kernel) || cooperative)
        })
        .map(|(kernel, overrides)| WantedPipeline::new(*kernel, &overrides))
        .collect()
}
