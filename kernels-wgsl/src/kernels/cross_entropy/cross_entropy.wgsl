// cross_entropy: fused log-softmax + negative log-likelihood over [rows, cols] logits with u32
// class targets and optional label smoothing eps (PyTorch `label_smoothing`: target
// distribution q = (1 - eps) onehot(t) + eps / cols). Reference: reference.rs, beside this file.
//
//   forward:  loss[r] = (1 - eps)(lse_r - x[r, t]) + eps (lse_r - mean_j x[r, j]),
//             lse_r = m_r + log sum_j exp(x[r, j] - m_r). Per-row losses; the mean loss is
//             reduce.wgsl mean_all on top.
//   backward: dlogits[r, j] = (softmax(x_r)_j - q_j) * dloss[r * dloss_stride] * scale
//             dloss_stride = 0: dloss is ONE value on the device (the gradient of a reduced
//             loss, e.g. 1.0 from backward()), broadcast to every row; = 1: per-row [rows].
//             scale = 1/rows for a mean reduction, 1 for sum/none (host constant).
// A target >= cols is invalid: that row's loss and all its dlogits are NaN (no out-of-bounds
// read; the mean loss turns NaN, which the trainer's read-back refuses). The launcher does not validate targets on the host:
// they live on the device, and reading them back would stall the batch.
//
// One invocation per ROW, looping over columns (as softmax.wgsl: clarity, no barriers): the
// forward makes one pass over the row (online max and sum of exp as in softmax.wgsl, and the
// sum of x), the backward two (the same statistics, then the write). Loop limit
// (kernels/mod.rs, "Loop limit on lavapipe"): 8 columns per loop pass and a loop of 7 guarded
// steps for the rest, so at most 2 * (cols / 8 + 1 + 8) passes per invocation
// (kernels::cross_entropy::loop_iterations; the launcher refuses more than the adapter's limit).
// Entry points (both @workgroup_size(64)): forward, backward.
//
// Params: declared in mod.rs (`shader_params!`), prepended with the bindings.
//   Each *_offset is the element index of that tensor in its binding (the launcher's
//   segment_index: block offset + tensor offset).
//   forward reads rows, cols, smoothing, logits_offset, targets_offset, losses_offset.
// Bindings (group 0; all storage read_write, docs/wgpu.md §4; each the WHOLE segment buffer):
//   forward:  0 params, 1 logits: array<f32> [rows*cols], 2 targets: array<u32> [rows],
//             3 losses: array<f32> [rows]
//   backward: 0 params, 1 logits, 2 targets, 3 dloss: array<f32> [1 or rows],
//             4 dlogits: array<f32> [rows*cols]
//
// Dispatch: groups = ceil(rows / 64); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); r = gid.x + gid.y * num_workgroups.x * 64; `r >= rows` returns.


const WG: u32 = 64u;

var<private> nan_bits: u32 = 0x7fc00000u;

// Running statistics of a row: max m, s = sum of exp(v - m), and the plain sum of the values.
struct Stats {
    m: f32,
    s: f32,
    sum: f32,
}

fn see(st: Stats, v: f32) -> Stats {
    let m = max(st.m, v);
    return Stats(m, st.s * rescale(st.m, m) + exp(v - shift_of(m)), st.sum + v);
}

// The statistics of the row starting at logits[b], in one pass of 8 columns per loop pass.
fn row_stats(b: u32) -> Stats {
    let n = params.cols;
    var st = Stats(bitcast<f32>(NEG_INF_BITS), 0.0, 0.0);
    var j = 0u;
    for (; j + 8u <= n; j += 8u) {
        let v0 = logits[b + j]; let v1 = logits[b + j + 1u]; let v2 = logits[b + j + 2u];
        let v3 = logits[b + j + 3u]; let v4 = logits[b + j + 4u]; let v5 = logits[b + j + 5u];
        let v6 = logits[b + j + 6u]; let v7 = logits[b + j + 7u];
        let m = max(st.m, max(max(max(v0, v1), max(v2, v3)), max(max(v4, v5), max(v6, v7))));
        let c = shift_of(m);
        st.s = st.s * rescale(st.m, m) + exp(v0 - c) + exp(v1 - c) + exp(v2 - c) + exp(v3 - c)
            + exp(v4 - c) + exp(v5 - c) + exp(v6 - c) + exp(v7 - c);
        st.m = m;
        st.sum += v0 + v1 + v2 + v3 + v4 + v5 + v6 + v7;
    }
    for (var i = 0u; i < 7u; i++) {
        if (j + i < n) { st = see(st, logits[b + j + i]); }
    }
    return st;
}

@compute @workgroup_size(64)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    let t = targets[params.targets_offset + r];
    let out = params.losses_offset + r;
    if (t >= params.cols) {
        losses[out] = bitcast<f32>(nan_bits);
        return;
    }
    let base = params.logits_offset + r * params.cols;
    let st = row_stats(base);
    let lse = st.m + log(st.s);
    let eps = params.smoothing;
    let mean_x = st.sum / f32(params.cols);
    losses[out] = (1.0 - eps) * (lse - logits[base + t]) + eps * (lse - mean_x);
}

// dlogits column j; g is NaN for an invalid target, which makes the whole row NaN.
fn put_grad(base: u32, out: u32, j: u32, t: u32, lse: f32, g: f32, uniform_q: f32) {
    let q = select(0.0, 1.0 - params.smoothing, j == t) + uniform_q;
    dlogits[out + j] = (exp(logits[base + j] - lse) - q) * g;
}

@compute @workgroup_size(64)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
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
    let lse = st.m + log(st.s);
    let uniform_q = params.smoothing / f32(n);
    var j = 0u;
    for (; j + 8u <= n; j += 8u) {
        put_grad(base, out, j, t, lse, g, uniform_q);
        put_grad(base, out, j + 1u, t, lse, g, uniform_q);
        put_grad(base, out, j + 2u, t, lse, g, uniform_q);
        put_grad(base, out, j + 3u, t, lse, g, uniform_q);
        put_grad(base, out, j + 4u, t, lse, g, uniform_q);
        put_grad(base, out, j + 5u, t, lse, g, uniform_q);
        put_grad(base, out, j + 6u, t, lse, g, uniform_q);
        put_grad(base, out, j + 7u, t, lse, g, uniform_q);
    }
    for (var i = 0u; i < 7u; i++) {
        if (j + i < n) { put_grad(base, out, j + i, t, lse, g, uniform_q); }
    }
}
