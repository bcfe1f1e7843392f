//! `matmul` against [`reference`](super::reference): both entry points, all four transposes,
//! offsets, broadcast batches, accumulate and alpha, the epilogues; the launcher's argument and
//! loop-limit checks. (The 16-bit operands' tests are in `f16_tests.rs`.)

use super::reference;
use super::{MatmulDims, MatmulEntry, entry_point};
use crate::kernels::largest_within;
use crate::testing::{
    DEADLINE, Rng, assert_close, assert_loop_limit, gpu, gpu_and_rng, largest_at_the_loop_limit,
    loop_limit_or_skip,
};
use crate::{Category, DeviceSlice, Error, Gpu, Result};

/// What C holds before a non-accumulating launch: any element the kernel fails to write shows.
const POISON: f32 = 12345.0;

/// Absolute tolerance per unit of K·|alpha| (in f32 epsilons). C is a sum of K products of
/// values in [-1, 1), accumulated in f32 (vec4 groups, then sequentially) and compared with an
/// f64 reference, so the rounding error grows with the partial sums, i.e. with K. Measured over
/// these cases: at most 0.5·eps·K (K = 63), 0.28·eps·K (K = 1024, |error| 3.4e-5). 4·eps·K leaves
/// 8× head-room and stays far below the error of a dropped or doubled product (|a·b| ≈ 0.25 on
/// average). `rtol` 1e-6 covers the rounding of `C + alpha·A·B` when accumulating.
const ATOL_EPS_PER_K: f64 = 4.0;

