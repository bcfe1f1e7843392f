// cross_entropy_rows: cross_entropy.wgsl's `forward` and `backward` with a WORKGROUP or a
// SUBGROUP per row instead of an invocation per row, for few long rows (large vocabularies) or
// coalesced reads on a GPU (kernels::row_layout picks). Same Params, bindings and formulas;
// reference: reference.rs. Placement: row_workgroup.wgsl (the `cross_entropy_rows` module) or
// row_subgroup.wgsl (the `cross_entropy_subgroup` module), appended, give each invocation its
// row, its `lane` and the number of `lanes`; each lane takes the columns j = lane, lane +
// lanes, ...; the row's statistics (online max and sum of exp, plain sum) are combined by
// row_softmax_stats (a tree in workgroup memory, or subgroup operations: another order of
// additions than cross_entropy.wgsl, rounding only). Dispatch: the placement file's.

const WG: u32 = 64u;
var<private> nan_bits: u32 = 0x7fc00000u;

// The row's (max, sum of exp(x - max), sum of x), combined over its lanes.
fn row_stats(base: u32) -> vec3<f32> {
    var m = bitcast<f32>(NEG_INF_BITS);
    var s = 0.0;
    var sum = 0.0;
    for (var j = lane; j < params.cols; j += lanes) {
        let v = logits[base + j];
        let m_new = max(m, v);
        s = s * rescale(m, m_new) + exp(v - shift_of(m_new));
        m = m_new;
        sum += v;
    }
    return row_softmax_stats(vec3<f32>(m, s, sum));
}

@compute @workgroup_size(64)
fn forward_rows(inv: RowInvocation) {
    let r = row_start(inv);
    if (r >= params.rows) {
        return;
    }
    let base = params.logits_offset + r * params.cols;
    let st = row_stats(base);
    if (lane != 0u) {
        return;
    }
    let t = targets[params.targets_offset + r];
    let out = params.losses_offset + r;
    if (t >= params.cols) {
        losses[out] = bitcast<f32>(nan_bits);
        return;
    }
    let lse = st.x + log(st.y);
    let eps = params.smoothing;
    let mean_x = st.z / f32(params.cols);
    losses[out] = (1.0 - eps) * (lse - logits[base + t]) + eps * (lse - mean_x);
}

@compute @workgroup_size(64)
fn backward_rows(inv: RowInvocation) {
    let r = row_start(inv);
    if (r >= params.rows) {
        return;
    }
    let base = params.logits_offset + r * params.cols;
    let out = params.dlogits_offset + r * params.cols;
    let t = targets[params.targets_offset + r];
    let n = params.cols;
    let g = select(dloss[params.dloss_offset + r * params.dloss_stride] * params.scale,
                   bitcast<f32>(nan_bits), t >= n);
    let st = row_stats(base);
    let lse = st.x + log(st.y);
    let uniform_q = params.smoothing / f32(n);
    for (var j = lane; j < n; j += lanes) {
        let q = select(0.0, 1.0 - params.smoothing, j == t) + uniform_q;
        dlogits[out + j] = (exp(logits[base + j] - lse) - q) * g;
    }
}
