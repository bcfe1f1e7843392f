// nonfinite: sets flags[0] = 1 if any element of x[0..n) is NaN or +-inf, and lowers flags[1]
// to the smallest such index (atomicOr / atomicMin on storage atomics: race-free and, for the
// index, deterministic). Reference: src/reference/nonfinite.rs (flags()).
// The kernel never clears the flags: the launcher initialises them to [0, 0xFFFFFFFF] once, and
// several dispatches (e.g. every gradient tensor of a step) accumulate into the same two words;
// flags[1] is then the first index within whichever tensor had one (only meaningful per tensor).
// The test inspects the exponent bits (exponent all ones), not x != x, which a compiler may fold.
//
// Entry point: check, @workgroup_size(256), one invocation per element.
// Params: declared in src/kernels/nonfinite.rs (`shader_params!`), prepended with the bindings.
//   x_offset, flags_offset: element offsets of x and of the two flag words in the segments their
//   bindings hold (block offset + tensor offset, from the launcher). The index written to the
//   flags is relative to x_offset (the index within the tensor).
// Bindings (group 0; all storage read_write, docs/wgpu.md §4; each binds a WHOLE segment, not the
// tensor, so bind groups are cached per segment; every index adds its binding's offset):
//   0 params, 1 x: array<f32> [x_offset ..+ n], 2 flags: array<atomic<u32>>
//   [flags_offset ..+ 2] (a DeviceBuffer of u32 words like any other)
// Dispatch: groups = ceil(n / 256); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); i = gid.x + gid.y * num_workgroups.x * 256; `i >= n` returns.


const WG: u32 = 256u;

@compute @workgroup_size(256)
fn check(@builtin(global_invocation_id) gid: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    if ((bitcast<u32>(x[params.x_offset + i]) & 0x7f800000u) == 0x7f800000u) {
        atomicOr(&flags[params.flags_offset], 1u);
        atomicMin(&flags[params.flags_offset + 1u], i);
    }
}
