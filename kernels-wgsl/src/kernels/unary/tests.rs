//! The `unary` launchers against [`reference`](super::reference) (f32 at odd and aligned
//! offsets, both 16-bit paths), their argument checks, and the reference itself against finite
//! differences and hand-worked values.

use super::{UnaryOp, reference};
use crate::kernels::convert::{F16Path, Halves};
use crate::kernels::convert::reference::round_to_f16;
use crate::testing::{DEADLINE, assert_close, f16_devices, gpu_and_rng, gpu_and_temporaries, halves_input, read_halves, Rng, sentinel_halves, upload_halves};
use crate::{Category, Error, Gpu, Result};

/// Odd sizes, none a multiple of the 256-wide workgroup except by accident; 70_001 needs 274
/// workgroups.
const LENS: [usize; 6] = [1, 7, 257, 1000, 1003, 70_001];

/// Inputs inside each op's domain (log and sqrt positive; pow with a non-integer exponent
/// positive), never all zeros.
fn input(rng: &mut Rng, op: UnaryOp, exponent: f32, len: usize) -> Vec<f32> {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt => rng.vec_f32(len, 0.05, 4.0),
        UnaryOp::Pow if exponent.fract() != 0.0 => rng.vec_f32(len, 0.05, 2.0),
        UnaryOp::Pow => rng.vec_f32(len, -2.0, 2.0),
        _ => rng.vec_f32(len, -4.0, 4.0),
    }
}

/// `(atol, rtol)`. Neg, abs and relu (and their backwards) are exact. The rest go through the
/// device's exp/log/pow/tanh, which Vulkan lets be a few ULP off (exp: 3 + 2|x| ULP, log: 2^-21
/// absolute near 1), so ~1e-6 relative; rtol 1e-5 leaves a 10x margin, and atol 1e-6 covers
/// log near 1 and the cancellation in 1 - y^2 and y (1 - y) (an absolute f32 rounding of ~1e-7
/// times |dy| <= 2).
fn tolerance(op: UnaryOp) -> (f64, f64) {
    match op {
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => (0.0, 0.0),
        _ => (1e-6, 1e-5),
    }
}

/// Runs forward and backward of `op` on `len` elements at non-zero offsets inside bigger
/// buffers, and compares the whole output buffers (so untouched elements must be unchanged).
/// Forward and backward of `op` over `len` elements at odd offsets, or (with `aligned`) at
/// offsets that are multiples of 4: the launchers' vec4 path for the whole vec4s and the scalar
/// kernel for the rest.
fn check_at(
    gpu: &Gpu,
    rng: &mut Rng,
    (op, exponent): (UnaryOp, f32),
    len: usize,
    aligned: bool,
) -> Result<()> {
    let (atol, rtol) = tolerance(op);
    let name = format!("unary {op:?} (p = {exponent}) len {len} aligned {aligned}");
    let [x_at, y_at, dy_at, dx_at] = if aligned { [4, 4, 4, 8] } else { [3, 2, 1, 5] };
    // x at x_at of len + x_at + 2, y at y_at of len + y_at + 2 prefilled with sentinels.
    let mut x_buf = rng.vec_f32(len + x_at + 2, -1.0, 1.0);
    let x = input(rng, op, exponent, len);
    x_buf[x_at..x_at + len].copy_from_slice(&x);
    let y0 = rng.vec_f32(len + y_at + 2, -9.0, 9.0);
    let x_gpu = gpu.upload(&x_buf, Category::Activation, "x")?;
    let y_gpu = gpu.upload(&y0, Category::Activation, "y")?;
    let n = len as u64;
    let (y_s, x_s) = (y_gpu.slice(y_at as u64, n)?, x_gpu.slice(x_at as u64, n)?);
    super::forward(gpu, op, y_s, x_s, exponent)?;
    let got: Vec<f32> = gpu.read_all(&y_gpu, DEADLINE)?;
    let y = reference::forward(op, &x, exponent);
    let mut want = y0.clone();
    want[y_at..y_at + len].copy_from_slice(&y);
    assert_close(&format!("{name} forward"), &got, &want, atol, rtol);

    // Backward: saved = y for exp/tanh/sigmoid, x otherwise; the saved tensor is read where the
    // forward left it.
    let dy = rng.vec_f32(len, -2.0, 2.0);
    let mut dy_buf = rng.vec_f32(len + dy_at, -1.0, 1.0);
    dy_buf[dy_at..].copy_from_slice(&dy);
    let dy_gpu = gpu.upload(&dy_buf, Category::Gradient, "dy")?;
    let dx0 = rng.vec_f32(len + dx_at + 1, -9.0, 9.0);
    let dx_gpu = gpu.upload(&dx0, Category::Gradient, "dx")?;
    let (saved, saved_s) = if op.backward_uses_output() {
        (&got[y_at..y_at + len], y_s)
    } else {
        (&x[..], x_s)
    };
    let (dx_s, dy_s) = (dx_gpu.slice(dx_at as u64, n)?, dy_gpu.slice(dy_at as u64, n)?);
    super::backward(gpu, op, dx_s, saved_s, dy_s, exponent)?;
    let got_dx: Vec<f32> = gpu.read_all(&dx_gpu, DEADLINE)?;
    let mut want_dx = dx0.clone();
    want_dx[dx_at..dx_at + len].copy_from_slice(&reference::backward(op, saved, &dy, exponent));
    assert_close(&format!("{name} backward"), &got_dx, &want_dx, atol, rtol);
    Ok(())
}