/// The entry point the launcher takes for `dims` on these operands: [`entry_point`], demoted to
/// `main_scalar` when A's, B's or C's first element is not a multiple of 4 elements into its
/// segment (the `vec4` loads and stores need aligned operands; see [`entry_point`]'s docs).
fn launched_entry(dims: &MatmulDims, operands: [DeviceSlice<'_>; 3]) -> MatmulEntry {
    match entry_point(dims) {
        MatmulEntry::Main if operands.iter().all(|s| s.index().is_multiple_of(4)) => {
            MatmulEntry::Main
        }
        _ => MatmulEntry::MainScalar,
    }
}

/// One launch: `dims` with A, B and C at element `offsets` `[a, b, c]` of buffers padded by `pad`
/// elements past each operand's extent, each operand passed as the slice of exactly its extent
/// from its offset; checked against the reference (on the same sub-slices) over the whole
/// output buffer (so elements outside C, before and after it, must stay intact). Returns the
/// entry point used.
fn check(
    gpu: &Gpu,
    rng: &mut Rng,
    dims: &MatmulDims,
    offsets: [usize; 3],
    pad: usize,
) -> Result<MatmulEntry> {
    let [off_a, off_b, off_c] = offsets;
    let (a_len, b_len) = operand_lens(dims);
    let c_len = dims.c_len();
    // stored A, (batch, m, k) or (batch, k, m); stored B, (batch, k, n) or (batch, n, k)
    let a = rng.vec_f32(off_a + a_len + pad, -1.0, 1.0);
    let b = rng.vec_f32(off_b + b_len + pad, -1.0, 1.0);
    let c_init = if dims.accumulate {
        rng.vec_f32(off_c + c_len + pad, -1.0, 1.0) // (batch, m, n)
    } else {
        vec![POISON; off_c + c_len + pad]
    };
    let a_gpu = gpu.upload(&a, Category::Temporary, "matmul a")?;
    let b_gpu = gpu.upload(&b, Category::Temporary, "matmul b")?;
    let c_gpu = gpu
        .upload(&c_init, Category::Temporary, "matmul c")?;
    let a_s = a_gpu.slice(off_a as u64, a_len as u64)?;
    let b_s = b_gpu.slice(off_b as u64, b_len as u64)?;
    let c_s = c_gpu.slice(off_c as u64, c_len as u64)?;
    let entry = launched_entry(dims, [a_s, b_s, c_s]);
    super::matmul(gpu, dims, c_s, a_s, b_s)?;
    let got: Vec<f32> = gpu.read_all(&c_gpu, DEADLINE)?;
    let mut want = c_init;
    reference::matmul_into(&a[off_a..], &b[off_b..], &mut want[off_c..], dims);
    let atol = ATOL_EPS_PER_K
        * f64::from(f32::EPSILON)
        * dims.k.max(1) as f64
        * f64::from(dims.alpha.abs().max(1.0));
    let name = format!("matmul {dims:?} offsets {offsets:?} ({entry:?})");
    assert_close(&name, &got, &want, atol, 1e-6);
    Ok(entry)
}

/// Elements each operand spans: `(batch - 1) * stride + rows * cols` for A and B.
fn operand_lens(d: &MatmulDims) -> (usize, usize) {
    let span = |stride: usize, elements: usize| d.batch.saturating_sub(1) * stride + elements;
    (
        span(d.batch_stride_a, d.m * d.k),
        span(d.batch_stride_b, d.k * d.n),
    )
}

/// [`dims`] over a batch of 2 contiguous products.
fn two_batches(m: usize, n: usize, k: usize, trans: (bool, bool)) -> MatmulDims {
    MatmulDims {
        batch: 2,
        batch_stride_a: m * k,
        batch_stride_b: k * n,
        batch_stride_c: m * n,
        ..dims(m, n, k, trans)
    }
}

/// `MatmulDims::dense(1, m, n, k)` with transposes (alpha and accumulate set by the callers).
fn dims(m: usize, n: usize, k: usize, trans: (bool, bool)) -> MatmulDims {
    MatmulDims {
        trans_a: trans.0,
        trans_b: trans.1,
        ..MatmulDims::dense(1, m, n, k)
    }
}

/// (m, n, k, [offset_a, offset_b, offset_c], the entry point all four transposes take, if one).
type Shape = (usize, usize, usize, [usize; 3], Option<MatmulEntry>);

const TRANSPOSES: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(0x6d6d);
    let mut entries = Vec::new();
    // `main` takes products of at least MAIN_MIN_FLOPS (2^23 = 2·128·256·128) only.
    let shapes: [Shape; 10] = [
        (1, 1, 1, [0, 0, 0], Some(MatmulEntry::MainScalar)),
        (7, 13, 5, [3, 1, 2], Some(MatmulEntry::MainScalar)),
        (33, 65, 17, [5, 0, 7], Some(MatmulEntry::MainScalar)),
        (127, 255, 63, [1, 2, 3], Some(MatmulEntry::MainScalar)),
        (132, 260, 124, [4, 8, 12], Some(MatmulEntry::Main)), // partial 128-tiles
        (132, 260, 124, [4, 8, 3], Some(MatmulEntry::MainScalar)), // odd C offset
        (128, 256, 128, [0, 0, 0], Some(MatmulEntry::Main)),
        (130, 132, 256, [8, 4, 4], None), // m % 4 != 0: trans_a takes main_scalar
        // n % 4 != 0 but k % 4 == 0: trans_b must not take main (it stores 4 columns at a time)
        (20, 30, 16, [0, 0, 0], Some(MatmulEntry::MainScalar)),
        // k % 4 != 0: only trans_a alone takes main (k is then no operand's row length).
        (132, 260, 125, [4, 8, 12], None),
    ];
    for (case, &(m, n, k, offsets, expect)) in shapes.iter().enumerate() {
        for (t, &trans) in TRANSPOSES.iter().enumerate() {
            let mut d = dims(m, n, k, trans);
            // Alternate plain, scaled and accumulating launches over the cases.
            d.accumulate = (case + t) % 2 == 1;
            d.alpha = [1.0, -0.75, 2.5][(case + t) % 3];
            let entry = check(&gpu, &mut rng, &d, offsets, 5)?;
            if let Some(expect) = expect {
                assert_eq!(entry, expect, "{d:?} offsets {offsets:?}");
            }
            entries.push(entry);
        }
    }
    assert_eq!(
        entry_point(&dims(130, 132, 256, (true, false))),
        MatmulEntry::MainScalar
    );
    assert_eq!(
        entry_point(&dims(130, 132, 256, (false, true))),
        MatmulEntry::Main
    );
    assert_eq!(
        entry_point(&dims(20, 30, 16, (false, true))),
        MatmulEntry::MainScalar
    );
    assert_eq!(
        entry_point(&dims(132, 260, 125, (true, false))),
        MatmulEntry::Main
    );
    // Below MAIN_MIN_FLOPS an aligned product takes main_scalar (cheaper to compile).
    assert_eq!(
        entry_point(&dims(128, 256, 127 + 1 - 4, (false, false))),
        MatmulEntry::MainScalar
    );
    // A misaligned offset (of A, then of B) sends a main-path shape to main_scalar.
    let aligned = dims(128, 256, 128, (false, false));
    assert_eq!(entry_point(&aligned), MatmulEntry::Main);
    assert_eq!(
        check(&gpu, &mut rng, &aligned, [1, 0, 0], 3)?,
        MatmulEntry::MainScalar
    );
    assert_eq!(
        check(&gpu, &mut rng, &aligned, [0, 2, 0], 3)?,
        MatmulEntry::MainScalar
    );

    // MLP-style products with N or K = 10: fwd (128×1024)·(1024×10), dX = dY·Wᵀ, dW = Xᵀ·dY.
    for (m, n, k, trans) in [
        (128, 10, 1024, (false, false)),
        (128, 1024, 10, (false, true)),
        (1024, 10, 128, (true, false)),
    ] {
        let mut d = dims(m, n, k, trans);
        d.accumulate = trans.0; // dW += Xᵀ·dY, gradient accumulation
        assert_eq!(
            check(&gpu, &mut rng, &d, [2, 6, 1], 1)?,
            MatmulEntry::MainScalar
        );
    }

    // Batch 3 with one operand broadcast (stride 0) and padded batch strides.
    let batched = |m: usize, n: usize, k: usize, trans, broadcast_b: bool| MatmulDims {
        batch: 3,
        batch_stride_a: if broadcast_b { m * k + 4 } else { 0 },
        batch_stride_b: if broadcast_b { 0 } else { k * n + 8 },
        batch_stride_c: m * n + 4,
        ..dims(m, n, k, trans)
    };
    for (t, &trans) in TRANSPOSES.iter().enumerate() {
        let mut d = batched(68, 132, 156, trans, t % 2 == 0);
        d.accumulate = t >= 2;
        d.alpha = 0.5;
        assert_eq!(
            check(&gpu, &mut rng, &d, [4, 12, 8], 2)?,
            MatmulEntry::Main,
            "{d:?}"
        );
        let d = batched(37, 45, 23, trans, t % 2 == 1);
        assert_eq!(
            check(&gpu, &mut rng, &d, [3, 5, 7], 2)?,
            MatmulEntry::MainScalar,
            "{d:?}"
        );
    }
    let main = entries.iter().filter(|&&e| e == MatmulEntry::Main).count();
    assert!(main >= 10 && entries.len() - main >= 18, "{entries:?}");

    // The unchecked-module variant agrees (same shader, wgpu's runtime checks off).
    // A at element 4, B at 8, C at 12.
    let d = dims(132, 260, 124, (false, true));
    let a = rng.vec_f32(132 * 124 + 4, -1.0, 1.0);
    let b = rng.vec_f32(260 * 124 + 8, -1.0, 1.0);
    let a_gpu = gpu.upload(&a, Category::Temporary, "a")?;
    let b_gpu = gpu.upload(&b, Category::Temporary, "b")?;
    let c_gpu = gpu
        .upload(&vec![POISON; 12 + d.c_len()], Category::Temporary, "c")?;
    let (a_s, b_s) = (
        a_gpu.slice(4, 132 * 124)?,
        b_gpu.slice(8, 260 * 124)?,
    );
    let c_s = c_gpu.slice(12, d.c_len() as u64)?;
    assert_eq!(launched_entry(&d, [a_s, b_s, c_s]), MatmulEntry::Main);
    super::matmul_unchecked(&gpu, &d, c_s, a_s, b_s)?;
    let got: Vec<f32> = gpu.read_all(&c_gpu, DEADLINE)?;
    let mut want = vec![POISON; 12 + d.c_len()];
    reference::matmul_into(&a[4..], &b[8..], &mut want[12..], &d);
    assert_close("matmul_unchecked", &got, &want, 1e-4, 1e-6);
    Ok(())
}

