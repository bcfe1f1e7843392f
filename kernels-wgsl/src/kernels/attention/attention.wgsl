// attention: causal scaled-dot-product attention that never stores the T x T scores or
// probabilities (FlashAttention's algorithm, Dao et al. 2022, in its second version's loop
// order). Forward: each query row runs over tiles of keys and values held in workgroup memory,
// keeping a running maximum `m` and sum `l` of exp(score - m) (online softmax) and the output
// accumulated under the same rescaling; it saves the row's log-sum-exp `m + log l`. Backward:
// the probabilities are recomputed from that log-sum-exp; `attention_backward_dq` (one
// invocation per query row) also writes `delta = rowsum(dO * O)`, which
// `attention_backward_dkdv` (one invocation per key row, over tiles of queries) reads.
//
// Storage: q, k, v and (read in the backward) o are read through `ld_q`, `ld_k`, `ld_v`, `ld_o`
// (an element index in, f32 out): `attention_io.wgsl` reads f32 bindings, `attention_io_f16.wgsl`
// packed f16 ones (`q_h`, `k_h`, `v_h`, `o_h`, offsets in halves), appended to make the module
// `attention` or `attention_f16`. Everything else (o written by the forward, lse, d_o, delta and
// the gradients) is f32 in both, and all arithmetic is f32.
//
// Layout: q, o, d_o, dq are [BH, T, D] row-major from their `*_offset`; lse and delta are
// [BH, T]; k, v, dk, dv are [BH / G, T, D] with G = `params.group` query heads per key/value
// head (grouped-query attention; 1: multi-head): query head h reads key/value head h / G, so
// the G query heads of a group are consecutive. `attention_backward_dkdv` is dispatched once
// per member g of a group (`params.member`), one workgroup per key/value head, reading query
// head kv * G + g: the first writes dk and dv, each further one adds to them, in order (no
// atomics, no copies of k and v, and each invocation loops no more than without groups). `Params` and the bindings are declared in mod.rs (`shader_params!`,
// `kernel!`) and prepended. Dispatch: workgroups (ceil(T / ROWS), BH) (dkdv: BH / G), one invocation a row;
// rows at or past T only help load tiles. Rows are padded to `dp` (D rounded up to 8) with
// zeros in private and workgroup memory, so the inner loops take 8 elements a pass (the loop
// limit of lavapipe, see kernels/mod.rs; mod.rs's `loop_iterations` counts every loop).
// Scores are `scale * q.k`: q is scaled as it is loaded.
//
// Dropout on the probabilities (`params.dropout` > 0, training): probability (bh, i, j) is
// kept, times `params.drop_scale` = 1 / (1 - p), when `dropout_kept(key, (bh * T + i) * T + j)`
// (`shaders/counter_hash.wgsl`, appended): the mask the `dropout` kernel draws over the
// reference path's [BH, T, T] probabilities with the same seed. The softmax's sum `l` is over
// the probabilities as they were; only what multiplies `v` (forward), `dO` (dv) and `dO vᵀ`
// (dP) is dropped, and `delta = rowsum(dO * O)` already includes it.

const ROWS: u32 = 64u;
const TILE: u32 = 16u;
const DMAX: u32 = 128u;
const NEG: f32 = -3.0e38;

var<workgroup> tile_a: array<f32, 2048>; // TILE * DMAX: keys (forward, dq) or scaled queries
var<workgroup> tile_b: array<f32, 2048>; // values (forward, dq) or output gradients (dkdv)
var<workgroup> tile_lse: array<f32, 16>;
var<workgroup> tile_delta: array<f32, 16>;

fn padded_dim() -> u32 {
    return (params.head_dim + 7u) / 8u * 8u;
}

