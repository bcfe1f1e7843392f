//! The device, memory, fences and ordering, beyond single kernels. Deadlines on long-running work
//! (waits, submits, drop) are in `watchdog.rs`.
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plimsoll_allocator::OomCause;
use plimsoll_kernels_wgsl::{Category, Dispatch, Error, GpuOptions, Kernel, kernels};

use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, assert_exact, fresh_gpu, gpu_with, scratch};

#[test]
fn adapter_info_and_limits_are_exposed() {
    let gpu = fresh_gpu();
    let info = gpu.adapter();
    assert!(!info.name.is_empty());
    assert!(gpu.limits().max_storage_buffer_binding_size > 0);
    assert!(gpu.max_buffer_bytes() <= gpu.limits().max_storage_buffer_binding_size);
    assert!(gpu.memory_budget_bytes() > 0);
    println!("{info}, budget {} MiB", gpu.memory_budget_bytes() >> 20);
}

#[test]
fn unknown_adapter_is_a_no_adapter_error_with_the_install_hint() {
    let err = plimsoll_kernels_wgsl::Gpu::with_options(GpuOptions {
        adapter: Some("no-such-adapter-xyz".into()),
        ..GpuOptions::default()
    })
    .unwrap_err();
    assert!(matches!(err, Error::NoAdapter { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("apt-get install mesa-vulkan-drivers libvulkan1"),
        "{err}"
    );
}

#[test]
fn budget_too_small_is_out_of_memory_and_earlier_data_survives() {
    let gpu = gpu_with(GpuOptions {
        memory_budget_bytes: Some(4 << 20),
        ..GpuOptions::from_env()
    });
    let mut rng = Rng::new(5);
    let data = rng.vec_f32(100_000, -1.0, 1.0);
    let kept = gpu
        .upload(&data, Category::Parameter, "kept weights")
        .unwrap();
    let err = gpu
        .alloc(16 << 20, Category::Activation, "too big for budget")
        .unwrap_err();
    match &err {
        Error::OutOfMemory(report) => assert!(report.to_string().contains("too big for budget")),
        other => panic!("expected OutOfMemory, got {other}"),
    }
    let got: Vec<f32> = gpu.read_all(&kept, DEADLINE).unwrap();
    assert_exact("kept after OOM", &got, &data);
}

/// A segment the device refuses (here: wgpu's own validation refusal, driven by the simulated
/// device-memory cap, through the same error scopes a real OOM takes) is `OutOfMemory` with cause
/// `SourceFailed` and wgpu's message; earlier data survives and the device stays usable.
#[test]
fn segment_refused_by_wgpu_is_out_of_memory_and_the_device_stays_usable() {
    let gpu = fresh_gpu();
    let mut rng = Rng::new(11);
    let data = rng.vec_f32(100_000, -1.0, 1.0);
    let kept = gpu
        .upload(&data, Category::Parameter, "kept weights")
        .unwrap();
    gpu.synchronize(DEADLINE).unwrap();
    let reserved = gpu.with_allocator(|a| a.stats().reserved_bytes);
    gpu.set_device_memory_cap(Some(reserved));
    let err = gpu
        .alloc(8 << 20, Category::Activation, "refused by the device")
        .unwrap_err();
    let Error::OutOfMemory(report) = &err else {
        panic!("expected OutOfMemory, got {err}");
    };
    let OomCause::SourceFailed { message } = &report.cause else {
        panic!("expected SourceFailed, got {:?}", report.cause);
    };
    // wgpu's own words, caught by the Validation scope in `create_segment`.
    assert!(message.contains("maximum buffer size"), "{message}");
    assert!(message.contains("simulated device memory cap"), "{message}");
    assert!(err.to_string().contains("refused by the device"), "{err}");
    assert!(
        err.to_string().contains("device refused a new segment"),
        "{err}"
    );
    assert!(
        gpu.take_uncaptured_errors().is_empty(),
        "the error was caught by a scope"
    );
    let got: Vec<f32> = gpu.read_all(&kept, DEADLINE).unwrap();
    assert_exact("kept after a refused segment", &got, &data);
    // Small requests still fit the segments the device already gave us.
    let small = gpu
        .upload(&[3.0f32; 64], Category::Temporary, "small after OOM")
        .unwrap();
    assert_eq!(
        gpu.read_all::<f32>(&small, DEADLINE).unwrap(),
        vec![3.0; 64]
    );
    // And once the device has room again, so do large ones.
    gpu.set_device_memory_cap(None);
    let large = gpu
        .upload(&vec![4.0f32; 2 << 20], Category::Activation, "large")
        .unwrap();
    assert_eq!(
        gpu.read::<f32>(&large, (2 << 20) - 1, 1, DEADLINE).unwrap(),
        vec![4.0f32]
    );
}

#[test]
fn bad_requests_are_typed_errors() {
    let gpu = fresh_gpu();
    assert!(matches!(
        gpu.alloc(0, Category::Temporary, "zero"),
        Err(Error::Allocation(_))
    ));
    assert!(matches!(
        gpu.alloc(6, Category::Temporary, "odd"),
        Err(Error::Misaligned { .. })
    ));
    let over = gpu.max_buffer_bytes() + 4;
    let err = gpu.alloc(over, Category::Activation, "huge").unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    let buf = gpu.alloc(64, Category::Temporary, "small").unwrap();
    // Write past the end: 8 elements from element 10 are bytes 40..72 of 64.
    let err = gpu.write(&buf, 10, &[1.0f32; 8]).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("bytes 40..72"),
        "{err}"
    );
    let err = gpu.read_bytes(&buf, 2, 4, DEADLINE).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Misaligned {
                what: "offset_bytes",
                value: 2,
                required: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_shader_is_a_validation_error_not_a_panic() {
    let gpu = fresh_gpu();
    const BAD: Kernel = Kernel::standalone(
        "bad_shader_test",
        "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }",
        "main",
        0,
        1,
    );
    let err = gpu
        .dispatch(Dispatch {
            kernel: &BAD,
            overrides: &[],
            params: &[],
            buffers: &[],
            also_uses: &[],
            workgroups: [1, 1, 1],
            work: Default::default(),
        })
        .unwrap_err();
    assert!(matches!(err, Error::Validation { .. }), "{err}");
    // The device is still usable.
    let buf = gpu
        .upload(&[1.0f32, 2.0], Category::Temporary, "after")
        .unwrap();
    assert_eq!(gpu.read_all::<f32>(&buf, DEADLINE).unwrap(), vec![1.0, 2.0]);
}

#[test]
fn dispatches_are_batched_into_one_submission() {
    let gpu = fresh_gpu();
    let buf = scratch(&gpu, 1000, "batched");
    for k in 0..10 {
        kernels::fill::fill(&gpu, buf.slice(k * 100, 100).unwrap(), k as f32).unwrap();
    }
    let fence = gpu.flush("ten fills").unwrap();
    gpu.wait(&fence, DEADLINE).unwrap();
    let recent = gpu.recent_submissions();
    let last = recent.0.last().unwrap();
    assert_eq!((last.dispatches, last.done), (10, true), "{recent}");
    let got: Vec<f32> = gpu.read_all(&buf, DEADLINE).unwrap();
    let want: Vec<f32> = (0..1000).map(|i| (i / 100) as f32).collect();
    assert_exact("batched fills", &got, &want);
}

/// `Gpu::atomically`: work recorded in a section that fails never runs, even past the
/// automatic-submission threshold; a section that succeeds runs all of it. The fills start
/// after earlier recorded work, which the section submits first and which does run.
#[test]
fn a_failed_atomic_section_runs_none_of_its_work() {
    use plimsoll_kernels_wgsl::recorder::AUTO_FLUSH_DISPATCHES;
    let gpu = fresh_gpu();
    let buf = scratch(&gpu, 100, "atomic");
    kernels::fill::fill(&gpu, buf.slice(0, 100).unwrap(), 7.0).unwrap();
    let fills = u64::from(AUTO_FLUSH_DISPATCHES) + 5;
    let failed: Result<(), Error> = gpu.atomically("failing section", || {
        for k in 0..fills {
            kernels::fill::fill(&gpu, buf.slice(k % 100, 1).unwrap(), k as f32)?;
        }
        Err(Error::InvalidArgument {
            op: "test",
            message: "the section fails after recording".to_string(),
        })
    });
    let err = failed.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { message, .. } if message.contains("after recording")),
        "{err}"
    );
    let got: Vec<f32> = gpu.read_all(&buf, DEADLINE).unwrap();
    assert_eq!(got, vec![7.0; 100], "the failed section's fills ran");

    gpu.atomically("section", || {
        kernels::fill::fill(&gpu, buf.slice(0, 50).unwrap(), 1.0)?;
        kernels::fill::fill(&gpu, buf.slice(50, 50).unwrap(), 2.0)
    })
    .unwrap();
    let got: Vec<f32> = gpu.read_all(&buf, DEADLINE).unwrap();
    let want: Vec<f32> = (0..100).map(|i| if i < 50 { 1.0 } else { 2.0 }).collect();
    assert_eq!(got, want);
}

/// The `write_buffer` hazard (docs/wgpu.md §4), first shown on raw wgpu: a write issued after a
/// recorded-but-unsubmitted read overtakes it.
#[test]
fn naive_write_buffer_overtakes_recorded_work() {
    let gpu = fresh_gpu();
    let (device, queue) = (gpu.device(), gpu.queue());
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let make = |label| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: 16,
            usage,
            mapped_at_creation: false,
        })
    };
    let (region, seen) = (make("region"), make("seen"));
    queue.write_buffer(&region, 0, bytemuck::cast_slice(&[1.0f32; 4]));
    queue.submit([]);
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(&region, 0, &seen, 0, 16); // the read of "A"
    queue.write_buffer(&region, 0, bytemuck::cast_slice(&[2.0f32; 4])); // the upload of "B"
    queue.submit([enc.finish()]);
    // Read `seen` back through a staging buffer.
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(&seen, 0, &staging, 0, 16);
    enc.map_buffer_on_submit(&staging, wgpu::MapMode::Read, .., |r| r.unwrap());
    queue.submit([enc.finish()]);
    device
        .poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: Some(DEADLINE),
        })
        .unwrap();
    let v: Vec<f32> = bytemuck::pod_collect_to_vec(&staging.slice(..).get_mapped_range().unwrap());
    assert_eq!(
        v,
        vec![2.0; 4],
        "the naive design reads B's data where A's was recorded"
    );
}

