// fill: out[offset + i] = value, for i in 0..len.
//
// Bindings (the crate convention, see src/kernels/mod.rs):
//   @group(0) @binding(0) params: Params (uniform, dynamic offset into the batch's params arena)
//   @group(0) @binding(1) out: array<u32>, the whole segment; `offset` already includes the
//                         block's offset. u32 words, so one kernel fills f32 (bits) and u32 buffers.
// Workgroup: 256 invocations, 1-D: a multiple of every subgroup size and within the default
//   max_compute_invocations_per_workgroup (256). The grid may be 2-D when len > 65535 * 256:
//   i = gid.x + gid.y * num_workgroups.x * 256 (see kernels::grid_1d).
// Bounds check: invocations with i >= len return; the launcher checked offset + len <= buffer.


// `Params` and the bindings are declared in src/kernels/fill.rs (`shader_params!`, `kernel!`)
// and prepended to this file when the module is created.

const WORKGROUP_SIZE: u32 = 256u;

@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if i >= params.len {
        return;
    }
    out[params.offset + i] = params.value_bits;
}