#[test]
fn matmul_rejects_bad_arguments() -> Result<()> {
    let gpu = gpu();
    let d = MatmulDims::dense(2, 8, 12, 16); // A (2, 8, 16), B (2, 16, 12), C (2, 8, 12)
    let buf = |len: usize| gpu.upload(&vec![1.0f32; len], Category::Temporary, "arg");
    let (a, b, c) = (buf(2 * 8 * 16)?, buf(2 * 16 * 12)?, buf(2 * 8 * 12)?);
    let (a_w, b_w, c_w) = (a.whole(), b.whole(), c.whole());
    super::matmul(&gpu, &d, c_w, a_w, b_w)?;
    let expect_invalid = |result: Result<()>, needle: &str| match result {
        Err(Error::InvalidArgument {
            op: "matmul",
            message,
        }) => {
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
        other => panic!("expected InvalidArgument containing {needle:?}, got {other:?}"),
    };
    // B one element short of its extent: offset 1 + 16·12 + 16·12 > 384. The slice of the full
    // extent cannot be made; the slice that fits is one element short and the launcher says so.
    let err = b.slice(1, 2 * 16 * 12).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let shifted = b.slice(1, 2 * 16 * 12 - 1)?;
    expect_invalid(super::matmul(&gpu, &d, c_w, a_w, shifted), "rhs (B)");
    // Likewise A and C one element short.
    let short_a = a.slice(0, 2 * 8 * 16 - 1)?;
    expect_invalid(super::matmul(&gpu, &d, c_w, short_a, b_w), "lhs (A)");
    let short_c = c.slice(1, 2 * 8 * 12 - 1)?;
    expect_invalid(super::matmul(&gpu, &d, short_c, a_w, b_w), "out (C)");
    // C's two batches overlap.
    let overlapping = MatmulDims {
        batch_stride_c: 8 * 12 - 1,
        ..d
    };
    expect_invalid(super::matmul(&gpu, &overlapping, c_w, a_w, b_w), "overlap");
    // C written over A in the same buffer.
    let one = MatmulDims::dense(1, 8, 8, 8);
    expect_invalid(super::matmul(&gpu, &one, a_w, a_w, b_w), "overlaps lhs");
    // Partly over A (C's first element is A's last) ...
    let (a_lo, a_hi) = (a.slice(0, 64)?, a.slice(63, 64)?);
    expect_invalid(super::matmul(&gpu, &one, a_hi, a_lo, b_w), "overlaps lhs");
    // ... and over B.
    let (b_lo, b_hi) = (b.slice(0, 64)?, b.slice(60, 64)?);
    expect_invalid(super::matmul(&gpu, &one, b_hi, a_lo, b_lo), "overlaps rhs");
    // C next to A in the same buffer, without overlap, is fine.
    super::matmul(&gpu, &one, a.slice(64, 64)?, a_lo, b_w)?;
    // A size that does not fit the shader's u32.
    let huge = MatmulDims::dense(1, 1, 1, 1 << 33);
    expect_invalid(
        super::matmul(&gpu, &huge, c_w, a_w, b_w),
        "does not fit in u32",
    );
    // Empty work records nothing and succeeds, even on small buffers.
    super::matmul(
        &gpu,
        &MatmulDims::dense(0, 1 << 20, 1 << 20, 1),
        c_w,
        a_w,
        b_w,
    )?;
    // main forced onto an operand that is not 4-element aligned is refused; main_scalar runs.
    let unaligned = b.slice(1, 64)?;
    expect_invalid(
        super::matmul_on(
            &gpu,
            MatmulEntry::Main,
            &one,
            a.slice(64, 64)?,
            a_lo,
            unaligned,
        ),
        "multiples of 4",
    );
    super::matmul_on(
        &gpu,
        MatmulEntry::MainScalar,
        &one,
        a.slice(64, 64)?,
        a_lo,
        unaligned,
    )?;
    Ok(())
}

/// `record_matmuls` keeps the shapes of the launches that passed validation, in order, until
/// `take_matmuls`; nothing before or after.
#[test]
fn recorded_matmuls_are_the_launches() -> Result<()> {
    let gpu = gpu();
    let buf = gpu
        .upload(&[1.0f32; 3 * 64], Category::Temporary, "ops")?;
    let (c, a, b) = (buf.slice(0, 64)?, buf.slice(64, 64)?, buf.slice(128, 64)?);
    let first = MatmulDims::dense(1, 8, 8, 8);
    let second = MatmulDims {
        trans_a: true,
        accumulate: true,
        ..MatmulDims::dense(1, 4, 16, 4)
    };
    super::matmul(&gpu, &first, c, a, b)?; // before: not recorded
    assert!(gpu.take_matmuls().is_empty());
    gpu.record_matmuls();
    super::matmul(&gpu, &first, c, a, b)?;
    let err = super::matmul(&gpu, &MatmulDims::dense(1, 9, 9, 9), c, a, b).expect_err("must be refused");
    assert!(
        matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("at least 81"),
        "{err}"
    );
    super::matmul(&gpu, &second, c, a, b)?;
    assert_eq!(gpu.take_matmuls(), vec![first, second]);
    super::matmul(&gpu, &first, c, a, b)?; // after: not recorded
    assert!(gpu.take_matmuls().is_empty());
    Ok(())
}

#[test]
fn matmul_refuses_k_over_the_loop_limit() -> Result<()> {
    let gpu = gpu();
    let Some(limit) = loop_limit_or_skip(&gpu, "matmul_refuses_k_over_the_loop_limit") else {
        return Ok(());
    };
    let t = gpu.alloc_elements(4, Category::Temporary, "tiny")?;
    let c = gpu.alloc_elements(16, Category::Temporary, "c")?;
    // (m, n, trans, entry): main_scalar, main with trans_a only (one k per pass), main.
    for (m, n, trans, entry) in [
        (1, 1, (false, false), MatmulEntry::MainScalar),
        (16, 16, (true, false), MatmulEntry::Main),
        (16, 16, (false, true), MatmulEntry::Main),
    ] {
        let passes = |k| super::loop_iterations(entry, trans.0, trans.1, k);
        let largest = largest_within(limit, passes);
        let k = (largest + 1).next_multiple_of(4) as usize; // main needs k % 4 == 0
        let d = dims(m, n, k, trans);
        assert_eq!(
            launched_entry(&d, [t.whole(), t.whole(), c.whole()]),
            entry,
            "{d:?}"
        );
        assert_loop_limit(
            super::matmul(&gpu, &d, c.whole(), t.whole(), t.whole()),
            "k",
            largest,
        );
    }
    Ok(())
}

#[test]
fn matmul_at_the_loop_limit_matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(29);
    for (m, n, trans, entry) in [
        (1, 1, (false, false), MatmulEntry::MainScalar),
        (2, 16, (false, false), MatmulEntry::Main),
    ] {
        let passes = |k| super::loop_iterations(entry, trans.0, trans.1, k);
        let k = largest_at_the_loop_limit(&gpu, passes) as usize / 4 * 4;
        assert_eq!(
            check(&gpu, &mut rng, &dims(m, n, k, trans), [0, 0, 0], 3)?,
            entry
        );
    }
    Ok(())
}

