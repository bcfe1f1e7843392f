// layer_norm over the last axis of [rows, cols], as PyTorch's nn.LayerNorm(cols, eps):
// biased variance, per-column gamma and beta. Reference: reference.rs, beside this file.
//
//   forward:         y = (x - mean_r) * rstd_r * gamma + beta, rstd_r = 1/sqrt(var_r + eps);
//                    also writes mean[r] and rstd[r] (saved for the backward). Two passes for
//                    the variance (mean first, then mean((x - mean)^2)): stable.
//   backward_input:  xhat = (x - mean) rstd, g = dy * gamma,
//                    dx = rstd (g - mean_j g - xhat mean_j(g xhat))
//   backward_params: dgamma[j] = sum_r dy[r, j] xhat[r, j], dbeta[j] = sum_r dy[r, j]
//                    (one invocation per COLUMN, looping over rows in order: deterministic,
//                    no atomics, no partial buffers)
// Gradients are WRITTEN (=), not accumulated, except dx with params.add_dx (below).
//
// RMSNorm (`params.rms` = 1, as PyTorch's nn.RMSNorm and Hugging Face's LlamaRMSNorm): the same
// formulas with the mean taken as 0 and no beta: y = x * rstd * gamma, rstd = 1/sqrt(mean(x^2)
// + eps), and dx = rstd (g - xhat mean_j(g xhat)). forward writes mean[r] = 0; backward_params
// writes dbeta = sum_r dy, which the caller discards.
//
// Entry points (all @workgroup_size(64)): forward and backward_input have one invocation per
// ROW (count = rows); backward_params one per COLUMN (count = cols), columns params.start ..
// params.end (the launch, or one range of it under a submission bound).
//
// Params: declared in mod.rs (`shader_params!`), prepended with the bindings.
//   Each *_offset is the element index of that tensor in its binding (the launcher's
//   segment_index: block offset + tensor offset); each entry point reads the offsets of the
//   tensors it binds.
// Bindings (group 0; all storage read_write, docs/wgpu.md §4; all array<f32>; each the WHOLE
// segment buffer):
//   forward:         0 params, 1 x [rows*cols], 2 gamma [cols], 3 beta [cols],
//                    4 y [rows*cols], 5 mean [rows], 6 rstd [rows]
//   forward_add:     forward's, then 7 add_a, 8 add_b [rows*cols] (x is then their sum, written)
//   backward_input:  0 params, 1 x, 2 gamma, 3 mean, 4 rstd, 5 dy [rows*cols], 6 dx [rows*cols]
//   backward_params: 0 params, 1 x, 2 mean, 3 rstd, 4 dy, 5 dgamma [cols], 6 dbeta [cols]
// (6 storage buffers, 8 for forward_add: within the default max_storage_buffers_per_shader_stage
// of 8.) params.add_dx: backward_input adds dx to what its binding holds (dx += ..., the
// gradient of a tensor that also reached it another way) instead of writing it.
//
// Dispatch: groups = ceil(count / 64); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); index = gid.x + gid.y * num_workgroups.x * 64;
// `index >= count` returns. 64: each invocation loops over a whole row or column.
//
// Loop limit (kernels/mod.rs, "Loop limit on lavapipe"): every loop takes 8 elements per pass
// and finishes the rest in a loop of 7 guarded steps, in the same order as a plain loop, so one
// invocation runs at most 3 * (cols / 8 + 1 + 8) passes (forward; backward_input: 2 loops) or
// rows / 8 + 1 + 8 (backward_params): kernels::layer_norm::{row_loop_iterations,
// column_loop_iterations}; the launcher refuses more than the adapter's limit.


const WG: u32 = 64u;

// The three column loops of forward: 0 = sum x, 1 = sum (x - mean)^2, 2 = write y.
fn forward_step(pass_: u32, base: u32, yb: u32, j: u32, mean: f32, rstd: f32) -> f32 {
    let v = x[base + j];
    if (pass_ == 0u) {
        return v;
    }
    let d = v - mean;
    if (pass_ == 1u) {
        return d * d;
    }
    var shift = 0.0;
    if (params.rms == 0u) {
        shift = beta[params.beta_offset + j];
    }
    y[yb + j] = d * rstd * gamma[params.gamma_offset + j] + shift;
    return 0.0;
}

// Sum over j < cols of forward_step(pass_, ..), in column order, 8 per loop pass.
fn forward_loop(pass_: u32, base: u32, yb: u32, mean: f32, rstd: f32) -> f32 {
    let n = params.cols;
    var acc = 0.0;
    var j = 0u;
    for (; j + 8u <= n; j += 8u) {
        acc += forward_step(pass_, base, yb, j, mean, rstd);
        acc += forward_step(pass_, base, yb, j + 1u, mean, rstd);
        acc += forward_step(pass_, base, yb, j + 2u, mean, rstd);
        acc += forward_step(pass_, base, yb, j + 3u, mean, rstd);
        acc += forward_step(pass_, base, yb, j + 4u, mean, rstd);
        acc += forward_step(pass_, base, yb, j + 5u, mean, rstd);
        acc += forward_step(pass_, base, yb, j + 6u, mean, rstd);
        acc += forward_step(pass_, base, yb, j + 7u, mean, rstd);
    }
    for (var i = 0u; i < 7u; i++) {
        if (j + i < n) { acc += forward_step(pass_, base, yb, j + i, mean, rstd); }
    }
    return acc;
}

@compute @workgroup_size(64)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    forward_row(r);
}

