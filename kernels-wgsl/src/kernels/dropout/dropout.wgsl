// dropout: y[i] = keep(seed, i) ? x[i] * scale : 0, for i in 0..len (inverted dropout,
// scale = 1 / (1 - p)). The mask is a counter-based hash of (seed, i): no RNG state, no mask
// buffer, and the same (seed, i) gives the same bit here and in mod.rs's `reference`, so the
// backward (dx = dropout(dy), same seed) and a checkpoint's recomputation redraw the same mask.
//
// Hash: PCG's output permutation (Jarzynski & Olano, "Hash Functions for GPU Rendering", 2020)
// on u32 with wrapping arithmetic; key = pcg(seed_lo ^ pcg(seed_hi)); h = pcg(i ^ key).
// keep = f32(h >> 8) * 2^-24 >= p: 24 bits are exactly representable in f32, so the comparison
// is exact and identical on the CPU.
//
// Declared in mod.rs beside this file: `Params` (`shader_params!`) and the bindings x, y
// (`kernel!`), prepended; each offset includes its block's offset; y may be x (in place).
// Dispatch: elementwise (`kernels::launch_1d`); invocations with i >= len return.


const WORKGROUP_SIZE: u32 = 256u;

fn pcg(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

@compute @workgroup_size(256)
fn dropout(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if i >= params.len {
        return;
    }
    let key = pcg(params.seed_lo ^ pcg(params.seed_hi));
    let h = pcg(i ^ key);
    let u = f32(h >> 8u) * (1.0 / 16777216.0);
    let v = x[params.x_offset + i];
    y[params.y_offset + i] = select(0.0, v * params.scale, u >= params.p);
}
