//! `matmul` with 16-bit operands ([`Operand::F16`]) against the f64 reference on the same
//! (f16-rounded) inputs, on both 16-bit paths, both entry points, every transpose, odd half
//! offsets, accumulate, alpha and the epilogue: products and sums in f32, a 16-bit C rounded once.

use super::reference;
use super::{Epilogue, MatmulDims, MatmulEntry, Operand};
use crate::kernels::convert::Halves;
use crate::kernels::convert::reference as cpu;
use crate::testing::{DEADLINE, Rng, SENTINEL, assert_close, assert_exact, f16_devices, to_f64};
use crate::{Category, DeviceBuffer, Gpu, Result};

/// One operand on the host: its values (f16-rounded when 16-bit) and the words uploaded, with
/// `offset` elements (halves when 16-bit) of [`SENTINEL`]s before it and some after (also what C
/// holds before a non-accumulating launch).
pub(super) struct Host {
    values: Vec<f32>,
    words: Vec<u32>,
    offset: usize,
    half: bool,
}

impl Host {
    pub(super) fn new(values: &[f32], offset: usize, half: bool) -> Host {
        let len = values.len();
        let (values, words) = if half {
            let values = cpu::round_to_f16(values);
            let mut words = vec![SENTINEL; (offset + len).div_ceil(2) + 2];
            for (i, &v) in values.iter().enumerate() {
                let h = offset + i;
                let bits = u32::from(cpu::f32_to_f16_bits(v)) << (16 * (h % 2));
                words[h / 2] = (words[h / 2] & !(0xffff << (16 * (h % 2)))) | bits;
            }
            (values, words)
        } else {
            let mut words = vec![SENTINEL; offset + len + 2];
            for (w, v) in words[offset..].iter_mut().zip(values) {
                *w = v.to_bits();
            }
            (values.to_vec(), words)
        };
        Host {
            values,
            words,
            offset,
            half,
        }
    }

    pub(super) fn upload(&self, gpu: &Gpu, label: &str) -> Result<DeviceBuffer> {
        gpu.upload(&self.words, Category::Temporary, label)
    }

    pub(super) fn operand<'a>(&self, buffer: &'a DeviceBuffer) -> Result<Operand<'a>> {
        let len = self.values.len() as u64;
        Ok(if self.half {
            Operand::F16(Halves::of(buffer, self.offset as u64, len)?)
        } else {
            Operand::F32(buffer.slice(self.offset as u64, len)?)
        })
    }

    /// The values a device buffer of this layout holds in this operand's place, and whether
    /// every word or half outside it still holds its sentinel.
    pub(super) fn read(&self, words: &[u32]) -> (Vec<f32>, bool) {
        let len = self.values.len();
        if !self.half {
            let inside = &words[self.offset..self.offset + len];
            let outside = words[..self.offset]
                .iter()
                .chain(&words[self.offset + len..]);
            let kept = outside.into_iter().all(|&w| w == SENTINEL);
            return (inside.iter().map(|w| f32::from_bits(*w)).collect(), kept);
        }
        let half = |h: usize| (words[h / 2] >> (16 * (h % 2))) as u16;
        let sentinel = |h: usize| (SENTINEL >> (16 * (h % 2))) as u16;
        let values = (self.offset..self.offset + len)
            .map(|h| cpu::f16_bits_to_f32(half(h)))
            .collect();
        let kept = (0..2 * words.len())
            .filter(|h| !(self.offset..self.offset + len).contains(h))
            .all(|h| half(h) == sentinel(h));
        (values, kept)
    }
}

