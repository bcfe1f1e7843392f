//! `unary` launchers against `reference::unary`.
// Helpers outside #[test] fns unwrap too: a failed unwrap is a failed test.

use plimsoll_kernels_wgsl::kernels::unary::{self, UnaryOp};
use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, assert_close, gpu};
use plimsoll_kernels_wgsl::{Category, Error, reference};

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
    gpu: &plimsoll_kernels_wgsl::Gpu,
    rng: &mut Rng,
    (op, exponent): (UnaryOp, f32),
    len: usize,
    aligned: bool,
) {
    let (atol, rtol) = tolerance(op);
    let name = format!("unary {op:?} (p = {exponent}) len {len} aligned {aligned}");
    let [x_at, y_at, dy_at, dx_at] = if aligned { [4, 4, 4, 8] } else { [3, 2, 1, 5] };
    // x at x_at of len + x_at + 2, y at y_at of len + y_at + 2 prefilled with sentinels.
    let mut x_buf = rng.vec_f32(len + x_at + 2, -1.0, 1.0);
    let x = input(rng, op, exponent, len);
    x_buf[x_at..x_at + len].copy_from_slice(&x);
    let y0 = rng.vec_f32(len + y_at + 2, -9.0, 9.0);
    let x_gpu = gpu.upload(&x_buf, Category::Activation, "x").unwrap();
    let y_gpu = gpu.upload(&y0, Category::Activation, "y").unwrap();
    let n = len as u64;
    let (y_s, x_s) = (
        y_gpu.slice(y_at as u64, n).unwrap(),
        x_gpu.slice(x_at as u64, n).unwrap(),
    );
    unary::forward(gpu, op, y_s, x_s, exponent).unwrap();
    let got: Vec<f32> = gpu.read_all(&y_gpu, DEADLINE).unwrap();
    let y = reference::unary::forward(op, &x, exponent);
    let mut want = y0.clone();
    want[y_at..y_at + len].copy_from_slice(&y);
    assert_close(&format!("{name} forward"), &got, &want, atol, rtol);

    // Backward: saved = y for exp/tanh/sigmoid, x otherwise; the saved tensor is read where the
    // forward left it.
    let dy = rng.vec_f32(len, -2.0, 2.0);
    let mut dy_buf = rng.vec_f32(len + dy_at, -1.0, 1.0);
    dy_buf[dy_at..].copy_from_slice(&dy);
    let dy_gpu = gpu.upload(&dy_buf, Category::Gradient, "dy").unwrap();
    let dx0 = rng.vec_f32(len + dx_at + 1, -9.0, 9.0);
    let dx_gpu = gpu.upload(&dx0, Category::Gradient, "dx").unwrap();
    let (saved, saved_s) = if op.backward_uses_output() {
        (&got[y_at..y_at + len], y_s)
    } else {
        (&x[..], x_s)
    };
    let (dx_s, dy_s) = (
        dx_gpu.slice(dx_at as u64, n).unwrap(),
        dy_gpu.slice(dy_at as u64, n).unwrap(),
    );
    unary::backward(gpu, op, dx_s, saved_s, dy_s, exponent).unwrap();
    let got_dx: Vec<f32> = gpu.read_all(&dx_gpu, DEADLINE).unwrap();
    let mut want_dx = dx0.clone();
    want_dx[dx_at..dx_at + len]
        .copy_from_slice(&reference::unary::backward(op, saved, &dy, exponent));
    assert_close(&format!("{name} backward"), &got_dx, &want_dx, atol, rtol);
}

fn check(gpu: &plimsoll_kernels_wgsl::Gpu, rng: &mut Rng, op: UnaryOp, exponent: f32, len: usize) {
    for aligned in [false, true] {
        check_at(gpu, rng, (op, exponent), len, aligned);
    }
}

#[test]
fn unary_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(41);
    for op in UnaryOp::ALL {
        for len in LENS {
            check(&gpu, &mut rng, op, 3.0, len);
        }
    }
}

#[test]
fn unary_pow_exponents_match_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(43);
    // Non-integer (positive base), negative, zero (x^0 = 1, derivative 0) and even exponents.
    for exponent in [2.5, -1.5, 0.0, 2.0, 1.0] {
        for len in [7, 1000] {
            check(&gpu, &mut rng, UnaryOp::Pow, exponent, len);
        }
    }
}

#[test]
fn unary_rejects_a_range_outside_the_buffer() {
    let gpu = gpu();
    let x = gpu.alloc_elements(100, Category::Temporary, "x").unwrap();
    let y = gpu.alloc_elements(50, Category::Temporary, "y").unwrap();
    // 100 outputs in a 50-element buffer: the slice cannot be made ...
    let err = y.slice(0, 100).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the launcher refuses an output shorter than the input.
    let err = unary::forward(&gpu, UnaryOp::Exp, y.whole(), x.whole(), 0.0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // (Named as the launcher's length check does: by the first slice that differs from y.)
    assert!(err.to_string().contains("x: 100 elements given"), "{err}");
    assert!(err.to_string().contains("50 needed"), "{err}");
    // saved = elements 1..101 of a 100-element buffer: refused when the slice is made ...
    let err = x.slice(1, 100).unwrap_err();
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the backward refuses slices of different lengths.
    let saved = x.slice(1, 99).unwrap();
    let err = unary::backward(&gpu, UnaryOp::Relu, x.whole(), saved, x.whole(), 0.0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err =
        unary::backward(&gpu, UnaryOp::Relu, x.whole(), x.whole(), y.whole(), 0.0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Empty work is fine and records nothing.
    let (y_end, x_end) = (y.slice(50, 0).unwrap(), x.slice(100, 0).unwrap());
    unary::forward(&gpu, UnaryOp::Exp, y_end, x_end, 0.0).unwrap();
}