/// Plimsoll's design, the same sequence through the allocator: record a read of block A, free A,
/// allocate B and upload into it. B gets A's bytes at once (freed blocks are reused while the batch
/// is open), but they carry the open batch's serial, so the upload into B submits the batch first:
/// the recorded read sees A's data and B holds its own.
#[test]
fn freed_block_is_reused_at_once_and_an_upload_into_it_submits_first() {
    let gpu = fresh_gpu();
    let a = gpu.upload(&[1.0f32; 64], Category::Temporary, "A").unwrap();
    let seen = gpu.alloc_elements(64, Category::Temporary, "seen").unwrap();
    gpu.synchronize(DEADLINE).unwrap();
    kernels::copy::copy(&gpu, seen.whole(), a.whole()).unwrap(); // the read of A: recorded only
    let a_place = a.placement();
    drop(a);
    let b = gpu.upload(&[2.0f32; 64], Category::Temporary, "B").unwrap();
    assert_eq!(b.placement(), a_place, "B gets A's bytes at once");
    let got: Vec<f32> = gpu.read_all(&seen, DEADLINE).unwrap();
    assert_eq!(got, vec![1.0; 64], "the recorded read saw A's data");
    assert_eq!(gpu.read_all::<f32>(&b, DEADLINE).unwrap(), vec![2.0; 64]);
    // Once that batch is submitted, the bytes' tag is stale: an upload needs no submit.
    drop(b);
    let c = gpu.upload(&[3.0f32; 64], Category::Temporary, "C").unwrap();
    assert_eq!(c.placement(), a_place);
    assert_eq!(gpu.read_all::<f32>(&c, DEADLINE).unwrap(), vec![3.0; 64]);
}