// What probability (bh, i, j) is multiplied by: 1 without dropout, else 0 or 1 / (1 - p).
// `bh` counts from the dispatch's first query head, `params.head_start` (a launch split in
// blocks of heads under a submission bound): the mask is that of the whole launch.
fn kept(key: u32, bh: u32, i: u32, j: u32) -> f32 {
    if params.dropout <= 0.0 {
        return 1.0;
    }
    let t = params.time;
    let h = params.head_start + bh;
    return select(0.0, params.drop_scale, dropout_kept(key, (h * t + i) * t + j, params.dropout));
}

// Keys j0..j0 + TILE of the head at `base` into tile_a and their values into tile_b (row stride
// `dp`, zeros past T and past D), this invocation's share of them (forward and dq).
fn load_key_tile(lane: u32, base: u32, j0: u32, dp: u32) {
    let t = params.time;
    let d = params.head_dim;
    for (var e = lane; e < TILE * dp; e = e + ROWS) {
        let j = j0 + e / dp;
        let c = e % dp;
        var kx = 0.0;
        var vx = 0.0;
        if j < t && c < d {
            kx = ld_k(params.k_offset + base + j * d + c);
            vx = ld_v(params.v_offset + base + j * d + c);
        }
        tile_a[e] = kx;
        tile_b[e] = vx;
    }
}

@compute @workgroup_size(64)
fn attention_forward(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let t = params.time;
    let d = params.head_dim;
    let dp = padded_dim();
    let base = wid.y * t * d;
    let kv_base = (wid.y / params.group) * t * d;
    let row0 = wid.x * ROWS;
    let i = row0 + lid.x;
    let live = i < t;
    var qr: array<f32, 128>;
    var acc: array<f32, 128>;
    for (var c = 0u; c < dp; c = c + 1u) {
        var x = 0.0;
        if live && c < d {
            x = ld_q(params.q_offset + base + i * d + c) * params.scale;
        }
        qr[c] = x;
        acc[c] = 0.0;
    }
    var m = NEG;
    var l = 0.0;
    let key = dropout_key(params.seed_lo, params.seed_hi);
    let tiles = (min(row0 + ROWS, t) - 1u) / TILE + 1u;
    for (var tile = 0u; tile < tiles; tile = tile + 1u) {
        let j0 = tile * TILE;
        load_key_tile(lid.x, kv_base, j0, dp);
        workgroupBarrier();
        // Every row of the workgroup runs the same loops (uniform control flow and tile
        // indices: lavapipe broadcasts the tile's loads); keys after the row are masked.
        {
            var s: array<f32, 16>;
            var mt = m;
            for (var jj = 0u; jj < TILE; jj = jj + 1u) {
                let kb = jj * dp;
                var dot = 0.0;
                for (var c = 0u; c < dp; c = c + 8u) {
                    dot = dot + qr[c] * tile_a[kb + c] +
                        qr[c + 1u] * tile_a[kb + c + 1u] +
                        qr[c + 2u] * tile_a[kb + c + 2u] +
                        qr[c + 3u] * tile_a[kb + c + 3u] +
                        qr[c + 4u] * tile_a[kb + c + 4u] +
                        qr[c + 5u] * tile_a[kb + c + 5u] +
                        qr[c + 6u] * tile_a[kb + c + 6u] +
                        qr[c + 7u] * tile_a[kb + c + 7u];
                }
                s[jj] = select(NEG, dot, live && j0 + jj <= i);
                mt = max(mt, s[jj]);
            }
            let corr = exp(m - mt);
            l = l * corr;
            for (var c = 0u; c < dp; c = c + 8u) {
                acc[c] = acc[c] * corr;
                    acc[c + 1u] = acc[c + 1u] * corr;
                    acc[c + 2u] = acc[c + 2u] * corr;
                    acc[c + 3u] = acc[c + 3u] * corr;
                    acc[c + 4u] = acc[c + 4u] * corr;
                    acc[c + 5u] = acc[c + 5u] * corr;
                    acc[c + 6u] = acc[c + 6u] * corr;
                    acc[c + 7u] = acc[c + 7u] * corr;
            }
            for (var jj = 0u; jj < TILE; jj = jj + 1u) {
                let p_all = select(0.0, exp(s[jj] - mt), live && j0 + jj <= i);
                l = l + p_all;
                let p = p_all * kept(key, wid.y, i, j0 + jj);
                let vb = jj * dp;
                for (var c = 0u; c < dp; c = c + 8u) {
                    acc[c] = acc[c] + p * tile_b[vb + c];
                    acc[c + 1u] = acc[c + 1u] + p * tile_b[vb + c + 1u];
                    acc[c + 2u] = acc[c + 2u] + p * tile_b[vb + c + 2u];
                    acc[c + 3u] = acc[c + 3u] + p * tile_b[vb + c + 3u];
                    acc[c + 4u] = acc[c + 4u] + p * tile_b[vb + c + 4u];
                    acc[c + 5u] = acc[c + 5u] + p * tile_b[vb + c + 5u];
                    acc[c + 6u] = acc[c + 6u] + p * tile_b[vb + c + 6u];
                    acc[c + 7u] = acc[c + 7u] + p * tile_b[vb + c + 7u];
                }
            }
            m = mt;
        }
        workgroupBarrier();
    }
    if live {
        for (var c = 0u; c < d; c = c + 1u) {
            o[params.o_offset + base + i * d + c] = acc[c] / l;
        }
        lse[params.lse_offset + wid.y * t + i] = m + log(l);
    }
}

