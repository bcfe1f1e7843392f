//! `convert` launchers against `reference::convert`.
// Helpers outside #[test] fns unwrap too: a failed unwrap is a failed test.

use plimsoll_kernels_wgsl::kernels::convert;
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

fn round_trip(gpu: &Gpu, rng: &mut Rng, len: usize) {
    let name = format!("convert len {len}");
    let x = input(rng, len);
    let words = convert::f16_words(len as u64) as usize;
    let mut x_buf = rng.vec_f32(len + 4, -1.0, 1.0);
    x_buf[3..3 + len].copy_from_slice(&x);
    let x_gpu = gpu.upload(&x_buf, Category::Activation, "x").unwrap();
    let words_gpu = gpu
        .upload(
            &vec![0xDEAD_BEEFu32; words + 3],
            Category::Activation,
            "halves",
        )
        .unwrap();
    let words_s = words_gpu.slice(2, words as u64).unwrap();
    convert::f32_to_f16(gpu, words_s, x_gpu.slice(3, len as u64).unwrap()).unwrap();
    let got: Vec<u32> = gpu.read_all(&words_gpu, DEADLINE).unwrap();
    let mut want = vec![0xDEAD_BEEFu32; words + 3];
    let packed = cpu::pack_f16(&x);
    want[2..2 + words].copy_from_slice(&packed);
    assert_words(&format!("{name} f32_to_f16"), &got, &want);

    // Back to f32 at another offset: exact (every value is a normal half, inf or NaN).
    let out0 = rng.vec_f32(len + 6, -9.0, 9.0);
    let out_gpu = gpu.upload(&out0, Category::Activation, "out").unwrap();
    convert::f16_to_f32(gpu, out_gpu.slice(5, len as u64).unwrap(), words_s).unwrap();
    let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
    let mut want = out0.clone();
    want[5..5 + len].copy_from_slice(&cpu::round_to_f16(&x));
    assert_close(&format!("{name} f16_to_f32"), &got, &want, 0.0, 0.0);
}

#[test]
fn convert_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(91);
    for len in [1usize, 2, 7, 255, 257, 1000, 70_001] {
        round_trip(&gpu, &mut rng, len);
    }
}

#[test]
fn convert_rejects_a_range_outside_the_buffer() {
    let gpu = gpu();
    let x = gpu.alloc_elements(9, Category::Temporary, "x").unwrap();
    let words = scratch(&gpu, 5, "halves");
    convert::f32_to_f16(&gpu, words.whole(), x.whole()).unwrap(); // 9 halves fit in 5 words
    // 5 words from offset 1 of 5: no such slice; the 4 that fit are too few for 9 halves.
    let err = words.slice(1, 5).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    let err = convert::f32_to_f16(&gpu, words.slice(1, 4).unwrap(), x.whole()).unwrap_err();
    assert!(err.to_string().contains("words: 4 elements given"), "{err}");
    // 9 outputs from offset 1 of 9: no such slice; 8 outputs need 4 words, not 5.
    let err = x.slice(1, 9).unwrap_err();
    assert!(err.to_string().contains("outside buffer"), "{err}");
    let err = convert::f16_to_f32(&gpu, x.slice(1, 8).unwrap(), words.whole()).unwrap_err();
    assert!(err.to_string().contains("words: 5 elements given"), "{err}");
}