/// GPU work recorded later in the same batch reuses a freed block (same bytes) and sees the right
/// data: fill A, copy A to `seen_a`, free A; allocate B (A's bytes), fill it with other values,
/// copy B to `seen_b`, all in one open batch. wgpu orders the dispatches, so `seen_a` holds A's
/// values and `seen_b` B's, and the batch was never submitted in between.
#[test]
fn block_freed_and_reallocated_within_one_batch_is_reused_with_correct_data() {
    let gpu = fresh_gpu();
    let seen_a = scratch(&gpu, 256, "seen A");
    let seen_b = scratch(&gpu, 256, "seen B");
    gpu.synchronize(DEADLINE).unwrap();
    let a = gpu.alloc_elements(256, Category::Temporary, "A").unwrap();
    kernels::fill::fill(&gpu, a.whole(), 1.5).unwrap();
    kernels::copy::copy(&gpu, seen_a.whole(), a.whole()).unwrap();
    let a_place = a.placement();
    let reserved = gpu.with_allocator(|m| m.stats().reserved_bytes);
    drop(a);
    let b = gpu.alloc_elements(256, Category::Temporary, "B").unwrap();
    assert_eq!(
        b.placement(),
        a_place,
        "B reuses A's bytes within the batch"
    );
    kernels::fill::fill(&gpu, b.whole(), -2.5).unwrap();
    kernels::copy::copy(&gpu, seen_b.whole(), b.whole()).unwrap();
    assert_eq!(gpu.with_allocator(|m| m.stats().reserved_bytes), reserved);
    assert_eq!(
        gpu.read_all::<f32>(&seen_a, DEADLINE).unwrap(),
        vec![1.5; 256]
    );
    assert_eq!(
        gpu.read_all::<f32>(&seen_b, DEADLINE).unwrap(),
        vec![-2.5; 256]
    );
    assert_eq!(gpu.read_all::<f32>(&b, DEADLINE).unwrap(), vec![-2.5; 256]);
}