fn check(gpu: &Gpu, rng: &mut Rng, op: UnaryOp, exponent: f32, len: usize) -> Result<()> {
    for aligned in [false, true] {
        check_at(gpu, rng, (op, exponent), len, aligned)?;
    }
    Ok(())
}

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(41);
    for op in UnaryOp::ALL {
        for len in LENS {
            check(&gpu, &mut rng, op, 3.0, len)?;
        }
    }
    Ok(())
}

#[test]
fn unary_pow_exponents_match_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(43);
    // Non-integer (positive base), negative, zero (x^0 = 1, derivative 0) and even exponents.
    for exponent in [2.5, -1.5, 0.0, 2.0, 1.0] {
        for len in [7, 1000] {
            check(&gpu, &mut rng, UnaryOp::Pow, exponent, len)?;
        }
    }
    Ok(())
}

#[test]
fn unary_rejects_a_range_outside_the_buffer() -> Result<()> {
    let (gpu, [x, y]) = gpu_and_temporaries([(100, "x"), (50, "y")])?;
    let refused = |result: Result<()>| result.expect_err("the launcher must refuse this");
    // 100 outputs in a 50-element buffer: the slice cannot be made ...
    let err = y.slice(0, 100).expect_err("100 elements of 50");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the launcher refuses an output shorter than the input.
    let err = refused(super::forward(&gpu, UnaryOp::Exp, y.whole(), x.whole(), 0.0));
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // (Named as the launcher's length check does: by the first slice that differs from y.)
    assert!(err.to_string().contains("x: 100 elements given"), "{err}");
    assert!(err.to_string().contains("50 needed"), "{err}");
    // saved = elements 1..101 of a 100-element buffer: refused when the slice is made ...
    let err = x.slice(1, 100).expect_err("elements 1..101 of 100");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the backward refuses slices of different lengths.
    let saved = x.slice(1, 99)?;
    let err = refused(super::backward(&gpu, UnaryOp::Relu, x.whole(), saved, x.whole(), 0.0));
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = refused(super::backward(&gpu, UnaryOp::Relu, x.whole(), x.whole(), y.whole(), 0.0));
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Empty work is fine and records nothing.
    let (y_end, x_end) = (y.slice(50, 0)?, x.slice(100, 0)?);
    super::forward(&gpu, UnaryOp::Exp, y_end, x_end, 0.0)
}

// ------------------------------------------------------------------------------------- f16

