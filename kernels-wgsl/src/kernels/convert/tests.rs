//! The `convert` launchers against [`reference`](super::reference) on both 16-bit paths at odd
//! half offsets, the device's choice of path, the argument checks, and the reference itself
//! (hand-worked bits, every half round-tripped).

use super::reference as cpu;
use super::{F16Path, Halves};
use crate::testing::{DEADLINE, Rng, assert_exact, gpu, gpu_and_temporaries};
use crate::{Category, Error, Gpu, Result};

/// Random normal-range halves (|x| in [1e-3, 1000]: devices may flush f16 subnormals, the
/// reference keeps them), with the special values planted at the front.
fn input(rng: &mut Rng, len: usize) -> Vec<f32> {
    let special = [
        1.0,
        -2.5,
        0.1,
        65504.0,  // largest half
        65519.0,  // rounds down to 65504
        65520.0,  // the first value that rounds to +inf
        -65520.0, // -inf
        70000.0,  // overflows to +inf
        -70000.0, // -inf
        f32::NAN, // 0x7e00
        0.0,
        -0.0,
        std::f32::consts::PI,
        f32::INFINITY,
    ];
    let mut x: Vec<f32> = (0..len)
        .map(|_| {
            let v = rng.f32_in(-1000.0, 1000.0);
            if v.abs() < 1e-3 { 1e-3 } else { v }
        })
        .collect();
    let k = special.len().min(len);
    x[..k].copy_from_slice(&special[..k]);
    x
}

/// Compares words exactly, printing the first differing index.
fn assert_words(name: &str, got: &[u32], want: &[u32]) {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!(
            "{name}: word {i} is {:#010x}, want {:#010x}",
            got[i], want[i]
        );
    }
}

/// `words` with halves `offset..offset + x.len()` set to `half(x)` (the reference, at a half
/// offset: the other half of a shared word is kept).
fn put_halves(words: &mut [u32], offset: usize, x: &[f32]) {
    for (i, &v) in x.iter().enumerate() {
        let h = offset + i;
        let bits = u32::from(cpu::f32_to_f16_bits(v)) << (16 * (h % 2));
        let keep = 0xffffu32 << (16 * (1 - h % 2));
        words[h / 2] = (words[h / 2] & keep) | bits;
    }
}

/// `len` values to halves at half `offset` of a buffer of sentinel words and back to f32 at
/// another offset, on `path`: every word must be the reference's, the sentinels around the run
/// (the other half of a shared first or last word included) untouched.
fn round_trip(gpu: &Gpu, path: F16Path, rng: &mut Rng, len: usize, offset: usize) -> Result<()> {
    let name = format!("convert {path:?} len {len} at half {offset}");
    let x = input(rng, len);
    let total_words = (offset + len).div_ceil(2) + 3;
    let mut x_buf = rng.vec_f32(len + 4, -1.0, 1.0);
    x_buf[3..3 + len].copy_from_slice(&x);
    let x_gpu = gpu.upload(&x_buf, Category::Activation, "x")?;
    let init = vec![0xDEAD_BEEFu32; total_words];
    let words_gpu = gpu.upload(&init, Category::Activation, "halves")?;
    let halves = Halves::of(&words_gpu, offset as u64, len as u64)?;
    super::f32_to_f16_on(gpu, path, halves, x_gpu.slice(3, len as u64)?)?;
    let got: Vec<u32> = gpu.read_all(&words_gpu, DEADLINE)?;
    let mut want = init.clone();
    put_halves(&mut want, offset, &x);
    assert_words(&format!("{name} f32_to_f16"), &got, &want);

    // Back to f32 at another offset: exact (every value is a normal half, inf or NaN).
    let out0 = rng.vec_f32(len + 6, -9.0, 9.0);
    let out_gpu = gpu.upload(&out0, Category::Activation, "out")?;
    super::f16_to_f32_on(gpu, path, out_gpu.slice(5, len as u64)?, halves)?;
    let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE)?;
    let mut want = out0.clone();
    want[5..5 + len].copy_from_slice(&cpu::round_to_f16(&x));
    assert_exact(&format!("{name} f16_to_f32"), &got, &want);
    Ok(())
}

fn paths(gpu: &Gpu) -> Vec<F16Path> {
    let mut paths = vec![F16Path::Packed];
    if gpu.features().contains(wgpu::Features::SHADER_F16) {
        paths.push(F16Path::Native);
    }
    paths
}

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let gpu = gpu();
    // lavapipe has SHADER_F16: both paths run there.
    let on_lavapipe = gpu.adapter().name.contains("llvmpipe");
    assert!(
        !on_lavapipe || paths(&gpu).len() == 2,
        "lavapipe lost SHADER_F16"
    );
    let mut rng = Rng::new(91);
    for path in paths(&gpu) {
        for len in [1usize, 2, 3, 7, 255, 257, 1000, 70_001] {
            for offset in [0usize, 1, 6, 9] {
                round_trip(&gpu, path, &mut rng, len, offset)?;
            }
        }
    }
    Ok(())
}

