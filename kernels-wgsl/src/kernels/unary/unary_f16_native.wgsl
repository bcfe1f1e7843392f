
// unary_f16_native.wgsl: `y = f(x)` with x and y in WGSL `f16` (the native path: the module
// starts with `enable f16;` and needs SHADER_F16): each element loaded as f16, unary_ops.wgsl's
// f in f32 (as PyTorch computes its f16 elementwise ops; the same values as the packed path),
// stored as f16, one invocation per element. Module `unary_f16_native`: `enable f16;`, this
// file, unary_ops.wgsl and f16_native.wgsl (kernels::unary::FORWARD_F16_NATIVE). Bindings: x_h,
// y_h (array<f16>). i counts from params.start and stops at n (a range of the launch).

@compute @workgroup_size(256)
fn forward_f16(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y_h[params.y_offset + i] = to_half(apply(f32(x_h[params.x_offset + i])));
}
