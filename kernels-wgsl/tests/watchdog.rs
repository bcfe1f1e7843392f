//! Deadlines on every wait wgpu would let block: a fence wait, a submit behind running work
//! (lavapipe's `vkQueueSubmit` waits for the previous submission), and dropping the device
//! (`Queue::drop` waits for idle). A spin kernel, calibrated to run about [`SPIN_TARGET`] on the
//! adapter at hand, keeps the GPU busy; each test waits its spin out (or, for the drop, sleeps it
//! out) so the next one starts on an idle GPU.
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use plimsoll_kernels_wgsl::{Category, DeviceBuffer, Dispatch, Error, Gpu, Kernel};

use plimsoll_kernels_wgsl::testing::{DEADLINE, fresh_gpu, scratch};

/// How long one calibrated spin dispatch runs: a real margin over the tiny deadlines below.
const SPIN_TARGET: Duration = Duration::from_secs(2);
/// Deadline given to the calls that must time out.
const TINY: Duration = Duration::from_millis(5);
/// A timed-out call must return within this (the deadline plus one poll slice and overhead),
/// far below [`SPIN_TARGET`].
const PROMPT: Duration = Duration::from_millis(400);
/// Most iterations of the spin loop. llvmpipe stops loops after about 65 535 iterations
/// (measured: larger counts, even split over nested loops, gave the same result and time), so
/// past this the spin scales its workgroups instead.
const MAX_ITERATIONS: u32 = 60_000;

/// Each iteration runs 64 rounds of an integer hash, so few iterations make a long dispatch (with
/// one cheap step per iteration, llvmpipe's loop cap held the old spin to about 80 ms whatever
/// its count). `out` is bound whole; `offset` is its place in it.
const SPIN: Kernel = Kernel::standalone(
    "spin_test",
    r"
struct Params { seed: u32, iterations: u32, offset: u32, _pad: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
fn mix(h: u32, k: u32) -> u32 { return (h ^ (h >> 15u)) * 0x2c1b3c6du + k; }
fn mix4(h: u32, k: u32) -> u32 { return mix(mix(mix(mix(h, k), k), k), k); }
fn mix16(h: u32, k: u32) -> u32 { return mix4(mix4(mix4(mix4(h, k), k), k), k); }
@compute @workgroup_size(64)
fn spin(@builtin(global_invocation_id) gid: vec3<u32>) {
    var h = params.seed ^ gid.x;
    for (var k = 0u; k < params.iterations; k++) {
        h = mix16(h, k); h = mix16(h, k); h = mix16(h, k); h = mix16(h, k);
    }
    out[params.offset + gid.x % 64u] = h;
}",
    "spin",
    1,
    64,
);

/// A calibrated spin: `iterations` per invocation over `workgroups` workgroups of 64.
#[derive(Debug, Clone, Copy)]
struct Spin {
    iterations: u32,
    workgroups: u32,
}

/// The tests time the GPU: one at a time, so they do not slow each other down.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn spin(gpu: &Gpu, out: &DeviceBuffer, size: Spin) {
    let out = out.whole();
    let params = [1u32, size.iterations, out.index(), 0];
    gpu.dispatch(Dispatch {
        kernel: &SPIN,
        overrides: &[],
        params: bytemuck::cast_slice(&params),
        buffers: &[out],
        also_uses: &[],
        workgroups: [size.workgroups, 1, 1],
        work: Default::default(),
    })
    .unwrap();
}

const WARM_UP: Spin = Spin {
    iterations: 1,
    workgroups: 1,
};

/// A GPU, a spin output buffer, and the spin size that runs about [`SPIN_TARGET`] on this
/// adapter (measured once per test binary: time a short spin, scale the iterations, then the
/// workgroups, linearly).
fn spinner() -> (Gpu, DeviceBuffer, Spin) {
    static CALIBRATED: OnceLock<Spin> = OnceLock::new();
    let gpu = fresh_gpu();
    let out = scratch(&gpu, 64, "spin out");
    // Compile this device's pipeline (lavapipe JITs on the first dispatch) before timing.
    spin(&gpu, &out, WARM_UP);
    gpu.synchronize(DEADLINE).unwrap();
    let size = *CALIBRATED.get_or_init(|| {
        let probe = Spin {
            iterations: 2_000,
            workgroups: 16,
        };
        // The fastest of three: a probe slowed by a busy machine would make the spin short.
        let took = (0..3)
            .map(|_| {
                spin(&gpu, &out, probe);
                let start = Instant::now();
                gpu.synchronize(DEADLINE).unwrap();
                start.elapsed()
            })
            .min()
            .unwrap_or(SPIN_TARGET)
            .max(Duration::from_micros(100));
        let scale = SPIN_TARGET.as_secs_f64() / took.as_secs_f64();
        let wanted = f64::from(probe.iterations) * scale;
        let iterations = wanted.clamp(1.0, f64::from(MAX_ITERATIONS));
        let workgroups = f64::from(probe.workgroups) * wanted / iterations;
        let size = Spin {
            iterations: iterations as u32,
            workgroups: workgroups.clamp(1.0, 65_535.0) as u32,
        };
        println!("calibration: {probe:?} took {took:?}; using {size:?}");
        size
    });
    (gpu, out, size)
}

/// Submits a calibrated spin, then fills the remaining in-flight slots with tiny batches, so the
/// next submit has to wait for the spin.
fn occupy(gpu: &Gpu, out: &DeviceBuffer, size: Spin) -> plimsoll_kernels_wgsl::Fence {
    spin(gpu, out, size);
    let long = gpu.flush("long spin").unwrap();
    for _ in 1..gpu.max_submissions_in_flight() {
        spin(gpu, out, WARM_UP);
        gpu.flush("queued behind the spin").unwrap();
    }
    long
}