/// `matmul_bias`: the epilogue (`+ bias[j]`, then ReLU) on both entry points, every transpose,
/// a batch of 2 with alpha 1 and 1.5 and a bias at an odd offset. Two oracles: the f64
/// reference plus the bias (then `max(0, .)`), within the matmul tolerance; and, with alpha 1,
/// the unfused kernels (matmul, then a broadcast bias add, then the ReLU kernel) on the GPU,
/// which it must equal bit for bit. C starts poisoned, so an element the epilogue skips shows.
#[test]
fn matmul_bias_equals_matmul_then_bias_then_relu() -> Result<()> {
    use crate::kernels::binary::{self, BinaryDims, BinaryOp};
    use super::Epilogue;
    use crate::kernels::unary::{self, UnaryOp};
    let (gpu, mut rng) = gpu_and_rng(0xb1a5);
    let mut entries = Vec::new();
    for (m, n, k) in [(7, 13, 5), (132, 260, 124)] {
        for (t, &trans) in TRANSPOSES.iter().enumerate() {
            let epilogue = [Epilogue::Bias, Epilogue::BiasRelu][t % 2];
            // Bit for bit only with alpha 1 (another alpha may be fused into an FMA by a driver).
            let alpha = if t < 2 { 1.0 } else { 1.5 };
            let d = MatmulDims {
                alpha,
                ..two_batches(m, n, k, trans)
            };
            let (a_len, b_len) = operand_lens(&d);
            let c_len = d.c_len();
            let a = rng.vec_f32(a_len, -1.0, 1.0);
            let b = rng.vec_f32(b_len, -1.0, 1.0);
            let bias = rng.vec_f32(n + 3, -1.0, 1.0);
            let a_gpu = gpu.upload(&a, Category::Temporary, "a")?;
            let b_gpu = gpu.upload(&b, Category::Temporary, "b")?;
            let bias_gpu = gpu.upload(&bias, Category::Temporary, "bias")?;
            let fused = gpu
                .upload(&vec![POISON; c_len], Category::Temporary, "c")?;
            let plain = gpu
                .upload(&vec![POISON; c_len], Category::Temporary, "c")?;
            let added = gpu
                .upload(&vec![POISON; c_len], Category::Temporary, "c")?;
            let (a_s, b_s) = (a_gpu.whole(), b_gpu.whole());
            let bias_s = bias_gpu.slice(3, n as u64)?;
            super::matmul_bias(&gpu, &d, epilogue, fused.whole(), a_s, b_s, bias_s)?;
            entries.push(launched_entry(&d, [a_s, b_s, fused.whole()]));
            // The unfused sequence.
            super::matmul(&gpu, &d, plain.whole(), a_s, b_s)?;
            let shape = [2, m, n];
            let add = BinaryDims {
                op: BinaryOp::Add,
                a_shape: &shape,
                b_shape: &[n],
            };
            binary::broadcast(&gpu, &add, added.whole(), plain.whole(), bias_s)?;
            if epilogue == Epilogue::BiasRelu {
                unary::forward(&gpu, UnaryOp::Relu, plain.whole(), added.whole(), 0.0)?;
            } else {
                crate::kernels::copy::copy(&gpu, plain.whole(), added.whole())?;
            }
            let got: Vec<f32> = gpu.read_all(&fused, DEADLINE)?;
            let unfused: Vec<f32> = gpu.read_all(&plain, DEADLINE)?;
            let name = format!("matmul_bias {epilogue:?} {d:?}");
            let differ = got
                .iter()
                .zip(&unfused)
                .position(|(g, u)| g.to_bits() != u.to_bits());
            if let Some(i) = differ.filter(|_| alpha == 1.0) {
                panic!(
                    "{name}: element {i} is {} fused, {} unfused",
                    got[i], unfused[i]
                );
            }
            let mut want = vec![0.0f32; c_len];
            reference::matmul_into(&a, &b, &mut want, &d);
            for (i, w) in want.iter_mut().enumerate() {
                *w += bias[3 + i % n];
                if epilogue == Epilogue::BiasRelu {
                    *w = w.max(0.0);
                }
            }
            let atol = ATOL_EPS_PER_K * f64::from(f32::EPSILON) * k as f64 * 1.5;
            assert_close(&name, &got, &want, atol, 1e-6);
        }
    }
    assert!(entries.contains(&MatmulEntry::Main), "{entries:?}");
    assert!(entries.contains(&MatmulEntry::MainScalar), "{entries:?}");
    // An epilogue with accumulate, or a bias of the wrong length, is refused.
    let d = dims(4, 8, 4, (false, false));
    let buf = gpu.upload(&[0.0f32; 64], Category::Temporary, "x")?;
    let (c, a, b) = (
        buf.slice(0, 32)?,
        buf.slice(32, 16)?,
        buf.slice(48, 16)?,
    );
    let short = buf.slice(48, 7)?;
    let err = super::matmul_bias(&gpu, &d, Epilogue::Bias, c, a, b, short).expect_err("must be refused");
    assert!(err.to_string().contains("bias: 7 elements given"), "{err}");
    let acc = MatmulDims {
        accumulate: true,
        ..d
    };
    let bias8 = buf.slice(48, 8)?;
    let err = super::matmul_bias(&gpu, &acc, Epilogue::BiasRelu, c, a, b, bias8).expect_err("must be refused");
    assert!(err.to_string().contains("accumulate"), "{err}");
    Ok(())
}

