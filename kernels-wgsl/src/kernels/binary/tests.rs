//! The `binary` launchers against [`reference`](super::reference) (f32 broadcasting and scalar
//! forms at odd and aligned offsets, both 16-bit paths), their argument checks, and the reference
//! itself against hand-worked values and finite differences.

use super::{BinaryDims, BinaryOp, Broadcast, reference};
use crate::kernels::convert::Halves;
use crate::kernels::{fill, reduce};
use crate::kernels::convert::reference::round_to_f16;
use crate::testing::{DEADLINE, assert_close, dot, f16_devices, gpu_and_rng, gpu_and_temporaries, halves_input, numeric_gradient, read_halves, Rng, sentinel_halves, sum_atol, upload_halves};
use crate::{Category, Error, Gpu, Result};

/// `(atol, rtol)`: add, sub, mul and the max/min selections are exact in f32 (the reference's
/// f64 result rounded once is the correctly rounded f32 result); division may be 2.5 ULP off on Vulkan, so 2e-6 relative (~16 ULP);
/// atol 1e-7 for the -a/b^2 products that land near zero.
const ATOL: f64 = 1e-7;
const RTOL: f64 = 2e-6;

/// Operands for `op`: divisors kept away from 0; max/min drawn from a few integers so ties are
/// common, with a NaN planted in `a` (NaN must win and, in the backward, split like a tie).
fn operands(rng: &mut Rng, op: BinaryOp, a_len: usize, b_len: usize) -> (Vec<f32>, Vec<f32>) {
    match op {
        BinaryOp::Max | BinaryOp::Min => {
            let mut small = |n| -> Vec<f32> { (0..n).map(|_| rng.below(5) as f32 - 2.0).collect() };
            let mut a = small(a_len);
            let b = small(b_len);
            a[a_len / 2] = f32::NAN;
            (a, b)
        }
        BinaryOp::Div => {
            let a = rng.vec_f32(a_len, -3.0, 3.0);
            let b = (0..b_len)
                .map(|i| {
                    let m = rng.f32_in(0.5, 2.0);
                    if i % 3 == 0 { -m } else { m }
                })
                .collect();
            (a, b)
        }
        _ => (rng.vec_f32(a_len, -3.0, 3.0), rng.vec_f32(b_len, -3.0, 3.0)),
    }
}

/// `data` at element `offset` of a host vector padded with `offset` leading and 3 trailing
/// random elements (to upload and operate on at a non-zero offset).
fn padded(rng: &mut Rng, data: &[f32], offset: usize) -> Vec<f32> {
    let mut buf = rng.vec_f32(offset + data.len() + 3, -9.0, 9.0);
    buf[offset..offset + data.len()].copy_from_slice(data);
    buf
}

