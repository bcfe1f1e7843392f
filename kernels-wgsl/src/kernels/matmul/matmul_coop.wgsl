// matmul_coop.wgsl (written by gen_coop.py: edit the script, not this file): `main_coop`,
// matmul.wgsl's product on cooperative matrices (tensor cores). The module is
// `enable f16; enable wgpu_cooperative_matrix;` (naga 30 takes the subgroup builtins without a
// directive), this file, matmul_epilogue.wgsl, the operands' accessors (matmul_coop_a*.wgsl,
// matmul_coop_b*.wgsl, matmul_coop_c*.wgsl: coop_lda / coop_ldb load four elements as stored
// (CoopA4 / CoopB4), coop_half_a / coop_half_b make them halves, an f32 operand rounded as
// autocast does; ldc4 / stc4 as in matmul.wgsl) and f16_native.wgsl;
// `Params` and the bindings come from mod.rs. Same Params, flags, epilogue, squares and bounds as
// `main` (matmul.wgsl's header); the differences:
//   - Each workgroup (256 invocations: 2 x 4 subgroups of 32 lanes, which the launcher
//     requires of the adapter) computes a 128 x 128 block of C; each subgroup 4 x 2 tiles of
//     16 x 16 in cooperative accumulators (f32). Per step of 32 along k the workgroup stages
//     A's 128 x 32 and B's 32 x 128 into workgroup memory as stored (a transposed operand
//     stays transposed and is loaded column-major), zero outside the matrix, so any M, N, K
//     works; `main`'s alignment (rows and offsets multiples of 4 elements) is required for the
//     vec4 loads. The next step's share is fetched into registers, as stored (f32 or f16),
//     before this step's multiply-adds, and converted to f16 only when it is staged, so that
//     the loads can stay in flight during the arithmetic.
//   - The products of halves are exact and the sums f32, as on `main`, in another order.
//   - The epilogue goes through workgroup memory one tile at a time: the subgroup stores its
//     accumulator there, then each lane applies alpha, accumulate, bias and ReLU to its groups
//     of four and stores them (store4); the squares of each 16 x 16 block are summed over the
//     subgroup (subgroupAdd) and written by its first lane.
// Dispatch (ceil(N / 128), ceil(M / 128), batch), from params.row_start / col_start.

override TRANS_A: bool = false;
override TRANS_B: bool = false;
const COOP_BM: u32 = 128u;
const COOP_BN: u32 = 128u;
const COOP_BK: u32 = 32u;
const COOP_S: u32 = 16u;
const COOP_WG: u32 = 256u;
var<workgroup> coop_a: array<f16, 4096>;
var<workgroup> coop_b: array<f16, 4096>;
var<workgroup> coop_c: array<f32, 2048>;

// Slot i (a vec4) of A's block at rows m0.., k from k0, as stored: [m][k] (BM x BK), or with
// TRANS_A [k][m] (BK x BM); zero outside the matrix.
fn coop_fetch_a(i: u32, oa: u32, m0: u32, k0: u32) -> CoopA4 {
    let M = params.m; let K = params.k;
    if (TRANS_A) {
        let r = i / (COOP_BM / 4u); let c = (i % (COOP_BM / 4u)) * 4u;
        if (k0 + r < K && m0 + c < M) { return coop_lda((oa + (k0 + r) * M + m0 + c) >> 2u); }
    } else {
        let r = i / (COOP_BK / 4u); let c = (i % (COOP_BK / 4u)) * 4u;
        if (m0 + r < M && k0 + c < K) { return coop_lda((oa + (m0 + r) * K + k0 + c) >> 2u); }
    }
    return CoopA4();
}

// Stores slot i of A's block into coop_a (the layout of coop_fetch_a), in f16.
fn coop_put_a(i: u32, raw: CoopA4) {
    let v = coop_half_a(raw);
    var at = (i / (COOP_BK / 4u)) * COOP_BK + (i % (COOP_BK / 4u)) * 4u;
    if (TRANS_A) { at = (i / (COOP_BM / 4u)) * COOP_BM + (i % (COOP_BM / 4u)) * 4u; }
    coop_a[at] = v.x; coop_a[at + 1u] = v.y; coop_a[at + 2u] = v.z; coop_a[at + 3u] = v.w;
}