/// One launch on `entry` of `dims` with the widths `[a, b, c]` (true: 16-bit) at element offsets
/// `offsets`, and `epilogue` (a bias per column, or none), checked against the reference. With
/// `f16_exact`, f32 operands too hold values an f16 represents (for the cooperative path, which
/// rounds them to f16: then exactly as the reference).
pub(super) fn check(
    gpu: &Gpu,
    rng: &mut Rng,
    (entry, dims): (MatmulEntry, &MatmulDims),
    widths: [bool; 3],
    offsets: [usize; 3],
    epilogue: Epilogue,
    f16_exact: bool,
) -> Result<()> {
    let (a_len, b_len) = lens(dims);
    let c_len = dims.c_len();
    // The cooperative path rounds an f32 A or B to f16 (as autocast): the reference then
    // takes f16-exact values for them, as for the 16-bit operands.
    let coop = super::coop::coop_kernel(gpu, entry, [widths[2], widths[0], widths[1]]).is_some();
    let f16_exact = f16_exact || coop;
    let mut draw = |len: usize| match f16_exact {
        true => cpu::round_to_f16(&rng.vec_f32(len, -2.0, 2.0)),
        false => rng.vec_f32(len, -2.0, 2.0),
    };
    let a = Host::new(&draw(a_len), offsets[0], widths[0]);
    let b = Host::new(&draw(b_len), offsets[1], widths[1]);
    let c_init = match dims.accumulate {
        true => rng.vec_f32(c_len, -2.0, 2.0),
        false => vec![f32::from_bits(SENTINEL); c_len],
    };
    let c = Host::new(&c_init, offsets[2], widths[2]);
    let bias = rng.vec_f32(dims.n, -1.0, 1.0);
    let (a_gpu, b_gpu, c_gpu) = (a.upload(gpu, "a")?, b.upload(gpu, "b")?, c.upload(gpu, "c")?);
    let bias_gpu = gpu.upload(&bias, Category::Temporary, "bias")?;
    let (a_op, b_op, c_op) = (a.operand(&a_gpu)?, b.operand(&b_gpu)?, c.operand(&c_gpu)?);
    match epilogue {
        Epilogue::None => super::matmul_on(gpu, entry, dims, c_op, a_op, b_op)?,
        _ => {
            assert_eq!(super::launch_entry(dims, [c_op, a_op, b_op]), entry);
            let bias_s = bias_gpu.whole();
            super::matmul_bias(gpu, dims, epilogue, c_op, a_op, b_op, bias_s)?;
        }
    }
    let words: Vec<u32> = gpu.read_all(&c_gpu, DEADLINE)?;
    let (got, kept) = c.read(&words);
    let mut want = to_f64(&c.values);
    let (a64, b64) = (to_f64(&a.values), to_f64(&b.values));
    reference::matmul_into_f64(&a64, &b64, &mut want, dims);
    if epilogue != Epilogue::None {
        for (i, w) in want.iter_mut().enumerate() {
            *w += f64::from(bias[i % dims.n]);
            if epilogue == Epilogue::BiasRelu {
                *w = w.max(0.0);
            }
        }
    }
    let path = (gpu.f16_path(), gpu.matmul_path());
    let name = format!("{path:?} {entry:?} {dims:?} widths {widths:?} offsets {offsets:?}");
    assert!(kept, "{name}: a word or half outside C changed");
    // f32 sums of K products of values in [-2, 2) (4 · eps · K per unit, as the f32 test, times
    // 4 for the range), then one rounding to f16 (2^-11 relative) when C is 16-bit.
    let atol = 16.0 * 4.0 * f64::from(f32::EPSILON) * dims.k.max(1) as f64;
    let rtol = if widths[2] { 2f64.powi(-11) } else { 1e-6 };
    assert_close(&name, &got, &want, atol, rtol);
    Ok(())
}

pub(super) fn lens(d: &MatmulDims) -> (usize, usize) {
    let span = |stride: usize, rows: usize, cols: usize| (d.batch - 1) * stride + rows * cols;
    (
        span(d.batch_stride_a, d.m, d.k),
        span(d.batch_stride_b, d.k, d.n),
    )
}

const WIDTHS: [[bool; 3]; 7] = [
    [true, false, false],
    [false, true, false],
    [false, false, true],
    [true, true, false],
    [true, false, true],
    [false, true, true],
    [true, true, true],
];

#[test]
fn f16_matmul_matches_reference_on_both_paths() -> Result<()> {
    let mut rng = Rng::new(0x1616);
    for (_, gpu) in f16_devices() {
        // main_scalar: odd sizes, odd half offsets, every width combination and transpose.
        for (i, widths) in WIDTHS.iter().enumerate() {
            for (t, (trans_a, trans_b)) in
                [(false, false), (false, true), (true, false), (true, true)]
                    .into_iter()
                    .enumerate()
            {
                let (m, n, k) = (5, 7, 9);
                let dims = MatmulDims {
                    trans_a,
                    trans_b,
                    accumulate: (i + t) % 3 == 0,
                    alpha: if t == 2 { 0.5 } else { 1.0 },
                    ..MatmulDims::dense(2, m, n, k)
                };
                let offsets = [1 + t, 3, 2 * i + 1];
                let entry = MatmulEntry::MainScalar;
                check(
                    &gpu,
                    &mut rng,
                    (entry, &dims),
                    *widths,
                    offsets,
                    Epilogue::None,
                    false,
                )?;
            }
        }
        // main: each layout with another combination (one pipeline each), offsets multiples of 4.
        let main_cases = [
            ((false, false), [true, true, true], false),
            ((false, true), [false, true, true], true),
            ((true, false), [true, false, false], false),
            ((true, true), [true, true, false], true),
        ];
        for ((trans_a, trans_b), widths, accumulate) in main_cases {
            let dims = MatmulDims {
                trans_a,
                trans_b,
                accumulate,
                ..MatmulDims::dense(2, 20, 24, 36)
            };
            let offsets = [4, 8, 12];
            check(
                &gpu,
                &mut rng,
                (MatmulEntry::Main, &dims),
                widths,
                offsets,
                Epilogue::None,
                false,
            )?;
        }
        // The epilogue into a 16-bit C, on both entry points (the launcher picks by size).
        let big = MatmulDims {
            trans_b: true,
            ..MatmulDims::dense(1, 64, 128, 512)
        };
        let entry = super::entry_point(&big);
        assert_eq!(entry, MatmulEntry::Main);
        check(
            &gpu,
            &mut rng,
            (entry, &big),
            [true, true, true],
            [0; 3],
            Epilogue::BiasRelu,
            false,
        )?;
        let small = MatmulDims::dense(1, 3, 5, 7);
        let entry = MatmulEntry::MainScalar;
        check(
            &gpu,
            &mut rng,
            (entry, &small),
            [true, false, true],
            [1, 0, 3],
            Epilogue::Bias,
            false,
        )?;
    }
    Ok(())
}

