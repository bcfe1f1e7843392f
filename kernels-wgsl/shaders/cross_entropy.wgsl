// cross_entropy: fused log-softmax + negative log-likelihood over [rows, cols] logits with u32
// class targets and optional label smoothing eps (PyTorch `label_smoothing`: target
// distribution q = (1 - eps) onehot(t) + eps / cols). Reference: src/reference/cross_entropy.rs.
//
//   forward:  loss[r] = (1 - eps)(lse_r - x[r, t]) + eps (lse_r - mean_j x[r, j]),
//             lse_r = m_r + log sum_j exp(x[r, j] - m_r). Per-row losses; the mean loss is
//             reduce.wgsl mean_all on top.
//   backward: dlogits[r, j] = (softmax(x_r)_j - q_j) * dloss[r * dloss_stride] * scale
//             dloss_stride = 0: dloss is ONE value on the device (the gradient of a reduced
//             loss, e.g. 1.0 from backward()), broadcast to every row; = 1: per-row [rows].
//             scale = 1/rows for a mean reduction, 1 for sum/none (host constant).
// A target >= cols is invalid: that row's loss and all its dlogits are NaN (no out-of-bounds
// read; the nonfinite check reports it). The launcher does not validate targets on the host:
// they live on the device, and reading them back would stall the batch.
//
// One invocation per ROW, looping over columns (as softmax.wgsl: clarity, no barriers).
// Entry points (both @workgroup_size(64)): forward, backward.
//
// Params (uniform, 48 bytes):
//   { rows: u32, cols: u32, dloss_stride: u32, smoothing: f32,
//     scale: f32, logits_offset: u32, targets_offset: u32, losses_offset: u32,
//     dloss_offset: u32, dlogits_offset: u32, _pad0: u32, _pad1: u32 }
//   Each *_offset is the element index of that tensor in its binding (the launcher's
//   segment_index: block offset + tensor offset).
//   forward reads rows, cols, smoothing, logits_offset, targets_offset, losses_offset.
// Bindings (group 0; all storage read_write, WGPU30.md §4; each the WHOLE segment buffer):
//   forward:  0 params, 1 logits: array<f32> [rows*cols], 2 targets: array<u32> [rows],
//             3 losses: array<f32> [rows]
//   backward: 0 params, 1 logits, 2 targets, 3 dloss: array<f32> [1 or rows],
//             4 dlogits: array<f32> [rows*cols]
//
// Dispatch: groups = ceil(rows / 64); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); r = gid.x + gid.y * num_workgroups.x * 64; `r >= rows` returns.

struct Params {
    rows: u32,
    cols: u32,
    dloss_stride: u32,
    smoothing: f32,
    scale: f32,
    logits_offset: u32,
    targets_offset: u32,
    losses_offset: u32,
    dloss_offset: u32,
    dlogits_offset: u32,
    _pad0: u32,
    _pad1: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> losses: array<f32>;
// backward
@group(0) @binding(3) var<storage, read_write> dloss: array<f32>;
@group(0) @binding(4) var<storage, read_write> dlogits: array<f32>;

var<private> nan_bits: u32 = 0x7fc00000u;
var<private> neg_inf_bits: u32 = 0xff800000u;

fn row_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// log sum_j exp(x[r, j]) of the row starting at logits[base], stably (max subtracted)
fn log_sum_exp(base: u32) -> f32 {
    var m = bitcast<f32>(neg_inf_bits);
    for (var j = 0u; j < params.cols; j++) {
        m = max(m, logits[base + j]);
    }
    var s = 0.0;
    for (var j = 0u; j < params.cols; j++) {
        s += exp(logits[base + j] - m);
    }
    return m + log(s);
}

@compute @workgroup_size(64)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row_index(gid, nwg);
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
    let lse = log_sum_exp(base);
    var sum_x = 0.0;
    for (var j = 0u; j < params.cols; j++) {
        sum_x += logits[base + j];
    }
    let eps = params.smoothing;
    let mean_x = sum_x / f32(params.cols);
    losses[out] = (1.0 - eps) * (lse - logits[base + t]) + eps * (lse - mean_x);
}

@compute @workgroup_size(64)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    let base = params.logits_offset + r * params.cols;
    let out = params.dlogits_offset + r * params.cols;
    let t = targets[params.targets_offset + r];
    if (t >= params.cols) {
        for (var j = 0u; j < params.cols; j++) {
            dlogits[out + j] = bitcast<f32>(nan_bits);
        }
        return;
    }
    let g = dloss[params.dloss_offset + r * params.dloss_stride] * params.scale;
    let lse = log_sum_exp(base);
    let eps = params.smoothing;
    let uniform_q = eps / f32(params.cols);
    for (var j = 0u; j < params.cols; j++) {
        let q = select(0.0, 1.0 - eps, j == t) + uniform_q;
        dlogits[out + j] = (exp(logits[base + j] - lse) - q) * g;
    }
}
