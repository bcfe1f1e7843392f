// fill: out[offset + i] = value_bits, for i in 0..len: u32 words, so one kernel fills f32 (its
// bits) and u32 buffers. `Params` and the binding are declared in mod.rs beside this file
// (`shader_params!`, `kernel!`) and prepended; `offset` already includes the block's offset.
// Dispatch: elementwise (`kernels::launch_ranges`: each range its own offset and len);
// invocations with i >= len return (the slice's range was checked when it was made).

const WORKGROUP_SIZE: u32 = 256u;

@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if i >= params.len {
        return;
    }
    out[params.offset + i] = params.value_bits;
}
