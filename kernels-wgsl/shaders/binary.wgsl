// binary: out = a op b with numpy broadcasting over up to 8 dimensions, the scalar forms
// a op s / s op a, and the backward at the output shape. ONE op per pipeline, chosen by the
// override constant OP (specialised pipeline, no per-element branch on a uniform).
// Reference: src/reference/binary.rs (BinaryOp::shader_code gives OP; Broadcast gives the
// shape and strides).
//
// OP (override, u32, no default): 0 add, 1 sub, 2 mul, 3 div, 4 max, 5 min.
//   max/min propagate NaN; their backward gives dy to the winner and dy/2 to each on a tie.
//
// Entry points (all @workgroup_size(256), one invocation per OUTPUT element):
//   broadcast:  out[i] = a[ia] op b[ib]
//   scalar_rhs: out[i] = a[i] op params.scalar
//   scalar_lhs: out[i] = params.scalar op a[i]
//   backward:   da[i] = dy[i] * d(a op b)/da, db[i] = dy[i] * d(a op b)/db, both OUTPUT-shaped
//               (reduce each to its operand's shape with reduce.wgsl sum_axis, one axis at a time)
//
// Params (uniform, 144 bytes; declared in src/kernels/binary.rs): n, rank, scalar, the element
// offset of each binding, then shape, a_strides, b_strides as array<vec4<u32>, 2> (dim d at
// [d / 4][d % 4], 0 = outermost; a stride is 0 where that operand is broadcast).
//   n = output element count = product of the first `rank` dims (rank <= 8; entries at index
//   >= rank are ignored, write 0). ia = a_offset + sum_d idx_d * a_strides[d], idx = row-major
//   multi-index of i. rank 0 (the launcher's choice when both operands have the output's
//   shape): ia = a_offset + i, ib = b_offset + i. The scalar entry points read only n, scalar, a_offset and y_offset.
//   Each *_offset is the element offset of that tensor in the segment its binding holds (block
//   offset + tensor offset, from the launcher): bindings are WHOLE segments, not tensors, so bind
//   groups are cached per segment, and every index adds its binding's offset.
// Bindings (group 0; all storage read_write, docs/wgpu.md §4):
//   broadcast:  0 params, 1 a: array<f32>, 2 b: array<f32>, 3 out: array<f32> [out_offset ..+ n]
//   scalar_rhs / scalar_lhs: 0 params, 1 a: array<f32> [a_offset ..+ n],
//               2 y: array<f32> [y_offset ..+ n]
//   backward:   0 params, 1 a, 2 b, 3 dy [dy_offset ..+ n], 4 da [da_offset ..+ n],
//               5 db [db_offset ..+ n] (all array<f32>)
//
// Dispatch: groups = ceil(n / 256); (groups, 1, 1) when groups <= 65535, else
// (65535, ceil(groups / 65535), 1); i = gid.x + gid.y * num_workgroups.x * 256; `i >= n` returns.
// 256: elementwise work, no shared memory.


// The op (override OP) and its math are in binary_ops.wgsl, appended to this file (and shared
// with the 16-bit modules, binary_f16*.wgsl).

@compute @workgroup_size(256)
fn broadcast(@builtin(global_invocation_id) gid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
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
    let i = flat_index(gid, nwg);
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
    let i = flat_index(gid, nwg);
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