@compute @workgroup_size(64)
fn attention_backward_dq(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let t = params.time;
    let d = params.head_dim;
    let dp = padded_dim();
    let base = wid.y * t * d;
    let kv_base = (wid.y / params.group) * t * d;
    let row0 = wid.x * ROWS;
    let i = row0 + lid.x;
    let live = i < t;
    var qr: array<f32, 128>;
    var gr: array<f32, 128>;
    var acc: array<f32, 128>;
    var delta_i = 0.0;
    for (var c = 0u; c < dp; c = c + 1u) {
        var x = 0.0;
        var g = 0.0;
        if live && c < d {
            let at = base + i * d + c;
            x = ld_q(params.q_offset + at) * params.scale;
            g = d_o[params.do_offset + at];
            delta_i = delta_i + g * ld_o(params.o_offset + at);
        }
        qr[c] = x;
        gr[c] = g;
        acc[c] = 0.0;
    }
    var lse_i = 0.0;
    if live {
        lse_i = lse[params.lse_offset + wid.y * t + i];
    }
    let key = dropout_key(params.seed_lo, params.seed_hi);
    let tiles = (min(row0 + ROWS, t) - 1u) / TILE + 1u;
    for (var tile = 0u; tile < tiles; tile = tile + 1u) {
        let j0 = tile * TILE;
        load_key_tile(lid.x, kv_base, j0, dp);
        workgroupBarrier();
        {
            for (var jj = 0u; jj < TILE; jj = jj + 1u) {
                let kb = jj * dp;
                var s = 0.0;
                var dpv = 0.0;
                for (var c = 0u; c < dp; c = c + 8u) {
                    s = s + qr[c] * tile_a[kb + c] +
                        qr[c + 1u] * tile_a[kb + c + 1u] +
                        qr[c + 2u] * tile_a[kb + c + 2u] +
                        qr[c + 3u] * tile_a[kb + c + 3u] +
                        qr[c + 4u] * tile_a[kb + c + 4u] +
                        qr[c + 5u] * tile_a[kb + c + 5u] +
                        qr[c + 6u] * tile_a[kb + c + 6u] +
                        qr[c + 7u] * tile_a[kb + c + 7u];
                    dpv = dpv + gr[c] * tile_b[kb + c] +
                        gr[c + 1u] * tile_b[kb + c + 1u] +
                        gr[c + 2u] * tile_b[kb + c + 2u] +
                        gr[c + 3u] * tile_b[kb + c + 3u] +
                        gr[c + 4u] * tile_b[kb + c + 4u] +
                        gr[c + 5u] * tile_b[kb + c + 5u] +
                        gr[c + 6u] * tile_b[kb + c + 6u] +
                        gr[c + 7u] * tile_b[kb + c + 7u];
                }
                let p = select(0.0, exp(s - lse_i), live && j0 + jj <= i);
                let ds = p * (dpv * kept(key, wid.y, i, j0 + jj) - delta_i);
                for (var c = 0u; c < dp; c = c + 8u) {
                    acc[c] = acc[c] + ds * tile_a[kb + c];
                    acc[c + 1u] = acc[c + 1u] + ds * tile_a[kb + c + 1u];
                    acc[c + 2u] = acc[c + 2u] + ds * tile_a[kb + c + 2u];
                    acc[c + 3u] = acc[c + 3u] + ds * tile_a[kb + c + 3u];
                    acc[c + 4u] = acc[c + 4u] + ds * tile_a[kb + c + 4u];
                    acc[c + 5u] = acc[c + 5u] + ds * tile_a[kb + c + 5u];
                    acc[c + 6u] = acc[c + 6u] + ds * tile_a[kb + c + 6u];
                    acc[c + 7u] = acc[c + 7u] + ds * tile_a[kb + c + 7u];
                }
            }
        }
        workgroupBarrier();
    }
    if live {
        for (var c = 0u; c < d; c = c + 1u) {
            dq[params.dq_offset + base + i * d + c] = acc[c] * params.scale;
        }
        delta[params.delta_offset + wid.y * t + i] = delta_i;
    }
}