/// Forward and backward of `op` over `a_shape` x `b_shape`, every operand at a non-zero offset
/// (all multiples of 4 with `aligned`: the launchers' vec4 paths), then the operand gradients
/// summed to their shapes with `reduce::sum_to_shape`.
fn check_broadcast(
    gpu: &Gpu,
    rng: &mut Rng,
    op: BinaryOp,
    (a_shape, b_shape): (&[usize], &[usize]),
    aligned: bool,
) -> Result<()> {
    let name = format!("binary {op:?} {a_shape:?} x {b_shape:?} aligned {aligned}");
    // Offsets of a, b, out, dy, da (db follows da after a gap).
    let [a_at, b_at, out_at, dy_at, da_at] = if aligned {
        [4, 8, 4, 4, 4]
    } else {
        [1, 2, 4, 3, 2]
    };
    let shape = Broadcast::new(a_shape, b_shape).expect("the cases broadcast");
    let (a_len, b_len, n) = (
        a_shape.iter().product::<usize>(),
        b_shape.iter().product::<usize>(),
        shape.len(),
    );
    let (a, b) = operands(rng, op, a_len, b_len);
    let a_host = padded(rng, &a, a_at);
    let b_host = padded(rng, &b, b_at);
    let out0 = rng.vec_f32(n + 7, -9.0, 9.0);
    let a_gpu = gpu.upload(&a_host, Category::Activation, "a")?;
    let b_gpu = gpu.upload(&b_host, Category::Activation, "b")?;
    let out_gpu = gpu.upload(&out0, Category::Activation, "out")?;
    let dims = BinaryDims {
        op,
        a_shape,
        b_shape,
    };
    let a_s = a_gpu.slice(a_at as u64, a_len as u64)?;
    let b_s = b_gpu.slice(b_at as u64, b_len as u64)?;
    let out_s = out_gpu.slice(out_at as u64, n as u64)?;
    super::broadcast(gpu, &dims, out_s, a_s, b_s)?;
    let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE)?;
    let mut want = out0.clone();
    want[out_at..out_at + n].copy_from_slice(&reference::broadcast(op, &a, &b, &shape));
    assert_close(&format!("{name} forward"), &got, &want, ATOL, RTOL);

    // Backward at the output shape, dy at offset 3, da and db sharing one buffer.
    let dy = rng.vec_f32(n, -2.0, 2.0);
    let dy_gpu = gpu
        .upload(&padded(rng, &dy, dy_at), Category::Gradient, "dy")?;
    let db_at = da_at + n.next_multiple_of(4) + 4;
    let grads0 = rng.vec_f32(db_at + n + 5, -9.0, 9.0);
    let grads_gpu = gpu.upload(&grads0, Category::Gradient, "da|db")?;
    let da_s = grads_gpu.slice(da_at as u64, n as u64)?;
    let db_s = grads_gpu.slice(db_at as u64, n as u64)?;
    let dy_s = dy_gpu.slice(dy_at as u64, n as u64)?;
    super::backward(gpu, &dims, da_s, db_s, a_s, b_s, dy_s)?;
    let got: Vec<f32> = gpu.read_all(&grads_gpu, DEADLINE)?;
    let (da_full, db_full) = reference::backward(op, &a, &b, &dy, &shape);
    let mut want = grads0.clone();
    want[da_at..da_at + n].copy_from_slice(&da_full);
    want[db_at..db_at + n].copy_from_slice(&db_full);
    assert_close(&format!("{name} backward"), &got, &want, ATOL, RTOL);

    // Operand gradients: sum the output-shaped gradients down to each operand's shape.
    for (label, full, full_at, operand_shape, operand_len) in [
        ("da", &da_full, da_at, a_shape, a_len),
        ("db", &db_full, db_at, b_shape, b_len),
    ] {
        let out_gpu = gpu
            .alloc_elements(operand_len as u64 + 2, Category::Gradient, label)?;
        fill::fill(gpu, out_gpu.slice(0, 2)?, -5.0)?;
        reduce::sum_to_shape(
            gpu,
            out_gpu.slice(2, operand_len as u64)?,
            grads_gpu.slice(full_at as u64, n as u64)?,
            &shape.out_shape,
            operand_shape,
        )?;
        let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE)?;
        let mut want = vec![-5.0, -5.0];
        want.extend(
            crate::kernels::reduce::reference::sum_to_shape(full, &shape.out_shape, operand_shape)
                .expect("the operand shape is reducible"),
        );
        // Sums of n / operand_len terms accumulated in f32 (see testing::sum_atol).
        let terms = (n / operand_len.max(1)).max(1);
        let largest = full.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let atol = sum_atol(terms, f64::from(largest));
        assert_close(
            &format!("{name} sum_to_shape {label}"),
            &got,
            &want,
            atol,
            1e-5,
        );
    }
    Ok(())
}

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(51);
    let cases: [(&[usize], &[usize]); 11] = [
        (&[70_001], &[70_001]),       // same shape, 274 workgroups (the fast path)
        (&[13, 7, 11], &[13, 7, 11]), // same shape, rank 3 (the fast path)
        (&[1], &[257]),               // scalar-like a
        (&[1000], &[1]),              // scalar-like b
        (&[37, 53], &[1, 53]),        // row
        (&[37, 53], &[37, 1]),        // column
        (&[4, 1, 6], &[3, 1]),        // 3-d mixed -> [4, 3, 6]
        (&[2, 1, 3, 1, 4, 5], &[3, 2, 1, 5]), // rank 6 -> [2, 1, 3, 2, 4, 5]
        (&[37, 56], &[56]),           // a bias row (suffix, whole vec4s when aligned)
        (&[5, 6, 8], &[1, 6, 8]),     // a suffix with a leading 1
        (&[1003], &[1003]),           // same shape, 250 vec4s and a tail of 3
    ];
    for op in BinaryOp::ALL {
        for shapes in cases {
            for aligned in [false, true] {
                check_broadcast(&gpu, &mut rng, op, shapes, aligned)?;
            }
        }
    }
    Ok(())
}

