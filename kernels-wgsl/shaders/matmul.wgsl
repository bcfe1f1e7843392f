// matmul.wgsl: batched C[b] = alpha * op(A[b]) * op(B[b])   (or C[b] += ..., flag bit 0)
//
// Row-major. Logical shapes M x K times K x N. op() is chosen per side by the override constants
// TRANS_A / TRANS_B (set through PipelineCompilationOptions.constants; default false):
//   TRANS_A: stored A is K x M (else M x K);  TRANS_B: stored B is N x K (else K x N).
// Batch b of an operand starts at offset_X + b * stride_X elements; stride 0 broadcasts it.
//
// Bindings (Plimsoll convention), all storage bindings read_write:
//   @binding(0) uniform Params (48 bytes, 12 x 4-byte fields in this order):
//     m, n, k, batch, stride_a, stride_b, stride_c, offset_a, offset_b, offset_c : u32,
//     flags : u32 (bit 0 = accumulate: C += alpha*A.B; else C = alpha*A.B, C is never read),
//     alpha : f32 (1.0 for a plain matmul)
//   @binding(1) a, @binding(2) b, @binding(3) c : array<f32>
//   Bindings 1 and 2 are ALSO declared as array<vec4<f32>> (a_v4, b_v4); only `main` uses
//   those, only `main_scalar` uses the f32 views (aliasing by entry point; naga/wgpu accept it).
//
// Entry points (launcher picks one; dispatch z = batch):
//   main        fast path. Preconditions (else use main_scalar):
//                 contiguous (stored) row length of A % 4 == 0  (K if !TRANS_A, M if TRANS_A)
//                 contiguous (stored) row length of B % 4 == 0  (N if !TRANS_B, K if TRANS_B)
//                 N % 4 == 0 in every case: `main` stores four columns at a time and checks
//                 only the first against N (with TRANS_B and N % 4 != 0 it would write past a row)
//                 offset_a, offset_b, stride_a, stride_b % 4 == 0 (elements), and the byte
//                 offsets of bindings 1 and 2 in their buffers % 16 == 0.
//               Dispatch (ceil(N / 128), ceil(M / 128), batch).
//   main_scalar any shape / alignment (M, N, K >= 0). Dispatch (ceil(N / 32), ceil(M / 32), batch).
//   TILE 128 128
//   TILE_SCALAR 32 32
//
// Workgroup 8 x 8 = 64 invocations. llvmpipe runs a workgroup as 8-wide SIMD (256-bit) over
// the invocations; 64 keeps 8 SIMD rows per workgroup and enough workgroups for 2 threads.
// Tiling: NO shared memory (on lavapipe every storage/shared access is a per-lane scalar loop,
// so staging through workgroup memory only adds cost). Each invocation of `main` computes a
// 16 x 16 block of C in 64 vec4 accumulators (register blocking), loading per 4 k-steps
// 16 + 16 vec4 values (A along its contiguous axis, B along its contiguous axis): the number of
// per-lane loads per FMA, which dominates on lavapipe, falls with the block size. Workgroup
// tile 128 x 128. `main_scalar` computes 4 x 4 per invocation with scalar loads.
//
// Bounds: invocations whose first row/column is outside C return at once. Row/column indices
// of loads are clamped into the matrix (min(i, M-1), vec4 groups min(g, D-4) on the fast path),
// so every load index lies inside [offset, offset + batch extent) of its operand; stores are
// guarded by row < M and by column < N for the first of each group of four (hence N % 4 == 0
// above). K is exact (no tail reads) on both paths: the fast path
// needs K % 4 only where K is a contiguous axis; when TRANS_A && !TRANS_B it loops k one by one.
// Hence, provided the launcher checks that Params fit inside the bound buffers
// (offset + (batch-1)*stride + rows*cols <= binding length for a, b and c), the kernel never
// reads or writes out of bounds and can be created with
// create_shader_module_trusted(.., ShaderRuntimeChecks::unchecked()); measured 1.3-2x faster in a
// scratch bench but only 1.01-1.05x in `cargo xtask bench kernels`, so the launcher keeps checks on.

// `Params` and the bindings are declared in src/kernels/matmul.rs (`shader_params!`, `kernel!`)
// and prepended to this file when the module is created.
override TRANS_A: bool = false;
override TRANS_B: bool = false;