#[test]
fn upload_into_a_buffer_the_open_batch_reads_submits_first() {
    let gpu = fresh_gpu();
    let a = gpu.upload(&[1.0f32; 64], Category::Temporary, "A").unwrap();
    let seen = gpu.alloc_elements(64, Category::Temporary, "seen").unwrap();
    kernels::copy::copy(&gpu, seen.whole(), a.whole()).unwrap();
    gpu.write(&a, 0, &[2.0f32; 64]).unwrap();
    assert_eq!(gpu.read_all::<f32>(&seen, DEADLINE).unwrap(), vec![1.0; 64]);
    assert_eq!(gpu.read_all::<f32>(&a, DEADLINE).unwrap(), vec![2.0; 64]);
}

#[test]
fn after_device_loss_every_call_is_device_lost() {
    let gpu = fresh_gpu();
    let buf = scratch(&gpu, 16, "before loss");
    gpu.synchronize(DEADLINE).unwrap();
    gpu.destroy();
    assert!(matches!(
        gpu.alloc(64, Category::Temporary, "x"),
        Err(Error::DeviceLost { .. })
    ));
    assert!(matches!(
        kernels::fill::fill(&gpu, buf.whole(), 1.0),
        Err(Error::DeviceLost { .. })
    ));
    assert!(matches!(
        gpu.flush("after loss"),
        Err(Error::DeviceLost { .. })
    ));
    assert!(matches!(
        gpu.read_all::<f32>(&buf, DEADLINE),
        Err(Error::DeviceLost { .. })
    ));
}

/// `compile_kernels` builds every pipeline a launcher can ask for: afterwards, launches of the
/// override-specialised kernels (a transposed matmul, unary and binary ops) build nothing new.
#[test]
fn compiled_kernels_cover_what_the_launchers_ask_for() {
    use plimsoll_kernels_wgsl::kernels::matmul::{MatmulDims, matmul};
    use plimsoll_kernels_wgsl::kernels::unary::{UnaryOp, forward};
    let gpu = fresh_gpu();
    let built = gpu.compile_kernels().unwrap();
    assert_eq!(gpu.compiled_pipelines(), built);
    assert!(
        built >= kernels::ALL.len(),
        "{built} pipelines for {} kernels",
        kernels::ALL.len()
    );
    // Both entry points: 8^3 takes main_scalar, 128^3 main (at least MAIN_MIN_FLOPS with batch 4).
    let elements = 3 * 4 * 128 * 128;
    let buf = scratch(&gpu, elements, "operands");
    for size in [8, 128] {
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let per_batch = size * size;
            let dims = MatmulDims {
                trans_a,
                trans_b,
                ..MatmulDims::dense(4, size, size, size)
            };
            let [c, a, b] = [0, 1, 2].map(|i| {
                buf.slice((i * 4 * per_batch) as u64, (4 * per_batch) as u64)
                    .unwrap()
            });
            matmul(&gpu, &dims, c, a, b).unwrap();
        }
    }
    for op in UnaryOp::ALL {
        forward(
            &gpu,
            op,
            buf.slice(0, 64).unwrap(),
            buf.slice(64, 64).unwrap(),
            2.0,
        )
        .unwrap();
    }
    gpu.wait(&gpu.flush("launches").unwrap(), DEADLINE).unwrap();
    assert_eq!(
        gpu.compiled_pipelines(),
        built,
        "a launch built a pipeline compile_kernels missed"
    );
}

