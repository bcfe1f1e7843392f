//! `binary::broadcast_f16` and `unary::forward_f16` against the references on f16 values, on
//! both 16-bit paths: odd lengths, operands at odd half offsets, broadcasting, the halves around
//! the output kept, and overflow to infinity.

use plimsoll_kernels_wgsl::kernels::binary::{self, BinaryDims, BinaryOp};
use plimsoll_kernels_wgsl::kernels::convert::{F16Path, Halves};
use plimsoll_kernels_wgsl::kernels::unary::{self, UnaryOp};
use plimsoll_kernels_wgsl::reference::convert as cpu;
use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, assert_close, f16_devices};
use plimsoll_kernels_wgsl::{Category, DeviceBuffer, Error, Gpu, reference};

const SENTINEL: u32 = 0xDEAD_BEEF;

/// `values` as halves at half `offset` of a buffer of sentinel words (two spare words after).
fn upload_halves(gpu: &Gpu, values: &[f32], offset: usize) -> DeviceBuffer {
    let mut words = vec![SENTINEL; (offset + values.len()).div_ceil(2) + 2];
    for (i, &v) in values.iter().enumerate() {
        let h = offset + i;
        let bits = u32::from(cpu::f32_to_f16_bits(v)) << (16 * (h % 2));
        words[h / 2] = (words[h / 2] & !(0xffff << (16 * (h % 2)))) | bits;
    }
    gpu.upload(&words, Category::Temporary, "halves").unwrap()
}

/// The `len` halves at half `offset` of `buffer` as f32, and whether every other half still
/// holds its sentinel.
fn read_halves(gpu: &Gpu, buffer: &DeviceBuffer, offset: usize, len: usize) -> (Vec<f32>, bool) {
    let words: Vec<u32> = gpu.read_all(buffer, DEADLINE).unwrap();
    let half = |h: usize| (words[h / 2] >> (16 * (h % 2))) as u16;
    let values = (offset..offset + len)
        .map(|h| cpu::f16_bits_to_f32(half(h)))
        .collect();
    let kept = (0..2 * words.len())
        .filter(|h| !(offset..offset + len).contains(h))
        .all(|h| half(h) == (SENTINEL >> (16 * (h % 2))) as u16);
    (values, kept)
}

/// f16 values in [-4, 4], with values whose sums and products overflow f16 planted at the front.
fn halves_input(rng: &mut Rng, len: usize) -> Vec<f32> {
    let mut x = cpu::round_to_f16(&rng.vec_f32(len, -4.0, 4.0));
    let special = [60000.0, -60000.0, 300.0, 0.0, -0.0, 1.0];
    let k = special.len().min(len);
    x[..k].copy_from_slice(&special[..k]);
    x
}

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
                    upload_halves(&gpu, &a, off_a),
                    upload_halves(&gpu, &b, off_b),
                );
                let words = vec![SENTINEL; (off_out + len).div_ceil(2) + 2];
                let out_gpu = gpu.upload(&words, Category::Temporary, "out").unwrap();
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
                let (got, kept) = read_halves(&gpu, &out_gpu, off_out, len);
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

#[test]
fn f16_unary_ops_match_reference_on_both_paths() {
    let mut rng = Rng::new(0x016);
    for (_, gpu) in f16_devices() {
        let path = gpu.f16_path();
        for op in UnaryOp::ALL {
            let len = 257;
            let x = match op {
                UnaryOp::Log | UnaryOp::Sqrt => cpu::round_to_f16(&rng.vec_f32(len, 0.05, 4.0)),
                _ => halves_input(&mut rng, len),
            };
            let exponent = 2.0;
            let (off_x, off_y) = (3, 4);
            let x_gpu = upload_halves(&gpu, &x, off_x);
            let words = vec![SENTINEL; (off_y + len).div_ceil(2) + 2];
            let y_gpu = gpu.upload(&words, Category::Temporary, "y").unwrap();
            let y = Halves::of(&y_gpu, off_y as u64, len as u64).unwrap();
            let xh = Halves::of(&x_gpu, off_x as u64, len as u64).unwrap();
            unary::forward_f16(&gpu, op, y, xh, exponent).unwrap();
            let (got, kept) = read_halves(&gpu, &y_gpu, off_y, len);
            let name = format!("{path:?} {op:?}");
            assert!(kept, "{name}: a half outside the output changed");
            // f in f32 on the device (a few f32 ULP from the f64 reference), then one rounding
            // to f16: at most one f16 ULP (2^-10 relative) from the reference rounded.
            let want: Vec<f32> = x
                .iter()
                .map(|&v| {
                    let exact = reference::unary::apply(op, f64::from(v), f64::from(exponent));
                    cpu::round_to_f16(&[exact as f32])[0]
                })
                .collect();
            let (atol, rtol) = match op {
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => (0.0, 0.0),
                _ => (1e-7, 1.0 / 1024.0),
            };
            assert_close(&name, &got, &want, atol, rtol);
        }
    }
}

/// The packed path writes whole words: an output starting in a word's high half is refused,
/// naming the fix; the native path takes it.
#[test]
fn f16_outputs_at_odd_offsets_are_refused_on_the_packed_path_only() {
    for (_, gpu) in f16_devices() {
        let x_gpu = upload_halves(&gpu, &[1.0, -2.0, 3.0], 0);
        let y_gpu = upload_halves(&gpu, &[0.0; 4], 0);
        let x = Halves::of(&x_gpu, 0, 3).unwrap();
        let y = Halves::of(&y_gpu, 1, 3).unwrap();
        let result = unary::forward_f16(&gpu, UnaryOp::Neg, y, x, 0.0);
        match gpu.f16_path() {
            F16Path::Packed => {
                let err = result.unwrap_err();
                assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
                assert!(err.to_string().contains("even element"), "{err}");
            }
            F16Path::Native => {
                result.unwrap();
                let (got, _) = read_halves(&gpu, &y_gpu, 1, 3);
                assert_eq!(got, [-1.0, 2.0, -3.0]);
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
        let src_gpu = upload_halves(&gpu, &x, off_src);
        let words = vec![SENTINEL; (off_dst + len).div_ceil(2) + 2];
        let dst_gpu = gpu.upload(&words, Category::Temporary, "dst").unwrap();
        let src = Halves::of(&src_gpu, off_src as u64, len as u64).unwrap();
        let dst = Halves::of(&dst_gpu, off_dst as u64, len as u64).unwrap();
        copy::strided_copy_f16(&gpu, dst, src, &shape, &strides).unwrap();
        let (got, kept) = read_halves(&gpu, &dst_gpu, off_dst, len);
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
                let x_gpu = upload_halves(&gpu, &x, 5);
                let words = vec![SENTINEL; len.div_ceil(2) + 2];
                let y_gpu = gpu.upload(&words, Category::Temporary, "y").unwrap();
                let xh = Halves::of(&x_gpu, 5, len as u64).unwrap();
                let y = Halves::of(&y_gpu, 0, len as u64).unwrap();
                binary::scalar_f16(&gpu, op, y, xh, s, rhs).unwrap();
                let (got, kept) = read_halves(&gpu, &y_gpu, 0, len);
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
