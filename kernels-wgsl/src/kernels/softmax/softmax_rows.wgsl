// softmax_rows: the four entry points of softmax.wgsl with a WORKGROUP or a SUBGROUP per row
// instead of an invocation per row, for few long rows (a real GPU would otherwise leave most of
// its lanes idle) or rows read in coalesced runs (kernels::row_layout picks). Same Params,
// bindings and formulas as softmax.wgsl; reference: reference.rs.
//
// Placement: row_workgroup.wgsl (the `softmax_rows` module) or row_subgroup.wgsl (the
// `softmax_subgroup` module), appended, give each invocation its row, its `lane` and the
// number of `lanes`. Each lane takes the columns j = lane, lane + lanes, ...; the row's
// statistic (online max and sum of exp; or the dot / sum of dy) is combined across them
// (row_softmax_stats, row_sum: a tree in workgroup memory, or subgroup operations), then each
// lane writes its columns. The order of the additions therefore differs from softmax.wgsl's
// (rounding only).
//
// Dispatch: the placement file's.

const WG: u32 = 64u;

// The causal mask (valid_cols, causal_valid, xv): softmax_mask.wgsl, appended.

// (max, sum exp(x - max)) of row r, combined over its lanes.
fn row_stats(r: u32) -> vec2<f32> {
    let b = params.x_offset + r * params.cols;
    var m = bitcast<f32>(NEG_INF_BITS);
    var s = 0.0;
    for (var j = lane; j < params.cols; j += lanes) {
        let v = xv(b, j);
        let m_new = max(m, v);
        s = s * rescale(m, m_new) + exp(v - shift_of(m_new));
        m = m_new;
    }
    return row_softmax_stats(vec3<f32>(m, s, 0.0)).xy;
}

fn forward_row(r: u32, is_log: bool) {
    valid_cols = causal_valid(r);
    let st = row_stats(r);
    let m = st.x;
    let total = st.y;
    let inv_sum = 1.0 / total;
    let log_sum = log(total);
    let xb = params.x_offset + r * params.cols;
    let yb = params.y_offset + r * params.cols;
    for (var j = lane; j < params.cols; j += lanes) {
        if (is_log) {
            y[yb + j] = (xv(xb, j) - m) - log_sum;
        } else {
            y[yb + j] = exp(xv(xb, j) - m) * inv_sum;
        }
    }
}

@compute @workgroup_size(64)
fn softmax_forward_rows(inv: RowInvocation) {
    let r = row_start(inv);
    if (r >= params.rows) {
        return;
    }
    forward_row(r, false);
}

@compute @workgroup_size(64)
fn log_softmax_forward_rows(inv: RowInvocation) {
    let r = row_start(inv);
    if (r >= params.rows) {
        return;
    }
    forward_row(r, true);
}

// sum over the row of dy * y_saved (dot) or of dy, summed over its lanes.
fn dy_sum(r: u32, dot: bool) -> f32 {
    let yb = params.y_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    var acc = 0.0;
    for (var j = lane; j < params.cols; j += lanes) {
        if (dot) {
            acc += dy[gb + j] * y_saved[yb + j];
        } else {
            acc += dy[gb + j];
        }
    }
    return row_sum(vec4<f32>(acc, 0.0, 0.0, 0.0)).x;
}

fn backward_row(r: u32, is_log: bool) {
    let s = dy_sum(r, !is_log);
    let yb = params.y_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    let xb = params.dx_offset + r * params.cols;
    for (var j = lane; j < params.cols; j += lanes) {
        if (is_log) {
            dx[xb + j] = dy[gb + j] - exp(y_saved[yb + j]) * s;
        } else {
            dx[xb + j] = y_saved[yb + j] * (dy[gb + j] - s);
        }
    }
}

@compute @workgroup_size(64)
fn softmax_backward_rows(inv: RowInvocation) {
    let r = row_start(inv);
    if (r >= params.rows) {
        return;
    }
    backward_row(r, false);
}

@compute @workgroup_size(64)
fn log_softmax_backward_rows(inv: RowInvocation) {
    let r = row_start(inv);
    if (r >= params.rows) {
        return;
    }
    backward_row(r, true);
}