/// Fault injection fails the armed event the way the real failure looks, once, and counts
/// events: the second allocation is a budget out-of-memory, a read-back a timeout, the second
/// host allocation a refusal of host memory, the second upload a refused write that writes
/// nothing, a submission with `LoseDevice` a lost device from then on.
#[cfg(all(feature = "fault-injection", debug_assertions))]
#[test]
fn injected_faults_fire_once_at_the_armed_event() {
    use plimsoll_kernels_wgsl::fault::{FaultAction, FaultPoint};
    let gpu = fresh_gpu();
    gpu.reset_fault_counts();
    gpu.arm_fault(FaultPoint::Allocation, 1, FaultAction::Fail);
    let first = gpu
        .upload(&[1.0f32; 4], Category::Temporary, "first")
        .unwrap();
    let err = gpu
        .upload(&[2.0f32; 4], Category::Temporary, "second")
        .unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)), "{err}");
    let third = gpu
        .upload(&[3.0f32; 4], Category::Temporary, "third")
        .unwrap();
    assert_eq!(gpu.fault_counts()[FaultPoint::Allocation.index()], 3);
    assert!(!gpu.disarm_fault(), "the fault fired and disarmed itself");

    gpu.reset_fault_counts();
    gpu.arm_fault(FaultPoint::ReadBack, 0, FaultAction::Fail);
    let err = gpu.read_all::<f32>(&first, DEADLINE).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert_eq!(gpu.read_all::<f32>(&third, DEADLINE).unwrap(), vec![3.0; 4]);

    gpu.reset_fault_counts();
    gpu.arm_fault(FaultPoint::HostAllocation, 1, FaultAction::Fail);
    gpu.host_allocation("one", 8).unwrap();
    let err = gpu.host_allocation("two", 16).unwrap_err();
    assert!(
        matches!(&err, Error::HostMemory { what, bytes: 16 } if what == "two"),
        "{err}"
    );
    gpu.host_allocation("three", 8).unwrap();
    assert_eq!(gpu.fault_counts()[FaultPoint::HostAllocation.index()], 3);

    // The second upload is refused and writes nothing; the third goes through.
    gpu.reset_fault_counts();
    gpu.arm_fault(FaultPoint::Upload, 1, FaultAction::Fail);
    gpu.write(&first, 0, &[6.0f32; 2]).unwrap();
    let err = gpu.write(&first, 2, &[7.0f32; 2]).unwrap_err();
    assert!(matches!(err, Error::Validation { .. }), "{err}");
    assert_eq!(
        gpu.read_all::<f32>(&first, DEADLINE).unwrap(),
        vec![6.0, 6.0, 1.0, 1.0]
    );
    gpu.write(&first, 0, &[1.0f32; 4]).unwrap();
    assert_eq!(gpu.fault_counts()[FaultPoint::Upload.index()], 3);

    gpu.reset_fault_counts();
    gpu.arm_fault(FaultPoint::Submission, 0, FaultAction::LoseDevice);
    kernels::fill::fill(&gpu, first.slice(0, 4).unwrap(), 5.0).unwrap();
    let err = gpu.flush("lost").unwrap_err();
    assert!(matches!(err, Error::DeviceLost { .. }), "{err}");
    let err = gpu.check_alive().unwrap_err();
    assert!(matches!(err, Error::DeviceLost { .. }), "{err}");

    // The loss was injected, so it can be cleared: the device works again, without the lost
    // batch (its fill of 5.0 never runs). A real loss is never cleared.
    assert!(gpu.revive_after_injected_loss());
    gpu.check_alive().unwrap();
    assert_eq!(gpu.read_all::<f32>(&first, DEADLINE).unwrap(), vec![1.0; 4]);
    assert!(!gpu.revive_after_injected_loss(), "nothing to clear");
    gpu.destroy();
    assert!(!gpu.revive_after_injected_loss(), "a real loss stays");
    let lost = gpu.check_alive().expect_err("destroyed");
    assert!(matches!(lost, Error::DeviceLost { .. }), "{lost}");
}

