// layer_norm_rows: layer_norm.wgsl's `forward` and `backward_input` with a WORKGROUP or a
// SUBGROUP per row instead of an invocation per row (kernels::row_layout picks). Same Params,
// bindings and formulas as layer_norm.wgsl (two-pass variance); reference: reference.rs.
// Placement: row_workgroup.wgsl (the `layer_norm_rows` module) or row_subgroup.wgsl (the
// `layer_norm_subgroup` module), appended, give each invocation its row, its `lane` and the
// number of `lanes`; each lane takes the columns j = lane, lane + lanes, ...; each row sum is
// combined by row_sum (a tree in workgroup memory, or subgroup operations; so the additions
// come in another order than layer_norm.wgsl's: rounding only). Dispatch: the placement
// file's. `params.rms`: RMSNorm, as in layer_norm.wgsl.

const WG: u32 = 64u;

// The row's sum of each lane's `v` (row_sum); every lane of the row must call it.
fn tree_sum(v: vec2<f32>) -> vec2<f32> {
    return row_sum(vec4<f32>(v, 0.0, 0.0)).xy;
}

@compute @workgroup_size(64)
fn forward_rows(inv: RowInvocation) {
    forward_row(row_start(inv));
}

// forward_add_rows: row r of x = add_a + add_b written into x first (each lane its columns),
// then forward_rows over it: each lane reads back only the columns it wrote.
@compute @workgroup_size(64)
fn forward_add_rows(inv: RowInvocation) {
    let r = row_start(inv);
    if (r < params.rows) {
        let n = params.cols;
        let xb = params.x_offset + r * n;
        let ab = params.a_offset + r * n;
        let bb = params.b_offset + r * n;
        for (var j = lane; j < n; j += lanes) {
            x[xb + j] = add_a[ab + j] + add_b[bb + j];
        }
    }
    forward_row(r);
}

// forward_rows' row r (every lane of the row calls it, as the row sums need).
fn forward_row(r: u32) {
    if (r >= params.rows) {
        return;
    }
    let base = params.x_offset + r * params.cols;
    let yb = params.y_offset + r * params.cols;
    let inv_cols = 1.0 / f32(params.cols);
    var acc = 0.0;
    if (params.rms == 0u) {
        for (var j = lane; j < params.cols; j += lanes) {
            acc += x[base + j];
        }
    }
    // Every lane takes part in the sum (acc is 0 everywhere for RMSNorm).
    let mean = tree_sum(vec2<f32>(acc, 0.0)).x * inv_cols;
    var sq = 0.0;
    for (var j = lane; j < params.cols; j += lanes) {
        let d = x[base + j] - mean;
        sq += d * d;
    }
    let rstd = inverseSqrt(tree_sum(vec2<f32>(sq, 0.0)).x * inv_cols + params.eps);
    for (var j = lane; j < params.cols; j += lanes) {
        let d = x[base + j] - mean;
        var shift = 0.0;
        if (params.rms == 0u) {
            shift = beta[params.beta_offset + j];
        }
        y[yb + j] = d * rstd * gamma[params.gamma_offset + j] + shift;
    }
    if (lane == 0u) {
        mean_out[params.mean_offset + r] = mean;
        rstd_out[params.rstd_offset + r] = rstd;
    }
}

@compute @workgroup_size(64)
fn backward_input_rows(inv: RowInvocation) {
    let r = row_start(inv);
    if (r >= params.rows) {
        return;
    }
    let base = params.x_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    let xb = params.dx_offset + r * params.cols;
    let m = bi_mean[params.mean_offset + r];
    let s = bi_rstd[params.rstd_offset + r];
    var acc = vec2<f32>(0.0);   // (sum g, sum g * xhat)
    for (var j = lane; j < params.cols; j += lanes) {
        let xhat = (x[base + j] - m) * s;
        let g = bi_dy[gb + j] * gamma[params.gamma_offset + j];
        acc += vec2<f32>(g, g * xhat);
    }
    var means = tree_sum(acc) * (1.0 / f32(params.cols));
    if (params.rms != 0u) {
        means.x = 0.0;
    }
    for (var j = lane; j < params.cols; j += lanes) {
        let xhat = (x[base + j] - m) * s;
        let g = bi_dy[gb + j] * gamma[params.gamma_offset + j];
        let v = s * (g - means.x - xhat * means.y);
        if (params.add_dx != 0u) {
            dx[xb + j] = dx[xb + j] + v;
        } else {
            dx[xb + j] = v;
        }
    }
}
