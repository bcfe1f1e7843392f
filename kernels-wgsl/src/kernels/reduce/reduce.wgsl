// reduce: sum, mean and max over one axis of a tensor viewed as [outer, axis_len, inner]
// (row-major), or over all of it; max also writes the arg-max (u32 index along the axis, or the
// flat index for *_all) saved for max_backward, which scatters dy back to it.
// Reference: reference.rs, beside this file (AxisView gives outer/axis_len/inner).
//
// "Sum to shape" (the backward of a broadcast) is a sequence of sum_axis dispatches, one per
// broadcast dimension, each keeping that dimension with extent 1 (reference::sum_to_shape).
//
// Max rule (as the reference's max_beats): NaN beats every number (the result is NaN); among
// equal values the smallest index wins.
//
// Entry points:
//   sum_axis, mean_axis   @workgroup_size(64):  dst[o*inner + i] = sum / mean over k of
//                                               src[(o*axis_len + k)*inner + i]
//   max_axis              @workgroup_size(64):  dst = max over k, idx_out = its k
//   max_backward          @workgroup_size(256): dx[(o*axis_len + k)*inner + i] =
//                                               (idx_in[o*inner + i] == k) ? dy[o*inner + i] : 0
//                                               (writes every element: no zero-fill needed)
//   sum_all, mean_all     @workgroup_size(256): dst[0] = sum / mean of src[0 .. n)
//   max_all               @workgroup_size(256): dst[0] = max, idx_out[0] = its flat index
//   sum_squares_chunks(_v4) @workgroup_size(256): dst[c] = sum of src[i]^2 over chunk c (below)
// For *_all, n = outer * axis_len * inner (write outer = inner = 1, axis_len = n).
//
// Params: declared in mod.rs (`shader_params!`), prepended with the bindings.
//   Each *_offset is the element offset of that tensor in the segment its binding holds (block
//   offset + tensor offset, from the launcher): bindings are WHOLE segments, not tensors, so bind
//   groups are cached per segment, and every index below adds its binding's offset (the index
//   formulas in "Entry points" are relative to those offsets). Arg-max indices are NOT offset:
//   they are positions along the axis (or in the flattened tensor), as in the reference.
// Bindings (group 0; all storage read_write, docs/wgpu.md §4):
//   sum_axis, mean_axis, sum_all, mean_all: 0 params, 1 src: array<f32>, 2 dst: array<f32>
//   max_axis, max_all: 0 params, 1 src: array<f32>, 2 dst: array<f32>, 3 idx_out: array<u32>
//   max_backward:      0 params, 1 dy: array<f32> [outer*inner], 2 idx_in: array<u32>
//                      [outer*inner], 3 dx: array<f32> [outer*axis_len*inner]
//
// Dispatch:
//   *_axis: one invocation per output (count = outer*inner), workgroup 64 (each invocation loops
//     over the axis, so fewer, longer invocations: 64 keeps several workgroups busy for small
//     outputs); max_backward: one per dx element, workgroup 256. Both: groups = ceil(count/WG),
//     (groups, 1, 1) if <= 65535 else (65535, ceil(groups/65535), 1);
//     index = params.start + gid.x + gid.y * num_workgroups.x * WG; `index >= params.end`
//     returns (start..end: the launch, or one range of it under a submission bound).
//   *_all: EXACTLY ONE workgroup, dispatch (1, 1, 1): 256 invocations sum strided chunks, then a
//     fixed-order tree in workgroup memory (8 barriers; deterministic). Accumulation is f32.


// Mesa's lavapipe (llvmpipe) silently stops looping after 65535 loop iterations per invocation,
// counted over ALL loops of the shader (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, one counter per
// function, set at entry): a flat loop over a 70_001-long axis returned the sum of its first
// 65535 terms, and nesting the loop did not help. So the data-length loops below take UNROLL
// elements per iteration, in the same order as a plain loop (results are unchanged): an axis
// of up to 65535 * UNROLL - UNROLL elements (kernels::reduce::MAX_AXIS_LEN, checked by the
// launcher), and *_all over up to 65535 * 256 * 4 elements (more than one binding holds).
const UNROLL: u32 = 8u;
const ROW_WG: u32 = 64u;
// The workgroup size of max_backward and *_all (indexing.wgsl, workgroup_reduce.wgsl).
const WG: u32 = 256u;

