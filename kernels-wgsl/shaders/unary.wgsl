// unary: elementwise y = f(x) and its backward dx = dy * f'(.), for ONE op chosen by the
// pipeline-overridable constant OP. Specialising the pipeline per op (WGSL `override`) lets the
// compiler drop the switch: no per-element branch on a uniform, one cached pipeline per op.
// Reference: src/reference/unary.rs (UnaryOp::shader_code gives OP).
//
// OP (override, u32, no default: a pipeline without it fails to build, loudly):
//   0 neg, 1 exp, 2 log, 3 sqrt, 4 abs, 5 relu, 6 gelu (TANH APPROXIMATION, computed as
//   x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3)), 7 tanh, 8 sigmoid, 9 pow (x^p, p =
//   params.exponent).
//
// Entry points (both @workgroup_size(256)):
//   forward:  y[i]  = f(x[i])
//   backward: dx[i] = dy[i] * f'(.) evaluated from `saved`, which is the forward OUTPUT y for
//             exp (1), tanh (7), sigmoid (8) and the forward INPUT x for every other op.
//
// Params: declared in src/kernels/unary.rs (`shader_params!`), prepended with the bindings.
//   n = element count; exponent used only by pow. Each *_offset is the element offset of that
//   tensor in the segment its binding holds (block offset + tensor offset, from the launcher);
//   forward reads x_offset, y_offset; backward saved_offset, dy_offset, dx_offset.
// Bindings (group 0; all storage bindings read_write, see docs/wgpu.md §4; each binds a WHOLE
// segment, not the tensor, so bind groups are cached per segment; every index adds its offset):
//   forward:  0 params, 1 x: array<f32> [x_offset ..+ n], 2 y: array<f32> [y_offset ..+ n]
//   backward: 0 params, 1 saved: array<f32> [saved_offset ..+ n],
//             2 dy: array<f32> [dy_offset ..+ n], 3 dx: array<f32> [dx_offset ..+ n]
//
// Dispatch (elementwise, 256 invocations per workgroup: a multiple of every common subgroup
// width, and few workgroups for large n): groups = ceil(n / 256); dispatch (groups, 1, 1) when
// groups <= 65535, else (65535, ceil(groups / 65535), 1). Flat index
// i = gid.x + gid.y * num_workgroups.x * 256; the bounds check `i >= n` returns.
//
// Domain edges follow IEEE where the device does (log of 0, sqrt of a negative); pow handles
// negative bases with integer exponents, 0^p and p = 0 explicitly (WGSL pow leaves them
// indeterminate); tanh and gelu' are guarded for large |x| (no exp overflow to NaN).


// The op (override OP) and its math are in unary_ops.wgsl, appended to this file (and shared
// with the 16-bit modules, unary_f16*.wgsl).

@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y[params.y_offset + i] = apply(x[params.x_offset + i]);
}

@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    dx[params.dx_offset + i] =
        apply_backward(saved[params.saved_offset + i], dy[params.dy_offset + i]);
}

// forward_v4 / backward_v4: the same, four elements per invocation through vec4 views of the
// same bindings (n and every offset in vec4s; the launcher's split, kernels::launch_split).
fn apply4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(apply(v.x), apply(v.y), apply(v.z), apply(v.w));
}

@compute @workgroup_size(256)
fn forward_v4(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y_v4[params.y_offset + i] = apply4(x_v4[params.x_offset + i]);
}

@compute @workgroup_size(256)
fn backward_v4(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let s = saved_v4[params.saved_offset + i];
    let g = dy_v4[params.dy_offset + i];
    dx_v4[params.dx_offset + i] = vec4<f32>(apply_backward(s.x, g.x), apply_backward(s.y, g.y),
                                            apply_backward(s.z, g.z), apply_backward(s.w, g.w));
}
