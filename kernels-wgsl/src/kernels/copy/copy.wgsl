// copy: contiguous copy of 4-byte words, and strided copy (an N-d gather, N <= 6: transpose,
// permute, slicing), dst[dst_offset + i] = src[src_offset + sum_d coord_d(i) * src_strides[d]],
// where coord(i) unravels i row-major over `shape`.
//
// Declared in mod.rs beside this file: `Params` (`shader_params!`, one for every entry point;
// `copy` ignores rank, shape and strides) and the bindings src, dst (`kernel!`: words, so f32 and
// u32 data alike; both read_write, since src may be dst's segment), prepended. Offsets include
// each block's offset. Dispatch: elementwise (`kernels::launch_split`, `launch_units`); i >= len
// returns (the launcher checked both ranges). The strided entry points number their invocations from
// params.start and stop at len (`kernels::launch_units`: a range under a submission bound).

const WORKGROUP_SIZE: u32 = 256u;

@compute @workgroup_size(256)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if i >= params.len {
        return;
    }
    dst[params.dst_offset + i] = src[params.src_offset + i];
}

// copy_v4: `copy` four words per invocation through vec4 views of the same bindings (len and
// both offsets in vec4s; the launcher's split, kernels::launch_split).
@compute @workgroup_size(256)
fn copy_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if i >= params.len {
        return;
    }
    dst_v4[params.dst_offset + i] = src_v4[params.src_offset + i];
}

// The source index of destination element i (src_offset + sum_d coord_d(i) * src_strides[d],
// coord(i) unravelled row-major over shape); in vec4s for strided_copy_v4.
fn source_index(i: u32) -> u32 {
    var rem = i;
    var at = params.src_offset;
    for (var d = i32(params.rank) - 1; d >= 0; d--) {
        let extent = params.shape[d / 4][d % 4];
        at += (rem % extent) * params.src_strides[d / 4][d % 4];
        rem /= extent;
    }
    return at;
}

@compute @workgroup_size(256)
fn strided_copy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = params.start + gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if i >= params.len {
        return;
    }
    dst[params.dst_offset + i] = src[source_index(i)];
}

// strided_copy_v4: `strided_copy` four words per invocation through vec4 views, for gathers
// whose innermost dimension is contiguous in src (stride 1) and a multiple of 4 long, every
// other stride and both offsets multiples of 4. The launcher passes len, the offsets, the
// innermost extent and the strides in vec4s (innermost stride 1).
@compute @workgroup_size(256)
fn strided_copy_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = params.start + gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if i >= params.len {
        return;
    }
    dst_v4[params.dst_offset + i] = src_v4[source_index(i)];
}

// strided_copy_rows_v4: `strided_copy_v4` a whole innermost run per invocation: invocation r
// copies the run4 = shape[rank - 1] vec4s of row r (params.len rows), so the index arithmetic
// of `source_index` (a division and a remainder per dimension) is paid once per run instead
// of once per vec4. The launcher takes it for runs of 2 to 64 vec4s (attention's head split
// and merge: 8); the loop then stays far below lavapipe's loop limit.
@compute @workgroup_size(256)
fn strided_copy_rows_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = params.start + gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if r >= params.len {
        return;
    }
    let run4 = params.shape[(params.rank - 1u) / 4u][(params.rank - 1u) % 4u];
    let at = source_index(r * run4);
    let to = params.dst_offset + r * run4;
    for (var j = 0u; j < run4; j++) {
        dst_v4[to + j] = src_v4[at + j];
    }
}

// strided_copy_f16: strided_copy over 16-bit elements, two to a word (both 16-bit paths: a copy
// has no arithmetic, the bits move as they are). Offsets, strides and len count halves. One
// invocation per destination word writes it whole, keeping the high half of a last word the
// run does not fill; dst_offset is even (the launcher checks), so no two share a word.
fn src_half(h: u32) -> u32 {
    return (src[h >> 1u] >> (16u * (h & 1u))) & 0xffffu;
}

@compute @workgroup_size(256)
fn strided_copy_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = params.start + 2u * (gid.x + gid.y * groups.x * WORKGROUP_SIZE);
    if i >= params.len {
        return;
    }
    let w = (params.dst_offset + i) >> 1u;
    var bits = src_half(source_index(i));
    if i + 1u < params.len {
        bits = bits | (src_half(source_index(i + 1u)) << 16u);
    } else {
        bits = bits | (dst[w] & 0xffff0000u);
    }
    dst[w] = bits;
}