/// The same hazard under planned steps: a step that records a read of A, frees A, then uploads
/// into B, repeated until the allocator replays a plan in which B takes A's planned bytes. The
/// replayed B carries the open batch's serial like any reused block, so its upload submits
/// first: each step's recorded read sees that step's A.
#[test]
fn a_replayed_offset_keeps_the_upload_ordering_rule() {
    use plimsoll_allocator::StepOutcome;
    let gpu = fresh_gpu();
    gpu.with_allocator(|m| m.set_step_planning(true));
    let seen = gpu.alloc_elements(64, Category::Temporary, "seen").unwrap();
    let mut outcomes = Vec::new();
    for step in 1..=5 {
        let value = step as f32;
        gpu.synchronize(DEADLINE).unwrap();
        gpu.with_allocator(|m| m.begin_step());
        let a = gpu.upload(&[value; 64], Category::Temporary, "A").unwrap();
        kernels::copy::copy(&gpu, seen.whole(), a.whole()).unwrap(); // recorded only
        let a_place = a.placement();
        drop(a);
        let b = gpu.upload(&[-value; 64], Category::Temporary, "B").unwrap();
        let same_bytes = b.placement() == a_place;
        let got: Vec<f32> = gpu.read_all(&seen, DEADLINE).unwrap();
        assert_eq!(
            got,
            vec![value; 64],
            "step {step}: the recorded read saw A's data"
        );
        assert_eq!(gpu.read_all::<f32>(&b, DEADLINE).unwrap(), vec![-value; 64]);
        drop(b);
        let outcome = gpu.with_allocator(|m| m.end_step());
        if matches!(outcome, StepOutcome::Replayed { .. }) {
            assert!(same_bytes, "step {step}: the plan gives B A's bytes");
        }
        outcomes.push(outcome);
    }
    assert!(
        matches!(outcomes[1], StepOutcome::Planned { .. }),
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes[4],
        StepOutcome::Replayed { fell_back: 0 },
        "{outcomes:?}"
    );
}

/// `compile_wanted` builds exactly the pipelines a planning twin's launches asked for, on
/// parallel threads; the same launches on the real device then build nothing new. With nothing
/// asked for it builds every kernel.
#[test]
fn compile_wanted_builds_what_the_twins_launches_asked_for() {
    use plimsoll_kernels_wgsl::kernels::unary::{UnaryOp, forward};
    let gpu = fresh_gpu();
    let launches = |g: &plimsoll_kernels_wgsl::Gpu| {
        let buf = scratch(g, 128, "operands");
        let (x, y) = (buf.slice(0, 64).unwrap(), buf.slice(64, 64).unwrap());
        forward(g, UnaryOp::Relu, y, x, 1.0).unwrap(); // 64 elements: forward_v4 only
        // 63 elements: forward_v4 for 60 and forward for the last 3.
        let (x63, y63) = (buf.slice(0, 63).unwrap(), buf.slice(64, 63).unwrap());
        forward(g, UnaryOp::Exp, y63, x63, 1.0).unwrap();
    };
    // A tensor on the real device before the warm-up: its dispatches (the twin's Params, whose
    // offsets point anywhere) must not write into it.
    let pattern: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let kept = gpu.upload(&pattern, Category::Parameter, "kept").unwrap();
    let twin = gpu.planning_twin(1 << 30);
    launches(&twin);
    drop(twin);
    assert_eq!(gpu.compiled_pipelines(), 0, "the twin built nothing");
    let compiled = gpu.compile_wanted(DEADLINE).unwrap();
    let after: Vec<f32> = gpu.read_all(&kept, DEADLINE).unwrap();
    assert_eq!(after, pattern, "the warm-up wrote into a tensor");
    assert!(compiled.threads >= 1);
    let built = gpu.compiled_pipelines();
    assert_eq!(built, compiled.built);
    assert!(
        (1..kernels::variants().len()).contains(&built),
        "{built} pipelines: only those asked for"
    );
    launches(&gpu);
    gpu.wait(&gpu.flush("launches").unwrap(), DEADLINE).unwrap();
    assert_eq!(gpu.compiled_pipelines(), built, "a launch built a pipeline");
    // Nothing asked for since: every kernel.
    let all = gpu.compile_wanted(DEADLINE).unwrap();
    assert_eq!(all.built, gpu.compiled_pipelines());
    assert!(all.built > built);
}

