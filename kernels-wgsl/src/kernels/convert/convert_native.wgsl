enable f16;
// convert, native path: f32 <-> f16 storage bound as array<f16> (device feature SHADER_F16;
// docs/wgpu.md §6). The layout is the packed path's (convert.wgsl): half h is the 2-byte
// element h of the binding. Each invocation loads or stores one 16-bit element, so a run may
// start at any half. Reference: reference.rs, beside this file.
//
// f32 -> f16: |x| >= 65520 (which rounds to infinity in IEEE) is written as +-inf and NaN as a
// quiet NaN explicitly (WGSL leaves out-of-range conversions indeterminate), so overflow stays
// visible to the nonfinite check. Devices may flush f16 subnormals to zero.
//
// Entry points (both @workgroup_size(256), one invocation per element):
//   f32_to_f16: dst_halves[dst_offset + i] = f16(src[src_offset + i])
//   f16_to_f32: dst[dst_offset + i] = f32(src_halves[src_offset + i])
// Params: declared in mod.rs (`shader_params!`), prepended with the bindings.
//   the f32 side's offset counts f32 elements, the f16 side's halves; both include the block's
//   offset in the segment (from the launcher).
// Bindings (group 0; storage read_write; whole segments):
//   f32_to_f16: 0 params, 1 src: array<f32>, 2 dst_halves: array<f16>
//   f16_to_f32: 0 params, 1 src_halves: array<f16>, 2 dst: array<f32>
// Dispatch: groups = ceil(n / 256); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); i = gid.x + gid.y * num_workgroups.x * 256; i >= n returns.

const WG: u32 = 256u;


@compute @workgroup_size(256)
fn f32_to_f16(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    dst_halves[params.dst_offset + i] = to_half(src[params.src_offset + i]);
}

@compute @workgroup_size(256)
fn f16_to_f32(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    dst[params.dst_offset + i] = f32(src_halves[params.src_offset + i]);
}
