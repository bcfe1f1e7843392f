#!/usr/bin/env python3
"""Writes the `main` entry point of matmul.wgsl: T x T outputs per invocation.

    python3 kernels-wgsl/src/kernels/matmul/gen_matmul.py T > /tmp/main.wgsl

T is a multiple of 4. The entry point is fully unrolled (T*T/4 vec4 accumulators), so its
size -- and lavapipe's LLVM compile time at the first dispatch -- grows with T*T; see the
header of matmul.wgsl for the measured trade-off. The file between the markers
`// BEGIN main (gen_matmul.py T=...)` and `// END main` in matmul.wgsl is this script's output:
edit the script, not the shader, and paste its output between the markers.
"""
import sys


def branch_core(t, g, w):
    """The k loop per layout, chosen by the override constants TRANS_A and TRANS_B: one
    pipeline per layout, and each compiles only its own loop."""
    def ra_rows():
        for i in range(t):
            w(f"        let ra{i} = (oa + min(m0 + {i}u, M - 1u) * K) >> 2u;")

    def rb_rows():
        for j in range(t):
            w(f"        let rb{j} = (ob + min(n0 + {j}u, N - 1u) * K) >> 2u;")

    def mgroups():
        for q in range(g):
            w(f"        let mg{q} = min(m0 + {4 * q}u, M - 4u) >> 2u;")

    # !TRANS_A && !TRANS_B: A rows along k, B rows along n.
    w("    if (!TRANS_A && !TRANS_B) {")
    ra_rows()
    w("        var rb = ob >> 2u;")
    w("        let n4 = N >> 2u;")
    w("        for (var k4 = 0u; k4 < (K >> 2u); k4++) {")
    for i in range(t):
        w(f"            let a{i} = lda4(ra{i} + k4);")
    for kk in range(4):
        for j in range(g):
            w(f"            let b{kk}_{j} = ldb4(rb + {kk}u * n4 + (cg{j} >> 2u));")
    for i in range(t):
        for j in range(g):
            w(f"            acc{i}_{j} += a{i}.x * b0_{j} + a{i}.y * b1_{j} + a{i}.z * b2_{j} + a{i}.w * b3_{j};")
    w("            rb += 4u * n4;")
    w("        }")
    # TRANS_A && !TRANS_B: A^T rows along m, B rows along n; any K.
    w("    } else if (TRANS_A && !TRANS_B) {")
    mgroups()
    w("        let m4 = M >> 2u; let n4 = N >> 2u;")
    w("        var ra = oa >> 2u; var rb = ob >> 2u;")
    w("        for (var k = 0u; k < K; k++) {   // any K: A^T rows run along m, B rows along n")
    for q in range(g):
        w(f"            let a{q} = lda4(ra + mg{q});")
    for j in range(g):
        w(f"            let b{j} = ldb4(rb + (cg{j} >> 2u));")
    for i in range(t):
        for j in range(g):
            w(f"            acc{i}_{j} += a{i // 4}[{i % 4}] * b{j};")
    w("            ra += m4; rb += n4;")
    w("        }")
    # !TRANS_A && TRANS_B: A rows along k, B^T rows along k.
    w("    } else if (!TRANS_A && TRANS_B) {")
    ra_rows()
    rb_rows()
    w("        for (var k4 = 0u; k4 < (K >> 2u); k4++) {")
    for i in range(t):
        w(f"            let a{i} = lda4(ra{i} + k4);")
    for j in range(t):
        w(f"            let b{j} = ldb4(rb{j} + k4);")
    for i in range(t):
        for j in range(g):
            d = ", ".join(f"dot(a{i}, b{4 * j + c})" for c in range(4))
            w(f"            acc{i}_{j} += vec4<f32>({d});")
    w("        }")
    # TRANS_A && TRANS_B: A^T rows along m, B^T rows along k.
    w("    } else {")
    mgroups()
    rb_rows()
    w("        let m4 = M >> 2u;")
    w("        var ra = oa >> 2u;")
    w("        for (var k4 = 0u; k4 < (K >> 2u); k4++) {")
    for kk in range(4):
        for q in range(g):
            w(f"            let a{kk}_{q} = lda4(ra + {kk}u * m4 + mg{q});")
    for j in range(t):
        w(f"            let b{j} = ldb4(rb{j} + k4);")
    for i in range(t):
        q, c = i // 4, i % 4
        for j in range(g):
            terms = []
            for col in range(4):
                n = 4 * j + col
                terms.append(" + ".join(f"a{kk}_{q}[{c}] * b{n}[{kk}]" for kk in range(4)))
            w(f"            acc{i}_{j} += vec4<f32>({', '.join(terms)});")
    w("            ra += 4u * m4;")
    w("        }")
    w("    }")


def gen(t: int) -> str:
    assert t % 4 == 0 and t >= 4
    g = t // 4  # vec4 groups per side
    o = []
    w = o.append
    w(f"// BEGIN main (gen_matmul.py T={t})")
    w("@compute @workgroup_size(8, 8, 1)")
    w("fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {")
    w("    let M = params.m; let N = params.n; let K = params.k;")
    w(f"    let n0 = params.col_start + (wg.x * 8u + lid.x) * {t}u;")
    w(f"    let m0 = params.row_start + (wg.y * 8u + lid.y) * {t}u;")
    w("    if (n0 >= N || m0 >= M) { return; }")
    w("    let oa = params.offset_a + wg.z * params.stride_a;")
    w("    let ob = params.offset_b + wg.z * params.stride_b;")
    for i in range(t):
        w("    " + " ".join(f"var acc{i}_{j} = vec4<f32>(0.0);" for j in range(g)))
    for j in range(g):
        w(f"    let cg{j} = min(n0 + {4 * j}u, N - 4u);   // vec4 column group (N % 4 == 0 on this path)")

    branch_core(t, g, w)
    # The epilogue: one vec4 store (and, accumulating, one vec4 load) per 4 columns, through
    # C's vec4 view. Four scalar read-modify-writes per group, unrolled over the T x G groups,
    # were most of lavapipe's JIT time for this entry point (about 4.3 of 5.4 s).
    w("    let oc4 = (params.offset_c + wg.z * params.stride_c) >> 2u;")
    w("    let n04 = n0 >> 2u; let n4c = N >> 2u;")
    # The epilogue's bias: one vec4 per column group, loaded once for all T rows (not per
    # store: 4 x T x G scalar loads made the epilogue JIT seconds slower).
    w("    " + " ".join(f"var bias{j} = vec4<f32>(0.0);" for j in range(g)))
    w("    if (epilogue_bias()) {")
    for j in range(g):
        w(f"        bias{j} = bias4(min(n04 + {j}u, n4c - 1u));")
    w("    }")
    w("    var sq = 0.0;")
    for i in range(t):
        w(f"    if (m0 + {i}u < M) {{")
        w(f"        let rc = oc4 + (m0 + {i}u) * n4c + n04;")
        for j in range(g):
            w(f"        if (n0 + {4 * j}u < N) {{ sq += store4(rc + {j}u, acc{i}_{j}, bias{j}); }}")
        w("    }")
    w(f"    put_squares(wg, m0 / {t}u, n0 / {t}u, {t}u, sq);")
    w("}")
    w("// END main")
    return "\n".join(o) + "\n"


if __name__ == "__main__":
    sys.stdout.write(gen(int(sys.argv[1]) if len(sys.argv) > 1 else 16))
