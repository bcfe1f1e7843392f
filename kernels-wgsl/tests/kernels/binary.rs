//! `binary` launchers against `reference::binary`.
// Helpers outside #[test] fns unwrap too: a failed unwrap is a failed test.

use plimsoll_kernels_wgsl::kernels::binary::{self, BinaryDims, BinaryOp, Broadcast};
use plimsoll_kernels_wgsl::kernels::{fill, reduce};
use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, assert_close, gpu};
use plimsoll_kernels_wgsl::{Category, Error, Gpu, reference};

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
) {
    let name = format!("binary {op:?} {a_shape:?} x {b_shape:?} aligned {aligned}");
    // Offsets of a, b, out, dy, da (db follows da after a gap).
    let [a_at, b_at, out_at, dy_at, da_at] = if aligned {
        [4, 8, 4, 4, 4]
    } else {
        [1, 2, 4, 3, 2]
    };
    let shape = Broadcast::new(a_shape, b_shape).unwrap();
    let (a_len, b_len, n) = (
        a_shape.iter().product::<usize>(),
        b_shape.iter().product::<usize>(),
        shape.len(),
    );
    let (a, b) = operands(rng, op, a_len, b_len);
    let a_host = padded(rng, &a, a_at);
    let b_host = padded(rng, &b, b_at);
    let out0 = rng.vec_f32(n + 7, -9.0, 9.0);
    let a_gpu = gpu.upload(&a_host, Category::Activation, "a").unwrap();
    let b_gpu = gpu.upload(&b_host, Category::Activation, "b").unwrap();
    let out_gpu = gpu.upload(&out0, Category::Activation, "out").unwrap();
    let dims = BinaryDims {
        op,
        a_shape,
        b_shape,
    };
    let a_s = a_gpu.slice(a_at as u64, a_len as u64).unwrap();
    let b_s = b_gpu.slice(b_at as u64, b_len as u64).unwrap();
    let out_s = out_gpu.slice(out_at as u64, n as u64).unwrap();
    binary::broadcast(gpu, &dims, out_s, a_s, b_s).unwrap();
    let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
    let mut want = out0.clone();
    want[out_at..out_at + n].copy_from_slice(&reference::binary::broadcast(op, &a, &b, &shape));
    assert_close(&format!("{name} forward"), &got, &want, ATOL, RTOL);

    // Backward at the output shape, dy at offset 3, da and db sharing one buffer.
    let dy = rng.vec_f32(n, -2.0, 2.0);
    let dy_gpu = gpu
        .upload(&padded(rng, &dy, dy_at), Category::Gradient, "dy")
        .unwrap();
    let db_at = da_at + n.next_multiple_of(4) + 4;
    let grads0 = rng.vec_f32(db_at + n + 5, -9.0, 9.0);
    let grads_gpu = gpu.upload(&grads0, Category::Gradient, "da|db").unwrap();
    let da_s = grads_gpu.slice(da_at as u64, n as u64).unwrap();
    let db_s = grads_gpu.slice(db_at as u64, n as u64).unwrap();
    let dy_s = dy_gpu.slice(dy_at as u64, n as u64).unwrap();
    binary::backward(gpu, &dims, da_s, db_s, a_s, b_s, dy_s).unwrap();
    let got: Vec<f32> = gpu.read_all(&grads_gpu, DEADLINE).unwrap();
    let (da_full, db_full) = reference::binary::backward(op, &a, &b, &dy, &shape);
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
            .alloc_elements(operand_len as u64 + 2, Category::Gradient, label)
            .unwrap();
        fill::fill(gpu, out_gpu.slice(0, 2).unwrap(), -5.0).unwrap();
        reduce::sum_to_shape(
            gpu,
            out_gpu.slice(2, operand_len as u64).unwrap(),
            grads_gpu.slice(full_at as u64, n as u64).unwrap(),
            &shape.out_shape,
            operand_shape,
        )
        .unwrap();
        let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
        let mut want = vec![-5.0, -5.0];
        want.extend(
            reference::reduce::sum_to_shape(full, &shape.out_shape, operand_shape).unwrap(),
        );
        // Sums of n / operand_len terms accumulated in f32 (see reduce::sum_atol).
        let terms = (n / operand_len.max(1)).max(1);
        let largest = full.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let atol = crate::reduce::sum_atol(terms, f64::from(largest));
        assert_close(
            &format!("{name} sum_to_shape {label}"),
            &got,
            &want,
            atol,
            1e-5,
        );
    }
}

