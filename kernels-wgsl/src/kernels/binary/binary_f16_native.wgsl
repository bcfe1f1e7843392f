
// binary_f16_native.wgsl: `out = a op b` with a, b and out in WGSL `f16` (the native path: the
// module starts with `enable f16;` and needs SHADER_F16), with binary_ops.wgsl's broadcasting.
// +, -, * and / are f16 arithmetic; max and min take binary_ops.wgsl's f32 rule (NaN if either
// is NaN), exact in f16. One invocation per element (16-bit stores). Module
// `binary_f16_native`: `enable f16;`, this file, binary_ops.wgsl and f16_native.wgsl
// (kernels::binary::BROADCAST_F16_NATIVE). Bindings: a_h, b_h, out_h (array<f16>).

fn apply_f16(l: f16, r: f16) -> f16 {
    var v: f16;
    switch OP {
        case Add: { v = l + r; }
        case Sub: { v = l - r; }
        case Mul: { v = l * r; }
        case Div: { v = l / r; }
        default: { v = to_half(apply(f32(l), f32(r))); }
    }
    return v;
}

@compute @workgroup_size(256)
fn broadcast_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let o = operand_offsets(i);
    out_h[params.out_offset + i] = apply_f16(a_h[o.x], b_h[o.y]);
}

// scalar_f16: y = a op s (params.period 0) or s op a (1), a and y `f16`, s the f32
// params.scalar (as PyTorch keeps a Python scalar in f32): f32 arithmetic on the f16 value,
// rounded once. Bindings a_h, y_h.
@compute @workgroup_size(256)
fn scalar_f16(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let x = f32(a_h[params.a_offset + i]);
    var v: f32;
    if (params.period == 0u) {
        v = apply(x, params.scalar);
    } else {
        v = apply(params.scalar, x);
    }
    y_h[params.out_offset + i] = to_half(v);
}
