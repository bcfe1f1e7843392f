// nonfinite: sets flags[0] = 1 if any element of x[0..n) is NaN or +-inf, and lowers flags[1]
// to the smallest such index (atomicOr / atomicMin on storage atomics: race-free and, for the
// index, deterministic). Reference: mod.rs's `reference::flags`, beside this file.
// The kernel never clears the flags: the launcher initialises them to [0, 0xFFFFFFFF] once, and
// several dispatches (e.g. every gradient tensor of a step) accumulate into the same two words;
// flags[1] is then the first index within whichever tensor had one (only meaningful per tensor).
// The test inspects the exponent bits (exponent all ones), not x != x, which a compiler may fold.
//
// Entry point: check, @workgroup_size(256), one invocation per element.
// Declared in mod.rs beside this file: `Params` (`shader_params!`) and the bindings x and
//   flags: array<atomic<u32>> [flags_offset ..+ 2] (`kernel!`), prepended. Each offset includes
//   its block's offset; the index written to the flags is relative to x_offset (the index
//   within the tensor). Dispatch: `kernels::launch_ranges`: i counts from `params.start`;
//   `i >= n` (the range's end) returns.


const WG: u32 = 256u;

@compute @workgroup_size(256)
fn check(@builtin(global_invocation_id) gid: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    if ((bitcast<u32>(x[params.x_offset + i]) & 0x7f800000u) == 0x7f800000u) {
        atomicOr(&flags[params.flags_offset], 1u);
        atomicMin(&flags[params.flags_offset + 1u], i);
    }
}