/// `matmul_squares`: C as `matmul` writes it (the same bits), and each partial sum is the sum of
/// the squares of its block of C as read back (16×16 on `main`, 4×4 on `main_scalar`, per
/// batch, row-major over the blocks), on both entry points, every transpose, accumulating or
/// not (the squares are of what C then holds); a wrong length is refused.
#[test]
fn matmul_squares_are_the_blocks_of_c() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(0x5a5a);
    let mut entries = Vec::new();
    for (m, n, k) in [(7, 13, 5), (132, 260, 124)] {
        for (t, &trans) in TRANSPOSES.iter().enumerate() {
            let d = MatmulDims {
                accumulate: t % 2 == 1,
                ..two_batches(m, n, k, trans)
            };
            let (a_len, b_len) = operand_lens(&d);
            let c_len = d.c_len();
            let a = rng.vec_f32(a_len, -1.0, 1.0);
            let b = rng.vec_f32(b_len, -1.0, 1.0);
            let c0 = rng.vec_f32(c_len, -1.0, 1.0);
            let a_gpu = gpu.upload(&a, Category::Temporary, "a")?;
            let b_gpu = gpu.upload(&b, Category::Temporary, "b")?;
            let c_gpu = gpu.upload(&c0, Category::Temporary, "c")?;
            let plain = gpu.upload(&c0, Category::Temporary, "c")?;
            let (a_s, b_s, c_s) = (a_gpu.whole(), b_gpu.whole(), c_gpu.whole());
            let entry = super::launch_entry(&d, [c_s.into(), a_s.into(), b_s.into()]);
            entries.push(entry);
            let len = super::squares_len(&d, entry);
            let sq_gpu = gpu
                .upload(&vec![POISON; len as usize], Category::Temporary, "sq")?;
            super::matmul_squares(&gpu, &d, c_s, a_s, b_s, sq_gpu.whole())?;
            super::matmul(&gpu, &d, plain.whole(), a_s, b_s)?;
            let c: Vec<f32> = gpu.read_all(&c_gpu, DEADLINE)?;
            let want_c: Vec<f32> = gpu.read_all(&plain, DEADLINE)?;
            let sq: Vec<f32> = gpu.read_all(&sq_gpu, DEADLINE)?;
            let name = format!("matmul_squares {entry:?} {d:?}");
            assert!(
                c.iter()
                    .zip(&want_c)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}: C differs from matmul's"
            );
            let size = if entry == MatmulEntry::Main { 16 } else { 4 };
            let (rows, cols) = (m.div_ceil(size), n.div_ceil(size));
            let mut want = vec![0.0f64; 2 * rows * cols];
            for bi in 0..2 {
                for i in 0..m {
                    for j in 0..n {
                        let v = f64::from(c[bi * m * n + i * n + j]);
                        want[(bi * rows + i / size) * cols + j / size] += v * v;
                    }
                }
            }
            // f32 sums of at most 256 squares of values up to ~k in size.
            assert_close(&name, &sq, &want, 1e-4, 1e-5);
        }
    }
    assert!(entries.contains(&MatmulEntry::Main), "{entries:?}");
    assert!(entries.contains(&MatmulEntry::MainScalar), "{entries:?}");
    let d = dims(4, 8, 4, (false, false));
    let buf = gpu.upload(&[0.0f32; 80], Category::Temporary, "x")?;
    let (c, a, b) = (
        buf.slice(0, 32)?,
        buf.slice(32, 16)?,
        buf.slice(48, 16)?,
    );
    let err = super::matmul_squares(&gpu, &d, c, a, b, buf.slice(64, 3)?).expect_err("must be refused");
    assert!(
        err.to_string().contains("squares: 3 elements given"),
        "{err}"
    );
    Ok(())
}

