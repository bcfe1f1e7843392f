// unary: elementwise y = f(x) and its backward dx = dy * f'(.), for ONE op chosen by the
// pipeline-overridable constant OP. Specialising the pipeline per op (WGSL `override`) lets the
// compiler drop the switch: no per-element branch on a uniform, one cached pipeline per op.
// Reference: reference.rs, beside this file.
//
// Declared in mod.rs, not here: the ops and their codes (`op_family!`, appended
// as `const Neg: u32 = 0u;` ..., which the switch in unary_ops.wgsl names), `Params`
// (`shader_params!`) and the bindings (`kernel!`), both prepended. OP has no default: a pipeline
// without it fails to build, loudly. gelu is the TANH APPROXIMATION, computed as
// x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3); pow is x^p with p = params.exponent.
//
// Entry points (both @workgroup_size(256)):
//   forward:  y[i]  = f(x[i])
//   backward: dx[i] = dy[i] * f'(.) evaluated from `saved`, which is the forward OUTPUT y for
//             exp, tanh and sigmoid and the forward INPUT x for every other op.
// Every index adds its binding's `*_offset` (bindings are whole segments, see docs/wgpu.md §4).
// Dispatch: elementwise (`kernels::launch_split`, in ranges under a submission bound); the
// bounds check `i >= n` returns.
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
