// layer_norm over the last axis of [rows, cols], as PyTorch's nn.LayerNorm(cols, eps):
// biased variance, per-column gamma and beta. Reference: src/reference/layer_norm.rs.
//
//   forward:         y = (x - mean_r) * rstd_r * gamma + beta, rstd_r = 1/sqrt(var_r + eps);
//                    also writes mean[r] and rstd[r] (saved for the backward). Two passes for
//                    the variance (mean first, then mean((x - mean)^2)): stable.
//   backward_input:  xhat = (x - mean) rstd, g = dy * gamma,
//                    dx = rstd (g - mean_j g - xhat mean_j(g xhat))
//   backward_params: dgamma[j] = sum_r dy[r, j] xhat[r, j], dbeta[j] = sum_r dy[r, j]
//                    (one invocation per COLUMN, looping over rows in order: deterministic,
//                    no atomics, no partial buffers)
// Gradients are WRITTEN (=), not accumulated; accumulation into .grad is autograd's business.
//
// Entry points (all @workgroup_size(64)): forward and backward_input have one invocation per
// ROW (count = rows); backward_params one per COLUMN (count = cols).
//
// Params (uniform, 64 bytes): { rows: u32, cols: u32, eps: f32, x_offset: u32,
//   gamma_offset: u32, beta_offset: u32, y_offset: u32, mean_offset: u32, rstd_offset: u32,
//   dy_offset: u32, dx_offset: u32, dgamma_offset: u32, dbeta_offset: u32, _pad0..2: u32 }
//   Each *_offset is the element index of that tensor in its binding (the launcher's
//   segment_index: block offset + tensor offset); each entry point reads the offsets of the
//   tensors it binds.
// Bindings (group 0; all storage read_write, WGPU30.md §4; all array<f32>; each the WHOLE
// segment buffer):
//   forward:         0 params, 1 x [rows*cols], 2 gamma [cols], 3 beta [cols],
//                    4 y [rows*cols], 5 mean [rows], 6 rstd [rows]
//   backward_input:  0 params, 1 x, 2 gamma, 3 mean, 4 rstd, 5 dy [rows*cols], 6 dx [rows*cols]
//   backward_params: 0 params, 1 x, 2 mean, 3 rstd, 4 dy, 5 dgamma [cols], 6 dbeta [cols]
// (6 storage buffers: within the default max_storage_buffers_per_shader_stage of 8.)
//
// Dispatch: groups = ceil(count / 64); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); index = gid.x + gid.y * num_workgroups.x * 64;
// `index >= count` returns. 64: each invocation loops over a whole row or column.

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    x_offset: u32,
    gamma_offset: u32,
    beta_offset: u32,
    y_offset: u32,
    mean_offset: u32,
    rstd_offset: u32,
    dy_offset: u32,
    dx_offset: u32,
    dgamma_offset: u32,
    dbeta_offset: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
// forward
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> gamma: array<f32>;
@group(0) @binding(3) var<storage, read_write> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd_out: array<f32>;
// backward_input (x, gamma as above)
@group(0) @binding(3) var<storage, read_write> bi_mean: array<f32>;
@group(0) @binding(4) var<storage, read_write> bi_rstd: array<f32>;
@group(0) @binding(5) var<storage, read_write> bi_dy: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
// backward_params (x as above)
@group(0) @binding(2) var<storage, read_write> bp_mean: array<f32>;
@group(0) @binding(3) var<storage, read_write> bp_rstd: array<f32>;
@group(0) @binding(4) var<storage, read_write> bp_dy: array<f32>;
@group(0) @binding(5) var<storage, read_write> dgamma: array<f32>;
@group(0) @binding(6) var<storage, read_write> dbeta: array<f32>;

fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

@compute @workgroup_size(64)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    let base = params.x_offset + r * params.cols;
    let yb = params.y_offset + r * params.cols;
    let inv_cols = 1.0 / f32(params.cols);
    var sum = 0.0;
    for (var j = 0u; j < params.cols; j++) {
        sum += x[base + j];
    }
    let mean = sum * inv_cols;
    var sq = 0.0;
    for (var j = 0u; j < params.cols; j++) {
        let d = x[base + j] - mean;
        sq += d * d;
    }
    let rstd = inverseSqrt(sq * inv_cols + params.eps);
    for (var j = 0u; j < params.cols; j++) {
        y[yb + j] = (x[base + j] - mean) * rstd * gamma[params.gamma_offset + j]
            + beta[params.beta_offset + j];
    }
    mean_out[params.mean_offset + r] = mean;
    rstd_out[params.rstd_offset + r] = rstd;
}

@compute @workgroup_size(64)
fn backward_input(@builtin(global_invocation_id) gid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    let base = params.x_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    let xb = params.dx_offset + r * params.cols;
    let m = bi_mean[params.mean_offset + r];
    let s = bi_rstd[params.rstd_offset + r];
    var sum_g = 0.0;
    var sum_gx = 0.0;
    for (var j = 0u; j < params.cols; j++) {
        let g = bi_dy[gb + j] * gamma[params.gamma_offset + j];
        sum_g += g;
        sum_gx += g * (x[base + j] - m) * s;
    }
    let inv_cols = 1.0 / f32(params.cols);
    let mean_g = sum_g * inv_cols;
    let mean_gx = sum_gx * inv_cols;
    for (var j = 0u; j < params.cols; j++) {
        let xhat = (x[base + j] - m) * s;
        let g = bi_dy[gb + j] * gamma[params.gamma_offset + j];
        dx[xb + j] = s * (g - mean_g - xhat * mean_gx);
    }
}

@compute @workgroup_size(64)
fn backward_params(@builtin(global_invocation_id) gid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = flat_index(gid, nwg);
    if (j >= params.cols) {
        return;
    }
    var dg = 0.0;
    var db = 0.0;
    for (var r = 0u; r < params.rows; r++) {
        let e = r * params.cols + j;
        let xhat = (x[params.x_offset + e] - bp_mean[params.mean_offset + r])
            * bp_rstd[params.rstd_offset + r];
        let d = bp_dy[params.dy_offset + e];
        dg += d * xhat;
        db += d;
    }
    dgamma[params.dgamma_offset + j] = dg;
    dbeta[params.dbeta_offset + j] = db;
}