#[test]
fn binary_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(51);
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
                check_broadcast(&gpu, &mut rng, op, shapes, aligned);
            }
        }
    }
}

#[test]
fn binary_scalar_forms_match_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(53);
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
                .upload(&padded(&mut rng, &a, a_at), Category::Activation, "a")
                .unwrap();
            let out0 = rng.vec_f32(lhs_at + len + 3, -9.0, 9.0);
            let out_gpu = gpu.upload(&out0, Category::Activation, "out").unwrap();
            let a_s = a_gpu.slice(a_at as u64, len as u64).unwrap();
            let rhs_out = out_gpu.slice(rhs_at as u64, len as u64).unwrap();
            let lhs_out = out_gpu.slice(lhs_at as u64, len as u64).unwrap();
            binary::scalar_rhs(&gpu, op, rhs_out, a_s, s).unwrap();
            binary::scalar_lhs(&gpu, op, lhs_out, s, a_s).unwrap();
            let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
            let mut want = out0.clone();
            want[rhs_at..rhs_at + len].copy_from_slice(&reference::binary::scalar_rhs(op, &a, s));
            want[lhs_at..lhs_at + len].copy_from_slice(&reference::binary::scalar_lhs(op, s, &a));
            assert_close(
                &format!("binary scalar {op:?} len {len}"),
                &got,
                &want,
                ATOL,
                RTOL,
            );
        }
    }
}

#[test]
fn binary_rejects_mismatched_shapes_and_bad_ranges() {
    let gpu = gpu();
    let a = gpu.alloc_elements(12, Category::Temporary, "a").unwrap();
    let out = gpu.alloc_elements(12, Category::Temporary, "out").unwrap();
    let dims = |op, a_shape, b_shape| BinaryDims {
        op,
        a_shape,
        b_shape,
    };
    let (a12, a3, a4, a1) = (
        a.whole(),
        a.slice(0, 3).unwrap(),
        a.slice(0, 4).unwrap(),
        a.slice(0, 1).unwrap(),
    );
    let err = binary::broadcast(
        &gpu,
        &dims(BinaryOp::Add, &[3, 4], &[3]),
        out.whole(),
        a12,
        a3,
    )
    .unwrap_err();
    assert!(err.to_string().contains("do not broadcast"), "{err}");
    let nine = [1usize; 9];
    let out1 = out.slice(0, 1).unwrap();
    let err = binary::broadcast(&gpu, &dims(BinaryOp::Add, &nine, &[1]), out1, a1, a1).unwrap_err();
    assert!(err.to_string().contains("rank 9"), "{err}");
    // 12 outputs from element 1 of a 12-element buffer: refused when the slice is made ...
    let err = out.slice(1, 12).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the launcher refuses an output (or operand) of the wrong length.
    let mul = dims(BinaryOp::Mul, &[3, 4], &[4]);
    let err = binary::broadcast(&gpu, &mul, out.slice(1, 11).unwrap(), a12, a4).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = binary::broadcast(&gpu, &mul, out.whole(), a12, a3).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = binary::broadcast(&gpu, &mul, out.whole(), a.slice(0, 11).unwrap(), a4).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // The backward: gradients of the wrong length.
    let short = out.slice(0, 11).unwrap();
    let err = binary::backward(&gpu, &mul, short, out.whole(), a12, a4, out.whole()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = binary::backward(&gpu, &mul, out.whole(), out.whole(), a12, a4, short).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Scalar form: a at element 5, 12 long, of a 12-element buffer.
    let err = a.slice(5, 12).unwrap_err();
    assert!(err.to_string().contains("outside buffer"), "{err}");
    let err = binary::scalar_rhs(
        &gpu,
        BinaryOp::Sub,
        out.whole(),
        a.slice(5, 7).unwrap(),
        1.0,
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = binary::scalar_lhs(
        &gpu,
        BinaryOp::Sub,
        out.whole(),
        1.0,
        a.slice(5, 7).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}