fn store4(base: u32, col: u32, v: vec4<f32>) {
    // writes C[base + col .. +3] (alpha/accumulate applied)
    let s = v * params.alpha;
    if ((params.flags & 1u) != 0u) {
        c[base + col] += s.x; c[base + col + 1u] += s.y; c[base + col + 2u] += s.z; c[base + col + 3u] += s.w;
    } else {
        c[base + col] = s.x; c[base + col + 1u] = s.y; c[base + col + 2u] = s.z; c[base + col + 3u] = s.w;
    }
}

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let M = params.m; let N = params.n; let K = params.k;
    let n0 = (wg.x * 8u + lid.x) * 16u;
    let m0 = (wg.y * 8u + lid.y) * 16u;
    if (n0 >= N || m0 >= M) { return; }
    let oa = params.offset_a + wg.z * params.stride_a;
    let ob = params.offset_b + wg.z * params.stride_b;
    var acc0_0 = vec4<f32>(0.0); var acc0_1 = vec4<f32>(0.0); var acc0_2 = vec4<f32>(0.0); var acc0_3 = vec4<f32>(0.0);
    var acc1_0 = vec4<f32>(0.0); var acc1_1 = vec4<f32>(0.0); var acc1_2 = vec4<f32>(0.0); var acc1_3 = vec4<f32>(0.0);
    var acc2_0 = vec4<f32>(0.0); var acc2_1 = vec4<f32>(0.0); var acc2_2 = vec4<f32>(0.0); var acc2_3 = vec4<f32>(0.0);
    var acc3_0 = vec4<f32>(0.0); var acc3_1 = vec4<f32>(0.0); var acc3_2 = vec4<f32>(0.0); var acc3_3 = vec4<f32>(0.0);
    var acc4_0 = vec4<f32>(0.0); var acc4_1 = vec4<f32>(0.0); var acc4_2 = vec4<f32>(0.0); var acc4_3 = vec4<f32>(0.0);
    var acc5_0 = vec4<f32>(0.0); var acc5_1 = vec4<f32>(0.0); var acc5_2 = vec4<f32>(0.0); var acc5_3 = vec4<f32>(0.0);
    var acc6_0 = vec4<f32>(0.0); var acc6_1 = vec4<f32>(0.0); var acc6_2 = vec4<f32>(0.0); var acc6_3 = vec4<f32>(0.0);
    var acc7_0 = vec4<f32>(0.0); var acc7_1 = vec4<f32>(0.0); var acc7_2 = vec4<f32>(0.0); var acc7_3 = vec4<f32>(0.0);
    var acc8_0 = vec4<f32>(0.0); var acc8_1 = vec4<f32>(0.0); var acc8_2 = vec4<f32>(0.0); var acc8_3 = vec4<f32>(0.0);
    var acc9_0 = vec4<f32>(0.0); var acc9_1 = vec4<f32>(0.0); var acc9_2 = vec4<f32>(0.0); var acc9_3 = vec4<f32>(0.0);
    var acc10_0 = vec4<f32>(0.0); var acc10_1 = vec4<f32>(0.0); var acc10_2 = vec4<f32>(0.0); var acc10_3 = vec4<f32>(0.0);
    var acc11_0 = vec4<f32>(0.0); var acc11_1 = vec4<f32>(0.0); var acc11_2 = vec4<f32>(0.0); var acc11_3 = vec4<f32>(0.0);
    var acc12_0 = vec4<f32>(0.0); var acc12_1 = vec4<f32>(0.0); var acc12_2 = vec4<f32>(0.0); var acc12_3 = vec4<f32>(0.0);
    var acc13_0 = vec4<f32>(0.0); var acc13_1 = vec4<f32>(0.0); var acc13_2 = vec4<f32>(0.0); var acc13_3 = vec4<f32>(0.0);
    var acc14_0 = vec4<f32>(0.0); var acc14_1 = vec4<f32>(0.0); var acc14_2 = vec4<f32>(0.0); var acc14_3 = vec4<f32>(0.0);
    var acc15_0 = vec4<f32>(0.0); var acc15_1 = vec4<f32>(0.0); var acc15_2 = vec4<f32>(0.0); var acc15_3 = vec4<f32>(0.0);
    let cg0 = min(n0 + 0u, N - 4u);   // vec4 column group (N % 4 == 0 on this path)
    let cg1 = min(n0 + 4u, N - 4u);   // vec4 column group (N % 4 == 0 on this path)
    let cg2 = min(n0 + 8u, N - 4u);   // vec4 column group (N % 4 == 0 on this path)
    let cg3 = min(n0 + 12u, N - 4u);   // vec4 column group (N % 4 == 0 on this path)
    if (!TRANS_A && !TRANS_B) {
        let ra0 = (oa + min(m0 + 0u, M - 1u) * K) >> 2u;
        let ra1 = (oa + min(m0 + 1u, M - 1u) * K) >> 2u;
        let ra2 = (oa + min(m0 + 2u, M - 1u) * K) >> 2u;
        let ra3 = (oa + min(m0 + 3u, M - 1u) * K) >> 2u;
        let ra4 = (oa + min(m0 + 4u, M - 1u) * K) >> 2u;
        let ra5 = (oa + min(m0 + 5u, M - 1u) * K) >> 2u;
        let ra6 = (oa + min(m0 + 6u, M - 1u) * K) >> 2u;
        let ra7 = (oa + min(m0 + 7u, M - 1u) * K) >> 2u;
        let ra8 = (oa + min(m0 + 8u, M - 1u) * K) >> 2u;
        let ra9 = (oa + min(m0 + 9u, M - 1u) * K) >> 2u;
        let ra10 = (oa + min(m0 + 10u, M - 1u) * K) >> 2u;
        let ra11 = (oa + min(m0 + 11u, M - 1u) * K) >> 2u;
        let ra12 = (oa + min(m0 + 12u, M - 1u) * K) >> 2u;
        let ra13 = (oa + min(m0 + 13u, M - 1u) * K) >> 2u;
        let ra14 = (oa + min(m0 + 14u, M - 1u) * K) >> 2u;
        let ra15 = (oa + min(m0 + 15u, M - 1u) * K) >> 2u;
        var rb = ob >> 2u;
        let n4 = N >> 2u;
        for (var k4 = 0u; k4 < (K >> 2u); k4++) {
            let a0 = a_v4[ra0 + k4];
            let a1 = a_v4[ra1 + k4];
            let a2 = a_v4[ra2 + k4];
            let a3 = a_v4[ra3 + k4];
            let a4 = a_v4[ra4 + k4];
            let a5 = a_v4[ra5 + k4];
            let a6 = a_v4[ra6 + k4];
            let a7 = a_v4[ra7 + k4];
            let a8 = a_v4[ra8 + k4];
            let a9 = a_v4[ra9 + k4];
            let a10 = a_v4[ra10 + k4];
            let a11 = a_v4[ra11 + k4];
            let a12 = a_v4[ra12 + k4];
            let a13 = a_v4[ra13 + k4];
            let a14 = a_v4[ra14 + k4];
            let a15 = a_v4[ra15 + k4];
            let b0_0 = b_v4[rb + 0u * n4 + (cg0 >> 2u)];
            let b0_1 = b_v4[rb + 0u * n4 + (cg1 >> 2u)];
            let b0_2 = b_v4[rb + 0u * n4 + (cg2 >> 2u)];
            let b0_3 = b_v4[rb + 0u * n4 + (cg3 >> 2u)];
            let b1_0 = b_v4[rb + 1u * n4 + (cg0 >> 2u)];
            let b1_1 = b_v4[rb + 1u * n4 + (cg1 >> 2u)];
            let b1_2 = b_v4[rb + 1u * n4 + (cg2 >> 2u)];
            let b1_3 = b_v4[rb + 1u * n4 + (cg3 >> 2u)];
            let b2_0 = b_v4[rb + 2u * n4 + (cg0 >> 2u)];
            let b2_1 = b_v4[rb + 2u * n4 + (cg1 >> 2u)];
            let b2_2 = b_v4[rb + 2u * n4 + (cg2 >> 2u)];
            let b2_3 = b_v4[rb + 2u * n4 + (cg3 >> 2u)];
            let b3_0 = b_v4[rb + 3u * n4 + (cg0 >> 2u)];
            let b3_1 = b_v4[rb + 3u * n4 + (cg1 >> 2u)];
            let b3_2 = b_v4[rb + 3u * n4 + (cg2 >> 2u)];
            let b3_3 = b_v4[rb + 3u * n4 + (cg3 >> 2u)];
            acc0_0 += a0.x * b0_0 + a0.y * b1_0 + a0.z * b2_0 + a0.w * b3_0;
            acc0_1 += a0.x * b0_1 + a0.y * b1_1 + a0.z * b2_1 + a0.w * b3_1;
            acc0_2 += a0.x * b0_2 + a0.y * b1_2 + a0.z * b2_2 + a0.w * b3_2;
            acc0_3 += a0.x * b0_3 + a0.y * b1_3 + a0.z * b2_3 + a0.w * b3_3;
            acc1_0 += a1.x * b0_0 + a1.y * b1_0 + a1.z * b2_0 + a1.w * b3_0;
            acc1_1 += a1.x * b0_1 + a1.y * b1_1 + a1.z * b2_1 + a1.w * b3_1;
            acc1_2 += a1.x * b0_2 + a1.y * b1_2 + a1.z * b2_2 + a1.w * b3_2;
            acc1_3 += a1.x * b0_3 + a1.y * b1_3 + a1.z * b2_3 + a1.w * b3_3;
            acc2_0 += a2.x * b0_0 + a2.y * b1_0 + a2.z * b2_0 + a2.w * b3_0;
            acc2_1 += a2.x * b0_1 + a2.y * b1_1 + a2.z * b2_1 + a2.w * b3_1;
            acc2_2 += a2.x * b0_2 + a2.y * b1_2 + a2.z * b2_2 + a2.w * b3_2;
            acc2_3 += a2.x * b0_3 + a2.y * b1_3 + a2.z * b2_3 + a2.w * b3_3;
            acc3_0 += a3.x * b0_0 + a3.y * b1_0 + a3.z * b2_0 + a3.w * b3_0;
            acc3_1 += a3.x * b0_1 + a3.y * b1_1 + a3.z * b2_1 + a3.w * b3_1;
            acc3_2 += a3.x * b0_2 + a3.y * b1_2 + a3.z * b2_2 + a3.w * b3_2;
            acc3_3 += a3.x * b0_3 + a3.y * b1_3 + a3.z * b2_3 + a3.w * b3_3;
            acc4_0 += a4.x * b0_0 + a4.y * b1_0 + a4.z * b2_0 + a4.w * b3_0;
            acc4_1 += a4.x * b0_1 + a4.y * b1_1 + a4.z * b2_1 + a4.w * b3_1;
            acc4_2 += a4.x * b0_2 + a4.y * b1_2 + a4.z * b2_2 + a4.w * b3_2;
            acc4_3 += a4.x * b0_3 + a4.y * b1_3 + a4.z * b2_3 + a4.w * b3_3;
            acc5_0 += a5.x * b0_0 + a5.y * b1_0 + a5.z * b2_0 + a5.w * b3_0;
            acc5_1 += a5.x * b0_1 + a5.y * b1_1 + a5.z * b2_1 + a5.w * b3_1;
            acc5_2 += a5.x * b0_2 + a5.y * b1_2 + a5.z * b2_2 + a5.w * b3_2;
            acc5_3 += a5.x * b0_3 + a5.y * b1_3 + a5.z * b2_3 + a5.w * b3_3;
            acc6_0 += a6.x * b0_0 + a6.y * b1_0 + a6.z * b2_0 + a6.w * b3_0;
            acc6_1 += a6.x * b0_1 + a6.y * b1_1 + a6.z * b2_1 + a6.w * b3_1;
            acc6_2 += a6.x * b0_2 + a6.y * b1_2 + a6.z * b2_2 + a6.w * b3_2;
            acc6_3 += a6.x * b0_3 + a6.y * b1_3 + a6.z * b2_3 + a6.w * b3_3;
            acc7_0 += a7.x * b0_0 + a7.y * b1_0 + a7.z * b2_0 + a7.w * b3_0;
            acc7_1 += a7.x * b0_1 + a7.y * b1_1 + a7.z * b2_1 + a7.w * b3_1;
            acc7_2 += a7.x * b0_2 + a7.y * b1_2 + a7.z * b2_2 + a7.w * b3_2;
            acc7_3 += a7.x * b0_3 + a7.y * b1_3 + a7.z * b2_3 + a7.w * b3_3;
            acc8_0 += a8.x * b0_0 + a8.y * b1_0 + a8.z * b2_0 + a8.w * b3_0;
            acc8_1 += a8.x * b0_1 + a8.y * b1_1 + a8.z * b2_1 + a8.w * b3_1;
            acc8_2 += a8.x * b0_2 + a8.y * b1_2 + a8.z * b2_2 + a8.w * b3_2;
            acc8_3 += a8.x * b0_3 + a8.y * b1_3 + a8.z * b2_3 + a8.w * b3_3;
            acc9_0 += a9.x * b0_0 + a9.y * b1_0 + a9.z * b2_0 + a9.w * b3_0;
            acc9_1 += a9.x * b0_1 + a9.y * b1_1 + a9.z * b2_1 + a9.w * b3_1;
            acc9_2 += a9.x * b0_2 + a9.y * b1_2 + a9.z * b2_2 + a9.w * b3_2;
            acc9_3 += a9.x * b0_3 + a9.y * b1_3 + a9.z * b2_3 + a9.w * b3_3;
            acc10_0 += a10.x * b0_0 + a10.y * b1_0 + a10.z * b2_0 + a10.w * b3_0;
            acc10_1 += a10.x * b0_1 + a10.y * b1_1 + a10.z * b2_1 + a10.w * b3_1;
            acc10_2 += a10.x * b0_2 + a10.y * b1_2 + a10.z * b2_2 + a10.w * b3_2;
            acc10_3 += a10.x * b0_3 + a10.y * b1_3 + a10.z * b2_3 + a10.w * b3_3;
            acc11_0 += a11.x * b0_0 + a11.y * b1_0 + a11.z * b2_0 + a11.w * b3_0;
            acc11_1 += a11.x * b0_1 + a11.y * b1_1 + a11.z * b2_1 + a11.w * b3_1;
            acc11_2 += a11.x * b0_2 + a11.y * b1_2 + a11.z * b2_2 + a11.w * b3_2;
            acc11_3 += a11.x * b0_3 + a11.y * b1_3 + a11.z * b2_3 + a11.w * b3_3;
            acc12_0 += a12.x * b0_0 + a12.y * b1_0 + a12.z * b2_0 + a12.w * b3_0;
            acc12_1 += a12.x * b0_1 + a12.y * b1_1 + a12.z * b2_1 + a12.w * b3_1;
            acc12_2 += a12.x * b0_2 + a12.y * b1_2 + a12.z * b2_2 + a12.w * b3_2;
            acc12_3 += a12.x * b0_3 + a12.y * b1_3 + a12.z * b2_3 + a12.w * b3_3;
            acc13_0 += a13.x * b0_0 + a13.y * b1_0 + a13.z * b2_0 + a13.w * b3_0;
            acc13_1 += a13.x * b0_1 + a13.y * b1_1 + a13.z * b2_1 + a13.w * b3_1;
            acc13_2 += a13.x * b0_2 + a13.y * b1_2 + a13.z * b2_2 + a13.w * b3_2;
            acc13_3 += a13.x * b0_3 + a13.y * b1_3 + a13.z * b2_3 + a13.w * b3_3;
            acc14_0 += a14.x * b0_0 + a14.y * b1_0 + a14.z * b2_0 + a14.w * b3_0;
            acc14_1 += a14.x * b0_1 + a14.y * b1_1 + a14.z * b2_1 + a14.w * b3_1;
            acc14_2 += a14.x * b0_2 + a14.y * b1_2 + a14.z * b2_2 + a14.w * b3_2;
            acc14_3 += a14.x * b0_3 + a14.y * b1_3 + a14.z * b2_3 + a14.w * b3_3;
            acc15_0 += a15.x * b0_0 + a15.y * b1_0 + a15.z * b2_0 + a15.w * b3_0;
            acc15_1 += a15.x * b0_1 + a15.y * b1_1 + a15.z * b2_1 + a15.w * b3_1;
            acc15_2 += a15.x * b0_2 + a15.y * b1_2 + a15.z * b2_2 + a15.w * b3_2;
            acc15_3 += a15.x * b0_3 + a15.y * b1_3 + a15.z * b2_3 + a15.w * b3_3;
            rb += 4u * n4;
        }
    } else if (TRANS_A && !TRANS_B) {
        let mg0 = min(m0 + 0u, M - 4u) >> 2u;
        let mg1 = min(m0 + 4u, M - 4u) >> 2u;
        let mg2 = min(m0 + 8u, M - 4u) >> 2u;
        let mg3 = min(m0 + 12u, M - 4u) >> 2u;
        let m4 = M >> 2u; let n4 = N >> 2u;
        var ra = oa >> 2u; var rb = ob >> 2u;
        for (var k = 0u; k < K; k++) {   // any K: A^T rows run along m, B rows along n
            let a0 = a_v4[ra + mg0];
            let a1 = a_v4[ra + mg1];
            let a2 = a_v4[ra + mg2];
            let a3 = a_v4[ra + mg3];
            let b0 = b_v4[rb + (cg0 >> 2u)];
            let b1 = b_v4[rb + (cg1 >> 2u)];
            let b2 = b_v4[rb + (cg2 >> 2u)];
            let b3 = b_v4[rb + (cg3 >> 2u)];
            acc0_0 += a0[0] * b0;
            acc0_1 += a0[0] * b1;
            acc0_2 += a0[0] * b2;
            acc0_3 += a0[0] * b3;
            acc1_0 += a0[1] * b0;
            acc1_1 += a0[1] * b1;
            acc1_2 += a0[1] * b2;
            acc1_3 += a0[1] * b3;
            acc2_0 += a0[2] * b0;
            acc2_1 += a0[2] * b1;
            acc2_2 += a0[2] * b2;
            acc2_3 += a0[2] * b3;
            acc3_0 += a0[3] * b0;
            acc3_1 += a0[3] * b1;
            acc3_2 += a0[3] * b2;
            acc3_3 += a0[3] * b3;
            acc4_0 += a1[0] * b0;
            acc4_1 += a1[0] * b1;
            acc4_2 += a1[0] * b2;
            acc4_3 += a1[0] * b3;
            acc5_0 += a1[1] * b0;
            acc5_1 += a1[1] * b1;
            acc5_2 += a1[1] * b2;
            acc5_3 += a1[1] * b3;
            acc6_0 += a1[2] * b0;
            acc6_1 += a1[2] * b1;
            acc6_2 += a1[2] * b2;
            acc6_3 += a1[2] * b3;
            acc7_0 += a1[3] * b0;
            acc7_1 += a1[3] * b1;
            acc7_2 += a1[3] * b2;
            acc7_3 += a1[3] * b3;
            acc8_0 += a2[0] * b0;
            acc8_1 += a2[0] * b1;
            acc8_2 += a2[0] * b2;
            acc8_3 += a2[0] * b3;
            acc9_0 += a2[1] * b0;
            acc9_1 += a2[1] * b1;
            acc9_2 += a2[1] * b2;
            acc9_3 += a2[1] * b3;
            acc10_0 += a2[2] * b0;
            acc10_1 += a2[2] * b1;
            acc10_2 += a2[2] * b2;
            acc10_3 += a2[2] * b3;
            acc11_0 += a2[3] * b0;
            acc11_1 += a2[3] * b1;
            acc11_2 += a2[3] * b2;
            acc11_3 += a2[3] * b3;
            acc12_0 += a3[0] * b0;
            acc12_1 += a3[0] * b1;
            acc12_2 += a3[0] * b2;
            acc12_3 += a3[0] * b3;
            acc13_0 += a3[1] * b0;
            acc13_1 += a3[1] * b1;
            acc13_2 += a3[1] * b2;
            acc13_3 += a3[1] * b3;
            acc14_0 += a3[2] * b0;
            acc14_1 += a3[2] * b1;
            acc14_2 += a3[2] * b2;
            acc14_3 += a3[2] * b3;
            acc15_0 += a3[3] * b0;
            acc15_1 += a3[3] * b1;
            acc15_2 += a3[3] * b2;
            acc15_3 += a3[3] * b3;
            ra += m4; rb += n4;
        }
    } else if (!TRANS_A && TRANS_B) {
        let ra0 = (oa + min(m0 + 0u, M - 1u) * K) >> 2u;
        let ra1 = (oa + min(m0 + 1u, M - 1u) * K) >> 2u;
        let ra2 = (oa + min(m0 + 2u, M - 1u) * K) >> 2u;
        let ra3 = (oa + min(m0 + 3u, M - 1u) * K) >> 2u;
        let ra4 = (oa + min(m0 + 4u, M - 1u) * K) >> 2u;
        let ra5 = (oa + min(m0 + 5u, M - 1u) * K) >> 2u;
        let ra6 = (oa + min(m0 + 6u, M - 1u) * K) >> 2u;
        let ra7 = (oa + min(m0 + 7u, M - 1u) * K) >> 2u;
        let ra8 = (oa + min(m0 + 8u, M - 1u) * K) >> 2u;
        let ra9 = (oa + min(m0 + 9u, M - 1u) * K) >> 2u;
        let ra10 = (oa + min(m0 + 10u, M - 1u) * K) >> 2u;
        let ra11 = (oa + min(m0 + 11u, M - 1u) * K) >> 2u;
        let ra12 = (oa + min(m0 + 12u, M - 1u) * K) >> 2u;
        let ra13 = (oa + min(m0 + 13u, M - 1u) * K) >> 2u;
        let ra14 = (oa + min(m0 + 14u, M - 1u) * K) >> 2u;
        let ra15 = (oa + min(m0 + 15u, M - 1u) * K) >> 2u;
        let rb0 = (ob + min(n0 + 0u, N - 1u) * K) >> 2u;
        let rb1 = (ob + min(n0 + 1u, N - 1u) * K) >> 2u;
        let rb2 = (ob + min(n0 + 2u, N - 1u) * K) >> 2u;
        let rb3 = (ob + min(n0 + 3u, N - 1u) * K) >> 2u;
        let rb4 = (ob + min(n0 + 4u, N - 1u) * K) >> 2u;
        let rb5 = (ob + min(n0 + 5u, N - 1u) * K) >> 2u;
        let rb6 = (ob + min(n0 + 6u, N - 1u) * K) >> 2u;
        let rb7 = (ob + min(n0 + 7u, N - 1u) * K) >> 2u;
        let rb8 = (ob + min(n0 + 8u, N - 1u) * K) >> 2u;
        let rb9 = (ob + min(n0 + 9u, N - 1u) * K) >> 2u;
        let rb10 = (ob + min(n0 + 10u, N - 1u) * K) >> 2u;
        let rb11 = (ob + min(n0 + 11u, N - 1u) * K) >> 2u;
        let rb12 = (ob + min(n0 + 12u, N - 1u) * K) >> 2u;
        let rb13 = (ob + min(n0 + 13u, N - 1u) * K) >> 2u;
        let rb14 = (ob + min(n0 + 14u, N - 1u) * K) >> 2u;
        let rb15 = (ob + min(n0 + 15u, N - 1u) * K) >> 2u;
        for (var k4 = 0u; k4 < (K >> 2u); k4++) {
            let a0 = a_v4[ra0 + k4];
            let a1 = a_v4[ra1 + k4];
            let a2 = a_v4[ra2 + k4];
            let a3 = a_v4[ra3 + k4];
            let a4 = a_v4[ra4 + k4];
            let a5 = a_v4[ra5 + k4];
            let a6 = a_v4[ra6 + k4];
            let a7 = a_v4[ra7 + k4];
            let a8 = a_v4[ra8 + k4];
            let a9 = a_v4[ra9 + k4];
            let a10 = a_v4[ra10 + k4];
            let a11 = a_v4[ra11 + k4];
            let a12 = a_v4[ra12 + k4];
            let a13 = a_v4[ra13 + k4];
            let a14 = a_v4[ra14 + k4];
            let a15 = a_v4[ra15 + k4];
            let b0 = b_v4[rb0 + k4];
            let b1 = b_v4[rb1 + k4];
            let b2 = b_v4[rb2 + k4];
            let b3 = b_v4[rb3 + k4];
            let b4 = b_v4[rb4 + k4];
            let b5 = b_v4[rb5 + k4];
            let b6 = b_v4[rb6 + k4];
            let b7 = b_v4[rb7 + k4];
            let b8 = b_v4[rb8 + k4];
            let b9 = b_v4[rb9 + k4];
            let b10 = b_v4[rb10 + k4];
            let b11 = b_v4[rb11 + k4];
            let b12 = b_v4[rb12 + k4];
            let b13 = b_v4[rb13 + k4];
            let b14 = b_v4[rb14 + k4];
            let b15 = b_v4[rb15 + k4];
            acc0_0 += vec4<f32>(dot(a0, b0), dot(a0, b1), dot(a0, b2), dot(a0, b3));
            acc0_1 += vec4<f32>(dot(a0, b4), dot(a0, b5), dot(a0, b6), dot(a0, b7));
            acc0_2 += vec4<f32>(dot(a0, b8), dot(a0, b9), dot(a0, b10), dot(a0, b11));
            acc0_3 += vec4<f32>(dot(a0, b12), dot(a0, b13), dot(a0, b14), dot(a0, b15));
            acc1_0 += vec4<f32>(dot(a1, b0), dot(a1, b1), dot(a1, b2), dot(a1, b3));
            acc1_1 += vec4<f32>(dot(a1, b4), dot(a1, b5), dot(a1, b6), dot(a1, b7));
            acc1_2 += vec4<f32>(dot(a1, b8), dot(a1, b9), dot(a1, b10), dot(a1, b11));
            acc1_3 += vec4<f32>(dot(a1, b12), dot(a1, b13), dot(a1, b14), dot(a1, b15));
            acc2_0 += vec4<f32>(dot(a2, b0), dot(a2, b1), dot(a2, b2), dot(a2, b3));
            acc2_1 += vec4<f32>(dot(a2, b4), dot(a2, b5), dot(a2, b6), dot(a2, b7));
            acc2_2 += vec4<f32>(dot(a2, b8), dot(a2, b9), dot(a2, b10), dot(a2, b11));
            acc2_3 += vec4<f32>(dot(a2, b12), dot(a2, b13), dot(a2, b14), dot(a2, b15));
            acc3_0 += vec4<f32>(dot(a3, b0), dot(a3, b1), dot(a3, b2), dot(a3, b3));
            acc3_1 += vec4<f32>(dot(a3, b4), dot(a3, b5), dot(a3, b6), dot(a3, b7));
            acc3_2 += vec4<f32>(dot(a3, b8), dot(a3, b9), dot(a3, b10), dot(a3, b11));
            acc3_3 += vec4<f32>(dot(a3, b12), dot(a3, b13), dot(a3, b14), dot(a3, b15));
            acc4_0 += vec4<f32>(dot(a4, b0), dot(a4, b1), dot(a4, b2), dot(a4, b3));
            acc4_1 += vec4<f32>(dot(a4, b4), dot(a4, b5), dot(a4, b6), dot(a4, b7));
            acc4_2 += vec4<f32>(dot(a4, b8), dot(a4, b9), dot(a4, b10), dot(a4, b11));
            acc4_3 += vec4<f32>(dot(a4, b12), dot(a4, b13), dot(a4, b14), dot(a4, b15));
            acc5_0 += vec4<f32>(dot(a5, b0), dot(a5, b1), dot(a5, b2), dot(a5, b3));
            acc5_1 += vec4<f32>(dot(a5, b4), dot(a5, b5), dot(a5, b6), dot(a5, b7));
            acc5_2 += vec4<f32>(dot(a5, b8), dot(a5, b9), dot(a5, b10), dot(a5, b11));
            acc5_3 += vec4<f32>(dot(a5, b12), dot(a5, b13), dot(a5, b14), dot(a5, b15));
            acc6_0 += vec4<f32>(dot(a6, b0), dot(a6, b1), dot(a6, b2), dot(a6, b3));
            acc6_1 += vec4<f32>(dot(a6, b4), dot(a6, b5), dot(a6, b6), dot(a6, b7));
            acc6_2 += vec4<f32>(dot(a6, b8), dot(a6, b9), dot(a6, b10), dot(a6, b11));
            acc6_3 += vec4<f32>(dot(a6, b12), dot(a6, b13), dot(a6, b14), dot(a6, b15));
            acc7_0 += vec4<f32>(dot(a7, b0), dot(a7, b1), dot(a7, b2), dot(a7, b3));
            acc7_1 += vec4<f32>(dot(a7, b4), dot(a7, b5), dot(a7, b6), dot(a7, b7));
            acc7_2 += vec4<f32>(dot(a7, b8), dot(a7, b9), dot(a7, b10), dot(a7, b11));
            acc7_3 += vec4<f32>(dot(a7, b12), dot(a7, b13), dot(a7, b14), dot(a7, b15));
            acc8_0 += vec4<f32>(dot(a8, b0), dot(a8, b1), dot(a8, b2), dot(a8, b3));
            acc8_1 += vec4<f32>(dot(a8, b4), dot(a8, b5), dot(a8, b6), dot(a8, b7));
            acc8_2 += vec4<f32>(dot(a8, b8), dot(a8, b9), dot(a8, b10), dot(a8, b11));
            acc8_3 += vec4<f32>(dot(a8, b12), dot(a8, b13), dot(a8, b14), dot(a8, b15));
            acc9_0 += vec4<f32>(dot(a9, b0), dot(a9, b1), dot(a9, b2), dot(a9, b3));
            acc9_1 += vec4<f32>(dot(a9, b4), dot(a9, b5), dot(a9, b6), dot(a9, b7));
            acc9_2 += vec4<f32>(dot(a9, b8), dot(a9, b9), dot(a9, b10), dot(a9, b11));
            acc9_3 += vec4<f32>(dot(a9, b12), dot(a9, b13), dot(a9, b14), dot(a9, b15));
            acc10_0 += vec4<f32>(dot(a10, b0), dot(a10, b1), dot(a10, b2), dot(a10, b3));
            acc10_1 += vec4<f32>(dot(a10, b4), dot(a10, b5), dot(a10, b6), dot(a10, b7));
            acc10_2 += vec4<f32>(dot(a10, b8), dot(a10, b9), dot(a10, b10), dot(a10, b11));
            acc10_3 += vec4<f32>(dot(a10, b12), dot(a10, b13), dot(a10, b14), dot(a10, b15));
            acc11_0 += vec4<f32>(dot(a11, b0), dot(a11, b1), dot(a11, b2), dot(a11, b3));
            acc11_1 += vec4<f32>(dot(a11, b4), dot(a11, b5), dot(a11, b6), dot(a11, b7));
            acc11_2 += vec4<f32>(dot(a11, b8), dot(a11, b9), dot(a11, b10), dot(a11, b11));
            acc11_3 += vec4<f32>(dot(a11, b12), dot(a11, b13), dot(a11, b14), dot(a11, b15));
            acc12_0 += vec4<f32>(dot(a12, b0), dot(a12, b1), dot(a12, b2), dot(a12, b3));
            acc12_1 += vec4<f32>(dot(a12, b4), dot(a12, b5), dot(a12, b6), dot(a12, b7));
            acc12_2 += vec4<f32>(dot(a12, b8), dot(a12, b9), dot(a12, b10), dot(a12, b11));
            acc12_3 += vec4<f32>(dot(a12, b12), dot(a12, b13), dot(a12, b14), dot(a12, b15));
            acc13_0 += vec4<f32>(dot(a13, b0), dot(a13, b1), dot(a13, b2), dot(a13, b3));
            acc13_1 += vec4<f32>(dot(a13, b4), dot(a13, b5), dot(a13, b6), dot(a13, b7));
            acc13_2 += vec4<f32>(dot(a13, b8), dot(a13, b9), dot(a13, b10), dot(a13, b11));
            acc13_3 += vec4<f32>(dot(a13, b12), dot(a13, b13), dot(a13, b14), dot(a13, b15));
            acc14_0 += vec4<f32>(dot(a14, b0), dot(a14, b1), dot(a14, b2), dot(a14, b3));
            acc14_1 += vec4<f32>(dot(a14, b4), dot(a14, b5), dot(a14, b6), dot(a14, b7));
            acc14_2 += vec4<f32>(dot(a14, b8), dot(a14, b9), dot(a14, b10), dot(a14, b11));
            acc14_3 += vec4<f32>(dot(a14, b12), dot(a14, b13), dot(a14, b14), dot(a14, b15));
            acc15_0 += vec4<f32>(dot(a15, b0), dot(a15, b1), dot(a15, b2), dot(a15, b3));
            acc15_1 += vec4<f32>(dot(a15, b4), dot(a15, b5), dot(a15, b6), dot(a15, b7));
            acc15_2 += vec4<f32>(dot(a15, b8), dot(a15, b9), dot(a15, b10), dot(a15, b11));
            acc15_3 += vec4<f32>(dot(a15, b12), dot(a15, b13), dot(a15, b14), dot(a15, b15));
        }
    } else {
        let mg0 = min(m0 + 0u, M - 4u) >> 2u;
        let mg1 = min(m0 + 4u, M - 4u) >> 2u;
        let mg2 = min(m0 + 8u, M - 4u) >> 2u;
        let mg3 = min(m0 + 12u, M - 4u) >> 2u;
        let rb0 = (ob + min(n0 + 0u, N - 1u) * K) >> 2u;
        let rb1 = (ob + min(n0 + 1u, N - 1u) * K) >> 2u;
        let rb2 = (ob + min(n0 + 2u, N - 1u) * K) >> 2u;
        let rb3 = (ob + min(n0 + 3u, N - 1u) * K) >> 2u;
        let rb4 = (ob + min(n0 + 4u, N - 1u) * K) >> 2u;
        let rb5 = (ob + min(n0 + 5u, N - 1u) * K) >> 2u;
        let rb6 = (ob + min(n0 + 6u, N - 1u) * K) >> 2u;
        let rb7 = (ob + min(n0 + 7u, N - 1u) * K) >> 2u;
        let rb8 = (ob + min(n0 + 8u, N - 1u) * K) >> 2u;
        let rb9 = (ob + min(n0 + 9u, N - 1u) * K) >> 2u;
        let rb10 = (ob + min(n0 + 10u, N - 1u) * K) >> 2u;
        let rb11 = (ob + min(n0 + 11u, N - 1u) * K) >> 2u;
        let rb12 = (ob + min(n0 + 12u, N - 1u) * K) >> 2u;
        let rb13 = (ob + min(n0 + 13u, N - 1u) * K) >> 2u;
        let rb14 = (ob + min(n0 + 14u, N - 1u) * K) >> 2u;
        let rb15 = (ob + min(n0 + 15u, N - 1u) * K) >> 2u;
        let m4 = M >> 2u;
        var ra = oa >> 2u;
        for (var k4 = 0u; k4 < (K >> 2u); k4++) {
            let a0_0 = a_v4[ra + 0u * m4 + mg0];
            let a0_1 = a_v4[ra + 0u * m4 + mg1];
            let a0_2 = a_v4[ra + 0u * m4 + mg2];
            let a0_3 = a_v4[ra + 0u * m4 + mg3];
            let a1_0 = a_v4[ra + 1u * m4 + mg0];
            let a1_1 = a_v4[ra + 1u * m4 + mg1];
            let a1_2 = a_v4[ra + 1u * m4 + mg2];
            let a1_3 = a_v4[ra + 1u * m4 + mg3];
            let a2_0 = a_v4[ra + 2u * m4 + mg0];
            let a2_1 = a_v4[ra + 2u * m4 + mg1];
            let a2_2 = a_v4[ra + 2u * m4 + mg2];
            let a2_3 = a_v4[ra + 2u * m4 + mg3];
            let a3_0 = a_v4[ra + 3u * m4 + mg0];
            let a3_1 = a_v4[ra + 3u * m4 + mg1];
            let a3_2 = a_v4[ra + 3u * m4 + mg2];
            let a3_3 = a_v4[ra + 3u * m4 + mg3];
            let b0 = b_v4[rb0 + k4];
            let b1 = b_v4[rb1 + k4];
            let b2 = b_v4[rb2 + k4];
            let b3 = b_v4[rb3 + k4];
            let b4 = b_v4[rb4 + k4];
            let b5 = b_v4[rb5 + k4];
            let b6 = b_v4[rb6 + k4];
            let b7 = b_v4[rb7 + k4];
            let b8 = b_v4[rb8 + k4];
            let b9 = b_v4[rb9 + k4];
            let b10 = b_v4[rb10 + k4];
            let b11 = b_v4[rb11 + k4];
            let b12 = b_v4[rb12 + k4];
            let b13 = b_v4[rb13 + k4];
            let b14 = b_v4[rb14 + k4];
            let b15 = b_v4[rb15 + k4];
            acc0_0 += vec4<f32>(a0_0[0] * b0[0] + a1_0[0] * b0[1] + a2_0[0] * b0[2] + a3_0[0] * b0[3], a0_0[0] * b1[0] + a1_0[0] * b1[1] + a2_0[0] * b1[2] + a3_0[0] * b1[3], a0_0[0] * b2[0] + a1_0[0] * b2[1] + a2_0[0] * b2[2] + a3_0[0] * b2[3], a0_0[0] * b3[0] + a1_0[0] * b3[1] + a2_0[0] * b3[2] + a3_0[0] * b3[3]);
            acc0_1 += vec4<f32>(a0_0[0] * b4[0] + a1_0[0] * b4[1] + a2_0[0] * b4[2] + a3_0[0] * b4[3], a0_0[0] * b5[0] + a1_0[0] * b5[1] + a2_0[0] * b5[2] + a3_0[0] * b5[3], a0_0[0] * b6[0] + a1_0[0] * b6[1] + a2_0[0] * b6[2] + a3_0[0] * b6[3], a0_0[0] * b7[0] + a1_0[0] * b7[1] + a2_0[0] * b7[2] + a3_0[0] * b7[3]);
            acc0_2 += vec4<f32>(a0_0[0] * b8[0] + a1_0[0] * b8[1] + a2_0[0] * b8[2] + a3_0[0] * b8[3], a0_0[0] * b9[0] + a1_0[0] * b9[1] + a2_0[0] * b9[2] + a3_0[0] * b9[3], a0_0[0] * b10[0] + a1_0[0] * b10[1] + a2_0[0] * b10[2] + a3_0[0] * b10[3], a0_0[0] * b11[0] + a1_0[0] * b11[1] + a2_0[0] * b11[2] + a3_0[0] * b11[3]);
            acc0_3 += vec4<f32>(a0_0[0] * b12[0] + a1_0[0] * b12[1] + a2_0[0] * b12[2] + a3_0[0] * b12[3], a0_0[0] * b13[0] + a1_0[0] * b13[1] + a2_0[0] * b13[2] + a3_0[0] * b13[3], a0_0[0] * b14[0] + a1_0[0] * b14[1] + a2_0[0] * b14[2] + a3_0[0] * b14[3], a0_0[0] * b15[0] + a1_0[0] * b15[1] + a2_0[0] * b15[2] + a3_0[0] * b15[3]);
            acc1_0 += vec4<f32>(a0_0[1] * b0[0] + a1_0[1] * b0[1] + a2_0[1] * b0[2] + a3_0[1] * b0[3], a0_0[1] * b1[0] + a1_0[1] * b1[1] + a2_0[1] * b1[2] + a3_0[1] * b1[3], a0_0[1] * b2[0] + a1_0[1] * b2[1] + a2_0[1] * b2[2] + a3_0[1] * b2[3], a0_0[1] * b3[0] + a1_0[1] * b3[1] + a2_0[1] * b3[2] + a3_0[1] * b3[3]);
            acc1_1 += vec4<f32>(a0_0[1] * b4[0] + a1_0[1] * b4[1] + a2_0[1] * b4[2] + a3_0[1] * b4[3], a0_0[1] * b5[0] + a1_0[1] * b5[1] + a2_0[1] * b5[2] + a3_0[1] * b5[3], a0_0[1] * b6[0] + a1_0[1] * b6[1] + a2_0[1] * b6[2] + a3_0[1] * b6[3], a0_0[1] * b7[0] + a1_0[1] * b7[1] + a2_0[1] * b7[2] + a3_0[1] * b7[3]);
            acc1_2 += vec4<f32>(a0_0[1] * b8[0] + a1_0[1] * b8[1] + a2_0[1] * b8[2] + a3_0[1] * b8[3], a0_0[1] * b9[0] + a1_0[1] * b9[1] + a2_0[1] * b9[2] + a3_0[1] * b9[3], a0_0[1] * b10[0] + a1_0[1] * b10[1] + a2_0[1] * b10[2] + a3_0[1] * b10[3], a0_0[1] * b11[0] + a1_0[1] * b11[1] + a2_0[1] * b11[2] + a3_0[1] * b11[3]);
            acc1_3 += vec4<f32>(a0_0[1] * b12[0] + a1_0[1] * b12[1] + a2_0[1] * b12[2] + a3_0[1] * b12[3], a0_0[1] * b13[0] + a1_0[1] * b13[1] + a2_0[1] * b13[2] + a3_0[1] * b13[3], a0_0[1] * b14[0] + a1_0[1] * b14[1] + a2_0[1] * b14[2] + a3_0[1] * b14[3], a0_0[1] * b15[0] + a1_0[1] * b15[1] + a2_0[1] * b15[2] + a3_0[1] * b15[3]);
            acc2_0 += vec4<f32>(a0_0[2] * b0[0] + a1_0[2] * b0[1] + a2_0[2] * b0[2] + a3_0[2] * b0[3], a0_0[2] * b1[0] + a1_0[2] * b1[1] + a2_0[2] * b1[2] + a3_0[2] * b1[3], a0_0[2] * b2[0] + a1_0[2] * b2[1] + a2_0[2] * b2[2] + a3_0[2] * b2[3], a0_0[2] * b3[0] + a1_0[2] * b3[1] + a2_0[2] * b3[2] + a3_0[2] * b3[3]);
            acc2_1 += vec4<f32>(a0_0[2] * b4[0] + a1_0[2] * b4[1] + a2_0[2] * b4[2] + a3_0[2] * b4[3], a0_0[2] * b5[0] + a1_0[2] * b5[1] + a2_0[2] * b5[2] + a3_0[2] * b5[3], a0_0[2] * b6[0] + a1_0[2] * b6[1] + a2_0[2] * b6[2] + a3_0[2] * b6[3], a0_0[2] * b7[0] + a1_0[2] * b7[1] + a2_0[2] * b7[2] + a3_0[2] * b7[3]);
            acc2_2 += vec4<f32>(a0_0[2] * b8[0] + a1_0[2] * b8[1] + a2_0[2] * b8[2] + a3_0[2] * b8[3], a0_0[2] * b9[0] + a1_0[2] * b9[1] + a2_0[2] * b9[2] + a3_0[2] * b9[3], a0_0[2] * b10[0] + a1_0[2] * b10[1] + a2_0[2] * b10[2] + a3_0[2] * b10[3], a0_0[2] * b11[0] + a1_0[2] * b11[1] + a2_0[2] * b11[2] + a3_0[2] * b11[3]);
            acc2_3 += vec4<f32>(a0_0[2] * b12[0] + a1_0[2] * b12[1] + a2_0[2] * b12[2] + a3_0[2] * b12[3], a0_0[2] * b13[0] + a1_0[2] * b13[1] + a2_0[2] * b13[2] + a3_0[2] * b13[3], a0_0[2] * b14[0] + a1_0[2] * b14[1] + a2_0[2] * b14[2] + a3_0[2] * b14[3], a0_0[2] * b15[0] + a1_0[2] * b15[1] + a2_0[2] * b15[2] + a3_0[2] * b15[3]);
            acc3_0 += vec4<f32>(a0_0[3] * b0[0] + a1_0[3] * b0[1] + a2_0[3] * b0[2] + a3_0[3] * b0[3], a0_0[3] * b1[0] + a1_0[3] * b1[1] + a2_0[3] * b1[2] + a3_0[3] * b1[3], a0_0[3] * b2[0] + a1_0[3] * b2[1] + a2_0[3] * b2[2] + a3_0[3] * b2[3], a0_0[3] * b3[0] + a1_0[3] * b3[1] + a2_0[3] * b3[2] + a3_0[3] * b3[3]);
            acc3_1 += vec4<f32>(a0_0[3] * b4[0] + a1_0[3] * b4[1] + a2_0[3] * b4[2] + a3_0[3] * b4[3], a0_0[3] * b5[0] + a1_0[3] * b5[1] + a2_0[3] * b5[2] + a3_0[3] * b5[3], a0_0[3] * b6[0] + a1_0[3] * b6[1] + a2_0[3] * b6[2] + a3_0[3] * b6[3], a0_0[3] * b7[0] + a1_0[3] * b7[1] + a2_0[3] * b7[2] + a3_0[3] * b7[3]);
            acc3_2 += vec4<f32>(a0_0[3] * b8[0] + a1_0[3] * b8[1] + a2_0[3] * b8[2] + a3_0[3] * b8[3], a0_0[3] * b9[0] + a1_0[3] * b9[1] + a2_0[3] * b9[2] + a3_0[3] * b9[3], a0_0[3] * b10[0] + a1_0[3] * b10[1] + a2_0[3] * b10[2] + a3_0[3] * b10[3], a0_0[3] * b11[0] + a1_0[3] * b11[1] + a2_0[3] * b11[2] + a3_0[3] * b11[3]);
            acc3_3 += vec4<f32>(a0_0[3] * b12[0] + a1_0[3] * b12[1] + a2_0[3] * b12[2] + a3_0[3] * b12[3], a0_0[3] * b13[0] + a1_0[3] * b13[1] + a2_0[3] * b13[2] + a3_0[3] * b13[3], a0_0[3] * b14[0] + a1_0[3] * b14[1] + a2_0[3] * b14[2] + a3_0[3] * b14[3], a0_0[3] * b15[0] + a1_0[3] * b15[1] + a2_0[3] * b15[2] + a3_0[3] * b15[3]);
            acc4_0 += vec4<f32>(a0_1[0] * b0[0] + a1_1[0] * b0[1] + a2_1[0] * b0[2] + a3_1[0] * b0[3], a0_1[0] * b1[0] + a1_1[0] * b1[1] + a2_1[0] * b1[2] + a3_1[0] * b1[3], a0_1[0] * b2[0] + a1_1[0] * b2[1] + a2_1[0] * b2[2] + a3_1[0] * b2[3], a0_1[0] * b3[0] + a1_1[0] * b3[1] + a2_1[0] * b3[2] + a3_1[0] * b3[3]);
            acc4_1 += vec4<f32>(a0_1[0] * b4[0] + a1_1[0] * b4[1] + a2_1[0] * b4[2] + a3_1[0] * b4[3], a0_1[0] * b5[0] + a1_1[0] * b5[1] + a2_1[0] * b5[2] + a3_1[0] * b5[3], a0_1[0] * b6[0] + a1_1[0] * b6[1] + a2_1[0] * b6[2] + a3_1[0] * b6[3], a0_1[0] * b7[0] + a1_1[0] * b7[1] + a2_1[0] * b7[2] + a3_1[0] * b7[3]);
            acc4_2 += vec4<f32>(a0_1[0] * b8[0] + a1_1[0] * b8[1] + a2_1[0] * b8[2] + a3_1[0] * b8[3], a0_1[0] * b9[0] + a1_1[0] * b9[1] + a2_1[0] * b9[2] + a3_1[0] * b9[3], a0_1[0] * b10[0] + a1_1[0] * b10[1] + a2_1[0] * b10[2] + a3_1[0] * b10[3], a0_1[0] * b11[0] + a1_1[0] * b11[1] + a2_1[0] * b11[2] + a3_1[0] * b11[3]);
            acc4_3 += vec4<f32>(a0_1[0] * b12[0] + a1_1[0] * b12[1] + a2_1[0] * b12[2] + a3_1[0] * b12[3], a0_1[0] * b13[0] + a1_1[0] * b13[1] + a2_1[0] * b13[2] + a3_1[0] * b13[3], a0_1[0] * b14[0] + a1_1[0] * b14[1] + a2_1[0] * b14[2] + a3_1[0] * b14[3], a0_1[0] * b15[0] + a1_1[0] * b15[1] + a2_1[0] * b15[2] + a3_1[0] * b15[3]);
            acc5_0 += vec4<f32>(a0_1[1] * b0[0] + a1_1[1] * b0[1] + a2_1[1] * b0[2] + a3_1[1] * b0[3], a0_1[1] * b1[0] + a1_1[1] * b1[1] + a2_1[1] * b1[2] + a3_1[1] * b1[3], a0_1[1] * b2[0] + a1_1[1] * b2[1] + a2_1[1] * b2[2] + a3_1[1] * b2[3], a0_1[1] * b3[0] + a1_1[1] * b3[1] + a2_1[1] * b3[2] + a3_1[1] * b3[3]);
            acc5_1 += vec4<f32>(a0_1[1] * b4[0] + a1_1[1] * b4[1] + a2_1[1] * b4[2] + a3_1[1] * b4[3], a0_1[1] * b5[0] + a1_1[1] * b5[1] + a2_1[1] * b5[2] + a3_1[1] * b5[3], a0_1[1] * b6[0] + a1_1[1] * b6[1] + a2_1[1] * b6[2] + a3_1[1] * b6[3], a0_1[1] * b7[0] + a1_1[1] * b7[1] + a2_1[1] * b7[2] + a3_1[1] * b7[3]);
            acc5_2 += vec4<f32>(a0_1[1] * b8[0] + a1_1[1] * b8[1] + a2_1[1] * b8[2] + a3_1[1] * b8[3], a0_1[1] * b9[0] + a1_1[1] * b9[1] + a2_1[1] * b9[2] + a3_1[1] * b9[3], a0_1[1] * b10[0] + a1_1[1] * b10[1] + a2_1[1] * b10[2] + a3_1[1] * b10[3], a0_1[1] * b11[0] + a1_1[1] * b11[1] + a2_1[1] * b11[2] + a3_1[1] * b11[3]);
            acc5_3 += vec4<f32>(a0_1[1] * b12[0] + a1_1[1] * b12[1] + a2_1[1] * b12[2] + a3_1[1] * b12[3], a0_1[1] * b13[0] + a1_1[1] * b13[1] + a2_1[1] * b13[2] + a3_1[1] * b13[3], a0_1[1] * b14[0] + a1_1[1] * b14[1] + a2_1[1] * b14[2] + a3_1[1] * b14[3], a0_1[1] * b15[0] + a1_1[1] * b15[1] + a2_1[1] * b15[2] + a3_1[1] * b15[3]);
            acc6_0 += vec4<f32>(a0_1[2] * b0[0] + a1_1[2] * b0[1] + a2_1[2] * b0[2] + a3_1[2] * b0[3], a0_1[2] * b1[0] + a1_1[2] * b1[1] + a2_1[2] * b1[2] + a3_1[2] * b1[3], a0_1[2] * b2[0] + a1_1[2] * b2[1] + a2_1[2] * b2[2] + a3_1[2] * b2[3], a0_1[2] * b3[0] + a1_1[2] * b3[1] + a2_1[2] * b3[2] + a3_1[2] * b3[3]);
            acc6_1 += vec4<f32>(a0_1[2] * b4[0] + a1_1[2] * b4[1] + a2_1[2] * b4[2] + a3_1[2] * b4[3], a0_1[2] * b5[0] + a1_1[2] * b5[1] + a2_1[2] * b5[2] + a3_1[2] * b5[3], a0_1[2] * b6[0] + a1_1[2] * b6[1] + a2_1[2] * b6[2] + a3_1[2] * b6[3], a0_1[2] * b7[0] + a1_1[2] * b7[1] + a2_1[2] * b7[2] + a3_1[2] * b7[3]);
            acc6_2 += vec4<f32>(a0_1[2] * b8[0] + a1_1[2] * b8[1] + a2_1[2] * b8[2] + a3_1[2] * b8[3], a0_1[2] * b9[0] + a1_1[2] * b9[1] + a2_1[2] * b9[2] + a3_1[2] * b9[3], a0_1[2] * b10[0] + a1_1[2] * b10[1] + a2_1[2] * b10[2] + a3_1[2] * b10[3], a0_1[2] * b11[0] + a1_1[2] * b11[1] + a2_1[2] * b11[2] + a3_1[2] * b11[3]);
            acc6_3 += vec4<f32>(a0_1[2] * b12[0] + a1_1[2] * b12[1] + a2_1[2] * b12[2] + a3_1[2] * b12[3], a0_1[2] * b13[0] + a1_1[2] * b13[1] + a2_1[2] * b13[2] + a3_1[2] * b13[3], a0_1[2] * b14[0] + a1_1[2] * b14[1] + a2_1[2] * b14[2] + a3_1[2] * b14[3], a0_1[2] * b15[0] + a1_1[2] * b15[1] + a2_1[2] * b15[2] + a3_1[2] * b15[3]);
            acc7_0 += vec4<f32>(a0_1[3] * b0[0] + a1_1[3] * b0[1] + a2_1[3] * b0[2] + a3_1[3] * b0[3], a0_1[3] * b1[0] + a1_1[3] * b1[1] + a2_1[3] * b1[2] + a3_1[3] * b1[3], a0_1[3] * b2[0] + a1_1[3] * b2[1] + a2_1[3] * b2[2] + a3_1[3] * b2[3], a0_1[3] * b3[0] + a1_1[3] * b3[1] + a2_1[3] * b3[2] + a3_1[3] * b3[3]);
            acc7_1 += vec4<f32>(a0_1[3] * b4[0] + a1_1[3] * b4[1] + a2_1[3] * b4[2] + a3_1[3] * b4[3], a0_1[3] * b5[0] + a1_1[3] * b5[1] + a2_1[3] * b5[2] + a3_1[3] * b5[3], a0_1[3] * b6[0] + a1_1[3] * b6[1] + a2_1[3] * b6[2] + a3_1[3] * b6[3], a0_1[3] * b7[0] + a1_1[3] * b7[1] + a2_1[3] * b7[2] + a3_1[3] * b7[3]);
            acc7_2 += vec4<f32>(a0_1[3] * b8[0] + a1_1[3] * b8[1] + a2_1[3] * b8[2] + a3_1[3] * b8[3], a0_1[3] * b9[0] + a1_1[3] * b9[1] + a2_1[3] * b9[2] + a3_1[3] * b9[3], a0_1[3] * b10[0] + a1_1[3] * b10[1] + a2_1[3] * b10[2] + a3_1[3] * b10[3], a0_1[3] * b11[0] + a1_1[3] * b11[1] + a2_1[3] * b11[2] + a3_1[3] * b11[3]);
            acc7_3 += vec4<f32>(a0_1[3] * b12[0] + a1_1[3] * b12[1] + a2_1[3] * b12[2] + a3_1[3] * b12[3], a0_1[3] * b13[0] + a1_1[3] * b13[1] + a2_1[3] * b13[2] + a3_1[3] * b13[3], a0_1[3] * b14[0] + a1_1[3] * b14[1] + a2_1[3] * b14[2] + a3_1[3] * b14[3], a0_1[3] * b15[0] + a1_1[3] * b15[1] + a2_1[3] * b15[2] + a3_1[3] * b15[3]);
            acc8_0 += vec4<f32>(a0_2[0] * b0[0] + a1_2[0] * b0[1] + a2_2[0] * b0[2] + a3_2[0] * b0[3], a0_2[0] * b1[0] + a1_2[0] * b1[1] + a2_2[0] * b1[2] + a3_2[0] * b1[3], a0_2[0] * b2[0] + a1_2[0] * b2[1] + a2_2[0] * b2[2] + a3_2[0] * b2[3], a0_2[0] * b3[0] + a1_2[0] * b3[1] + a2_2[0] * b3[2] + a3_2[0] * b3[3]);
            acc8_1 += vec4<f32>(a0_2[0] * b4[0] + a1_2[0] * b4[1] + a2_2[0] * b4[2] + a3_2[0] * b4[3], a0_2[0] * b5[0] + a1_2[0] * b5[1] + a2_2[0] * b5[2] + a3_2[0] * b5[3], a0_2[0] * b6[0] + a1_2[0] * b6[1] + a2_2[0] * b6[2] + a3_2[0] * b6[3], a0_2[0] * b7[0] + a1_2[0] * b7[1] + a2_2[0] * b7[2] + a3_2[0] * b7[3]);
            acc8_2 += vec4<f32>(a0_2[0] * b8[0] + a1_2[0] * b8[1] + a2_2[0] * b8[2] + a3_2[0] * b8[3], a0_2[0] * b9[0] + a1_2[0] * b9[1] + a2_2[0] * b9[2] + a3_2[0] * b9[3], a0_2[0] * b10[0] + a1_2[0] * b10[1] + a2_2[0] * b10[2] + a3_2[0] * b10[3], a0_2[0] * b11[0] + a1_2[0] * b11[1] + a2_2[0] * b11[2] + a3_2[0] * b11[3]);
            acc8_3 += vec4<f32>(a0_2[0] * b12[0] + a1_2[0] * b12[1] + a2_2[0] * b12[2] + a3_2[0] * b12[3], a0_2[0] * b13[0] + a1_2[0] * b13[1] + a2_2[0] * b13[2] + a3_2[0] * b13[3], a0_2[0] * b14[0] + a1_2[0] * b14[1] + a2_2[0] * b14[2] + a3_2[0] * b14[3], a0_2[0] * b15[0] + a1_2[0] * b15[1] + a2_2[0] * b15[2] + a3_2[0] * b15[3]);
            acc9_0 += vec4<f32>(a0_2[1] * b0[0] + a1_2[1] * b0[1] + a2_2[1] * b0[2] + a3_2[1] * b0[3], a0_2[1] * b1[0] + a1_2[1] * b1[1] + a2_2[1] * b1[2] + a3_2[1] * b1[3], a0_2[1] * b2[0] + a1_2[1] * b2[1] + a2_2[1] * b2[2] + a3_2[1] * b2[3], a0_2[1] * b3[0] + a1_2[1] * b3[1] + a2_2[1] * b3[2] + a3_2[1] * b3[3]);
            acc9_1 += vec4<f32>(a0_2[1] * b4[0] + a1_2[1] * b4[1] + a2_2[1] * b4[2] + a3_2[1] * b4[3], a0_2[1] * b5[0] + a1_2[1] * b5[1] + a2_2[1] * b5[2] + a3_2[1] * b5[3], a0_2[1] * b6[0] + a1_2[1] * b6[1] + a2_2[1] * b6[2] + a3_2[1] * b6[3], a0_2[1] * b7[0] + a1_2[1] * b7[1] + a2_2[1] * b7[2] + a3_2[1] * b7[3]);
            acc9_2 += vec4<f32>(a0_2[1] * b8[0] + a1_2[1] * b8[1] + a2_2[1] * b8[2] + a3_2[1] * b8[3], a0_2[1] * b9[0] + a1_2[1] * b9[1] + a2_2[1] * b9[2] + a3_2[1] * b9[3], a0_2[1] * b10[0] + a1_2[1] * b10[1] + a2_2[1] * b10[2] + a3_2[1] * b10[3], a0_2[1] * b11[0] + a1_2[1] * b11[1] + a2_2[1] * b11[2] + a3_2[1] * b11[3]);
            acc9_3 += vec4<f32>(a0_2[1] * b12[0] + a1_2[1] * b12[1] + a2_2[1] * b12[2] + a3_2[1] * b12[3], a0_2[1] * b13[0] + a1_2[1] * b13[1] + a2_2[1] * b13[2] + a3_2[1] * b13[3], a0_2[1] * b14[0] + a1_2[1] * b14[1] + a2_2[1] * b14[2] + a3_2[1] * b14[3], a0_2[1] * b15[0] + a1_2[1] * b15[1] + a2_2[1] * b15[2] + a3_2[1] * b15[3]);
            acc10_0 += vec4<f32>(a0_2[2] * b0[0] + a1_2[2] * b0[1] + a2_2[2] * b0[2] + a3_2[2] * b0[3], a0_2[2] * b1[0] + a1_2[2] * b1[1] + a2_2[2] * b1[2] + a3_2[2] * b1[3], a0_2[2] * b2[0] + a1_2[2] * b2[1] + a2_2[2] * b2[2] + a3_2[2] * b2[3], a0_2[2] * b3[0] + a1_2[2] * b3[1] + a2_2[2] * b3[2] + a3_2[2] * b3[3]);
            acc10_1 += vec4<f32>(a0_2[2] * b4[0] + a1_2[2] * b4[1] + a2_2[2] * b4[2] + a3_2[2] * b4[3], a0_2[2] * b5[0] + a1_2[2] * b5[1] + a2_2[2] * b5[2] + a3_2[2] * b5[3], a0_2[2] * b6[0] + a1_2[2] * b6[1] + a2_2[2] * b6[2] + a3_2[2] * b6[3], a0_2[2] * b7[0] + a1_2[2] * b7[1] + a2_2[2] * b7[2] + a3_2[2] * b7[3]);
            acc10_2 += vec4<f32>(a0_2[2] * b8[0] + a1_2[2] * b8[1] + a2_2[2] * b8[2] + a3_2[2] * b8[3], a0_2[2] * b9[0] + a1_2[2] * b9[1] + a2_2[2] * b9[2] + a3_2[2] * b9[3], a0_2[2] * b10[0] + a1_2[2] * b10[1] + a2_2[2] * b10[2] + a3_2[2] * b10[3], a0_2[2] * b11[0] + a1_2[2] * b11[1] + a2_2[2] * b11[2] + a3_2[2] * b11[3]);
            acc10_3 += vec4<f32>(a0_2[2] * b12[0] + a1_2[2] * b12[1] + a2_2[2] * b12[2] + a3_2[2] * b12[3], a0_2[2] * b13[0] + a1_2[2] * b13[1] + a2_2[2] * b13[2] + a3_2[2] * b13[3], a0_2[2] * b14[0] + a1_2[2] * b14[1] + a2_2[2] * b14[2] + a3_2[2] * b14[3], a0_2[2] * b15[0] + a1_2[2] * b15[1] + a2_2[2] * b15[2] + a3_2[2] * b15[3]);
            acc11_0 += vec4<f32>(a0_2[3] * b0[0] + a1_2[3] * b0[1] + a2_2[3] * b0[2] + a3_2[3] * b0[3], a0_2[3] * b1[0] + a1_2[3] * b1[1] + a2_2[3] * b1[2] + a3_2[3] * b1[3], a0_2[3] * b2[0] + a1_2[3] * b2[1] + a2_2[3] * b2[2] + a3_2[3] * b2[3], a0_2[3] * b3[0] + a1_2[3] * b3[1] + a2_2[3] * b3[2] + a3_2[3] * b3[3]);
            acc11_1 += vec4<f32>(a0_2[3] * b4[0] + a1_2[3] * b4[1] + a2_2[3] * b4[2] + a3_2[3] * b4[3], a0_2[3] * b5[0] + a1_2[3] * b5[1] + a2_2[3] * b5[2] + a3_2[3] * b5[3], a0_2[3] * b6[0] + a1_2[3] * b6[1] + a2_2[3] * b6[2] + a3_2[3] * b6[3], a0_2[3] * b7[0] + a1_2[3] * b7[1] + a2_2[3] * b7[2] + a3_2[3] * b7[3]);
            acc11_2 += vec4<f32>(a0_2[3] * b8[0] + a1_2[3] * b8[1] + a2_2[3] * b8[2] + a3_2[3] * b8[3], a0_2[3] * b9[0] + a1_2[3] * b9[1] + a2_2[3] * b9[2] + a3_2[3] * b9[3], a0_2[3] * b10[0] + a1_2[3] * b10[1] + a2_2[3] * b10[2] + a3_2[3] * b10[3], a0_2[3] * b11[0] + a1_2[3] * b11[1] + a2_2[3] * b11[2] + a3_2[3] * b11[3]);
            acc11_3 += vec4<f32>(a0_2[3] * b12[0] + a1_2[3] * b12[1] + a2_2[3] * b12[2] + a3_2[3] * b12[3], a0_2[3] * b13[0] + a1_2[3] * b13[1] + a2_2[3] * b13[2] + a3_2[3] * b13[3], a0_2[3] * b14[0] + a1_2[3] * b14[1] + a2_2[3] * b14[2] + a3_2[3] * b14[3], a0_2[3] * b15[0] + a1_2[3] * b15[1] + a2_2[3] * b15[2] + a3_2[3] * b15[3]);
            acc12_0 += vec4<f32>(a0_3[0] * b0[0] + a1_3[0] * b0[1] + a2_3[0] * b0[2] + a3_3[0] * b0[3], a0_3[0] * b1[0] + a1_3[0] * b1[1] + a2_3[0] * b1[2] + a3_3[0] * b1[3], a0_3[0] * b2[0] + a1_3[0] * b2[1] + a2_3[0] * b2[2] + a3_3[0] * b2[3], a0_3[0] * b3[0] + a1_3[0] * b3[1] + a2_3[0] * b3[2] + a3_3[0] * b3[3]);
            acc12_1 += vec4<f32>(a0_3[0] * b4[0] + a1_3[0] * b4[1] + a2_3[0] * b4[2] + a3_3[0] * b4[3], a0_3[0] * b5[0] + a1_3[0] * b5[1] + a2_3[0] * b5[2] + a3_3[0] * b5[3], a0_3[0] * b6[0] + a1_3[0] * b6[1] + a2_3[0] * b6[2] + a3_3[0] * b6[3], a0_3[0] * b7[0] + a1_3[0] * b7[1] + a2_3[0] * b7[2] + a3_3[0] * b7[3]);
            acc12_2 += vec4<f32>(a0_3[0] * b8[0] + a1_3[0] * b8[1] + a2_3[0] * b8[2] + a3_3[0] * b8[3], a0_3[0] * b9[0] + a1_3[0] * b9[1] + a2_3[0] * b9[2] + a3_3[0] * b9[3], a0_3[0] * b10[0] + a1_3[0] * b10[1] + a2_3[0] * b10[2] + a3_3[0] * b10[3], a0_3[0] * b11[0] + a1_3[0] * b11[1] + a2_3[0] * b11[2] + a3_3[0] * b11[3]);
            acc12_3 += vec4<f32>(a0_3[0] * b12[0] + a1_3[0] * b12[1] + a2_3[0] * b12[2] + a3_3[0] * b12[3], a0_3[0] * b13[0] + a1_3[0] * b13[1] + a2_3[0] * b13[2] + a3_3[0] * b13[3], a0_3[0] * b14[0] + a1_3[0] * b14[1] + a2_3[0] * b14[2] + a3_3[0] * b14[3], a0_3[0] * b15[0] + a1_3[0] * b15[1] + a2_3[0] * b15[2] + a3_3[0] * b15[3]);
            acc13_0 += vec4<f32>(a0_3[1] * b0[0] + a1_3[1] * b0[1] + a2_3[1] * b0[2] + a3_3[1] * b0[3], a0_3[1] * b1[0] + a1_3[1] * b1[1] + a2_3[1] * b1[2] + a3_3[1] * b1[3], a0_3[1] * b2[0] + a1_3[1] * b2[1] + a2_3[1] * b2[2] + a3_3[1] * b2[3], a0_3[1] * b3[0] + a1_3[1] * b3[1] + a2_3[1] * b3[2] + a3_3[1] * b3[3]);
            acc13_1 += vec4<f32>(a0_3[1] * b4[0] + a1_3[1] * b4[1] + a2_3[1] * b4[2] + a3_3[1] * b4[3], a0_3[1] * b5[0] + a1_3[1] * b5[1] + a2_3[1] * b5[2] + a3_3[1] * b5[3], a0_3[1] * b6[0] + a1_3[1] * b6[1] + a2_3[1] * b6[2] + a3_3[1] * b6[3], a0_3[1] * b7[0] + a1_3[1] * b7[1] + a2_3[1] * b7[2] + a3_3[1] * b7[3]);
            acc13_2 += vec4<f32>(a0_3[1] * b8[0] + a1_3[1] * b8[1] + a2_3[1] * b8[2] + a3_3[1] * b8[3], a0_3[1] * b9[0] + a1_3[1] * b9[1] + a2_3[1] * b9[2] + a3_3[1] * b9[3], a0_3[1] * b10[0] + a1_3[1] * b10[1] + a2_3[1] * b10[2] + a3_3[1] * b10[3], a0_3[1] * b11[0] + a1_3[1] * b11[1] + a2_3[1] * b11[2] + a3_3[1] * b11[3]);
            acc13_3 += vec4<f32>(a0_3[1] * b12[0] + a1_3[1] * b12[1] + a2_3[1] * b12[2] + a3_3[1] * b12[3], a0_3[1] * b13[0] + a1_3[1] * b13[1] + a2_3[1] * b13[2] + a3_3[1] * b13[3], a0_3[1] * b14[0] + a1_3[1] * b14[1] + a2_3[1] * b14[2] + a3_3[1] * b14[3], a0_3[1] * b15[0] + a1_3[1] * b15[1] + a2_3[1] * b15[2] + a3_3[1] * b15[3]);
            acc14_0 += vec4<f32>(a0_3[2] * b0[0] + a1_3[2] * b0[1] + a2_3[2] * b0[2] + a3_3[2] * b0[3], a0_3[2] * b1[0] + a1_3[2] * b1[1] + a2_3[2] * b1[2] + a3_3[2] * b1[3], a0_3[2] * b2[0] + a1_3[2] * b2[1] + a2_3[2] * b2[2] + a3_3[2] * b2[3], a0_3[2] * b3[0] + a1_3[2] * b3[1] + a2_3[2] * b3[2] + a3_3[2] * b3[3]);
            acc14_1 += vec4<f32>(a0_3[2] * b4[0] + a1_3[2] * b4[1] + a2_3[2] * b4[2] + a3_3[2] * b4[3], a0_3[2] * b5[0] + a1_3[2] * b5[1] + a2_3[2] * b5[2] + a3_3[2] * b5[3], a0_3[2] * b6[0] + a1_3[2] * b6[1] + a2_3[2] * b6[2] + a3_3[2] * b6[3], a0_3[2] * b7[0] + a1_3[2] * b7[1] + a2_3[2] * b7[2] + a3_3[2] * b7[3]);
            acc14_2 += vec4<f32>(a0_3[2] * b8[0] + a1_3[2] * b8[1] + a2_3[2] * b8[2] + a3_3[2] * b8[3], a0_3[2] * b9[0] + a1_3[2] * b9[1] + a2_3[2] * b9[2] + a3_3[2] * b9[3], a0_3[2] * b10[0] + a1_3[2] * b10[1] + a2_3[2] * b10[2] + a3_3[2] * b10[3], a0_3[2] * b11[0] + a1_3[2] * b11[1] + a2_3[2] * b11[2] + a3_3[2] * b11[3]);
            acc14_3 += vec4<f32>(a0_3[2] * b12[0] + a1_3[2] * b12[1] + a2_3[2] * b12[2] + a3_3[2] * b12[3], a0_3[2] * b13[0] + a1_3[2] * b13[1] + a2_3[2] * b13[2] + a3_3[2] * b13[3], a0_3[2] * b14[0] + a1_3[2] * b14[1] + a2_3[2] * b14[2] + a3_3[2] * b14[3], a0_3[2] * b15[0] + a1_3[2] * b15[1] + a2_3[2] * b15[2] + a3_3[2] * b15[3]);
            acc15_0 += vec4<f32>(a0_3[3] * b0[0] + a1_3[3] * b0[1] + a2_3[3] * b0[2] + a3_3[3] * b0[3], a0_3[3] * b1[0] + a1_3[3] * b1[1] + a2_3[3] * b1[2] + a3_3[3] * b1[3], a0_3[3] * b2[0] + a1_3[3] * b2[1] + a2_3[3] * b2[2] + a3_3[3] * b2[3], a0_3[3] * b3[0] + a1_3[3] * b3[1] + a2_3[3] * b3[2] + a3_3[3] * b3[3]);
            acc15_1 += vec4<f32>(a0_3[3] * b4[0] + a1_3[3] * b4[1] + a2_3[3] * b4[2] + a3_3[3] * b4[3], a0_3[3] * b5[0] + a1_3[3] * b5[1] + a2_3[3] * b5[2] + a3_3[3] * b5[3], a0_3[3] * b6[0] + a1_3[3] * b6[1] + a2_3[3] * b6[2] + a3_3[3] * b6[3], a0_3[3] * b7[0] + a1_3[3] * b7[1] + a2_3[3] * b7[2] + a3_3[3] * b7[3]);
            acc15_2 += vec4<f32>(a0_3[3] * b8[0] + a1_3[3] * b8[1] + a2_3[3] * b8[2] + a3_3[3] * b8[3], a0_3[3] * b9[0] + a1_3[3] * b9[1] + a2_3[3] * b9[2] + a3_3[3] * b9[3], a0_3[3] * b10[0] + a1_3[3] * b10[1] + a2_3[3] * b10[2] + a3_3[3] * b10[3], a0_3[3] * b11[0] + a1_3[3] * b11[1] + a2_3[3] * b11[2] + a3_3[3] * b11[3]);
            acc15_3 += vec4<f32>(a0_3[3] * b12[0] + a1_3[3] * b12[1] + a2_3[3] * b12[2] + a3_3[3] * b12[3], a0_3[3] * b13[0] + a1_3[3] * b13[1] + a2_3[3] * b13[2] + a3_3[3] * b13[3], a0_3[3] * b14[0] + a1_3[3] * b14[1] + a2_3[3] * b14[2] + a3_3[3] * b14[3], a0_3[3] * b15[0] + a1_3[3] * b15[1] + a2_3[3] * b15[2] + a3_3[3] * b15[3]);
            ra += 4u * m4;
        }
    }
    let oc = params.offset_c + wg.z * params.stride_c;
    if (m0 + 0u < M) {
        let rc = oc + (m0 + 0u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc0_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc0_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc0_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc0_3); }
    }
    if (m0 + 1u < M) {
        let rc = oc + (m0 + 1u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc1_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc1_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc1_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc1_3); }
    }
    if (m0 + 2u < M) {
        let rc = oc + (m0 + 2u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc2_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc2_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc2_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc2_3); }
    }
    if (m0 + 3u < M) {
        let rc = oc + (m0 + 3u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc3_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc3_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc3_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc3_3); }
    }
    if (m0 + 4u < M) {
        let rc = oc + (m0 + 4u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc4_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc4_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc4_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc4_3); }
    }
    if (m0 + 5u < M) {
        let rc = oc + (m0 + 5u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc5_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc5_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc5_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc5_3); }
    }
    if (m0 + 6u < M) {
        let rc = oc + (m0 + 6u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc6_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc6_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc6_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc6_3); }
    }
    if (m0 + 7u < M) {
        let rc = oc + (m0 + 7u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc7_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc7_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc7_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc7_3); }
    }
    if (m0 + 8u < M) {
        let rc = oc + (m0 + 8u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc8_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc8_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc8_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc8_3); }
    }
    if (m0 + 9u < M) {
        let rc = oc + (m0 + 9u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc9_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc9_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc9_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc9_3); }
    }
    if (m0 + 10u < M) {
        let rc = oc + (m0 + 10u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc10_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc10_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc10_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc10_3); }
    }
    if (m0 + 11u < M) {
        let rc = oc + (m0 + 11u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc11_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc11_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc11_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc11_3); }
    }
    if (m0 + 12u < M) {
        let rc = oc + (m0 + 12u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc12_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc12_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc12_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc12_3); }
    }
    if (m0 + 13u < M) {
        let rc = oc + (m0 + 13u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc13_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc13_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc13_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc13_3); }
    }
    if (m0 + 14u < M) {
        let rc = oc + (m0 + 14u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc14_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc14_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc14_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc14_3); }
    }
    if (m0 + 15u < M) {
        let rc = oc + (m0 + 15u) * N;
        if (n0 + 0u < N) { store4(rc, n0 + 0u, acc15_0); }
        if (n0 + 4u < N) { store4(rc, n0 + 4u, acc15_1); }
        if (n0 + 8u < N) { store4(rc, n0 + 8u, acc15_2); }
        if (n0 + 12u < N) { store4(rc, n0 + 12u, acc15_3); }
    }
}