// Slot i of B's block at k from k0, columns n0.., as stored: [k][n] (BK x BN), or with TRANS_B
// [n][k] (BN x BK); zero outside the matrix.
fn coop_fetch_b(i: u32, ob: u32, n0: u32, k0: u32) -> CoopB4 {
    let N = params.n; let K = params.k;
    if (TRANS_B) {
        let r = i / (COOP_BK / 4u); let c = (i % (COOP_BK / 4u)) * 4u;
        if (n0 + r < N && k0 + c < K) { return coop_ldb((ob + (n0 + r) * K + k0 + c) >> 2u); }
    } else {
        let r = i / (COOP_BN / 4u); let c = (i % (COOP_BN / 4u)) * 4u;
        if (k0 + r < K && n0 + c < N) { return coop_ldb((ob + (k0 + r) * N + n0 + c) >> 2u); }
    }
    return CoopB4();
}

// Stores slot i of B's block into coop_b (the layout of coop_fetch_b), in f16.
fn coop_put_b(i: u32, raw: CoopB4) {
    let v = coop_half_b(raw);
    var at = (i / (COOP_BN / 4u)) * COOP_BN + (i % (COOP_BN / 4u)) * 4u;
    if (TRANS_B) { at = (i / (COOP_BK / 4u)) * COOP_BK + (i % (COOP_BK / 4u)) * 4u; }
    coop_b[at] = v.x; coop_b[at + 1u] = v.y; coop_b[at + 2u] = v.z; coop_b[at + 3u] = v.w;
}

// op(A)'s tile at rows r.., k kk.. of the staged block.
fn coop_tile_a(r: u32, kk: u32) -> coop_mat16x16<f16, A> {
    if (TRANS_A) { return coopLoad<coop_mat16x16<f16, A>>(&coop_a[kk * COOP_BM + r], COOP_BM); }
    return coopLoadT<coop_mat16x16<f16, A>>(&coop_a[r * COOP_BK + kk], COOP_BK);
}

// op(B)'s tile at k kk.., columns c.. of the staged block.
fn coop_tile_b(kk: u32, c: u32) -> coop_mat16x16<f16, B> {
    if (TRANS_B) { return coopLoad<coop_mat16x16<f16, B>>(&coop_b[c * COOP_BK + kk], COOP_BK); }
    return coopLoadT<coop_mat16x16<f16, B>>(&coop_b[kk * COOP_BN + c], COOP_BN);
}

// Stores one accumulator tile (rows row0.., columns col0.. of C) through the subgroup's slice
// of coop_c: alpha, accumulate and the epilogue per group of four (store4). Returns this lane's
// sum of the squares of what it stored.
fn coop_store_tile(t: coop_mat16x16<f32, C>, sg: u32, lane: u32, lanes: u32, oc: u32,
                   row0: u32, col0: u32) -> f32 {
    let base = sg * COOP_S * COOP_S;
    coopStoreT(t, &coop_c[base], COOP_S);
    workgroupBarrier();
    var sq = 0.0;
    for (var e = lane; e < COOP_S * COOP_S / 4u; e += lanes) {
        let r = e / (COOP_S / 4u); let c = (e % (COOP_S / 4u)) * 4u;
        let row = row0 + r; let col = col0 + c;
        if (row < params.m && col < params.n) {
            let at = base + r * COOP_S + c;
            let v = vec4<f32>(coop_c[at], coop_c[at + 1u], coop_c[at + 2u], coop_c[at + 3u]);
            var b = vec4<f32>(0.0);
            if (epilogue_bias()) { b = bias4(col >> 2u); }
            sq += store4((oc + row * params.n + col) >> 2u, v, b);
        }
    }
    workgroupBarrier();
    return sq;
}