#[test]
fn the_device_path_follows_the_feature_and_the_choice() -> Result<()> {
    let gpu = gpu();
    let native = gpu.features().contains(wgpu::Features::SHADER_F16);
    assert_eq!(gpu.f16_path() == F16Path::Native, native);
    gpu.set_f16_path(F16Path::Packed)?;
    assert_eq!(gpu.f16_path(), F16Path::Packed);
    assert_eq!(gpu.planning_twin(1 << 20).f16_path(), F16Path::Packed);
    match gpu.set_f16_path(F16Path::Native) {
        Ok(()) => assert!(native),
        Err(e) => assert!(!native && e.to_string().contains("SHADER_F16"), "{e}"),
    }
    assert_eq!(gpu.f16_path() == F16Path::Native, native);
    Ok(())
}

#[test]
fn convert_rejects_a_range_outside_the_buffer() -> Result<()> {
    let (gpu, [x, words]) = gpu_and_temporaries([(9, "x"), (5, "halves")])?;
    // 9 halves fit in 5 words from half 0 or 1, not from half 2.
    super::f32_to_f16(&gpu, Halves::of(&words, 0, 9)?, x.whole())?;
    super::f32_to_f16(&gpu, Halves::of(&words, 1, 9)?, x.whole())?;
    let err = Halves::of(&words, 2, 9).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // The words must be exactly those the run touches, and the lengths must agree.
    let err = Halves::new(words.slice(0, 4)?, 0, 9).expect_err("must be refused");
    assert!(err.to_string().contains("words: 4 elements given"), "{err}");
    let err = Halves::new(words.whole(), 2, 1).expect_err("must be refused");
    assert!(err.to_string().contains("first half 2"), "{err}");
    let halves = Halves::of(&words, 0, 8)?;
    let err = super::f16_to_f32(&gpu, x.whole(), halves).expect_err("must be refused");
    assert!(
        err.to_string().contains("8 halves and 9 f32 elements"),
        "{err}"
    );
    Ok(())
}

// ------------------------------------------------------------------------------- reference

#[test]
fn f16_round_trips_and_hand_worked_bits() {
    // exactly representable values survive: 1, -2.5, 65504 (max half), 0.5, -0, 2^-14 (min
    // normal), 2^-24 (min subnormal), 3.140625
    let exact = [
        1.0,
        -2.5,
        65504.0,
        0.5,
        -0.0,
        2f32.powi(-14),
        2f32.powi(-24),
        3.140_625,
    ];
    let back = cpu::round_to_f16(&exact);
    for (a, b) in exact.iter().zip(&back) {
        assert_eq!(a.to_bits(), b.to_bits(), "{a} round-tripped to {b}");
    }
    // 0.1 = 0x2E66.66.. in half units -> 0x2e66 = 0.099975586 (docs/wgpu.md §6)
    assert_eq!(cpu::f32_to_f16_bits(0.1), 0x2e66);
    assert_eq!(cpu::round_to_f16(&[0.1]), [0.099_975_586]);
    // layout: [1.0, -2.5] -> 0xc1003c00 (element 0 in the low half); odd length: high half 0
    assert_eq!(
        cpu::pack_f16(&[1.0, -2.5, 1.0]),
        [0xc100_3c00, 0x0000_3c00]
    );
    // ties to even: 1 + 2^-11 is halfway between 0x3c00 and 0x3c01 -> 0x3c00 (even);
    // 1 + 3*2^-11 is halfway between 0x3c01 and 0x3c02 -> 0x3c02 (even)
    assert_eq!(cpu::f32_to_f16_bits(1.0 + 2f32.powi(-11)), 0x3c00);
    assert_eq!(cpu::f32_to_f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
    // overflow: 65519 -> 65504, 65520 -> inf, 70000 -> inf; NaN stays NaN; 1e-8 -> 0
    assert_eq!(cpu::f32_to_f16_bits(65519.0), 0x7bff);
    assert_eq!(cpu::f32_to_f16_bits(65520.0), 0x7c00);
    assert_eq!(cpu::f32_to_f16_bits(-70000.0), 0xfc00);
    assert!(cpu::f16_bits_to_f32(cpu::f32_to_f16_bits(f32::NAN)).is_nan());
    assert_eq!(cpu::f32_to_f16_bits(1e-8), 0x0000);
}

#[test]
fn every_half_round_trips_through_f32() {
    for h in 0..=u16::MAX {
        let v = cpu::f16_bits_to_f32(h);
        if v.is_nan() {
            assert!(
                h & 0x7c00 == 0x7c00 && h & 0x3ff != 0,
                "{h:#06x} decoded to NaN"
            );
            continue;
        }
        assert_eq!(
            cpu::f32_to_f16_bits(v),
            h,
            "{h:#06x} -> {v} did not round-trip"
        );
    }
}