// forward_add: row r of x = add_a + add_b written into x (binding 1, the sum) first, 8 columns
// per loop pass, then forward over it; this invocation reads back only what it wrote.
@compute @workgroup_size(64)
fn forward_add(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    let n = params.cols;
    let xb = params.x_offset + r * n;
    let ab = params.a_offset + r * n;
    let bb = params.b_offset + r * n;
    var j = 0u;
    for (; j + 8u <= n; j += 8u) {
        add_at(xb + j, ab + j, bb + j);
        add_at(xb + j + 1u, ab + j + 1u, bb + j + 1u);
        add_at(xb + j + 2u, ab + j + 2u, bb + j + 2u);
        add_at(xb + j + 3u, ab + j + 3u, bb + j + 3u);
        add_at(xb + j + 4u, ab + j + 4u, bb + j + 4u);
        add_at(xb + j + 5u, ab + j + 5u, bb + j + 5u);
        add_at(xb + j + 6u, ab + j + 6u, bb + j + 6u);
        add_at(xb + j + 7u, ab + j + 7u, bb + j + 7u);
    }
    for (var i = 0u; i < 7u; i++) {
        if (j + i < n) { add_at(xb + j + i, ab + j + i, bb + j + i); }
    }
    forward_row(r);
}

fn add_at(xi: u32, ai: u32, bi: u32) {
    x[xi] = add_a[ai] + add_b[bi];
}

// forward's row r: mean, rstd and y from x.
fn forward_row(r: u32) {
    let base = params.x_offset + r * params.cols;
    let yb = params.y_offset + r * params.cols;
    let inv_cols = 1.0 / f32(params.cols);
    var mean = 0.0;
    if (params.rms == 0u) {
        mean = forward_loop(0u, base, yb, 0.0, 0.0) * inv_cols;
    }
    let sq = forward_loop(1u, base, yb, mean, 0.0);
    let rstd = inverseSqrt(sq * inv_cols + params.eps);
    forward_loop(2u, base, yb, mean, rstd);
    mean_out[params.mean_offset + r] = mean;
    rstd_out[params.rstd_offset + r] = rstd;
}

// Column j of backward_input: adds (g, g * xhat) to acc, or (write) writes dx from the means.
fn input_step(acc: vec2<f32>, write: bool, base: u32, gb: u32, xb: u32, j: u32, m: f32,
              s: f32, means: vec2<f32>) -> vec2<f32> {
    let xhat = (x[base + j] - m) * s;
    let g = bi_dy[gb + j] * gamma[params.gamma_offset + j];
    if (write) {
        let v = s * (g - means.x - xhat * means.y);
        if (params.add_dx != 0u) {
            dx[xb + j] = dx[xb + j] + v;
        } else {
            dx[xb + j] = v;
        }
        return acc;
    }
    return acc + vec2<f32>(g, g * xhat);
}

// Both column loops of backward_input, 8 columns per loop pass.
fn input_loop(write: bool, base: u32, gb: u32, xb: u32, m: f32, s: f32,
              means: vec2<f32>) -> vec2<f32> {
    let n = params.cols;
    var acc = vec2<f32>(0.0);
    var j = 0u;
    for (; j + 8u <= n; j += 8u) {
        acc = input_step(acc, write, base, gb, xb, j, m, s, means);
        acc = input_step(acc, write, base, gb, xb, j + 1u, m, s, means);
        acc = input_step(acc, write, base, gb, xb, j + 2u, m, s, means);
        acc = input_step(acc, write, base, gb, xb, j + 3u, m, s, means);
        acc = input_step(acc, write, base, gb, xb, j + 4u, m, s, means);
        acc = input_step(acc, write, base, gb, xb, j + 5u, m, s, means);
        acc = input_step(acc, write, base, gb, xb, j + 6u, m, s, means);
        acc = input_step(acc, write, base, gb, xb, j + 7u, m, s, means);
    }
    for (var i = 0u; i < 7u; i++) {
        if (j + i < n) { acc = input_step(acc, write, base, gb, xb, j + i, m, s, means); }
    }
    return acc;
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
    let sums = input_loop(false, base, gb, xb, m, s, vec2<f32>(0.0));
    var means = sums * (1.0 / f32(params.cols));
    if (params.rms != 0u) {
        means.x = 0.0;
    }
    input_loop(true, base, gb, xb, m, s, means);
}

// Row r's terms (dy xhat, dy) of column j's parameter gradients.
fn params_term(r: u32, j: u32) -> vec2<f32> {
    let e = r * params.cols + j;
    let xhat = (x[params.x_offset + e] - bp_mean[params.mean_offset + r])
        * bp_rstd[params.rstd_offset + r];
    let d = bp_dy[params.dy_offset + e];
    return vec2<f32>(d * xhat, d);
}

@compute @workgroup_size(64)
fn backward_params(@builtin(global_invocation_id) gid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = params.start + flat_index(gid, nwg);
    if (j >= params.end) {
        return;
    }
    let n = params.rows;
    var acc = vec2<f32>(0.0);   // (dgamma, dbeta), rows in order, 8 per loop pass
    var r = 0u;
    for (; r + 8u <= n; r += 8u) {
        acc += params_term(r, j);
        acc += params_term(r + 1u, j);
        acc += params_term(r + 2u, j);
        acc += params_term(r + 3u, j);
        acc += params_term(r + 4u, j);
        acc += params_term(r + 5u, j);
        acc += params_term(r + 6u, j);
        acc += params_term(r + 7u, j);
    }
    for (var i = 0u; i < 7u; i++) {
        if (r + i < n) { acc += params_term(r + i, j); }
    }
    dgamma[params.dgamma_offset + j] = acc.x;
    dbeta[params.dbeta_offset + j] = acc.y;
}