#[track_caller]
fn assert_timeout_names(err: &Error, long: &plimsoll_kernels_wgsl::Fence, deadline: Duration) {
    match err {
        Error::Timeout {
            label,
            serial,
            deadline_ms,
            recent,
        } => {
            assert!(label.contains("long spin"), "{err}");
            assert_eq!(*serial, long.serial(), "{err}");
            assert_eq!(*deadline_ms, deadline.as_millis() as u64, "{err}");
            assert!(
                recent
                    .0
                    .iter()
                    .any(|r| r.serial == long.serial() && !r.done),
                "the ring shows the spin running:\n{recent}"
            );
        }
        other => panic!("expected Timeout, got {other}"),
    }
}

#[test]
fn long_dispatch_with_tiny_deadline_times_out_and_names_it() {
    let _one = one_at_a_time();
    let (gpu, out, size) = spinner();
    spin(&gpu, &out, size);
    let fence = gpu.flush("long spin").unwrap();
    let submitted = Instant::now();
    let start = Instant::now();
    let err = gpu.wait(&fence, TINY).unwrap_err();
    let timed_out_after = start.elapsed();
    assert_timeout_names(&err, &fence, TINY);
    println!("{err}");
    gpu.wait(&fence, DEADLINE).unwrap();
    let spin_ran = submitted.elapsed();
    println!("wait timed out after {timed_out_after:?}; the spin ran {spin_ran:?}");
    assert!(timed_out_after < PROMPT, "{timed_out_after:?}");
    assert!(
        timed_out_after * 4 < spin_ran,
        "{timed_out_after:?} vs {spin_ran:?}"
    );
    assert!(gpu.is_done(&fence).unwrap());
}

/// The submit itself is under the deadline: behind a running spin, `flush_within`, `flush` (with
/// the default deadline) and a read-back all return `Timeout` naming the spin, promptly, instead
/// of blocking in the driver; the batch stays open and goes out once the spin is done.
#[test]
fn flush_behind_a_long_dispatch_times_out_at_its_deadline() {
    let _one = one_at_a_time();
    let (gpu, out, size) = spinner();
    let small = gpu.alloc_elements(4, Category::Temporary, "small").unwrap();
    let long = occupy(&gpu, &out, size);
    let submitted = Instant::now();

    plimsoll_kernels_wgsl::kernels::fill::fill(&gpu, small.whole(), 7.0).unwrap();
    let start = Instant::now();
    let err = gpu.flush_within("after the spin", TINY).unwrap_err();
    let flush_within_took = start.elapsed();
    assert_timeout_names(&err, &long, TINY);
    println!("{err}");

    gpu.set_default_deadline(TINY);
    let start = Instant::now();
    let err = gpu.flush("after the spin").unwrap_err();
    let flush_took = start.elapsed();
    assert_timeout_names(&err, &long, TINY);
    gpu.set_default_deadline(DEADLINE);

    let start = Instant::now();
    let err = gpu.read_all::<f32>(&small, TINY).unwrap_err();
    let read_took = start.elapsed();
    assert_timeout_names(&err, &long, TINY);

    gpu.wait(&long, DEADLINE).unwrap();
    let spin_ran = submitted.elapsed();
    println!(
        "timed out after: flush_within {flush_within_took:?}, flush {flush_took:?}, \
         read {read_took:?}; the spin ran {spin_ran:?}"
    );
    for took in [flush_within_took, flush_took, read_took] {
        assert!(took < PROMPT, "{took:?}");
        assert!(took * 4 < spin_ran, "{took:?} vs {spin_ran:?}");
    }
    // The batch that could not go out was kept: the fill runs now.
    assert_eq!(gpu.read_all::<f32>(&small, DEADLINE).unwrap(), vec![7.0; 4]);
}

/// Dropping the last `Gpu` while a spin runs returns after the drop deadline (leaking the device
/// with a warning on stderr) instead of waiting for the spin.
#[test]
fn dropping_the_gpu_during_a_long_dispatch_leaks_instead_of_blocking() {
    let _one = one_at_a_time();
    let (gpu, out, size) = spinner();
    gpu.set_drop_deadline(Duration::from_millis(50));
    spin(&gpu, &out, size);
    gpu.flush("long spin").unwrap();
    let submitted = Instant::now();
    let leaked = Gpu::leaked_devices();
    let start = Instant::now();
    drop(out);
    drop(gpu);
    let drop_took = start.elapsed();
    println!("drop returned after {drop_took:?} (the spin runs about {SPIN_TARGET:?})");
    assert!(drop_took < PROMPT, "{drop_took:?}");
    assert_eq!(
        Gpu::leaked_devices(),
        leaked + 1,
        "the busy device was leaked"
    );
    // Let the leaked spin finish before the next test times anything.
    std::thread::sleep(SPIN_TARGET.saturating_sub(submitted.elapsed()));
}

/// The other half: with no work in flight, dropping waits for nothing and leaks nothing.
#[test]
fn dropping_an_idle_gpu_returns_at_once() {
    let _one = one_at_a_time();
    let (gpu, out, _) = spinner();
    gpu.set_drop_deadline(Duration::from_millis(50));
    let leaked = Gpu::leaked_devices();
    let start = Instant::now();
    drop(out);
    drop(gpu);
    let drop_took = start.elapsed();
    println!("idle drop took {drop_took:?}");
    assert!(drop_took < PROMPT, "{drop_took:?}");
    assert_eq!(
        Gpu::leaked_devices(),
        leaked,
        "an idle device is released, not leaked"
    );
}
