//! `binary::broadcast_f16` and `binary::scalar_f16` against the references on f16 values, and
//! `copy::strided_copy_f16`, on both 16-bit paths: odd lengths, operands at odd half offsets,
//! broadcasting, the halves around the output kept, and overflow to infinity (`unary`'s 16-bit
//! tests are in its family, `kernels::unary::tests`).

use plimsoll_kernels_wgsl::kernels::binary::{self, BinaryDims, BinaryOp};
use plimsoll_kernels_wgsl::kernels::convert::Halves;
use plimsoll_kernels_wgsl::reference::convert as cpu;
use plimsoll_kernels_wgsl::testing::{
    Rng, assert_close, f16_devices, halves_input, read_halves, sentinel_halves, upload_halves,
};

#[test]
fn f16_binary_ops_match_reference_on_both_paths() {
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
                let shape = binary::broadcast_shapes("test", a_shape, b_shape).unwrap();
                let len = shape.len();
                let (off_a, off_b, off_out) = (1 + i, 3, 2 * i);
                let (a_gpu, b_gpu) = (
                    upload_halves(&gpu, &a, off_a).unwrap(),
                    upload_halves(&gpu, &b, off_b).unwrap(),
                );
                let out_gpu = sentinel_halves(&gpu, off_out, len, "out").unwrap();
                let halves = |buf, off, n| Halves::of(buf, off as u64, n as u64).unwrap();
                let dims = BinaryDims {
                    op,
                    a_shape,
                    b_shape,
                };
                binary::broadcast_f16(
                    &gpu,
                    &dims,
                    halves(&out_gpu, off_out, len),
                    halves(&a_gpu, off_a, a_len),
                    halves(&b_gpu, off_b, b_len),
                )
                .unwrap();
                let (got, kept) = read_halves(&gpu, &out_gpu, off_out, len).unwrap();
                let name = format!("{path:?} {op:?} {a_shape:?} {b_shape:?}");
                assert!(kept, "{name}: a half outside the output changed");
                // The exact result rounded once to f16 (through f32: the same for these ops).
                let want: Vec<f32> = (0..len)
                    .map(|j| {
                        let (ia, ib) = shape.operand_offsets(j);
                        let exact = op.apply_f64(f64::from(a[ia]), f64::from(b[ib]));
                        cpu::round_to_f16(&[exact as f32])[0]
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
}

/// `copy::strided_copy_f16` moves the bits of a permuted run of halves (a 3-D transpose from an
/// odd source offset), keeping the halves around the destination, on both paths.
#[test]
fn f16_strided_copy_permutes_the_bits() {
    use plimsoll_kernels_wgsl::kernels::copy;
    let (d0, d1, d2) = (3usize, 5usize, 7usize);
    let len = d0 * d1 * d2;
    let mut rng = Rng::new(0xC0);
    let mut x = cpu::round_to_f16(&rng.vec_f32(len, -100.0, 100.0));
    x[0] = f32::NAN;
    x[1] = f32::NEG_INFINITY;
    // out[i][j][k] = x[k][i][j]: shape (d1, d2, d0) over x of (d0, d1, d2).
    let shape = [d1 as u32, d2 as u32, d0 as u32];
    let strides = [d2 as u32, 1, (d1 * d2) as u32];
    for (_, gpu) in f16_devices() {
        let (off_src, off_dst) = (3, 2);
        let src_gpu = upload_halves(&gpu, &x, off_src).unwrap();
        let dst_gpu = sentinel_halves(&gpu, off_dst, len, "dst").unwrap();
        let src = Halves::of(&src_gpu, off_src as u64, len as u64).unwrap();
        let dst = Halves::of(&dst_gpu, off_dst as u64, len as u64).unwrap();
        copy::strided_copy_f16(&gpu, dst, src, &shape, &strides).unwrap();
        let (got, kept) = read_halves(&gpu, &dst_gpu, off_dst, len).unwrap();
        let want: Vec<f32> = (0..len)
            .map(|i| {
                let (a, b, c) = (i / (d2 * d0), (i / d0) % d2, i % d0);
                x[a * d2 + b + c * d1 * d2]
            })
            .collect();
        let name = format!("{:?} strided_copy_f16", gpu.f16_path());
        assert!(kept, "{name}: a half outside the destination changed");
        assert_close(&name, &got, &want, 0.0, 0.0);
        let odd = Halves::of(&dst_gpu, 1, len as u64).unwrap();
        let err = copy::strided_copy_f16(&gpu, odd, src, &shape, &strides).unwrap_err();
        assert!(err.to_string().contains("even element"), "{err}");
    }
}

/// `binary::scalar_f16`: `x op s` and `s op x` with `s` in f32, against the f32 result of the f16
/// value rounded once to f16, on both paths.
#[test]
fn f16_scalar_ops_match_reference_on_both_paths() {
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
                let x_gpu = upload_halves(&gpu, &x, 5).unwrap();
                let y_gpu = sentinel_halves(&gpu, 0, len, "y").unwrap();
                let xh = Halves::of(&x_gpu, 5, len as u64).unwrap();
                let y = Halves::of(&y_gpu, 0, len as u64).unwrap();
                binary::scalar_f16(&gpu, op, y, xh, s, rhs).unwrap();
                let (got, kept) = read_halves(&gpu, &y_gpu, 0, len).unwrap();
                let name = format!("{path:?} {op:?} rhs {rhs}");
                assert!(kept, "{name}: a half outside the output changed");
                let want: Vec<f32> = x
                    .iter()
                    .map(|&v| {
                        let (l, r) = if rhs { (v, s) } else { (s, v) };
                        let f32_result = op.apply_f64(f64::from(l), f64::from(r)) as f32;
                        cpu::round_to_f16(&[f32_result])[0]
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
}