@compute @workgroup_size(64)
fn attention_backward_dkdv(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let t = params.time;
    let d = params.head_dim;
    let dp = padded_dim();
    let base = wid.y * t * d;
    let row0 = wid.x * ROWS;
    let j = row0 + lid.x;
    let live = j < t;
    var kr: array<f32, 128>;
    var vr: array<f32, 128>;
    var dk_acc: array<f32, 128>;
    var dv_acc: array<f32, 128>;
    for (var c = 0u; c < dp; c = c + 1u) {
        var kx = 0.0;
        var vx = 0.0;
        if live && c < d {
            kx = ld_k(params.k_offset + base + j * d + c);
            vx = ld_v(params.v_offset + base + j * d + c);
        }
        kr[c] = kx;
        vr[c] = vx;
        dk_acc[c] = 0.0;
        dv_acc[c] = 0.0;
    }
    let key = dropout_key(params.seed_lo, params.seed_hi);
    // Queries i >= j of query head qh (wid.y is the key/value head): from the workgroup's
    // first key row (a multiple of TILE) to T.
    let qh = wid.y * params.group + params.member;
    let q_base = qh * t * d;
    let tiles = (t - row0 + TILE - 1u) / TILE;
    for (var tile = 0u; tile < tiles; tile = tile + 1u) {
        let i0 = row0 + tile * TILE;
        for (var e = lid.x; e < TILE * dp; e = e + ROWS) {
            let i = i0 + e / dp;
            let c = e % dp;
            var qx = 0.0;
            var gx = 0.0;
            if i < t && c < d {
                qx = ld_q(params.q_offset + q_base + i * d + c) * params.scale;
                gx = d_o[params.do_offset + q_base + i * d + c];
            }
            tile_a[e] = qx;
            tile_b[e] = gx;
        }
        if lid.x < TILE {
            let i = i0 + lid.x;
            var r = 0.0;
            var dl = 0.0;
            if i < t {
                r = lse[params.lse_offset + qh * t + i];
                dl = delta[params.delta_offset + qh * t + i];
            }
            tile_lse[lid.x] = r;
            tile_delta[lid.x] = dl;
        }
        workgroupBarrier();
        {
            for (var ii = 0u; ii < TILE; ii = ii + 1u) {
                let i = i0 + ii;
                {
                    let qb = ii * dp;
                    var s = 0.0;
                    var dpv = 0.0;
                    for (var c = 0u; c < dp; c = c + 8u) {
                        s = s + kr[c] * tile_a[qb + c] +
                        kr[c + 1u] * tile_a[qb + c + 1u] +
                        kr[c + 2u] * tile_a[qb + c + 2u] +
                        kr[c + 3u] * tile_a[qb + c + 3u] +
                        kr[c + 4u] * tile_a[qb + c + 4u] +
                        kr[c + 5u] * tile_a[qb + c + 5u] +
                        kr[c + 6u] * tile_a[qb + c + 6u] +
                        kr[c + 7u] * tile_a[qb + c + 7u];
                        dpv = dpv + vr[c] * tile_b[qb + c] +
                        vr[c + 1u] * tile_b[qb + c + 1u] +
                        vr[c + 2u] * tile_b[qb + c + 2u] +
                        vr[c + 3u] * tile_b[qb + c + 3u] +
                        vr[c + 4u] * tile_b[qb + c + 4u] +
                        vr[c + 5u] * tile_b[qb + c + 5u] +
                        vr[c + 6u] * tile_b[qb + c + 6u] +
                        vr[c + 7u] * tile_b[qb + c + 7u];
                    }
                    let p_all = select(0.0, exp(s - tile_lse[ii]), live && i < t && i >= j);
                    let z = kept(key, qh, i, j);
                    let ds = p_all * (dpv * z - tile_delta[ii]);
                    let p = p_all * z;
                    for (var c = 0u; c < dp; c = c + 8u) {
                        dv_acc[c] = dv_acc[c] + p * tile_b[qb + c];
                        dk_acc[c] = dk_acc[c] + ds * tile_a[qb + c];
                        dv_acc[c + 1u] = dv_acc[c + 1u] + p * tile_b[qb + c + 1u];
                        dk_acc[c + 1u] = dk_acc[c + 1u] + ds * tile_a[qb + c + 1u];
                        dv_acc[c + 2u] = dv_acc[c + 2u] + p * tile_b[qb + c + 2u];
                        dk_acc[c + 2u] = dk_acc[c + 2u] + ds * tile_a[qb + c + 2u];
                        dv_acc[c + 3u] = dv_acc[c + 3u] + p * tile_b[qb + c + 3u];
                        dk_acc[c + 3u] = dk_acc[c + 3u] + ds * tile_a[qb + c + 3u];
                        dv_acc[c + 4u] = dv_acc[c + 4u] + p * tile_b[qb + c + 4u];
                        dk_acc[c + 4u] = dk_acc[c + 4u] + ds * tile_a[qb + c + 4u];
                        dv_acc[c + 5u] = dv_acc[c + 5u] + p * tile_b[qb + c + 5u];
                        dk_acc[c + 5u] = dk_acc[c + 5u] + ds * tile_a[qb + c + 5u];
                        dv_acc[c + 6u] = dv_acc[c + 6u] + p * tile_b[qb + c + 6u];
                        dk_acc[c + 6u] = dk_acc[c + 6u] + ds * tile_a[qb + c + 6u];
                        dv_acc[c + 7u] = dv_acc[c + 7u] + p * tile_b[qb + c + 7u];
                        dk_acc[c + 7u] = dk_acc[c + 7u] + ds * tile_a[qb + c + 7u];
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if live {
        for (var c = 0u; c < d; c = c + 1u) {
            let at = base + j * d + c;
            if params.member == 0u {
                dk[params.dk_offset + at] = dk_acc[c];
                dv[params.dv_offset + at] = dv_acc[c];
            } else {
                dk[params.dk_offset + at] = dk[params.dk_offset + at] + dk_acc[c];
                dv[params.dv_offset + at] = dv[params.dv_offset + at] + dv_acc[c];
            }
        }
    }
}