#[test]
fn binary_scalar_forms_match_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(53);
    for op in BinaryOp::ALL {
        for len in [1usize, 7, 257, 1000, 1003] {
            let (a, _) = operands(&mut rng, op, len, 1);
            let s = if op == BinaryOp::Div { 1.75 } else { 0.0 };
            let s = if matches!(op, BinaryOp::Max | BinaryOp::Min) {
                s
            } else {
                s + 0.625
            };
            // Misaligned, then 4-aligned offsets (the vec4 path and its tail).
            let aligned = len % 2 == 1;
            let (a_at, rhs_at) = if aligned { (4, 4) } else { (2, 1) };
            let lhs_at = rhs_at + len.next_multiple_of(4) + 4;
            let a_gpu = gpu
                .upload(&padded(&mut rng, &a, a_at), Category::Activation, "a")?;
            let out0 = rng.vec_f32(lhs_at + len + 3, -9.0, 9.0);
            let out_gpu = gpu.upload(&out0, Category::Activation, "out")?;
            let a_s = a_gpu.slice(a_at as u64, len as u64)?;
            let rhs_out = out_gpu.slice(rhs_at as u64, len as u64)?;
            let lhs_out = out_gpu.slice(lhs_at as u64, len as u64)?;
            super::scalar_rhs(&gpu, op, rhs_out, a_s, s)?;
            super::scalar_lhs(&gpu, op, lhs_out, s, a_s)?;
            let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE)?;
            let mut want = out0.clone();
            want[rhs_at..rhs_at + len].copy_from_slice(&reference::scalar_rhs(op, &a, s));
            want[lhs_at..lhs_at + len].copy_from_slice(&reference::scalar_lhs(op, s, &a));
            assert_close(
                &format!("binary scalar {op:?} len {len}"),
                &got,
                &want,
                ATOL,
                RTOL,
            );
        }
    }
    Ok(())
}

#[test]
fn binary_rejects_mismatched_shapes_and_bad_ranges() -> Result<()> {
    let (gpu, [a, out]) = gpu_and_temporaries([(12, "a"), (12, "out")])?;
    let dims = |op, a_shape, b_shape| BinaryDims {
        op,
        a_shape,
        b_shape,
    };
    let (a12, a3, a4, a1) = (
        a.whole(),
        a.slice(0, 3)?,
        a.slice(0, 4)?,
        a.slice(0, 1)?,
    );
    let err = super::broadcast(
        &gpu,
        &dims(BinaryOp::Add, &[3, 4], &[3]),
        out.whole(),
        a12,
        a3,
    ).expect_err("must be refused");
    assert!(err.to_string().contains("do not broadcast"), "{err}");
    let nine = [1usize; 9];
    let out1 = out.slice(0, 1)?;
    let err = super::broadcast(&gpu, &dims(BinaryOp::Add, &nine, &[1]), out1, a1, a1).expect_err("must be refused");
    assert!(err.to_string().contains("rank 9"), "{err}");
    // 12 outputs from element 1 of a 12-element buffer: refused when the slice is made ...
    let err = out.slice(1, 12).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the launcher refuses an output (or operand) of the wrong length.
    let mul = dims(BinaryOp::Mul, &[3, 4], &[4]);
    let err = super::broadcast(&gpu, &mul, out.slice(1, 11)?, a12, a4).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::broadcast(&gpu, &mul, out.whole(), a12, a3).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::broadcast(&gpu, &mul, out.whole(), a.slice(0, 11)?, a4).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // The backward: gradients of the wrong length.
    let short = out.slice(0, 11)?;
    let err = super::backward(&gpu, &mul, short, out.whole(), a12, a4, out.whole()).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::backward(&gpu, &mul, out.whole(), out.whole(), a12, a4, short).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Scalar form: a at element 5, 12 long, of a 12-element buffer.
    let err = a.slice(5, 12).expect_err("must be refused");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    let err = super::scalar_rhs(
        &gpu,
        BinaryOp::Sub,
        out.whole(),
        a.slice(5, 7)?,
        1.0,
    ).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::scalar_lhs(
        &gpu,
        BinaryOp::Sub,
        out.whole(),
        1.0,
        a.slice(5, 7)?,
    ).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    Ok(())
}