#[test]
fn f16_unary_ops_match_reference_on_both_paths() -> Result<()> {
    let mut rng = Rng::new(0x016);
    for (_, gpu) in f16_devices() {
        let path = gpu.f16_path();
        for op in UnaryOp::ALL {
            let len = 257;
            let x = match op {
                UnaryOp::Log | UnaryOp::Sqrt => round_to_f16(&rng.vec_f32(len, 0.05, 4.0)),
                _ => halves_input(&mut rng, len),
            };
            let exponent = 2.0;
            let (off_x, off_y) = (3, 4);
            let x_gpu = upload_halves(&gpu, &x, off_x)?;
            let y_gpu = sentinel_halves(&gpu, off_y, len, "y")?;
            let y = Halves::of(&y_gpu, off_y as u64, len as u64)?;
            let xh = Halves::of(&x_gpu, off_x as u64, len as u64)?;
            super::forward_f16(&gpu, op, y, xh, exponent)?;
            let (got, kept) = read_halves(&gpu, &y_gpu, off_y, len)?;
            let name = format!("{path:?} {op:?}");
            assert!(kept, "{name}: a half outside the output changed");
            // f in f32 on the device (a few f32 ULP from the f64 reference), then one rounding
            // to f16: at most one f16 ULP (2^-10 relative) from the reference rounded.
            let want: Vec<f32> = x
                .iter()
                .map(|&v| {
                    let exact = reference::apply(op, f64::from(v), f64::from(exponent));
                    round_to_f16(&[exact as f32])[0]
                })
                .collect();
            let (atol, rtol) = match op {
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => (0.0, 0.0),
                _ => (1e-7, 1.0 / 1024.0),
            };
            assert_close(&name, &got, &want, atol, rtol);
        }
    }
    Ok(())
}

