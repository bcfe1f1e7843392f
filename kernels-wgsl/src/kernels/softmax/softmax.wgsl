// softmax: softmax and log-softmax over the last axis of a [rows, cols] row-major matrix, and
// their backwards. Numerically stable: the row max is subtracted before exp.
// Reference: reference.rs, beside this file.
//
// One invocation per ROW, looping over the columns: two passes over the row (forward: max and
// sum of exp together by the online-softmax recurrence, then the write; backward: the dot or
// sum, then the write). Chosen for clarity and because lavapipe penalises workgroupBarrier; it
// is slow for few rows with very many columns on a real GPU (a workgroup-per-row variant would
// fix that later). Accumulation is f32 (the summed terms are exp(x - max) <= 1).
//
// Loop limit (kernels/mod.rs, "Loop limit on lavapipe"): every column loop takes 8 columns per
// pass and the remainder (< 8) in a loop of 7 guarded steps, so each entry point costs
// 2 * (cols / 8 + 1 + 8) loop passes per invocation (kernels::softmax::loop_iterations; the
// launcher refuses more than the adapter's limit: cols <= 262_071 on lavapipe).
//
// Entry points (all @workgroup_size(64)):
//   softmax_forward:      y[r, j] = exp(x[r, j] - m_r) / sum_k exp(x[r, k] - m_r)
//   log_softmax_forward:  y[r, j] = x[r, j] - m_r - log sum_k exp(x[r, k] - m_r)
//   softmax_backward:     dx = y * (dy - sum_j dy_j y_j)           (y = softmax output)
//   log_softmax_backward: dx = dy - exp(y) * sum_j dy_j            (y = log-softmax output)
//
// Params: declared in mod.rs (`shader_params!`), prepended with the bindings.
//   causal: 0, or T for a causal softmax of [.., T, T] scores (softmax_forward only; see
//   causal_valid: the masked columns come out 0).
//   Each *_offset is the element index of that tensor in its binding (the launcher's
//   segment_index: block offset + tensor offset); the forward uses x_offset, y_offset, the
//   backward y_offset, dy_offset, dx_offset.
// Bindings (group 0; all storage read_write, docs/wgpu.md §4; each the WHOLE segment buffer):
//   *_forward:  0 params, 1 x: array<f32> [rows*cols], 2 y: array<f32> [rows*cols]
//   *_backward: 0 params, 1 y: array<f32> (the forward OUTPUT), 2 dy: array<f32>,
//               3 dx: array<f32>, each [rows*cols]
//
// Dispatch: groups = ceil(rows / 64); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); r = gid.x + gid.y * num_workgroups.x * 64; `r >= rows`
// returns. 64 invocations per workgroup: each does a whole row, so small groups spread rows.


const WG: u32 = 64u;

// The causal mask (valid_cols, causal_valid, xv): softmax_mask.wgsl, appended.

// Online softmax: running max m and s = sum of exp(v - m) over the values seen so far.
struct Stats {
    m: f32,
    s: f32,
}

fn see(st: Stats, v: f32) -> Stats {
    let m = max(st.m, v);
    return Stats(m, st.s * rescale(st.m, m) + exp(v - shift_of(m)));
}

// (max, sum exp(x - max)) of row r of x, in one pass: 8 columns per loop pass, then the rest.
fn row_stats(r: u32) -> Stats {
    let b = params.x_offset + r * params.cols;
    let n = params.cols;
    var st = Stats(bitcast<f32>(NEG_INF_BITS), 0.0);
    var j = 0u;
    for (; j + 8u <= n; j += 8u) {
        let v0 = xv(b, j); let v1 = xv(b, j + 1u); let v2 = xv(b, j + 2u); let v3 = xv(b, j + 3u);
        let v4 = xv(b, j + 4u); let v5 = xv(b, j + 5u); let v6 = xv(b, j + 6u);
        let v7 = xv(b, j + 7u);
        let m = max(st.m, max(max(max(v0, v1), max(v2, v3)), max(max(v4, v5), max(v6, v7))));
        let c = shift_of(m);
        st.s = st.s * rescale(st.m, m) + exp(v0 - c) + exp(v1 - c) + exp(v2 - c) + exp(v3 - c)
            + exp(v4 - c) + exp(v5 - c) + exp(v6 - c) + exp(v7 - c);
        st.m = m;
    }
    for (var i = 0u; i < 7u; i++) {
        if (j + i < n) { st = see(st, xv(b, j + i)); }
    }
    return st;
}

// Output column j of a forward (softmax when log is false).
fn put_forward(xb: u32, yb: u32, j: u32, m: f32, inv_sum: f32, log_sum: f32, is_log: bool) {
    if (is_log) {
        y[yb + j] = (xv(xb, j) - m) - log_sum;
    } else {
        y[yb + j] = exp(xv(xb, j) - m) * inv_sum;
    }
}

