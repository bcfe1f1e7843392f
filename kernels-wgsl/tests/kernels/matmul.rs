//! `matmul` against `reference::matmul`: both entry points, all four transposes, offsets,
//! broadcast batches, accumulate and alpha; and the launcher's argument checks.

use plimsoll_kernels_wgsl::kernels::largest_within;
use plimsoll_kernels_wgsl::kernels::matmul::{self, MatmulDims, MatmulEntry, entry_point};
use plimsoll_kernels_wgsl::{Category, Error, Gpu, reference};

use crate::common::{DEADLINE, Rng, assert_close, assert_loop_limit, gpu, loop_limit_or_note};

/// What C holds before a non-accumulating launch: any element the kernel fails to write shows.
const POISON: f32 = 12345.0;

/// Absolute tolerance per unit of K·|alpha| (in f32 epsilons). C is a sum of K products of
/// values in [-1, 1), accumulated in f32 (vec4 groups, then sequentially) and compared with an
/// f64 reference, so the rounding error grows with the partial sums, i.e. with K. Measured over
/// these cases: at most 0.5·eps·K (K = 63), 0.28·eps·K (K = 1024, |error| 3.4e-5). 4·eps·K leaves
/// 8× head-room and stays far below the error of a dropped or doubled product (|a·b| ≈ 0.25 on
/// average). `rtol` 1e-6 covers the rounding of `C + alpha·A·B` when accumulating.
const ATOL_EPS_PER_K: f32 = 4.0;

/// One launch: `dims` over buffers padded by `pad` elements past each operand's extent, checked
/// against the reference over the whole output buffer (so elements outside C must stay intact).
/// Returns the entry point used.
fn check(gpu: &Gpu, rng: &mut Rng, dims: &MatmulDims, pad: usize) -> MatmulEntry {
    let (a_len, b_len) = operand_lens(dims);
    let a = rng.vec_f32(a_len + pad, -1.0, 1.0); // stored A, (batch, m, k) or (batch, k, m)
    let b = rng.vec_f32(b_len + pad, -1.0, 1.0); // stored B, (batch, k, n) or (batch, n, k)
    let c_init = if dims.accumulate {
        rng.vec_f32(dims.c_len() + pad, -1.0, 1.0) // (batch, m, n)
    } else {
        vec![POISON; dims.c_len() + pad]
    };
    let a_gpu = gpu.upload(&a, Category::Temporary, "matmul a").unwrap();
    let b_gpu = gpu.upload(&b, Category::Temporary, "matmul b").unwrap();
    let c_gpu = gpu
        .upload(&c_init, Category::Temporary, "matmul c")
        .unwrap();
    matmul::matmul(gpu, &c_gpu, &a_gpu, &b_gpu, dims).unwrap();
    let got: Vec<f32> = gpu.read_all(&c_gpu, DEADLINE).unwrap();
    let mut want = c_init;
    reference::matmul::matmul_into(&a, &b, &mut want, dims);
    let atol = ATOL_EPS_PER_K * f32::EPSILON * dims.k.max(1) as f32 * dims.alpha.abs().max(1.0);
    let name = format!("matmul {dims:?} ({:?})", entry_point(dims));
    assert_close(&name, &got, &want, atol, 1e-6);
    entry_point(dims)
}

/// Elements each operand spans: `offset + (batch - 1) * stride + rows * cols` for A and B.
fn operand_lens(d: &MatmulDims) -> (usize, usize) {
    let span = |offset: usize, stride: usize, elements: usize| {
        offset + d.batch.saturating_sub(1) * stride + elements
    };
    (
        span(d.offset_a, d.batch_stride_a, d.m * d.k),
        span(d.offset_b, d.batch_stride_b, d.k * d.n),
    )
}

/// `MatmulDims::dense(1, m, n, k)` with transposes, offsets, alpha and accumulate.
fn dims(m: usize, n: usize, k: usize, trans: (bool, bool), offsets: [usize; 3]) -> MatmulDims {
    MatmulDims {
        trans_a: trans.0,
        trans_b: trans.1,
        offset_a: offsets[0],
        offset_b: offsets[1],
        offset_c: offsets[2],
        ..MatmulDims::dense(1, m, n, k)
    }
}

/// (m, n, k, [offset_a, offset_b, offset_c], the entry point all four transposes take, if one).
type Shape = (usize, usize, usize, [usize; 3], Option<MatmulEntry>);

const TRANSPOSES: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