/// A read started (`Gpu::start_read_bytes`) before later work returns the values from before
/// it: the copy is submitted at once, so a kernel recorded afterwards and an upload into the
/// same buffer (and a block freed and taken again) cannot overtake it. An empty read and a
/// read dropped unwaited cost nothing more.
#[test]
fn a_started_read_returns_the_values_from_before_later_work() {
    let gpu = fresh_gpu();
    let first = gpu
        .upload(&[1.0f32; 256], Category::Temporary, "first")
        .unwrap();
    let pending = gpu.start_read_bytes(&first, 16, 64, DEADLINE).unwrap();
    kernels::fill::fill(&gpu, first.slice(0, 256).unwrap(), 5.0).unwrap();
    gpu.write(&first, 4, &[7.0f32; 4]).unwrap();
    // Freed and taken again at once (the same bytes), then written.
    drop(first);
    let again = gpu
        .upload(&[9.0f32; 256], Category::Temporary, "again")
        .unwrap();
    assert_eq!(pending.wait_as::<f32>(DEADLINE).unwrap(), vec![1.0; 16]);
    assert_eq!(
        gpu.read_all::<f32>(&again, DEADLINE).unwrap(),
        vec![9.0; 256]
    );
    let empty = gpu.start_read_bytes(&again, 0, 0, DEADLINE).unwrap();
    assert!(empty.wait(DEADLINE).unwrap().is_empty());
    drop(gpu.start_read_bytes(&again, 0, 1024, DEADLINE).unwrap());
    assert_eq!(
        gpu.read_all::<f32>(&again, DEADLINE).unwrap(),
        vec![9.0; 256]
    );
}

/// A batch goes out by itself every `Gpu::submit_every` dispatches: 1024 on a CPU adapter (one
/// submission runs at a time there), what `GpuOptions::submit_every` says where set. Ten fills
/// with a submission every 4 dispatches go out as 4, 4 and 2, with the same values.
#[test]
fn a_batch_is_submitted_every_so_many_dispatches() {
    use plimsoll_kernels_wgsl::GpuOptions;
    use plimsoll_kernels_wgsl::recorder::{AUTO_FLUSH_DISPATCHES, GPU_SUBMIT_EVERY};
    let default = fresh_gpu();
    let want = match default.is_cpu() {
        true => AUTO_FLUSH_DISPATCHES,
        false => GPU_SUBMIT_EVERY,
    };
    assert_eq!(default.submit_every(), want);
    drop(default);
    let gpu = plimsoll_kernels_wgsl::testing::gpu_with(GpuOptions {
        submit_every: Some(4),
        ..GpuOptions::from_env()
    });
    assert_eq!(gpu.submit_every(), 4);
    let buf = scratch(&gpu, 1000, "every four");
    let before = gpu.recent_submissions().0.len();
    for k in 0..10 {
        kernels::fill::fill(&gpu, buf.slice(k * 100, 100).unwrap(), k as f32).unwrap();
    }
    let fence = gpu.flush("the last two").unwrap();
    gpu.wait(&fence, DEADLINE).unwrap();
    let recent = gpu.recent_submissions();
    let counts: Vec<u32> = recent.0[before..].iter().map(|s| s.dispatches).collect();
    assert_eq!(counts, [4, 4, 2], "{recent}");
    let got: Vec<f32> = gpu.read_all(&buf, DEADLINE).unwrap();
    let want: Vec<f32> = (0..1000).map(|i| (i / 100) as f32).collect();
    assert_exact("fills in three submissions", &got, &want);
}

