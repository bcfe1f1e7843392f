//! Pitfalls 2 and 4: wgpu calls that block behind running GPU work. A spin dispatch, calibrated
//! to run about [`SPIN_TARGET`] on the adapter at hand, keeps the device busy.

use std::sync::{Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use plimsoll_kernels_wgsl::testing::skip;

use crate::{DEADLINE, Raw, is_done, raw_device, storage_buffer};

/// How long the spin dispatch runs: long against the few milliseconds the probes need between
/// starting it and checking on it.
const SPIN_TARGET: Duration = Duration::from_millis(1500);
/// How long after `queue.submit` returns the previous submission's fence may take to signal.
const FENCE_GRACE: Duration = Duration::from_millis(100);
/// Loop iterations per invocation (under lavapipe's loop limit); the workgroups are calibrated.
const SPIN_ITERATIONS: u32 = 2_000;

const SPIN: &str = r"
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
override ITERATIONS: u32 = 1u;
fn mix(h: u32, k: u32) -> u32 { return (h ^ (h >> 15u)) * 0x2c1b3c6du + k; }
@compute @workgroup_size(64)
fn spin(@builtin(global_invocation_id) gid: vec3<u32>) {
    var h = gid.x;
    for (var k = 0u; k < ITERATIONS; k++) {
        for (var r = 0u; r < 64u; r++) { h = mix(h, k); }
    }
    out[gid.x % 64u] = h;
}
";

/// A raw device with a spin pipeline, and the workgroup count that runs about [`SPIN_TARGET`].
struct Spinner {
    raw: Raw,
    pipe: wgpu::ComputePipeline,
    group: wgpu::BindGroup,
    workgroups: u32,
}

impl Spinner {
    fn new() -> Self {
        let raw = raw_device(wgpu::Features::empty(), None);
        let module = raw
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("spin"),
                source: wgpu::ShaderSource::Wgsl(SPIN.into()),
            });
        let pipe = raw
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("spin"),
                layout: None,
                module: &module,
                entry_point: Some("spin"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &[("ITERATIONS", f64::from(SPIN_ITERATIONS))],
                    ..Default::default()
                },
                cache: None,
            });
        let out = storage_buffer(&raw.device, "spin out", 256);
        let group = raw.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: out.as_entire_binding(),
            }],
        });
        let mut spinner = Spinner {
            raw,
            pipe,
            group,
            workgroups: 1,
        };
        spinner.wait(&spinner.submit(1)); // lavapipe compiles the pipeline on its first dispatch
        let probe = 16;
        // The fastest of three: a probe slowed by a busy machine would make the spin short.
        let took = (0..3)
            .map(|_| {
                let start = Instant::now();
                spinner.wait(&spinner.submit(probe));
                start.elapsed()
            })
            .min()
            .unwrap_or(SPIN_TARGET)
            .max(Duration::from_micros(100));
        let scale = SPIN_TARGET.as_secs_f64() / took.as_secs_f64();
        spinner.workgroups = (f64::from(probe) * scale).clamp(1.0, 65_535.0) as u32;
        println!(
            "spin calibration: {probe} workgroups took {took:?}; using {}",
            spinner.workgroups
        );
        spinner
    }

    fn submit(&self, workgroups: u32) -> wgpu::SubmissionIndex {
        let mut enc = self.raw.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipe);
            pass.set_bind_group(0, &self.group, &[]);
            pass.dispatch_workgroups(workgroups, 1, 1);
        }
        self.raw.queue.submit([enc.finish()])
    }

    fn wait(&self, index: &wgpu::SubmissionIndex) {
        self.raw
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index.clone()),
                timeout: Some(DEADLINE),
            })
            .unwrap();
    }
}

/// The spin probes time the device: one at a time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Pitfall 2, lavapipe only: `queue.submit` returns only once the previous submission's work
/// has run (so the default of one submission in flight on CPU adapters loses nothing).
#[test]
fn lavapipe_submit_waits_for_the_previous_submission() {
    let _one = one_at_a_time();
    let spinner = Spinner::new();
    let raw = &spinner.raw;
    if raw.info.device_type != wgpu::DeviceType::Cpu {
        let why = format!(
            "{}: not a CPU adapter; this is lavapipe's behaviour",
            raw.info.name
        );
        skip("lavapipe_submit_waits_for_the_previous_submission", &why);
        return;
    }
    let small = storage_buffer(&raw.device, "small", 256);
    let spin = spinner.submit(spinner.workgroups);
    assert!(
        !is_done(raw, &spin),
        "the spin ended before the next submit; lengthen it"
    );
    let mut enc = raw.device.create_command_encoder(&Default::default());
    enc.clear_buffer(&small, 0, None);
    let next = raw.queue.submit([enc.finish()]);
    // The driver signals the spin's fence a moment after its work ends, so the check allows a
    // short wait; had the submit not waited, the spin would have most of its run still ahead.
    let finished = raw.device.poll(wgpu::PollType::Wait {
        submission_index: Some(spin),
        timeout: Some(FENCE_GRACE),
    });
    assert!(
        finished.is_ok(),
        "queue.submit returned while the previous submission had more than {FENCE_GRACE:?} \
         left to run ({finished:?})"
    );
    spinner.wait(&next);
}

/// Pitfall 4: while one thread waits in `device.poll(Wait)`, `Buffer::destroy` on another thread
/// blocks until that wait returns (hence waits in slices, and `drop` rather than `destroy`).
#[test]
fn poll_wait_on_one_thread_blocks_buffer_destroy_on_another() {
    let _one = one_at_a_time();
    let spinner = Spinner::new();
    let raw = &spinner.raw;
    let victim = storage_buffer(&raw.device, "destroyed while another thread waits", 256);
    let spin = spinner.submit(spinner.workgroups);
    let (entering, entered) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            entering.send(()).unwrap();
            spinner.wait(&spin);
        });
        entered.recv().unwrap();
        std::thread::sleep(Duration::from_millis(100)); // let it get into the poll
        assert!(!is_done(raw, &spin), "the spin ended too soon; lengthen it");
        victim.destroy();
        assert!(
            is_done(raw, &spin),
            "Buffer::destroy returned while another thread was still in poll(Wait)"
        );
    });
}