/// Under a bound on one submission's GPU time ([`crate::pacing`]), a product too long for it
/// goes out in pieces (products of the batch, blocks of C) and every value (C, and the squares
/// of its blocks) is the one the product in one dispatch gives, bit for bit: both entry
/// points, all four transposes.
#[test]
fn a_bounded_submission_splits_the_product_and_changes_no_value() -> Result<()> {
    let gpu = crate::testing::fresh_gpu();
    let mut rng = Rng::new(11);
    // Several row blocks; one row block and several column blocks; odd sizes.
    for (m, n, k) in [(300, 72, 40), (100, 300, 24), (261, 133, 17)] {
        for (t, trans) in TRANSPOSES.into_iter().enumerate() {
            let batch = [2, 3, 1, 2][t];
            let dims = MatmulDims {
                batch,
                batch_stride_a: m * k,
                batch_stride_b: k * n,
                batch_stride_c: m * n,
                ..dims(m, n, k, trans)
            };
            let (a_len, b_len) = operand_lens(&dims);
            let a = gpu.upload(&rng.vec_f32(a_len, -1.0, 1.0), Category::Temporary, "a")?;
            let b = gpu.upload(&rng.vec_f32(b_len, -1.0, 1.0), Category::Temporary, "b")?;
            let run = |bound: Option<std::time::Duration>| -> Result<(Vec<f32>, u64)> {
                gpu.set_max_submission(bound);
                let c = gpu.upload(&vec![POISON; dims.c_len()], Category::Temporary, "c")?;
                let early = gpu.pacing().early_submissions;
                super::matmul(&gpu, &dims, c.whole(), a.whole(), b.whole())?;
                gpu.flush("bounded matmul")?;
                let early = gpu.pacing().early_submissions - early;
                Ok((gpu.read_all(&c, DEADLINE)?, early))
            };
            let (whole, _) = run(None)?;
            let (pieces, early) = run(Some(std::time::Duration::from_nanos(1)))?;
            let name = format!("{dims:?}");
            assert!(whole == pieces, "{name}: the pieces changed values");
            // The squares of C's blocks too (what a gradient's norm is summed from).
            let squares = |bound: Option<std::time::Duration>| -> Result<Vec<f32>> {
                gpu.set_max_submission(bound);
                let c = gpu.upload(&vec![POISON; dims.c_len()], Category::Temporary, "c")?;
                let operands = [c.whole().into(), a.whole().into(), b.whole().into()];
                let len = super::squares_len(&dims, super::launch_entry(&dims, operands));
                let sq = gpu.upload(&vec![POISON; len as usize], Category::Temporary, "sq")?;
                super::matmul_squares(&gpu, &dims, c.whole(), a.whole(), b.whole(), sq.whole())?;
                gpu.read_all(&sq, DEADLINE)
            };
            let tiny = Some(std::time::Duration::from_nanos(1));
            assert!(squares(None)? == squares(tiny)?, "{name}: the pieces changed the squares");
            // Every piece after the first went out in a submission of its own.
            let least = batch * m.div_ceil(128) * n.div_ceil(128) - 1;
            assert!(early >= least as u64, "{name}: {early} early submissions");
        }
    }
    Ok(())
}