/// A 16-bit C takes ±inf for sums at or beyond 65520, as the conversion does, so the loss
/// scaler's overflow check sees them; f32 inputs beyond f16's range are read as they are.
#[test]
fn f16_output_overflows_to_infinity() -> Result<()> {
    for (_, gpu) in f16_devices() {
        for entry in [MatmulEntry::MainScalar, MatmulEntry::Main] {
            let dims = MatmulDims::dense(1, 4, 4, 4);
            // A in f32 with entries 200 (f16 holds them), B f16 of ±100: |C| = 80000 > 65504.
            let a = gpu
                .upload(&[200.0f32; 16], Category::Temporary, "a")?;
            let b_values: Vec<f32> = (0..16)
                .map(|i| if i % 4 < 2 { 100.0 } else { -100.0 })
                .collect();
            let b_host = Host::new(&b_values, 0, true);
            let b = b_host.upload(&gpu, "b")?;
            let c = gpu.upload(&[0u32; 8], Category::Temporary, "c")?;
            let c_op = Operand::F16(Halves::of(&c, 0, 16)?);
            let b_op = b_host.operand(&b)?;
            // 4x4x4 is below main's size but aligned: forced, main runs it.
            super::matmul_on(&gpu, entry, &dims, c_op, a.whole(), b_op)?;
            let words: Vec<u32> = gpu.read_all(&c, DEADLINE)?;
            let got: Vec<f32> = (0..16)
                .map(|h| cpu::f16_bits_to_f32((words[h / 2] >> (16 * (h % 2))) as u16))
                .collect();
            let want: Vec<f32> = (0..16)
                .map(|i| {
                    if i % 4 < 2 {
                        f32::INFINITY
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            assert_exact(&format!("{:?} {entry:?}", gpu.f16_path()), &got, &want);
        }
    }
    Ok(())
}

/// Under a bound on one submission's GPU time, a product with 16-bit operands goes out in
/// blocks of C over the whole batch, one submission each, and C is the same bit for bit, on
/// both 16-bit paths and both transposes of A.
#[test]
fn a_bounded_f16_product_goes_out_in_blocks_with_the_same_values() -> Result<()> {
    let mut rng = Rng::new(0xb10c);
    for (_, gpu) in f16_devices() {
        for trans_a in [false, true] {
            let (m, n, k) = (300, 260, 24);
            let dims = MatmulDims {
                trans_a,
                batch: 2,
                batch_stride_a: m * k,
                batch_stride_b: k * n,
                batch_stride_c: m * n,
                ..MatmulDims::dense(2, m, n, k)
            };
            let (a_len, b_len) = lens(&dims);
            let a = Host::new(&rng.vec_f32(a_len, -2.0, 2.0), 3, true);
            let b = Host::new(&rng.vec_f32(b_len, -2.0, 2.0), 0, true);
            let c = Host::new(&vec![0.0; dims.c_len()], 1, true);
            let (a_gpu, b_gpu) = (a.upload(&gpu, "a")?, b.upload(&gpu, "b")?);
            let run = |bound: Option<std::time::Duration>| -> Result<(Vec<u32>, u64)> {
                gpu.set_max_submission(bound);
                let c_gpu = c.upload(&gpu, "c")?;
                let ops = (c.operand(&c_gpu)?, a.operand(&a_gpu)?, b.operand(&b_gpu)?);
                let early = gpu.pacing().early_submissions;
                super::matmul(&gpu, &dims, ops.0, ops.1, ops.2)?;
                gpu.flush("bounded f16 matmul")?;
                let early = gpu.pacing().early_submissions - early;
                Ok((gpu.read_all(&c_gpu, DEADLINE)?, early))
            };
            let (whole, _) = run(None)?;
            let (blocks, early) = run(Some(std::time::Duration::from_nanos(1)))?;
            let name = format!("{:?} {dims:?}", gpu.f16_path());
            assert!(whole == blocks, "{name}: the blocks changed C");
            // 3 row blocks x 3 column blocks of 128.
            assert!(early >= 8, "{name}: {early} early submissions");
        }
    }
    Ok(())
}