fn forward_row(r: u32, is_log: bool) {
    valid_cols = causal_valid(r);
    let xb = params.x_offset + r * params.cols;
    let yb = params.y_offset + r * params.cols;
    let st = row_stats(r);
    let inv_sum = 1.0 / st.s;
    let log_sum = log(st.s);
    let n = params.cols;
    var j = 0u;
    for (; j + 8u <= n; j += 8u) {
        put_forward(xb, yb, j, st.m, inv_sum, log_sum, is_log);
        put_forward(xb, yb, j + 1u, st.m, inv_sum, log_sum, is_log);
        put_forward(xb, yb, j + 2u, st.m, inv_sum, log_sum, is_log);
        put_forward(xb, yb, j + 3u, st.m, inv_sum, log_sum, is_log);
        put_forward(xb, yb, j + 4u, st.m, inv_sum, log_sum, is_log);
        put_forward(xb, yb, j + 5u, st.m, inv_sum, log_sum, is_log);
        put_forward(xb, yb, j + 6u, st.m, inv_sum, log_sum, is_log);
        put_forward(xb, yb, j + 7u, st.m, inv_sum, log_sum, is_log);
    }
    for (var i = 0u; i < 7u; i++) {
        if (j + i < n) { put_forward(xb, yb, j + i, st.m, inv_sum, log_sum, is_log); }
    }
}

@compute @workgroup_size(64)
fn softmax_forward(@builtin(global_invocation_id) gid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    forward_row(r, false);
}

@compute @workgroup_size(64)
fn log_softmax_forward(@builtin(global_invocation_id) gid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    forward_row(r, true);
}

// sum over j < cols of dy[gb + j] * w(j), w(j) = y_saved[yb + j] (dot) or 1 (plain sum), in
// column order, 8 per loop pass.
fn dy_sum(gb: u32, yb: u32, dot: bool) -> f32 {
    let n = params.cols;
    var acc = 0.0;
    var j = 0u;
    for (; j + 8u <= n; j += 8u) {
        acc += dy_term(gb, yb, j, dot);
        acc += dy_term(gb, yb, j + 1u, dot);
        acc += dy_term(gb, yb, j + 2u, dot);
        acc += dy_term(gb, yb, j + 3u, dot);
        acc += dy_term(gb, yb, j + 4u, dot);
        acc += dy_term(gb, yb, j + 5u, dot);
        acc += dy_term(gb, yb, j + 6u, dot);
        acc += dy_term(gb, yb, j + 7u, dot);
    }
    for (var i = 0u; i < 7u; i++) {
        if (j + i < n) { acc += dy_term(gb, yb, j + i, dot); }
    }
    return acc;
}

fn dy_term(gb: u32, yb: u32, j: u32, dot: bool) -> f32 {
    if (dot) {
        return dy[gb + j] * y_saved[yb + j];
    }
    return dy[gb + j];
}

// dx column j of a backward (softmax when log is false); s is the row's dy_sum.
fn put_backward(yb: u32, gb: u32, xb: u32, j: u32, s: f32, is_log: bool) {
    if (is_log) {
        dx[xb + j] = dy[gb + j] - exp(y_saved[yb + j]) * s;
    } else {
        dx[xb + j] = y_saved[yb + j] * (dy[gb + j] - s);
    }
}

fn backward_row(r: u32, is_log: bool) {
    let yb = params.y_offset + r * params.cols;
    let gb = params.dy_offset + r * params.cols;
    let xb = params.dx_offset + r * params.cols;
    let s = dy_sum(gb, yb, !is_log);
    let n = params.cols;
    var j = 0u;
    for (; j + 8u <= n; j += 8u) {
        put_backward(yb, gb, xb, j, s, is_log);
        put_backward(yb, gb, xb, j + 1u, s, is_log);
        put_backward(yb, gb, xb, j + 2u, s, is_log);
        put_backward(yb, gb, xb, j + 3u, s, is_log);
        put_backward(yb, gb, xb, j + 4u, s, is_log);
        put_backward(yb, gb, xb, j + 5u, s, is_log);
        put_backward(yb, gb, xb, j + 6u, s, is_log);
        put_backward(yb, gb, xb, j + 7u, s, is_log);
    }
    for (var i = 0u; i < 7u; i++) {
        if (j + i < n) { put_backward(yb, gb, xb, j + i, s, is_log); }
    }
}

@compute @workgroup_size(64)
fn softmax_backward(@builtin(global_invocation_id) gid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    backward_row(r, false);
}

@compute @workgroup_size(64)
fn log_softmax_backward(@builtin(global_invocation_id) gid: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = flat_index(gid, nwg);
    if (r >= params.rows) {
        return;
    }
    backward_row(r, true);
}
