//! `convert` launchers against `reference::convert`.
// Helpers outside #[test] fns unwrap too: a failed unwrap is a failed test.

use plimsoll_kernels_wgsl::kernels::convert::{self, F16Path, Halves};
use plimsoll_kernels_wgsl::reference::convert as cpu;
use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, assert_close, gpu, scratch};
use plimsoll_kernels_wgsl::{Category, Error, Gpu};

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
fn round_trip(gpu: &Gpu, path: F16Path, rng: &mut Rng, len: usize, offset: usize) {
    let name = format!("convert {path:?} len {len} at half {offset}");
    let x = input(rng, len);
    let total_words = (offset + len).div_ceil(2) + 3;
    let mut x_buf = rng.vec_f32(len + 4, -1.0, 1.0);
    x_buf[3..3 + len].copy_from_slice(&x);
    let x_gpu = gpu.upload(&x_buf, Category::Activation, "x").unwrap();
    let init = vec![0xDEAD_BEEFu32; total_words];
    let words_gpu = gpu.upload(&init, Category::Activation, "halves").unwrap();
    let halves = Halves::of(&words_gpu, offset as u64, len as u64).unwrap();
    convert::f32_to_f16_on(gpu, path, halves, x_gpu.slice(3, len as u64).unwrap()).unwrap();
    let got: Vec<u32> = gpu.read_all(&words_gpu, DEADLINE).unwrap();
    let mut want = init.clone();
    put_halves(&mut want, offset, &x);
    assert_words(&format!("{name} f32_to_f16"), &got, &want);

    // Back to f32 at another offset: exact (every value is a normal half, inf or NaN).
    let out0 = rng.vec_f32(len + 6, -9.0, 9.0);
    let out_gpu = gpu.upload(&out0, Category::Activation, "out").unwrap();
    convert::f16_to_f32_on(gpu, path, out_gpu.slice(5, len as u64).unwrap(), halves).unwrap();
    let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
    let mut want = out0.clone();
    want[5..5 + len].copy_from_slice(&cpu::round_to_f16(&x));
    assert_close(&format!("{name} f16_to_f32"), &got, &want, 0.0, 0.0);
}

fn paths(gpu: &Gpu) -> Vec<F16Path> {
    let mut paths = vec![F16Path::Packed];
    if gpu.features().contains(wgpu::Features::SHADER_F16) {
        paths.push(F16Path::Native);
    }
    paths
}

#[test]
fn convert_matches_reference_on_both_paths_at_odd_offsets() {
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
                round_trip(&gpu, path, &mut rng, len, offset);
            }
        }
    }
}

#[test]
fn the_device_path_follows_the_feature_and_the_choice() {
    let gpu = gpu();
    let native = gpu.features().contains(wgpu::Features::SHADER_F16);
    assert_eq!(gpu.f16_path() == F16Path::Native, native);
    gpu.set_f16_path(F16Path::Packed).unwrap();
    assert_eq!(gpu.f16_path(), F16Path::Packed);
    assert_eq!(gpu.planning_twin(1 << 20).f16_path(), F16Path::Packed);
    match gpu.set_f16_path(F16Path::Native) {
        Ok(()) => assert!(native),
        Err(e) => assert!(!native && e.to_string().contains("SHADER_F16"), "{e}"),
    }
    assert_eq!(gpu.f16_path() == F16Path::Native, native);
}

#[test]
fn convert_rejects_a_range_outside_the_buffer() {
    let gpu = gpu();
    let x = gpu.alloc_elements(9, Category::Temporary, "x").unwrap();
    let words = scratch(&gpu, 5, "halves");
    // 9 halves fit in 5 words from half 0 or 1, not from half 2.
    convert::f32_to_f16(&gpu, Halves::of(&words, 0, 9).unwrap(), x.whole()).unwrap();
    convert::f32_to_f16(&gpu, Halves::of(&words, 1, 9).unwrap(), x.whole()).unwrap();
    let err = Halves::of(&words, 2, 9).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // The words must be exactly those the run touches, and the lengths must agree.
    let err = Halves::new(words.slice(0, 4).unwrap(), 0, 9).unwrap_err();
    assert!(err.to_string().contains("words: 4 elements given"), "{err}");
    let err = Halves::new(words.whole(), 2, 1).unwrap_err();
    assert!(err.to_string().contains("first half 2"), "{err}");
    let halves = Halves::of(&words, 0, 8).unwrap();
    let err = convert::f16_to_f32(&gpu, x.whole(), halves).unwrap_err();
    assert!(
        err.to_string().contains("8 halves and 9 f32 elements"),
        "{err}"
    );
}