#[test]
fn matmul_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(0x6d6d);
    let mut entries = Vec::new();
    let shapes: [Shape; 8] = [
        (1, 1, 1, [0, 0, 0], Some(MatmulEntry::MainScalar)),
        (7, 13, 5, [3, 1, 2], Some(MatmulEntry::MainScalar)),
        (33, 65, 17, [5, 0, 7], Some(MatmulEntry::MainScalar)),
        (127, 255, 63, [1, 2, 3], Some(MatmulEntry::MainScalar)),
        (36, 68, 20, [4, 8, 3], Some(MatmulEntry::Main)), // partial 128-tiles, odd C offset
        (64, 128, 32, [0, 0, 0], Some(MatmulEntry::Main)),
        (130, 132, 36, [8, 4, 1], None), // m % 4 != 0: trans_a takes main_scalar
        // n % 4 != 0 but k % 4 == 0: trans_b must not take main (it stores 4 columns at a time)
        (20, 30, 16, [0, 0, 0], Some(MatmulEntry::MainScalar)),
    ];
    for (case, &(m, n, k, offsets, expect)) in shapes.iter().enumerate() {
        for (t, &trans) in TRANSPOSES.iter().enumerate() {
            let mut d = dims(m, n, k, trans, offsets);
            // Alternate plain, scaled and accumulating launches over the cases.
            d.accumulate = (case + t) % 2 == 1;
            d.alpha = [1.0, -0.75, 2.5][(case + t) % 3];
            let entry = check(&gpu, &mut rng, &d, 5);
            if let Some(expect) = expect {
                assert_eq!(entry, expect, "{d:?}");
            }
            entries.push(entry);
        }
    }
    assert_eq!(
        entry_point(&dims(130, 132, 36, (true, false), [0; 3])),
        MatmulEntry::MainScalar
    );
    assert_eq!(
        entry_point(&dims(130, 132, 36, (false, true), [0; 3])),
        MatmulEntry::Main
    );
    assert_eq!(
        entry_point(&dims(20, 30, 16, (false, true), [0; 3])),
        MatmulEntry::MainScalar
    );
    // A misaligned offset sends a main-path shape to main_scalar.
    let misaligned = dims(64, 128, 32, (false, false), [1, 0, 0]);
    assert_eq!(
        check(&gpu, &mut rng, &misaligned, 3),
        MatmulEntry::MainScalar
    );

    // MLP-style products with N or K = 10: fwd (128×1024)·(1024×10), dX = dY·Wᵀ, dW = Xᵀ·dY.
    for (m, n, k, trans) in [
        (128, 10, 1024, (false, false)),
        (128, 1024, 10, (false, true)),
        (1024, 10, 128, (true, false)),
    ] {
        let mut d = dims(m, n, k, trans, [2, 6, 1]);
        d.accumulate = trans.0; // dW += Xᵀ·dY, gradient accumulation
        assert_eq!(check(&gpu, &mut rng, &d, 1), MatmulEntry::MainScalar);
    }

    // Batch 3 with one operand broadcast (stride 0) and padded batch strides.
    let batched = |m: usize, n: usize, k: usize, trans, offsets, broadcast_b: bool| MatmulDims {
        batch: 3,
        batch_stride_a: if broadcast_b { m * k + 4 } else { 0 },
        batch_stride_b: if broadcast_b { 0 } else { k * n + 8 },
        batch_stride_c: m * n + 3,
        ..dims(m, n, k, trans, offsets)
    };
    for (t, &trans) in TRANSPOSES.iter().enumerate() {
        let mut d = batched(36, 44, 24, trans, [4, 12, 1], t % 2 == 0);
        d.accumulate = t >= 2;
        d.alpha = 0.5;
        assert_eq!(check(&gpu, &mut rng, &d, 2), MatmulEntry::Main, "{d:?}");
        let d = batched(37, 45, 23, trans, [3, 5, 7], t % 2 == 1);
        assert_eq!(
            check(&gpu, &mut rng, &d, 2),
            MatmulEntry::MainScalar,
            "{d:?}"
        );
    }
    let main = entries.iter().filter(|&&e| e == MatmulEntry::Main).count();
    assert!(main >= 10 && entries.len() - main >= 18, "{entries:?}");

    // The unchecked-module variant agrees (same shader, wgpu's runtime checks off).
    let d = dims(36, 68, 20, (false, true), [4, 8, 3]);
    let a = rng.vec_f32(36 * 20 + 4, -1.0, 1.0);
    let b = rng.vec_f32(68 * 20 + 8, -1.0, 1.0);
    let a_gpu = gpu.upload(&a, Category::Temporary, "a").unwrap();
    let b_gpu = gpu.upload(&b, Category::Temporary, "b").unwrap();
    let c_gpu = gpu
        .upload(&vec![POISON; d.c_len()], Category::Temporary, "c")
        .unwrap();
    matmul::matmul_unchecked(&gpu, &c_gpu, &a_gpu, &b_gpu, &d).unwrap();
    let got: Vec<f32> = gpu.read_all(&c_gpu, DEADLINE).unwrap();
    let mut want = vec![POISON; d.c_len()];
    reference::matmul::matmul_into(&a, &b, &mut want, &d);
    assert_close("matmul_unchecked", &got, &want, 1e-5, 1e-6);
}

