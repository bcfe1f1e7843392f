#!/usr/bin/env python3
"""Writes matmul_coop.wgsl: the cooperative-matrix (tensor-core) entry point `main_coop`.

    python3 kernels-wgsl/src/kernels/matmul/gen_coop.py > kernels-wgsl/src/kernels/matmul/matmul_coop.wgsl

Edit this script, not the shader. The configuration (below): one 16x16x16 f16 x f16 -> f32
cooperative matrix per multiply-add (what NVIDIA's Vulkan driver offers), 32-lane subgroups,
2 x 4 subgroups per workgroup, each computing 4 x 2 tiles (64 x 32 outputs), so a workgroup
computes the same 128 x 128 block of C as `main` (the bounded splitting cuts C in those
blocks). Each invocation fetches its share of the next step's A and B into registers before the
current step's multiply-adds, so the global loads overlap the arithmetic.
"""

S = 16          # cooperative matrix size (M = N = K)
SUBGROUP = 32   # lanes per subgroup the launcher requires
WM, WN = 2, 4   # subgroups along M and N
TM, TN = 4, 2   # tiles per subgroup along M and N
BK = 32         # k per stage through workgroup memory
BM, BN = WM * TM * S, WN * TN * S
WG = WM * WN * SUBGROUP
SQ = 16         # the squares' block (as `main`'s)
G = SQ // S     # tiles per squares block side
FA = BM * BK // 4 // WG   # vec4s of A each invocation stages per step
FB = BK * BN // 4 // WG
assert BM == 128 and BN == 128 and BK % S == 0 and SQ % S == 0 and TM % G == 0 and TN % G == 0
assert FA * WG * 4 == BM * BK and FB * WG * 4 == BK * BN

out = []
w = out.append

w(f"""// matmul_coop.wgsl (written by gen_coop.py: edit the script, not this file): `main_coop`,
// matmul.wgsl's product on cooperative matrices (tensor cores). The module is
// `enable f16; enable wgpu_cooperative_matrix;` (naga 30 takes the subgroup builtins without a
// directive), this file, matmul_epilogue.wgsl, the operands' accessors (matmul_coop_a*.wgsl,
// matmul_coop_b*.wgsl, matmul_coop_c*.wgsl: coop_lda / coop_ldb load four elements as stored
// (CoopA4 / CoopB4), coop_half_a / coop_half_b make them halves, an f32 operand rounded as
// autocast does; ldc4 / stc4 as in matmul.wgsl) and f16_native.wgsl;
// `Params` and the bindings come from mod.rs. Same Params, flags, epilogue, squares and bounds as
// `main` (matmul.wgsl's header); the differences:
//   - Each workgroup ({WG} invocations: {WM} x {WN} subgroups of {SUBGROUP} lanes, which the launcher
//     requires of the adapter) computes a {BM} x {BN} block of C; each subgroup {TM} x {TN} tiles of
//     {S} x {S} in cooperative accumulators (f32). Per step of {BK} along k the workgroup stages
//     A's {BM} x {BK} and B's {BK} x {BN} into workgroup memory as stored (a transposed operand
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
// Dispatch (ceil(N / {BN}), ceil(M / {BM}), batch), from params.row_start / col_start.
""")

w("override TRANS_A: bool = false;")
w("override TRANS_B: bool = false;")
w(f"const COOP_BM: u32 = {BM}u;")
w(f"const COOP_BN: u32 = {BN}u;")
w(f"const COOP_BK: u32 = {BK}u;")
w(f"const COOP_S: u32 = {S}u;")
w(f"const COOP_WG: u32 = {WG}u;")
w(f"var<workgroup> coop_a: array<f16, {BM * BK}>;")
w(f"var<workgroup> coop_b: array<f16, {BK * BN}>;")
w(f"var<workgroup> coop_c: array<f32, {WM * WN * S * S}>;")
w("")
w("""// Slot i (a vec4) of A's block at rows m0.., k from k0, as stored: [m][k] (BM x BK), or with
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
""")

w(f"@compute @workgroup_size({WG}, 1, 1)")
w("""fn main_coop(@builtin(workgroup_id) wg: vec3<u32>,
             @builtin(local_invocation_index) li: u32,
             @builtin(subgroup_id) sg: u32,
             @builtin(subgroup_invocation_id) lane: u32,
             @builtin(subgroup_size) lanes: u32) {
    let m0 = params.row_start + wg.y * COOP_BM;
    let n0 = params.col_start + wg.x * COOP_BN;
    let oa = params.offset_a + wg.z * params.stride_a;
    let ob = params.offset_b + wg.z * params.stride_b;
    let oc = params.offset_c + wg.z * params.stride_c;""")
w(f"    let wm = (sg / {WN}u) * {TM * S}u;")
w(f"    let wn = (sg % {WN}u) * {TN * S}u;")
for i in range(TM):
    for j in range(TN):
        w(f"    var c{i}_{j} = coop_mat16x16<f32, C>();")
for q in range(FA):
    w(f"    var ra{q} = coop_fetch_a(li + {q * WG}u, oa, m0, 0u);")
for q in range(FB):
    w(f"    var rb{q} = coop_fetch_b(li + {q * WG}u, ob, n0, 0u);")
w("    for (var k0 = 0u; k0 < params.k; k0 += COOP_BK) {")
for q in range(FA):
    w(f"        coop_put_a(li + {q * WG}u, ra{q});")
for q in range(FB):
    w(f"        coop_put_b(li + {q * WG}u, rb{q});")
w("        workgroupBarrier();")
w("        let kn = k0 + COOP_BK;")
w("        if (kn < params.k) {")
for q in range(FA):
    w(f"            ra{q} = coop_fetch_a(li + {q * WG}u, oa, m0, kn);")
for q in range(FB):
    w(f"            rb{q} = coop_fetch_b(li + {q * WG}u, ob, n0, kn);")
w("        }")
for kk in range(0, BK, S):
    for i in range(TM):
        w(f"        let a{i}_{kk} = coop_tile_a(wm + {i * S}u, {kk}u);")
    for j in range(TN):
        w(f"        let b{j}_{kk} = coop_tile_b({kk}u, wn + {j * S}u);")
    for i in range(TM):
        for j in range(TN):
            w(f"        c{i}_{j} = coopMultiplyAdd(a{i}_{kk}, b{j}_{kk}, c{i}_{j});")
w("        workgroupBarrier();")
w("    }")
# The epilogue, one squares block (G x G tiles) at a time.
for bi in range(TM // G):
    for bj in range(TN // G):
        w("    {")
        w("        var sq = 0.0;")
        for i in range(bi * G, bi * G + G):
            for j in range(bj * G, bj * G + G):
                w(f"        sq += coop_store_tile(c{i}_{j}, sg, lane, lanes, oc, m0 + wm + {i * S}u, "
                  f"n0 + wn + {j * S}u);")
        w("        let total = subgroupAdd(sq);")
        w(f"        let r0 = m0 + wm + {bi * SQ}u; let c0 = n0 + wn + {bj * SQ}u;")
        w("        if (lane == 0u && r0 < params.m && c0 < params.n) {")
        w(f"            put_squares(wg, r0 / {SQ}u, c0 / {SQ}u, {SQ}u, total);")
        w("        }")
        w("    }")
w("}")
print("\n".join(out))