// Any shape, any alignment: scalar loads with clamped indices, 4x4 outputs per invocation.
@compute @workgroup_size(8, 8, 1)
fn main_scalar(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let M = params.m; let N = params.n; let K = params.k;
    let n0 = (wg.x * 8u + lid.x) * 4u;
    let m0 = (wg.y * 8u + lid.y) * 4u;
    if (n0 >= N || m0 >= M) { return; }
    let oa = params.offset_a + wg.z * params.stride_a;
    let ob = params.offset_b + wg.z * params.stride_b;
    // element (i, l) of op(A) is a[oa + i * sam + l * sak]; (l, j) of op(B) is b[ob + l * sbk + j * sbn]
    var sam = K; var sak = 1u; if (TRANS_A) { sam = 1u; sak = M; }
    var sbk = N; var sbn = 1u; if (TRANS_B) { sbk = 1u; sbn = K; }
    var pa0 = oa + min(m0 + 0u, M - 1u) * sam;
    var pa1 = oa + min(m0 + 1u, M - 1u) * sam;
    var pa2 = oa + min(m0 + 2u, M - 1u) * sam;
    var pa3 = oa + min(m0 + 3u, M - 1u) * sam;
    var pb0 = ob + min(n0 + 0u, N - 1u) * sbn;
    var pb1 = ob + min(n0 + 1u, N - 1u) * sbn;
    var pb2 = ob + min(n0 + 2u, N - 1u) * sbn;
    var pb3 = ob + min(n0 + 3u, N - 1u) * sbn;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k = 0u; k < K; k++) {
        let a0 = a[pa0];
        let a1 = a[pa1];
        let a2 = a[pa2];
        let a3 = a[pa3];
        let bv = vec4<f32>(b[pb0], b[pb1], b[pb2], b[pb3]);
        acc0 += a0 * bv;
        acc1 += a1 * bv;
        acc2 += a2 * bv;
        acc3 += a3 * bv;
        pa0 += sak;
        pa1 += sak;
        pa2 += sak;
        pa3 += sak;
        pb0 += sbk;
        pb1 += sbk;
        pb2 += sbk;
        pb3 += sbk;
    }
    let oc = params.offset_c + wg.z * params.stride_c;
    let fl = params.flags; let alpha = params.alpha;
    if (m0 + 0u < M) {
        let rc = oc + (m0 + 0u) * N + n0;
        if (n0 + 0u < N) { let v = alpha * acc0[0]; if ((fl & 1u) != 0u) { c[rc + 0u] += v; } else { c[rc + 0u] = v; } }
        if (n0 + 1u < N) { let v = alpha * acc0[1]; if ((fl & 1u) != 0u) { c[rc + 1u] += v; } else { c[rc + 1u] = v; } }
        if (n0 + 2u < N) { let v = alpha * acc0[2]; if ((fl & 1u) != 0u) { c[rc + 2u] += v; } else { c[rc + 2u] = v; } }
        if (n0 + 3u < N) { let v = alpha * acc0[3]; if ((fl & 1u) != 0u) { c[rc + 3u] += v; } else { c[rc + 3u] = v; } }
    }
    if (m0 + 1u < M) {
        let rc = oc + (m0 + 1u) * N + n0;
        if (n0 + 0u < N) { let v = alpha * acc1[0]; if ((fl & 1u) != 0u) { c[rc + 0u] += v; } else { c[rc + 0u] = v; } }
        if (n0 + 1u < N) { let v = alpha * acc1[1]; if ((fl & 1u) != 0u) { c[rc + 1u] += v; } else { c[rc + 1u] = v; } }
        if (n0 + 2u < N) { let v = alpha * acc1[2]; if ((fl & 1u) != 0u) { c[rc + 2u] += v; } else { c[rc + 2u] = v; } }
        if (n0 + 3u < N) { let v = alpha * acc1[3]; if ((fl & 1u) != 0u) { c[rc + 3u] += v; } else { c[rc + 3u] = v; } }
    }
    if (m0 + 2u < M) {
        let rc = oc + (m0 + 2u) * N + n0;
        if (n0 + 0u < N) { let v = alpha * acc2[0]; if ((fl & 1u) != 0u) { c[rc + 0u] += v; } else { c[rc + 0u] = v; } }
        if (n0 + 1u < N) { let v = alpha * acc2[1]; if ((fl & 1u) != 0u) { c[rc + 1u] += v; } else { c[rc + 1u] = v; } }
        if (n0 + 2u < N) { let v = alpha * acc2[2]; if ((fl & 1u) != 0u) { c[rc + 2u] += v; } else { c[rc + 2u] = v; } }
        if (n0 + 3u < N) { let v = alpha * acc2[3]; if ((fl & 1u) != 0u) { c[rc + 3u] += v; } else { c[rc + 3u] = v; } }
    }
    if (m0 + 3u < M) {
        let rc = oc + (m0 + 3u) * N + n0;
        if (n0 + 0u < N) { let v = alpha * acc3[0]; if ((fl & 1u) != 0u) { c[rc + 0u] += v; } else { c[rc + 0u] = v; } }
        if (n0 + 1u < N) { let v = alpha * acc3[1]; if ((fl & 1u) != 0u) { c[rc + 1u] += v; } else { c[rc + 1u] = v; } }
        if (n0 + 2u < N) { let v = alpha * acc3[2]; if ((fl & 1u) != 0u) { c[rc + 2u] += v; } else { c[rc + 2u] = v; } }
        if (n0 + 3u < N) { let v = alpha * acc3[3]; if ((fl & 1u) != 0u) { c[rc + 3u] += v; } else { c[rc + 3u] = v; } }
    }
}