#[test]
fn matmul_rejects_bad_arguments() {
    let gpu = gpu();
    let d = MatmulDims::dense(2, 8, 12, 16); // A (2, 8, 16), B (2, 16, 12), C (2, 8, 12)
    let buf = |len: usize| {
        gpu.upload(&vec![1.0f32; len], Category::Temporary, "arg")
            .unwrap()
    };
    let (a, b, c) = (buf(2 * 8 * 16), buf(2 * 16 * 12), buf(2 * 8 * 12));
    matmul::matmul(&gpu, &c, &a, &b, &d).unwrap();
    let expect_invalid = |result: plimsoll_kernels_wgsl::Result<()>, needle: &str| match result {
        Err(Error::InvalidArgument {
            op: "matmul",
            message,
        }) => {
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
        other => panic!("expected InvalidArgument containing {needle:?}, got {other:?}"),
    };
    // B one element short of its extent: offset 1 + 16·12 + 16·12 > 384.
    let shifted = MatmulDims { offset_b: 1, ..d };
    expect_invalid(matmul::matmul(&gpu, &c, &a, &b, &shifted), "rhs (B)");
    // C's two batches overlap.
    let overlapping = MatmulDims {
        batch_stride_c: 8 * 12 - 1,
        ..d
    };
    expect_invalid(matmul::matmul(&gpu, &c, &a, &b, &overlapping), "overlap");
    // C written over A in the same buffer.
    let one = MatmulDims::dense(1, 8, 8, 8);
    expect_invalid(matmul::matmul(&gpu, &a, &a, &b, &one), "overlap lhs");
    // A size that does not fit the shader's u32.
    let huge = MatmulDims::dense(1, 1, 1, 1 << 33);
    expect_invalid(
        matmul::matmul(&gpu, &c, &a, &b, &huge),
        "does not fit in u32",
    );
    // Empty work records nothing and succeeds, even on small buffers.
    matmul::matmul(&gpu, &c, &a, &b, &MatmulDims::dense(0, 1 << 20, 1 << 20, 1)).unwrap();
}

#[test]
fn matmul_refuses_k_over_the_loop_limit() {
    let gpu = gpu();
    let Some(limit) = loop_limit_or_note(&gpu, "matmul") else {
        return;
    };
    let t = gpu.alloc_elements(4, Category::Temporary, "tiny").unwrap();
    let c = gpu.alloc_elements(16, Category::Temporary, "c").unwrap();
    // (m, n, trans, entry): main_scalar, main with trans_a only (one k per pass), main.
    for (m, n, trans, entry) in [
        (1, 1, (false, false), MatmulEntry::MainScalar),
        (4, 4, (true, false), MatmulEntry::Main),
        (4, 4, (false, true), MatmulEntry::Main),
    ] {
        let passes = |k| matmul::loop_iterations(entry, trans.0, trans.1, k);
        let largest = largest_within(limit, passes);
        let k = (largest + 1).next_multiple_of(4) as usize; // main needs k % 4 == 0
        let d = dims(m, n, k, trans, [0, 0, 0]);
        assert_eq!(entry_point(&d), entry, "{d:?}");
        assert_loop_limit(matmul::matmul(&gpu, &c, &t, &t, &d), "k", largest);
    }
}

#[test]
fn matmul_at_the_loop_limit_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(29);
    let limit = gpu.loop_iteration_limit().unwrap_or(65_535);
    for (m, n, trans, entry) in [
        (1, 1, (false, false), MatmulEntry::MainScalar),
        (1, 4, (false, false), MatmulEntry::Main),
    ] {
        let passes = |k| matmul::loop_iterations(entry, trans.0, trans.1, k);
        let k = largest_within(limit, passes) as usize / 4 * 4;
        assert_eq!(
            check(&gpu, &mut rng, &dims(m, n, k, trans, [0, 0, 0]), 3),
            entry
        );
    }
}
