// softmax_rows: the four entry points of softmax.wgsl with a WORKGROUP per row instead of an
// invocation per row, for few long rows (a real GPU would otherwise leave most of its lanes
// idle; see kernels::row_layout for the launchers' choice). Same Params,
// bindings and formulas as softmax.wgsl; reference: reference.rs.
//
// Each of the WG = 64 invocations of a workgroup takes the columns j = lid, lid + 64, ...; the
// row's statistic (online max and sum of exp; or the dot / sum of dy) is combined across them
// by a tree in workgroup memory (log2(64) = 6 barrier steps), then each invocation writes its
// columns. The order of the additions therefore differs from softmax.wgsl's (rounding only).
//
// Dispatch: one workgroup per row; (rows, 1, 1) if rows <= 65535 else (65535, ceil(rows /
// 65535), 1); r = wg.x + wg.y * num_workgroups.x; a workgroup with r >= rows returns at once
// (uniformly, before any barrier).

const WG: u32 = 64u;

// The causal mask (valid_cols, causal_valid, xv): softmax_mask.wgsl, appended.

// (max, sum exp(x - max)) of row r, combined over the workgroup.
fn row_stats(r: u32, lid: u32) -> vec2<f32> {
    let b = params.x_offset + r * params.cols;
    var m = bitcast<f32>(NEG_INF_BITS);
    var s = 0.0;
    for (var j = lid; j < params.cols; j += WG) {
        let v = xv(b, j);
        let m_new = max(m, v);
        s = s * rescale(m, m_new) + exp(v - shift_of(m_new));
        m = m_new;
    }
    return workgroup_softmax_stats(lid, vec3<f32>(m, s, 0.0)).xy;
}

fn forward_row(r: u32, lid: u32, is_log: bool) {
    valid_cols = causal_valid(r);
    let st = row_stats(r, lid);
    let m = st.x;
    let total = st.y;
    let inv_sum = 1.0 / total;
    let log_sum = log(total);
    let xb = params.x_offset + r * params.cols;
    let yb = params.y_offset + r * params.cols;
    for (var j = lid; j < params.cols; j += WG) {
        if (is_log) {
            y[yb + j] = (xv(xb, j) - m) - log_sum;
        } else {
            y[yb + j] = exp(xv(xb, j) - m) * inv_sum;
        }
    }
}

@compute @workgroup_size(64)
fn softmax_forward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let r = row_of(wg, nwg);
    if (r >= params.rows) {
        return;
    }
    forward_row(r, lid, false);
}

@compute @workgroup_size(64)
fn log_softmax_forward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                            @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32) {
    let r = row_of(wg, nwg);
    if (r >= params.rows) {
        return;
    }
    forward_row(r, lid, true);
}

// sum over the row of dy * y_saved (dot) or of dy, summed over the workgroup.
fn dy_sum(r: u32, lid: u32, dot: bool) -> f32 {
    let yb = params.y_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    var acc = 0.0;
    for (var j = lid; j < params.cols; j += WG) {
        if (dot) {
            acc += dy[gb + j] * y_saved[yb + j];
        } else {
            acc += dy[gb + j];
        }
    }
    return workgroup_sum(lid, vec4<f32>(acc, 0.0, 0.0, 0.0)).x;
}

fn backward_row(r: u32, lid: u32, is_log: bool) {
    let s = dy_sum(r, lid, !is_log);
    let yb = params.y_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    let xb = params.dx_offset + r * params.cols;
    for (var j = lid; j < params.cols; j += WG) {
        if (is_log) {
            dx[xb + j] = dy[gb + j] - exp(y_saved[yb + j]) * s;
        } else {
            dx[xb + j] = y_saved[yb + j] * (dy[gb + j] - s);
        }
    }
}

@compute @workgroup_size(64)
fn softmax_backward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let r = row_of(wg, nwg);
    if (r >= params.rows) {
        return;
    }
    backward_row(r, lid, false);
}

@compute @workgroup_size(64)
fn log_softmax_backward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                             @builtin(num_workgroups) nwg: vec3<u32>,
                             @builtin(local_invocation_index) lid: u32) {
    let r = row_of(wg, nwg);
    if (r >= params.rows) {
        return;
    }
    backward_row(r, lid, true);
}
