// layer_norm_rows: layer_norm.wgsl's `forward` and `backward_input` with a WORKGROUP per row
// instead of an invocation per row, for few long rows on a GPU (kernels::softmax::row_layout
// picks). Same Params, bindings and formulas as layer_norm.wgsl (two-pass variance); reference:
// reference.rs. Each of the WG = 64 invocations takes the columns j = lid,
// lid + 64, ...; each row sum is combined by a tree in workgroup memory (so the additions come
// in another order than layer_norm.wgsl's: rounding only).
//
// Dispatch: one workgroup per row; (rows, 1, 1) if rows <= 65535 else (65535, ceil(rows /
// 65535), 1); r = wg.x + wg.y * num_workgroups.x; a workgroup with r >= rows returns at once
// (uniformly, before any barrier). `params.rms`: RMSNorm, as in layer_norm.wgsl.

const WG: u32 = 64u;

// The workgroup's sum of each invocation's `v` (workgroup_reduce.wgsl); every invocation of the
// workgroup must call it.
fn tree_sum(lid: u32, v: vec2<f32>) -> vec2<f32> {
    return workgroup_sum(lid, vec4<f32>(v, 0.0, 0.0)).xy;
}

@compute @workgroup_size(64)
fn forward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let r = row_of(wg, nwg);
    if (r >= params.rows) {
        return;
    }
    let base = params.x_offset + r * params.cols;
    let yb = params.y_offset + r * params.cols;
    let inv_cols = 1.0 / f32(params.cols);
    var acc = 0.0;
    if (params.rms == 0u) {
        for (var j = lid; j < params.cols; j += WG) {
            acc += x[base + j];
        }
    }
    // Every invocation takes part in the tree (acc is 0 everywhere for RMSNorm).
    let mean = tree_sum(lid, vec2<f32>(acc, 0.0)).x * inv_cols;
    var sq = 0.0;
    for (var j = lid; j < params.cols; j += WG) {
        let d = x[base + j] - mean;
        sq += d * d;
    }
    let rstd = inverseSqrt(tree_sum(lid, vec2<f32>(sq, 0.0)).x * inv_cols + params.eps);
    for (var j = lid; j < params.cols; j += WG) {
        let d = x[base + j] - mean;
        var shift = 0.0;
        if (params.rms == 0u) {
            shift = beta[params.beta_offset + j];
        }
        y[yb + j] = d * rstd * gamma[params.gamma_offset + j] + shift;
    }
    if (lid == 0u) {
        mean_out[params.mean_offset + r] = mean;
        rstd_out[params.rstd_offset + r] = rstd;
    }
}

@compute @workgroup_size(64)
fn backward_input_rows(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let r = row_of(wg, nwg);
    if (r >= params.rows) {
        return;
    }
    let base = params.x_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    let xb = params.dx_offset + r * params.cols;
    let m = bi_mean[params.mean_offset + r];
    let s = bi_rstd[params.rstd_offset + r];
    var acc = vec2<f32>(0.0);   // (sum g, sum g * xhat)
    for (var j = lid; j < params.cols; j += WG) {
        let xhat = (x[base + j] - m) * s;
        let g = bi_dy[gb + j] * gamma[params.gamma_offset + j];
        acc += vec2<f32>(g, g * xhat);
    }
    var means = tree_sum(lid, acc) * (1.0 / f32(params.cols));
    if (params.rms != 0u) {
        means.x = 0.0;
    }
    for (var j = lid; j < params.cols; j += WG) {
        let xhat = (x[base + j] - m) * s;
        let g = bi_dy[gb + j] * gamma[params.gamma_offset + j];
        dx[xb + j] = s * (g - means.x - xhat * means.y);
    }
}
