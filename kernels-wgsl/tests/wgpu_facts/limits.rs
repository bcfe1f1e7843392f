//! §3: limits, and the loop limit wgpu does not report.

use plimsoll_kernels_wgsl::testing::scratch;
use plimsoll_kernels_wgsl::{Dispatch, Kernel};

use crate::{DEADLINE, gpu, raw_device};

/// §3, pitfall 9: the device gets exactly the limits it asks for, here the adapter's own (which
/// on lavapipe are far above `Limits::default()`). Prints the limits the crate reads.
#[test]
fn device_gets_the_adapters_limits() {
    let plimsoll = gpu();
    let raw = raw_device(wgpu::Features::empty(), None);
    let l = plimsoll.limits();
    assert_eq!(*l, raw.adapter_limits, "Gpu limits vs the adapter's");
    assert_eq!(
        raw.device.limits(),
        raw.adapter_limits,
        "granted vs requested"
    );
    println!("{:?} {}", raw.info.device_type, plimsoll.adapter());
    println!(
        "max_buffer_size {}, max_storage_buffer_binding_size {}, \
         min_storage_buffer_offset_alignment {}, min_uniform_buffer_offset_alignment {}, \
         max_compute_workgroups_per_dimension {}, max_compute_invocations_per_workgroup {}, \
         max_storage_buffers_per_shader_stage {}; features {:?}",
        l.max_buffer_size,
        l.max_storage_buffer_binding_size,
        l.min_storage_buffer_offset_alignment,
        l.min_uniform_buffer_offset_alignment,
        l.max_compute_workgroups_per_dimension,
        l.max_compute_invocations_per_workgroup,
        l.max_storage_buffers_per_shader_stage,
        plimsoll.features(),
    );
}

/// Counts its own passes through three loops in a row (one invocation).
const LOOPS: Kernel = Kernel::standalone(
    "loop_limit_probe",
    r"
struct Params { n0: u32, n1: u32, n2: u32, offset: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn count() {
    var c0 = 0u; for (var i = 0u; i < params.n0; i++) { c0 += 1u; }
    var c1 = 0u; for (var i = 0u; i < params.n1; i++) { c1 += 1u; }
    var c2 = 0u; for (var i = 0u; i < params.n2; i++) { c2 += 1u; }
    out[params.offset] = c0; out[params.offset + 1u] = c1; out[params.offset + 2u] = c2;
}",
    "count",
    1,
    1,
);

/// What the loops of one invocation run under a budget of `limit` passes shared by all of them:
/// a loop of `n` iterations costs `n + 1` passes; once the budget is spent the loop running
/// leaves, and each later loop runs one pass (see `kernels` module docs).
fn loop_model(limit: Option<u64>, asked: [u32; 3]) -> [u32; 3] {
    let Some(mut left) = limit else {
        return asked;
    };
    asked.map(|n| {
        let n = u64::from(n);
        let ran = if left == 0 { n.min(1) } else { n.min(left) };
        left -= (n + 1).min(left);
        ran as u32
    })
}

/// §3: `Gpu::loop_iteration_limit` is what the adapter does. On lavapipe a shader invocation has
/// one budget of 65,535 loop passes for all its loops, and past it loops stop without an error;
/// elsewhere (no limit) every loop runs in full.
#[test]
fn loop_iteration_limit_matches_what_the_adapter_does() {
    let gpu = gpu();
    let out = scratch(&gpu, 3, "loop counts");
    let limit = gpu.loop_iteration_limit();
    for asked in [
        [65_535, 0, 0],
        [70_001, 0, 0],
        [40_000, 40_000, 5],
        [30_000, 30_000, 10_000],
        [32_767, 32_767, 0],
    ] {
        let params = [asked[0], asked[1], asked[2], out.offset_elements()];
        gpu.dispatch(Dispatch {
            kernel: &LOOPS,
            overrides: &[],
            params: bytemuck::cast_slice(&params),
            buffers: &[out.whole()],
            also_uses: &[],
            workgroups: [1, 1, 1],
            work: Default::default(),
        })
        .unwrap();
        let got: Vec<u32> = gpu.read_all(&out, DEADLINE).unwrap();
        assert_eq!(
            got,
            loop_model(limit, asked),
            "loops of {asked:?} with limit {limit:?} on {}",
            gpu.adapter()
        );
    }
}
