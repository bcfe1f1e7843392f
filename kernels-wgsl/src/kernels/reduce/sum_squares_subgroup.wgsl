// sum_squares_subgroup: reduce.wgsl's sum_squares_chunks with a SUBGROUP per chunk instead of
// an invocation per chunk, so a subgroup reads its chunk in contiguous runs (an invocation per
// chunk reads 256 elements alone, its neighbours' loads landing 256 elements apart). Placed by
// row_subgroup.wgsl, appended (a chunk is its "row"): lane l takes the chunk's elements
// start + l, start + l + lanes, ...; the lanes' sums are added by subgroupAdd (another order
// of additions than reduce.wgsl's: rounding only; the chunks, and so the outputs, are the
// same). Same Params and bindings as sum_squares_chunks (reduce.wgsl's header); dispatch: the
// placement file's, a chunk per subgroup.

const WG: u32 = 64u;
const SQ_CHUNK: u32 = 256u;

@compute @workgroup_size(64)
fn sum_squares_chunks_subgroup(inv: RowInvocation) {
    let c = row_start(inv);
    let n = params.outer * params.axis_len * params.inner;
    let start = c * SQ_CHUNK;
    if (c > 0u && start >= n) {   // past the last chunk (the grid's spare subgroups)
        return;
    }
    let end = min(n, start + SQ_CHUNK);
    let base = params.src_offset;
    var acc = 0.0;
    for (var i = start + lane; i < end; i += lanes) {
        let v = src[base + i];
        acc += v * v;
    }
    let total = row_sum(vec4<f32>(acc, 0.0, 0.0, 0.0)).x;
    if (lane == 0u) {
        dst[params.dst_offset + c] = total;
    }
}