var<private> neg_inf_bits: u32 = 0xff800000u;
var<workgroup> partial_value: array<f32, WG>;
var<workgroup> partial_index: array<u32, WG>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// Whether (v, i) beats the best so far (best, best_i); see the header's max rule.
fn max_beats(v: f32, i: u32, best: f32, best_i: u32) -> bool {
    let vn = is_nan(v);
    let bn = is_nan(best);
    if (vn != bn) {
        return vn;
    }
    if (vn) {
        return i < best_i;
    }
    return v > best || (v == best && i < best_i);
}

// The best (value, index) so far of a max.
struct Best {
    value: f32,
    index: u32,
}

fn keep(best: Best, v: f32, i: u32) -> Best {
    if (max_beats(v, i, best.value, best.index)) {
        return Best(v, i);
    }
    return best;
}

fn axis_sum(o: u32) -> f32 {
    let base = params.src_offset + (o / params.inner) * params.axis_len * params.inner
        + o % params.inner;
    let step = params.inner;
    var acc = 0.0;
    var k = 0u;
    for (; k + UNROLL <= params.axis_len; k += UNROLL) {
        let p = base + k * step;
        acc += src[p];
        acc += src[p + step];
        acc += src[p + 2u * step];
        acc += src[p + 3u * step];
        acc += src[p + 4u * step];
        acc += src[p + 5u * step];
        acc += src[p + 6u * step];
        acc += src[p + 7u * step];
    }
    for (; k < params.axis_len; k++) {
        acc += src[base + k * step];
    }
    return acc;
}

@compute @workgroup_size(64)
fn sum_axis(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = params.start + gid.x + gid.y * nwg.x * ROW_WG;
    if (o >= params.end) {
        return;
    }
    dst[params.dst_offset + o] = axis_sum(o);
}

@compute @workgroup_size(64)
fn mean_axis(@builtin(global_invocation_id) gid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = params.start + gid.x + gid.y * nwg.x * ROW_WG;
    if (o >= params.end) {
        return;
    }
    dst[params.dst_offset + o] = axis_sum(o) / f32(params.axis_len);
}

@compute @workgroup_size(64)
fn max_axis(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = params.start + gid.x + gid.y * nwg.x * ROW_WG;
    if (o >= params.end) {
        return;
    }
    let base = params.src_offset + (o / params.inner) * params.axis_len * params.inner
        + o % params.inner;
    let step = params.inner;
    var best = Best(bitcast<f32>(neg_inf_bits), 0xffffffffu);
    var k = 0u;
    for (; k + UNROLL <= params.axis_len; k += UNROLL) {
        let p = base + k * step;
        best = keep(best, src[p], k);
        best = keep(best, src[p + step], k + 1u);
        best = keep(best, src[p + 2u * step], k + 2u);
        best = keep(best, src[p + 3u * step], k + 3u);
        best = keep(best, src[p + 4u * step], k + 4u);
        best = keep(best, src[p + 5u * step], k + 5u);
        best = keep(best, src[p + 6u * step], k + 6u);
        best = keep(best, src[p + 7u * step], k + 7u);
    }
    for (; k < params.axis_len; k++) {
        best = keep(best, src[base + k * step], k);
    }
    dst[params.dst_offset + o] = best.value;
    idx_out[params.idx_out_offset + o] = best.index;
}

@compute @workgroup_size(256)
fn max_backward(@builtin(global_invocation_id) gid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = params.start + flat_index(gid, nwg);
    if (e >= params.end) {
        return;
    }
    let i = e % params.inner;
    let k = (e / params.inner) % params.axis_len;
    let o = e / (params.inner * params.axis_len);
    let r = o * params.inner + i;
    dx[params.dx_offset + e] =
        select(0.0, dy[params.dy_offset + r], idx_in[params.idx_in_offset + r] == k);
}

// Sum of src[0..n), by each invocation's strided chunk and then workgroup_reduce.wgsl's
// fixed-order tree; every invocation of the workgroup must call it.
fn sum_of_src(lid: u32) -> f32 {
    let n = params.outer * params.axis_len * params.inner;
    let base = params.src_offset;
    var acc = 0.0;
    var i = lid;
    for (; i + 3u * WG < n; i += 4u * WG) {   // 4 per iteration: see UNROLL
        acc += src[base + i];
        acc += src[base + i + WG];
        acc += src[base + i + 2u * WG];
        acc += src[base + i + 3u * WG];
    }
    for (; i < n; i += WG) {
        acc += src[base + i];
    }
    return workgroup_sum(lid, vec4<f32>(acc, 0.0, 0.0, 0.0)).x;
}

