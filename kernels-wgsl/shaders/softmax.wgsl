// softmax: softmax and log-softmax over the last axis of a [rows, cols] row-major matrix, and
// their backwards. Numerically stable: the row max is subtracted before exp.
// Reference: src/reference/softmax.rs.
//
// One invocation per ROW, looping over the columns (three passes: max, sum of exp, write).
// Chosen for clarity and because lavapipe penalises workgroupBarrier; it is slow for few rows
// with very many columns on a real GPU (a workgroup-per-row variant would fix that later).
// Accumulation is f32 (the summed terms are exp(x - max) <= 1).
//
// Entry points (all @workgroup_size(64)):
//   softmax_forward:      y[r, j] = exp(x[r, j] - m_r) / sum_k exp(x[r, k] - m_r)
//   log_softmax_forward:  y[r, j] = x[r, j] - m_r - log sum_k exp(x[r, k] - m_r)
//   softmax_backward:     dx = y * (dy - sum_j dy_j y_j)           (y = softmax output)
//   log_softmax_backward: dx = dy - exp(y) * sum_j dy_j            (y = log-softmax output)
//
// Params (uniform, 32 bytes): { rows: u32, cols: u32, x_offset: u32, y_offset: u32,
//   dy_offset: u32, dx_offset: u32, _pad0: u32, _pad1: u32 }
//   Each *_offset is the element index of that tensor in its binding (the launcher's
//   segment_index: block offset + tensor offset); the forward uses x_offset, y_offset, the
//   backward y_offset, dy_offset, dx_offset.
// Bindings (group 0; all storage read_write, WGPU30.md §4; each the WHOLE segment buffer):
//   *_forward:  0 params, 1 x: array<f32> [rows*cols], 2 y: array<f32> [rows*cols]
//   *_backward: 0 params, 1 y: array<f32> (the forward OUTPUT), 2 dy: array<f32>,
//               3 dx: array<f32>, each [rows*cols]
//
// Dispatch: groups = ceil(rows / 64); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); r = gid.x + gid.y * num_workgroups.x * 64; `r >= rows`
// returns. 64 invocations per workgroup: each does a whole row, so small groups spread rows.

struct Params {
    rows: u32,
    cols: u32,
    x_offset: u32,
    y_offset: u32,
    dy_offset: u32,
    dx_offset: u32,
    _pad0: u32,
    _pad1: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
// backward: y at binding 1 (forward output), then dy, dx
@group(0) @binding(1) var<storage, read_write> y_saved: array<f32>;
@group(0) @binding(2) var<storage, read_write> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

var<private> neg_inf_bits: u32 = 0xff800000u;

fn row_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// (max, sum exp(x - max)) of row r of x
fn row_stats(r: u32) -> vec2<f32> {
    let base = params.x_offset + r * params.cols;
    var m = bitcast<f32>(neg_inf_bits);
    for (var j = 0u; j < params.cols; j++) {
        m = max(m, x[base + j]);
    }
    var s = 0.0;
    for (var j = 0u; j < params.cols; j++) {
        s += exp(x[base + j] - m);
    }
    return vec2<f32>(m, s);
}

@compute @workgroup_size(64)
fn softmax_forward(@builtin(global_invocation_id) gid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    let xb = params.x_offset + r * params.cols;
    let yb = params.y_offset + r * params.cols;
    let stats = row_stats(r);
    let inv_sum = 1.0 / stats.y;
    for (var j = 0u; j < params.cols; j++) {
        y[yb + j] = exp(x[xb + j] - stats.x) * inv_sum;
    }
}

@compute @workgroup_size(64)
fn log_softmax_forward(@builtin(global_invocation_id) gid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    let xb = params.x_offset + r * params.cols;
    let yb = params.y_offset + r * params.cols;
    let stats = row_stats(r);
    let log_sum = log(stats.y);
    for (var j = 0u; j < params.cols; j++) {
        y[yb + j] = (x[xb + j] - stats.x) - log_sum;
    }
}

@compute @workgroup_size(64)
fn softmax_backward(@builtin(global_invocation_id) gid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    let yb = params.y_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    let xb = params.dx_offset + r * params.cols;
    var dot = 0.0;
    for (var j = 0u; j < params.cols; j++) {
        dot += dy[gb + j] * y_saved[yb + j];
    }
    for (var j = 0u; j < params.cols; j++) {
        dx[xb + j] = y_saved[yb + j] * (dy[gb + j] - dot);
    }
}

@compute @workgroup_size(64)
fn log_softmax_backward(@builtin(global_invocation_id) gid: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    let yb = params.y_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    let xb = params.dx_offset + r * params.cols;
    var sum = 0.0;
    for (var j = 0u; j < params.cols; j++) {
        sum += dy[gb + j];
    }
    for (var j = 0u; j < params.cols; j++) {
        dx[xb + j] = dy[gb + j] - exp(y_saved[yb + j]) * sum;
    }
}
