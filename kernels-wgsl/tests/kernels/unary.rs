//! `unary` launchers against `reference::unary`.
// Helpers outside #[test] fns unwrap too: a failed unwrap is a failed test.

use plimsoll_kernels_wgsl::kernels::unary::{self, UnaryOp};
use plimsoll_kernels_wgsl::{Category, reference};

use crate::common::{DEADLINE, Rng, assert_close, gpu};

/// Odd sizes, none a multiple of the 256-wide workgroup except by accident; 70_001 needs 274
/// workgroups.
const LENS: [usize; 5] = [1, 7, 257, 1000, 70_001];

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
fn tolerance(op: UnaryOp) -> (f32, f32) {
    match op {
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => (0.0, 0.0),
        _ => (1e-6, 1e-5),
    }
}

/// Runs forward and backward of `op` on `len` elements at non-zero offsets inside bigger
/// buffers, and compares the whole output buffers (so untouched elements must be unchanged).
fn check(gpu: &plimsoll_kernels_wgsl::Gpu, rng: &mut Rng, op: UnaryOp, exponent: f32, len: usize) {
    let (atol, rtol) = tolerance(op);
    let name = format!("unary {op:?} (p = {exponent}) len {len}");
    // x at offset 3 of len + 5, y at offset 2 of len + 4 prefilled with sentinels.
    let mut x_buf = rng.vec_f32(len + 5, -1.0, 1.0);
    let x = input(rng, op, exponent, len);
    x_buf[3..3 + len].copy_from_slice(&x);
    let y0 = rng.vec_f32(len + 4, -9.0, 9.0);
    let x_gpu = gpu.upload(&x_buf, Category::Activation, "x").unwrap();
    let y_gpu = gpu.upload(&y0, Category::Activation, "y").unwrap();
    unary::forward(gpu, op, &y_gpu, 2, &x_gpu, 3, len as u64, exponent).unwrap();
    let got: Vec<f32> = gpu.read_all(&y_gpu, DEADLINE).unwrap();
    let y = reference::unary::forward(op, &x, exponent);
    let mut want = y0.clone();
    want[2..2 + len].copy_from_slice(&y);
    assert_close(&format!("{name} forward"), &got, &want, atol, rtol);

    // Backward: saved = y for exp/tanh/sigmoid, x otherwise; the saved tensor is read where the
    // forward left it (y_gpu at offset 2, or x_gpu at offset 3).
    let dy = rng.vec_f32(len, -2.0, 2.0);
    let mut dy_buf = rng.vec_f32(len + 1, -1.0, 1.0);
    dy_buf[1..].copy_from_slice(&dy);
    let dy_gpu = gpu.upload(&dy_buf, Category::Gradient, "dy").unwrap();
    let dx0 = rng.vec_f32(len + 6, -9.0, 9.0);
    let dx_gpu = gpu.upload(&dx0, Category::Gradient, "dx").unwrap();
    let (saved, saved_gpu, saved_offset) = if op.backward_uses_output() {
        (&got[2..2 + len], &y_gpu, 2)
    } else {
        (&x[..], &x_gpu, 3)
    };
    unary::backward(
        gpu,
        op,
        &dx_gpu,
        5,
        saved_gpu,
        saved_offset,
        &dy_gpu,
        1,
        len as u64,
        exponent,
    )
    .unwrap();
    let got_dx: Vec<f32> = gpu.read_all(&dx_gpu, DEADLINE).unwrap();
    let mut want_dx = dx0.clone();
    want_dx[5..5 + len].copy_from_slice(&reference::unary::backward(op, saved, &dy, exponent));
    assert_close(&format!("{name} backward"), &got_dx, &want_dx, atol, rtol);
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
    let err = unary::forward(&gpu, UnaryOp::Exp, &y, 0, &x, 0, 100, 0.0).unwrap_err();
    assert!(err.to_string().contains("outside buffer"), "{err}");
    let err = unary::backward(&gpu, UnaryOp::Relu, &x, 0, &x, 1, &y, 0, 100, 0.0).unwrap_err();
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // Empty work is fine and records nothing.
    unary::forward(&gpu, UnaryOp::Exp, &y, 50, &x, 100, 0, 0.0).unwrap();
}
