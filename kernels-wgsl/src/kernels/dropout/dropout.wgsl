// dropout: y[i] = keep(seed, i) ? x[i] * scale : 0, for i in 0..len (inverted dropout,
// scale = 1 / (1 - p)). The mask is a counter-based hash of (seed, i): no RNG state, no mask
// buffer, and the same (seed, i) gives the same bit here and in mod.rs's `reference`, so the
// backward (dx = dropout(dy), same seed) and a checkpoint's recomputation redraw the same mask.
//
// Hash: `shaders/counter_hash.wgsl` (appended), shared with the attention kernels.
//
// Declared in mod.rs beside this file: `Params` (`shader_params!`) and the bindings x, y
// (`kernel!`), prepended; each offset includes its block's offset; y may be x (in place).
// Dispatch: elementwise (`kernels::launch_ranges`): i counts from `params.start` (a launch in
// ranges under a submission bound), and invocations with i >= len (the range's end) return.


const WORKGROUP_SIZE: u32 = 256u;

@compute @workgroup_size(256)
fn dropout(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = params.start + gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if i >= params.len {
        return;
    }
    let key = dropout_key(params.seed_lo, params.seed_hi);
    let v = x[params.x_offset + i];
    y[params.y_offset + i] = select(0.0, v * params.scale, dropout_kept(key, i, params.p));
}