// ------------------------------------------------------------------------------------- f16

#[test]
fn f16_binary_ops_match_reference_on_both_paths() -> Result<()> {
    let mut rng = Rng::new(0xB16);
    let cases: [(&[usize], &[usize]); 3] = [(&[37], &[37]), (&[3, 5, 7], &[5, 1]), (&[1], &[9, 3])];
    for (_, gpu) in f16_devices() {
        let path = gpu.f16_path();
        for op in BinaryOp::ALL {
            for (i, (a_shape, b_shape)) in cases.into_iter().enumerate() {
                let (a_len, b_len) = (a_shape.iter().product(), b_shape.iter().product());
                let a = halves_input(&mut rng, a_len);
                let mut b = halves_input(&mut rng, b_len);
                if op == BinaryOp::Div {
                    b.iter_mut().filter(|v| **v == 0.0).for_each(|v| *v = 0.5);
                }
                let shape = super::broadcast_shapes("test", a_shape, b_shape)?;
                let len = shape.len();
                let (off_a, off_b, off_out) = (1 + i, 3, 2 * i);
                let (a_gpu, b_gpu) = (
                    upload_halves(&gpu, &a, off_a)?,
                    upload_halves(&gpu, &b, off_b)?,
                );
                let out_gpu = sentinel_halves(&gpu, off_out, len, "out")?;
                let halves = |buf, off, n| Halves::of(buf, off as u64, n as u64);
                let dims = BinaryDims {
                    op,
                    a_shape,
                    b_shape,
                };
                super::broadcast_f16(
                    &gpu,
                    &dims,
                    halves(&out_gpu, off_out, len)?,
                    halves(&a_gpu, off_a, a_len)?,
                    halves(&b_gpu, off_b, b_len)?,
                )?;
                let (got, kept) = read_halves(&gpu, &out_gpu, off_out, len)?;
                let name = format!("{path:?} {op:?} {a_shape:?} {b_shape:?}");
                assert!(kept, "{name}: a half outside the output changed");
                // The exact result rounded once to f16 (through f32: the same for these ops).
                let want: Vec<f32> = (0..len)
                    .map(|j| {
                        let (ia, ib) = shape.operand_offsets(j);
                        let exact = op.apply_f64(f64::from(a[ia]), f64::from(b[ib]));
                        round_to_f16(&[exact as f32])[0]
                    })
                    .collect();
                // Bit for bit but for division, which WGSL lets native f16 do to 2.5 ULP.
                let rtol = if op == BinaryOp::Div {
                    2.5 / 1024.0
                } else {
                    0.0
                };
                assert_close(&name, &got, &want, 0.0, rtol);
                if matches!(op, BinaryOp::Add) && i == 0 {
                    assert_eq!(got[0], f32::INFINITY, "{name}: 60000 + 60000 overflows");
                }
            }
        }
    }
    Ok(())
}