@compute @workgroup_size(256, 1, 1)
fn main_coop(@builtin(workgroup_id) wg: vec3<u32>,
             @builtin(local_invocation_index) li: u32,
             @builtin(subgroup_id) sg: u32,
             @builtin(subgroup_invocation_id) lane: u32,
             @builtin(subgroup_size) lanes: u32) {
    let m0 = params.row_start + wg.y * COOP_BM;
    let n0 = params.col_start + wg.x * COOP_BN;
    let oa = params.offset_a + wg.z * params.stride_a;
    let ob = params.offset_b + wg.z * params.stride_b;
    let oc = params.offset_c + wg.z * params.stride_c;
    let wm = (sg / 4u) * 64u;
    let wn = (sg % 4u) * 32u;
    var c0_0 = coop_mat16x16<f32, C>();
    var c0_1 = coop_mat16x16<f32, C>();
    var c1_0 = coop_mat16x16<f32, C>();
    var c1_1 = coop_mat16x16<f32, C>();
    var c2_0 = coop_mat16x16<f32, C>();
    var c2_1 = coop_mat16x16<f32, C>();
    var c3_0 = coop_mat16x16<f32, C>();
    var c3_1 = coop_mat16x16<f32, C>();
    var ra0 = coop_fetch_a(li + 0u, oa, m0, 0u);
    var ra1 = coop_fetch_a(li + 256u, oa, m0, 0u);
    var ra2 = coop_fetch_a(li + 512u, oa, m0, 0u);
    var ra3 = coop_fetch_a(li + 768u, oa, m0, 0u);
    var rb0 = coop_fetch_b(li + 0u, ob, n0, 0u);
    var rb1 = coop_fetch_b(li + 256u, ob, n0, 0u);
    var rb2 = coop_fetch_b(li + 512u, ob, n0, 0u);
    var rb3 = coop_fetch_b(li + 768u, ob, n0, 0u);
    for (var k0 = 0u; k0 < params.k; k0 += COOP_BK) {
        coop_put_a(li + 0u, ra0);
        coop_put_a(li + 256u, ra1);
        coop_put_a(li + 512u, ra2);
        coop_put_a(li + 768u, ra3);
        coop_put_b(li + 0u, rb0);
        coop_put_b(li + 256u, rb1);
        coop_put_b(li + 512u, rb2);
        coop_put_b(li + 768u, rb3);
        workgroupBarrier();
        let kn = k0 + COOP_BK;
        if (kn < params.k) {
            ra0 = coop_fetch_a(li + 0u, oa, m0, kn);
            ra1 = coop_fetch_a(li + 256u, oa, m0, kn);
            ra2 = coop_fetch_a(li + 512u, oa, m0, kn);
            ra3 = coop_fetch_a(li + 768u, oa, m0, kn);
            rb0 = coop_fetch_b(li + 0u, ob, n0, kn);
            rb1 = coop_fetch_b(li + 256u, ob, n0, kn);
            rb2 = coop_fetch_b(li + 512u, ob, n0, kn);
            rb3 = coop_fetch_b(li + 768u, ob, n0, kn);
        }
        let a0_0 = coop_tile_a(wm + 0u, 0u);
        let a1_0 = coop_tile_a(wm + 16u, 0u);
        let a2_0 = coop_tile_a(wm + 32u, 0u);
        let a3_0 = coop_tile_a(wm + 48u, 0u);
        let b0_0 = coop_tile_b(0u, wn + 0u);
        let b1_0 = coop_tile_b(0u, wn + 16u);
        c0_0 = coopMultiplyAdd(a0_0, b0_0, c0_0);
        c0_1 = coopMultiplyAdd(a0_0, b1_0, c0_1);
        c1_0 = coopMultiplyAdd(a1_0, b0_0, c1_0);
        c1_1 = coopMultiplyAdd(a1_0, b1_0, c1_1);
        c2_0 = coopMultiplyAdd(a2_0, b0_0, c2_0);
        c2_1 = coopMultiplyAdd(a2_0, b1_0, c2_1);
        c3_0 = coopMultiplyAdd(a3_0, b0_0, c3_0);
        c3_1 = coopMultiplyAdd(a3_0, b1_0, c3_1);
        let a0_16 = coop_tile_a(wm + 0u, 16u);
        let a1_16 = coop_tile_a(wm + 16u, 16u);
        let a2_16 = coop_tile_a(wm + 32u, 16u);
        let a3_16 = coop_tile_a(wm + 48u, 16u);
        let b0_16 = coop_tile_b(16u, wn + 0u);
        let b1_16 = coop_tile_b(16u, wn + 16u);
        c0_0 = coopMultiplyAdd(a0_16, b0_16, c0_0);
        c0_1 = coopMultiplyAdd(a0_16, b1_16, c0_1);
        c1_0 = coopMultiplyAdd(a1_16, b0_16, c1_0);
        c1_1 = coopMultiplyAdd(a1_16, b1_16, c1_1);
        c2_0 = coopMultiplyAdd(a2_16, b0_16, c2_0);
        c2_1 = coopMultiplyAdd(a2_16, b1_16, c2_1);
        c3_0 = coopMultiplyAdd(a3_16, b0_16, c3_0);
        c3_1 = coopMultiplyAdd(a3_16, b1_16, c3_1);
        workgroupBarrier();
    }
    {
        var sq = 0.0;
        sq += coop_store_tile(c0_0, sg, lane, lanes, oc, m0 + wm + 0u, n0 + wn + 0u);
        let total = subgroupAdd(sq);
        let r0 = m0 + wm + 0u; let c0 = n0 + wn + 0u;
        if (lane == 0u && r0 < params.m && c0 < params.n) {
            put_squares(wg, r0 / 16u, c0 / 16u, 16u, total);
        }
    }
    {
        var sq = 0.0;
        sq += coop_store_tile(c0_1, sg, lane, lanes, oc, m0 + wm + 0u, n0 + wn + 16u);
        let total = subgroupAdd(sq);
        let r0 = m0 + wm + 0u; let c0 = n0 + wn + 16u;
        if (lane == 0u && r0 < params.m && c0 < params.n) {
            put_squares(wg, r0 / 16u, c0 / 16u, 16u, total);
        }
    }
    {
        var sq = 0.0;
        sq += coop_store_tile(c1_0, sg, lane, lanes, oc, m0 + wm + 16u, n0 + wn + 0u);
        let total = subgroupAdd(sq);
        let r0 = m0 + wm + 16u; let c0 = n0 + wn + 0u;
        if (lane == 0u && r0 < params.m && c0 < params.n) {
            put_squares(wg, r0 / 16u, c0 / 16u, 16u, total);
        }
    }
    {
        var sq = 0.0;
        sq += coop_store_tile(c1_1, sg, lane, lanes, oc, m0 + wm + 16u, n0 + wn + 16u);
        let total = subgroupAdd(sq);
        let r0 = m0 + wm + 16u; let c0 = n0 + wn + 16u;
        if (lane == 0u && r0 < params.m && c0 < params.n) {
            put_squares(wg, r0 / 16u, c0 / 16u, 16u, total);
        }
    }
    {
        var sq = 0.0;
        sq += coop_store_tile(c2_0, sg, lane, lanes, oc, m0 + wm + 32u, n0 + wn + 0u);
        let total = subgroupAdd(sq);
        let r0 = m0 + wm + 32u; let c0 = n0 + wn + 0u;
        if (lane == 0u && r0 < params.m && c0 < params.n) {
            put_squares(wg, r0 / 16u, c0 / 16u, 16u, total);
        }
    }
    {
        var sq = 0.0;
        sq += coop_store_tile(c2_1, sg, lane, lanes, oc, m0 + wm + 32u, n0 + wn + 16u);
        let total = subgroupAdd(sq);
        let r0 = m0 + wm + 32u; let c0 = n0 + wn + 16u;
        if (lane == 0u && r0 < params.m && c0 < params.n) {
            put_squares(wg, r0 / 16u, c0 / 16u, 16u, total);
        }
    }
    {
        var sq = 0.0;
        sq += coop_store_tile(c3_0, sg, lane, lanes, oc, m0 + wm + 48u, n0 + wn + 0u);
        let total = subgroupAdd(sq);
        let r0 = m0 + wm + 48u; let c0 = n0 + wn + 0u;
        if (lane == 0u && r0 < params.m && c0 < params.n) {
            put_squares(wg, r0 / 16u, c0 / 16u, 16u, total);
        }
    }
    {
        var sq = 0.0;
        sq += coop_store_tile(c3_1, sg, lane, lanes, oc, m0 + wm + 48u, n0 + wn + 16u);
        let total = subgroupAdd(sq);
        let r0 = m0 + wm + 48u; let c0 = n0 + wn + 16u;
        if (lane == 0u && r0 < params.m && c0 < params.n) {
            put_squares(wg, r0 / 16u, c0 / 16u, 16u, total);
        }
    }
}
