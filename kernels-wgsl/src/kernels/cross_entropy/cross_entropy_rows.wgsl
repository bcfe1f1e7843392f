// cross_entropy_rows: cross_entropy.wgsl's `forward` and `backward` with a WORKGROUP per row
// instead of an invocation per row, for few long rows (large vocabularies) on a GPU
// (kernels::row_layout picks). Same Params, bindings and formulas; reference:
// reference.rs. Each of the WG = 64 invocations takes the columns j = lid,
// lid + 64, ...; the row's statistics (online max and sum of exp, plain sum) are combined by a
// tree in workgroup memory (another order of additions than cross_entropy.wgsl: rounding only).
//
// Dispatch: one workgroup per row; (rows, 1, 1) if rows <= 65535 else (65535, ceil(rows /
// 65535), 1); r = wg.x + wg.y * num_workgroups.x; a workgroup with r >= rows returns at once
// (uniformly, before any barrier).

const WG: u32 = 64u;
var<private> nan_bits: u32 = 0x7fc00000u;

// The row's (max, sum of exp(x - max), sum of x), combined over the workgroup.
fn row_stats(base: u32, lid: u32) -> vec3<f32> {
    var m = bitcast<f32>(NEG_INF_BITS);
    var s = 0.0;
    var sum = 0.0;
    for (var j = lid; j < params.cols; j += WG) {
        let v = logits[base + j];
        let m_new = max(m, v);
        s = s * rescale(m, m_new) + exp(v - shift_of(m_new));
        m = m_new;
        sum += v;
    }
    return workgroup_softmax_stats(lid, vec3<f32>(m, s, sum));
}

@compute @workgroup_size(64)
fn forward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let r = row_of(wg, nwg);
    if (r >= params.rows) {
        return;
    }
    let base = params.logits_offset + r * params.cols;
    let st = row_stats(base, lid);
    if (lid != 0u) {
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
fn backward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let r = row_of(wg, nwg);
    if (r >= params.rows) {
        return;
    }
    let base = params.logits_offset + r * params.cols;
    let out = params.dlogits_offset + r * params.cols;
    let t = targets[params.targets_offset + r];
    let n = params.cols;
    let g = select(dloss[params.dloss_offset + r * params.dloss_stride] * params.scale,
                   bitcast<f32>(nan_bits), t >= n);
    let st = row_stats(base, lid);
    let lse = st.x + log(st.y);
    let uniform_q = params.smoothing / f32(n);
    for (var j = lid; j < n; j += WG) {
        let q = select(0.0, 1.0 - params.smoothing, j == t) + uniform_q;
        dlogits[out + j] = (exp(logits[base + j] - lse) - q) * g;
    }
}
