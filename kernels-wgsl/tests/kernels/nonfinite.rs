//! `nonfinite` launchers against `reference::nonfinite`.
// Helpers outside #[test] fns unwrap too: a failed unwrap is a failed test.

use plimsoll_kernels_wgsl::kernels::nonfinite::{self, NO_INDEX};
use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, gpu};
use plimsoll_kernels_wgsl::{Category, Error, reference};

#[test]
fn nonfinite_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(81);
    for len in [1usize, 7, 257, 1000, 70_001] {
        let clean = rng.vec_f32(len, -1e30, 1e30);
        // (what, value, where): each planted alone in an otherwise finite range; the second
        // copy later on must not move the first index.
        let planted = [
            ("none", None, 0),
            ("NaN", Some(f32::NAN), len / 2),
            ("+inf", Some(f32::INFINITY), len - 1),
            ("-inf", Some(f32::NEG_INFINITY), len / 3),
        ];
        for (what, value, at) in planted {
            let mut x = clean.clone();
            if let Some(v) = value {
                x[at] = v;
                if at + 7 < len {
                    x[at + 7] = f32::NAN;
                }
            }
            // Non-finite values just outside the checked range: the offsets must exclude them.
            let mut buf = vec![f32::NAN; len + 6];
            buf[4..4 + len].copy_from_slice(&x);
            buf[len + 5] = f32::INFINITY;
            let x_gpu = gpu.upload(&buf, Category::Gradient, "x").unwrap();
            let flags_gpu = gpu
                .upload(&[5u32, 5, 5, 5], Category::Temporary, "flags")
                .unwrap();
            let flags_s = flags_gpu.slice(1, 2).unwrap();
            let x_s = x_gpu.slice(4, len as u64).unwrap();
            nonfinite::check(&gpu, flags_s, x_s).unwrap();
            let got: Vec<u32> = gpu.read_all(&flags_gpu, DEADLINE).unwrap();
            let [any, first] = reference::nonfinite::flags(&x);
            assert_eq!(got, [5, any, first, 5], "nonfinite {what} len {len}");
            let found = nonfinite::read_flags(&gpu, flags_s, DEADLINE).unwrap();
            let want = reference::nonfinite::first_nonfinite(&x).map(|i| i as u64);
            assert_eq!(found, want, "nonfinite {what} len {len} read_flags");
            let found = nonfinite::first_nonfinite(&gpu, x_s, DEADLINE).unwrap();
            assert_eq!(found, want, "nonfinite {what} len {len} first_nonfinite");
        }
    }
}

#[test]
fn nonfinite_accumulates_over_several_ranges() {
    let gpu = gpu();
    let mut rng = Rng::new(83);
    let mut x = rng.vec_f32(3000, -5.0, 5.0);
    let x_gpu = gpu.upload(&x, Category::Gradient, "grads").unwrap();
    let flags_buf = gpu.alloc_elements(2, Category::Temporary, "flags").unwrap();
    let flags = flags_buf.whole();
    // Three clean "tensors" in one buffer: nothing found.
    nonfinite::reset_flags(&gpu, flags).unwrap();
    for (offset, len) in [(0, 1000), (1000, 1000), (2000, 1000)] {
        nonfinite::accumulate(&gpu, flags, x_gpu.slice(offset, len).unwrap()).unwrap();
    }
    assert_eq!(nonfinite::read_flags(&gpu, flags, DEADLINE).unwrap(), None);
    let words: Vec<u32> = gpu.read_all(&flags_buf, DEADLINE).unwrap();
    assert_eq!(words, [0, NO_INDEX]);
    // An infinity at element 1500 = index 500 of the second tensor.
    x[1500] = f32::INFINITY;
    gpu.write(&x_gpu, 1500, &x[1500..1501]).unwrap();
    nonfinite::reset_flags(&gpu, flags).unwrap();
    for (offset, len) in [(0, 1000), (1000, 1000), (2000, 1000)] {
        nonfinite::accumulate(&gpu, flags, x_gpu.slice(offset, len).unwrap()).unwrap();
    }
    assert_eq!(
        nonfinite::read_flags(&gpu, flags, DEADLINE).unwrap(),
        Some(500)
    );
}

#[test]
fn nonfinite_rejects_a_range_outside_the_buffer() {
    let gpu = gpu();
    let x = gpu.alloc_elements(10, Category::Temporary, "x").unwrap();
    let flags = gpu.alloc_elements(2, Category::Temporary, "flags").unwrap();
    // Flags from offset 1 of 2 words: no two-word slice; a one-word slice is refused.
    let err = flags.slice(1, 2).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    let one = flags.slice(1, 1).unwrap();
    let err = nonfinite::check(&gpu, one, x.whole()).unwrap_err();
    assert!(err.to_string().contains("flags: 1 elements given"), "{err}");
    let refusals = [
        nonfinite::reset_flags(&gpu, one).unwrap_err(),
        nonfinite::accumulate(&gpu, one, x.whole()).unwrap_err(),
        nonfinite::read_flags(&gpu, one, DEADLINE).unwrap_err(),
    ];
    for err in refusals {
        assert!(
            matches!(err, Error::InvalidArgument { .. })
                && err.to_string().contains("flags: 1 elements given"),
            "{err}"
        );
    }
    // x = elements 3..11 of 10.
    let err = x.slice(3, 8).unwrap_err();
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // Empty range: the flags say "clean".
    nonfinite::check(&gpu, flags.whole(), x.slice(10, 0).unwrap()).unwrap();
    assert_eq!(
        nonfinite::read_flags(&gpu, flags.whole(), DEADLINE).unwrap(),
        None
    );
}