/// `Gpu::evict` and `Gpu::restore`: an evicted buffer's block is freed and its values are
/// in host memory, where reads and writes reach them; a kernel given it is `Error::Evicted`
/// and records nothing; restored, it holds the values again (the written ones included).
/// `Evict::Unchanged` keeps the restore's copy without reading, and freeing the block keeps
/// the ordering rule: an upload into its bytes waits for the recorded work that read it.
#[test]
fn an_evicted_buffer_lives_in_host_memory_until_it_is_restored() {
    use plimsoll_kernels_wgsl::Evict;
    let gpu = fresh_gpu();
    let p = gpu.alloc_elements(64, Category::Parameter, "p").unwrap();
    let seen = scratch(&gpu, 64, "seen");
    kernels::fill::fill(&gpu, p.whole(), 1.5).unwrap();
    gpu.synchronize(DEADLINE).unwrap();
    let allocated = || gpu.with_allocator(|m| m.stats().allocated_bytes);
    let before = allocated();
    gpu.evict(&[&p], Evict::ReadBack).unwrap();
    assert!(!p.is_resident());
    assert_eq!(allocated(), before - 256, "the block is freed");
    assert_eq!(p.host_bytes(), 256);
    assert_eq!(gpu.read_all::<f32>(&p, DEADLINE).unwrap(), vec![1.5; 64]);
    let err = kernels::copy::copy(&gpu, seen.whole(), p.whole()).unwrap_err();
    assert!(
        matches!(&err, Error::Evicted { label, .. } if label == "p"),
        "{err}"
    );
    gpu.write(&p, 8, &[7.0f32; 4]).unwrap();

    gpu.restore(&p).unwrap();
    assert!(p.is_resident());
    assert_eq!(allocated(), before);
    kernels::copy::copy(&gpu, seen.whole(), p.whole()).unwrap();
    let mut want = vec![1.5f32; 64];
    want[8..12].copy_from_slice(&[7.0; 4]);
    assert_exact(
        "restored",
        &gpu.read_all::<f32>(&seen, DEADLINE).unwrap(),
        &want,
    );

    // The copy reading p is recorded, not submitted; p leaves without a read (its copy from
    // the restore is kept) and another buffer takes its bytes at once.
    kernels::fill::fill(&gpu, seen.whole(), 0.0).unwrap();
    kernels::copy::copy(&gpu, seen.whole(), p.whole()).unwrap();
    let place = p.placement();
    gpu.evict(&[&p], Evict::Unchanged).unwrap();
    let q = gpu
        .upload(&[-3.0f32; 64], Category::Temporary, "q")
        .unwrap();
    assert_eq!(q.placement(), place, "q takes p's bytes");
    assert_exact(
        "recorded read",
        &gpu.read_all::<f32>(&seen, DEADLINE).unwrap(),
        &want,
    );
    assert_eq!(gpu.read_all::<f32>(&p, DEADLINE).unwrap(), want);
    // Restored elsewhere (q holds its old bytes), with the same values.
    gpu.restore(&p).unwrap();
    assert_eq!(gpu.read_all::<f32>(&p, DEADLINE).unwrap(), want);
    // A write while resident makes the kept copy stale: Unchanged then reads back.
    gpu.write(&p, 0, &[9.0f32; 2]).unwrap();
    assert_eq!(p.host_bytes(), 0);
    gpu.evict(&[&p], Evict::Unchanged).unwrap();
    want[..2].copy_from_slice(&[9.0; 2]);
    assert_eq!(gpu.read_all::<f32>(&p, DEADLINE).unwrap(), want);

    // Read back later: the block is free at once and work recorded into its bytes runs after
    // the copy; the values are waited for when read.
    gpu.restore(&p).unwrap();
    kernels::fill::fill(&gpu, p.slice(0, 4).unwrap(), -1.0).unwrap();
    want[..4].copy_from_slice(&[-1.0; 4]);
    let place = p.placement();
    gpu.evict(&[&p], Evict::ReadBackLater).unwrap();
    assert_eq!(p.host_bytes(), 256);
    let r = gpu.alloc_elements(64, Category::Temporary, "r").unwrap();
    assert_eq!(r.placement(), place, "r takes p's bytes at once");
    kernels::fill::fill(&gpu, r.whole(), 5.0).unwrap();
    assert_eq!(gpu.read_all::<f32>(&p, DEADLINE).unwrap(), want);
    assert_eq!(gpu.read_all::<f32>(&r, DEADLINE).unwrap(), vec![5.0; 64]);
}

/// On a planning twin eviction and restoring move no data and keep no host memory, and the
/// allocator counts them as the device's would.
#[test]
fn a_planning_twin_counts_evictions_without_data() {
    use plimsoll_kernels_wgsl::Evict;
    let gpu = fresh_gpu();
    let twin = gpu.planning_twin(1 << 30);
    let p = twin
        .alloc_elements(1 << 20, Category::Parameter, "p")
        .unwrap();
    let allocated = || twin.with_allocator(|m| m.stats().allocated_bytes);
    let before = allocated();
    twin.evict(&[&p], Evict::ReadBack).unwrap();
    assert_eq!((allocated(), p.host_bytes()), (before - (4 << 20), 0));
    let err = kernels::fill::fill(&twin, p.whole(), 1.0).unwrap_err();
    assert!(matches!(err, Error::Evicted { .. }), "{err}");
    twin.restore(&p).unwrap();
    assert_eq!(allocated(), before);
    kernels::fill::fill(&twin, p.whole(), 1.0).unwrap();
}

/// A kernel given a buffer of another device is a typed error naming it, not a read of
/// whatever the binding finds there.
#[test]
fn a_buffer_of_another_device_is_refused() {
    let (a, b) = (fresh_gpu(), fresh_gpu());
    let mine = scratch(&a, 16, "mine");
    let theirs = scratch(&b, 16, "theirs");
    let err = kernels::copy::copy(&a, mine.whole(), theirs.whole()).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { message, .. } if message.contains("\"theirs\"")),
        "{err}"
    );
    kernels::copy::copy(&b, scratch(&b, 16, "also theirs").whole(), theirs.whole()).unwrap();
}