@compute @workgroup_size(256)
fn sum_all(@builtin(local_invocation_index) lid: u32) {
    let total = sum_of_src(lid);
    if (lid == 0u) {
        dst[params.dst_offset] = total;
    }
}

// Sums of squares by chunks: invocation c (= workgroup_id.x * 256 + local index) writes
// dst[dst_offset + c] = sum of src[i]^2 over its chunk i in [c * SQ_CHUNK, min(n, (c + 1) *
// SQ_CHUNK)), in order (the squares are not stored); invocations past the last chunk return.
// Dispatch (ceil(chunks / 256), 1, 1) with chunks = max(1, ceil(n / SQ_CHUNK)): with one
// chunk, dst gets the whole sum. No workgroup memory and no barrier (on lavapipe a barrier
// costs more than the loads of a chunk); the chunks depend on n alone, so the result is
// deterministic; kernels::reduce::sum_squares_all adds the chunks' sums with sum_all when there
// are several, the trainer adds them on the host. Each invocation takes 64
// vec4s (or 64 passes of 4 scalars): far below lavapipe's loop limit.
const SQ_CHUNK: u32 = 256u;

@compute @workgroup_size(256)
fn sum_squares_chunks(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = params.outer * params.axis_len * params.inner;
    let c = gid.x;
    let start = c * SQ_CHUNK;
    if (c > 0u && start >= n) {
        return;
    }
    let end = min(n, start + SQ_CHUNK);
    let base = params.src_offset;
    var acc = 0.0;
    var i = start;
    for (; i + 4u <= end; i += 4u) {   // 4 per iteration: see UNROLL
        let v0 = src[base + i];
        let v1 = src[base + i + 1u];
        let v2 = src[base + i + 2u];
        let v3 = src[base + i + 3u];
        acc += v0 * v0;
        acc += v1 * v1;
        acc += v2 * v2;
        acc += v3 * v3;
    }
    for (; i < end; i++) {
        let v = src[base + i];
        acc += v * v;
    }
    dst[params.dst_offset + c] = acc;
}

// sum_squares_chunks over vec4s (the launcher's choice when src_offset is a multiple of 4; a
// chunk starts on a multiple of 4 too); components past n (the last vec4's) count as 0.
// Another order of additions than sum_squares_chunks (rounding only); still fixed.
@compute @workgroup_size(256)
fn sum_squares_chunks_v4(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = params.outer * params.axis_len * params.inner;
    let c = gid.x;
    let start = c * SQ_CHUNK;
    if (c > 0u && start >= n) {
        return;
    }
    let end = min(n, start + SQ_CHUNK);
    let base4 = (params.src_offset + start) / 4u;
    let n4 = (end - start + 3u) / 4u;
    var acc = 0.0;
    for (var i = 0u; i < n4; i++) {
        let first = start + 4u * i;
        let inside = vec4<bool>(first < end, first + 1u < end, first + 2u < end, first + 3u < end);
        let v = select(vec4<f32>(0.0), src_v4[base4 + i], inside);
        acc += dot(v, v);
    }
    dst[params.dst_offset + c] = acc;
}

@compute @workgroup_size(256)
fn mean_all(@builtin(local_invocation_index) lid: u32) {
    let total = sum_of_src(lid);
    if (lid == 0u) {
        dst[params.dst_offset] = total / f32(params.outer * params.axis_len * params.inner);
    }
}

@compute @workgroup_size(256)
fn max_all(@builtin(local_invocation_index) lid: u32) {
    let n = params.outer * params.axis_len * params.inner;
    let base = params.src_offset;
    var best = Best(bitcast<f32>(neg_inf_bits), 0xffffffffu);
    var i = lid;
    for (; i + 3u * WG < n; i += 4u * WG) {   // 4 per iteration: see UNROLL
        best = keep(best, src[base + i], i);
        best = keep(best, src[base + i + WG], i + WG);
        best = keep(best, src[base + i + 2u * WG], i + 2u * WG);
        best = keep(best, src[base + i + 3u * WG], i + 3u * WG);
    }
    for (; i < n; i += WG) {
        best = keep(best, src[base + i], i);
    }
    partial_value[lid] = best.value;
    partial_index[lid] = best.index;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            let v = partial_value[lid + stride];
            let i = partial_index[lid + stride];
            if (max_beats(v, i, partial_value[lid], partial_index[lid])) {
                partial_value[lid] = v;
                partial_index[lid] = i;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        dst[params.dst_offset] = partial_value[0];
        idx_out[params.idx_out_offset] = partial_index[0];
    }
}