/// The packed path writes whole words: an output starting in a word's high half is refused,
/// naming the fix; the native path takes it.
#[test]
fn f16_outputs_at_odd_offsets_are_refused_on_the_packed_path_only() -> Result<()> {
    for (_, gpu) in f16_devices() {
        let x_gpu = upload_halves(&gpu, &[1.0, -2.0, 3.0], 0)?;
        let y_gpu = upload_halves(&gpu, &[0.0; 4], 0)?;
        let x = Halves::of(&x_gpu, 0, 3)?;
        let y = Halves::of(&y_gpu, 1, 3)?;
        let result = super::forward_f16(&gpu, UnaryOp::Neg, y, x, 0.0);
        match gpu.f16_path() {
            F16Path::Packed => {
                let err = result.expect_err("the packed path refuses an odd output");
                assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
                assert!(err.to_string().contains("even element"), "{err}");
            }
            F16Path::Native => {
                result?;
                let (got, _) = read_halves(&gpu, &y_gpu, 1, 3)?;
                assert_eq!(got, [-1.0, 2.0, -3.0]);
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------- reference

#[test]
fn unary_backward_matches_finite_differences() {
    for op in UnaryOp::ALL {
        for exponent in [3.0f64, 2.5, -1.5, 0.0] {
            if op != UnaryOp::Pow && exponent != 3.0 {
                continue;
            }
            let positive_only = matches!(op, UnaryOp::Log | UnaryOp::Sqrt)
                || (op == UnaryOp::Pow && exponent.fract() != 0.0);
            let points: &[f64] = if positive_only {
                &[0.3, 0.9, 1.7, 4.2]
            } else {
                &[-2.3, -0.7, -0.1, 0.2, 0.8, 1.9, 3.1]
            };
            for &x in points {
                let h = 1e-6;
                let numeric = (reference::apply(op, x + h, exponent)
                    - reference::apply(op, x - h, exponent))
                    / (2.0 * h);
                let saved = if op.backward_uses_output() {
                    reference::apply(op, x, exponent)
                } else {
                    x
                };
                let analytic = reference::apply_backward(op, saved, 1.0, exponent);
                assert!(
                    (numeric - analytic).abs() <= 1e-6 + 1e-6 * analytic.abs(),
                    "{op:?} p={exponent} at x={x}: analytic {analytic}, numeric {numeric}"
                );
            }
        }
    }
}

#[test]
fn unary_hand_worked_values() {
    use reference as unary;
    // gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.5 (1 + tanh(0.8335565)) = 0.8411920
    // (PyTorch: F.gelu(torch.tensor(1.), approximate="tanh") = 0.8412).
    assert!((unary::gelu(1.0) - 0.841_191_990_6).abs() < 1e-9);
    assert_eq!(unary::gelu(0.0), 0.0);
    assert_eq!(unary::sigmoid(0.0), 0.5);
    // (-2)^3 = -8, (-2)^2 = 4, 4^0.5 = 2, 0^0 = 1, (-2)^0.5 = NaN
    let y = unary::forward(UnaryOp::Pow, &[-2.0], 3.0);
    assert_eq!(y, [-8.0]);
    assert_eq!(unary::forward(UnaryOp::Pow, &[-2.0], 2.0), [4.0]);
    assert_eq!(unary::forward(UnaryOp::Pow, &[4.0, 0.0], 0.5)[0], 2.0);
    assert_eq!(unary::forward(UnaryOp::Pow, &[0.0], 0.0), [1.0]);
    assert!(unary::forward(UnaryOp::Pow, &[-2.0], 0.5)[0].is_nan());
    // relu'(0) = 0 and |x|'(0) = 0, as PyTorch
    assert_eq!(
        unary::backward(UnaryOp::Relu, &[0.0, 2.0, -1.0], &[5.0, 5.0, 5.0], 0.0),
        [0.0, 5.0, 0.0]
    );
    assert_eq!(
        unary::backward(UnaryOp::Abs, &[0.0, -3.0], &[5.0, 5.0], 0.0),
        [0.0, -5.0]
    );
    // tanh' from y = 0.5: 1 - 0.25 = 0.75; sigmoid' from y = 0.5: 0.25
    assert_eq!(unary::backward(UnaryOp::Tanh, &[0.5], &[2.0], 0.0), [1.5]);
    assert_eq!(
        unary::backward(UnaryOp::Sigmoid, &[0.5], &[2.0], 0.0),
        [0.5]
    );
    // extreme inputs stay finite where the function is
    let big = unary::forward(UnaryOp::Sigmoid, &[-100.0, 100.0], 0.0);
    assert!(big[0] >= 0.0 && big[0] < 1e-40 && big[1] == 1.0, "{big:?}");
    assert_eq!(
        unary::backward(UnaryOp::Gelu, &[-30.0, 30.0], &[1.0, 1.0], 0.0),
        [0.0, 1.0]
    );
}

/// Under a bound on one submission's GPU time ([`crate::pacing`]), an elementwise op too long
/// for it goes out in ranges, each in a submission of its own, and gives the same values:
/// aligned (`vec4` ranges and a scalar tail) and not.
#[test]
fn a_bounded_submission_splits_the_op_into_ranges_and_changes_no_value() -> Result<()> {
    let gpu = crate::testing::fresh_gpu();
    let mut rng = Rng::new(5);
    let len = 70_003;
    let x = gpu.upload(&rng.vec_f32(len + 1, -3.0, 3.0), Category::Temporary, "x")?;
    for start in [0, 1] {
        let run = |bound: Option<std::time::Duration>| -> Result<(Vec<f32>, u64)> {
            gpu.set_max_submission(bound);
            let y = gpu.upload(&vec![0.0f32; len], Category::Temporary, "y")?;
            let early = gpu.pacing().early_submissions;
            super::forward(&gpu, UnaryOp::Tanh, y.whole(), x.slice(start, len as u64)?, 1.0)?;
            gpu.flush("bounded unary")?;
            let early = gpu.pacing().early_submissions - early;
            Ok((gpu.read_all(&y, DEADLINE)?, early))
        };
        let (whole, _) = run(None)?;
        let (ranges, early) = run(Some(std::time::Duration::from_micros(50)))?;
        assert!(whole == ranges, "start {start}: the ranges changed values");
        assert!(early >= 2, "start {start}: {early} early submissions");
    }
    Ok(())
}