/// `binary::scalar_f16`: `x op s` and `s op x` with `s` in f32, against the f32 result of the f16
/// value rounded once to f16, on both paths.
#[test]
fn f16_scalar_ops_match_reference_on_both_paths() -> Result<()> {
    let mut rng = Rng::new(0x5C);
    let s = 0.3f32; // not an f16 value: the kernel must keep it in f32
    for (_, gpu) in f16_devices() {
        let path = gpu.f16_path();
        for op in BinaryOp::ALL {
            for rhs in [true, false] {
                let len = 41;
                let mut x = halves_input(&mut rng, len);
                if op == BinaryOp::Div && !rhs {
                    x.iter_mut().filter(|v| **v == 0.0).for_each(|v| *v = 0.5);
                }
                let x_gpu = upload_halves(&gpu, &x, 5)?;
                let y_gpu = sentinel_halves(&gpu, 0, len, "y")?;
                let xh = Halves::of(&x_gpu, 5, len as u64)?;
                let y = Halves::of(&y_gpu, 0, len as u64)?;
                super::scalar_f16(&gpu, op, y, xh, s, rhs)?;
                let (got, kept) = read_halves(&gpu, &y_gpu, 0, len)?;
                let name = format!("{path:?} {op:?} rhs {rhs}");
                assert!(kept, "{name}: a half outside the output changed");
                let want: Vec<f32> = x
                    .iter()
                    .map(|&v| {
                        let (l, r) = if rhs { (v, s) } else { (s, v) };
                        let f32_result = op.apply_f64(f64::from(l), f64::from(r)) as f32;
                        round_to_f16(&[f32_result])[0]
                    })
                    .collect();
                let rtol = if op == BinaryOp::Div {
                    1.0 / 1024.0
                } else {
                    0.0
                };
                assert_close(&name, &got, &want, 0.0, rtol);
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------- reference

#[test]
fn binary_broadcast_hand_worked() {
    // [2,3] + [3]: b is repeated over rows; strides b = [0, 1]
    let shape = Broadcast::new(&[2, 3], &[3]).expect("compatible");
    assert_eq!(shape.out_shape, [2, 3]);
    assert_eq!(shape.a_strides, [3, 1]);
    assert_eq!(shape.b_strides, [0, 1]);
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let out = reference::broadcast(BinaryOp::Add, &a, &[10.0, 20.0, 30.0], &shape);
    assert_eq!(out, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    // [2,1] * [1,3] -> [2,3] outer product
    let shape = Broadcast::new(&[2, 1], &[1, 3]).expect("compatible");
    assert_eq!(shape.out_shape, [2, 3]);
    let out = reference::broadcast(BinaryOp::Mul, &[2.0, 3.0], &[1.0, 10.0, 100.0], &shape);
    assert_eq!(out, [2.0, 20.0, 200.0, 3.0, 30.0, 300.0]);
    assert!(Broadcast::new(&[2, 3], &[2]).is_none());
    // scalar forms: 1 - 5 = -4 and 5 - 1 = 4; max/min propagate NaN
    assert_eq!(reference::scalar_rhs(BinaryOp::Sub, &[1.0], 5.0), [-4.0]);
    assert_eq!(reference::scalar_lhs(BinaryOp::Sub, 5.0, &[1.0]), [4.0]);
    assert!(BinaryOp::Max.apply(f32::NAN, 1.0).is_nan());
    assert!(BinaryOp::Min.apply(1.0, f32::NAN).is_nan());
    // max tie: half of dy to each side (PyTorch maximum)
    assert_eq!(BinaryOp::Max.apply_backward(2.0, 2.0, 1.0), (0.5, 0.5));
}

#[test]
fn binary_backward_with_sum_to_shape_matches_finite_differences() {
    let mut rng = Rng::new(0x5eed_0001);
    let (a_shape, b_shape) = ([2usize, 1, 3], [4usize, 1]);
    let shape = Broadcast::new(&a_shape, &b_shape).expect("compatible");
    let a = rng.vec_f32(6, 0.5, 2.0);
    let b = rng.vec_f32(4, 0.5, 2.0);
    let w = rng.vec_f32(shape.len(), -1.0, 1.0);
    for op in BinaryOp::ALL {
        let (da_full, db_full) = reference::backward(op, &a, &b, &w, &shape);
        let da = crate::kernels::reduce::reference::sum_to_shape(&da_full, &shape.out_shape, &a_shape).expect("reducible");
        let db = crate::kernels::reduce::reference::sum_to_shape(&db_full, &shape.out_shape, &b_shape).expect("reducible");
        let num_a = numeric_gradient(&a, 1e-3, |a| dot(&w, &reference::broadcast(op, a, &b, &shape)));
        let num_b = numeric_gradient(&b, 1e-3, |b| dot(&w, &reference::broadcast(op, &a, b, &shape)));
        assert_close(&format!("{op:?} da"), &da, &num_a, 2e-3, 2e-3);
        assert_close(&format!("{op:?} db"), &db, &num_b, 2e-3, 2e-3);
    }
}
