// binary: out = a op b with numpy broadcasting over up to 8 dimensions, the scalar forms
// a op s / s op a, and the backward at the output shape. ONE op per pipeline, chosen by the
// override constant OP (specialised pipeline, no per-element branch on a uniform).
// Reference: reference.rs, beside this file (BinaryOp::shader_code gives OP; Broadcast gives the
// shape and strides).
//
// Declared in mod.rs, not here: the ops and their codes (`op_family!`, appended
// as `const Add: u32 = 0u;` ..., which the switch in binary_ops.wgsl names), `Params`
// (`shader_params!`) and the bindings (`kernel!`), both prepended. OP has no default.
//   max/min propagate NaN; their backward gives dy to the winner and dy/2 to each on a tie.
//
// Entry points (all @workgroup_size(256), one invocation per OUTPUT element):
//   broadcast:  out[i] = a[ia] op b[ib]
//   scalar_rhs: out[i] = a[i] op params.scalar
//   scalar_lhs: out[i] = params.scalar op a[i]
//   backward:   da[i] = dy[i] * d(a op b)/da, db[i] = dy[i] * d(a op b)/db, both OUTPUT-shaped
//               (reduce each to its operand's shape with reduce.wgsl sum_axis, one axis at a time)
//
// Indexing: shape, a_strides and b_strides are array<vec4<u32>, 2> (dim d at [d / 4][d % 4],
// 0 = outermost; a stride is 0 where that operand is broadcast); entries at index >= rank are
// ignored. ia = a_offset + sum_d idx_d * a_strides[d], idx = the row-major multi-index of i.
// rank 0 (both operands have the output's shape): ia = a_offset + i, ib = b_offset + i. Every
// index adds its binding's `*_offset` (bindings are whole segments, see docs/wgpu.md §4).
// Dispatch: elementwise (`kernels::launch_split` and `launch_ranges`, in ranges under a
// submission bound); `i >= n` returns. broadcast, suffix_v4 and backward number their
// invocations from `params.start` and stop at `n` (the range's end).


// The op (override OP) and its math are in binary_ops.wgsl, appended to this file (and shared
// with the 16-bit modules, binary_f16*.wgsl).

@compute @workgroup_size(256)
fn broadcast(@builtin(global_invocation_id) gid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let o = operand_offsets(i);
    out[params.out_offset + i] = apply(a[o.x], b[o.y]);
}

@compute @workgroup_size(256)
fn scalar_rhs(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y[params.y_offset + i] = apply(a[params.a_offset + i], params.scalar);
}

@compute @workgroup_size(256)
fn scalar_lhs(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y[params.y_offset + i] = apply(params.scalar, a[params.a_offset + i]);
}

@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let o = operand_offsets(i);
    let g = apply_backward(a[o.x], b[o.y], dy[params.dy_offset + i]);
    da[params.da_offset + i] = g.x;
    db[params.db_offset + i] = g.y;
}

// The vec4 entry points: four elements per invocation through vec4 views of the same bindings
// (n and every offset in vec4s), for the launcher's split (kernels::launch_split) of the
// same-shape (rank 0) and scalar forms, and `suffix_v4` for b broadcast along the leading
// dimensions of a (a bias row): out[i] = a[i] op b[i % period], period = b's length, in vec4s.
fn apply4(l: vec4<f32>, r: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(apply(l.x, r.x), apply(l.y, r.y), apply(l.z, r.z), apply(l.w, r.w));
}

@compute @workgroup_size(256)
fn same_v4(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    out_v4[params.out_offset + i] = apply4(a_v4[params.a_offset + i], b_v4[params.b_offset + i]);
}

@compute @workgroup_size(256)
fn suffix_v4(@builtin(global_invocation_id) gid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let r = b_v4[params.b_offset + i % params.period];
    out_v4[params.out_offset + i] = apply4(a_v4[params.a_offset + i], r);
}

@compute @workgroup_size(256)
fn scalar_rhs_v4(@builtin(global_invocation_id) gid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y_v4[params.y_offset + i] = apply4(a_v4[params.a_offset + i], vec4<f32>(params.scalar));
}

@compute @workgroup_size(256)
fn scalar_lhs_v4(@builtin(global_invocation_id) gid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y_v4[params.y_offset + i] = apply4(vec4<f32>(params.scalar), a_v4[params.a_offset + i]);
}

@compute @workgroup_size(256)
fn backward_same_v4(@builtin(global_invocation_id) gid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let l = a_v4[params.a_offset + i];
    let r = b_v4[params.b_offset + i];
    let g = dy_v4[params.dy_offset + i];
    let x = apply_backward(l.x, r.x, g.x);
    let y = apply_backward(l.y, r.y, g.y);
    let z = apply_backward(l.z, r.z, g.z);
    let w = apply_backward(l.w, r.w, g.w);
    da_v4[params.da_offset + i] = vec4<f32>(x.x, y.x, z.x, w.x);
    db_v4[params.db_offset + i] = vec4<f32>(x.y, y.y, z.y, w.y);
}
