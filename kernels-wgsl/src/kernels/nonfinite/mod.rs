//! `nonfinite`: whether a range holds a NaN or an infinity, and the first such index, into two
//! `u32` flag words `[any, first_index]` (a [`crate::DeviceBuffer`] of `u32` elements like any other).
//! In one place: the shader (`nonfinite.wgsl`, beside this file), the launchers, the CPU
//! [`reference`](mod@reference) and the tests.
//!
//! [`check`] resets the flags and checks one range; [`reset_flags`] + several [`accumulate`] calls
//! check many tensors (e.g. every gradient of a step) into one pair of words, which is then read
//! once with [`read_flags`]. [`first_nonfinite`] does all of it for one range and waits.

use std::time::Duration;

use plimsoll_allocator::Category;

use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::fill::fill_u32;
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_ranges};
use crate::pipeline::{Kernel, kernel, shader_params, shader_source};
use const_format::concatcp;
use crate::slice::DeviceSlice;

/// The `first_index` word when no element is non-finite.
pub const NO_INDEX: u32 = u32::MAX;

/// Number of `u32` flag words: `[any, first_index]`.
pub const FLAG_WORDS: u64 = 2;

/// The module: `nonfinite.wgsl` and the helpers it calls.
const WGSL: &str = concatcp!(include_str!("nonfinite.wgsl"), shader_source!("indexing"));

/// The `check` entry point: bindings `x`, `flags`.
pub const KERNEL: Kernel = kernel!("nonfinite", "check", source: WGSL, [x, flags: "array<atomic<u32>>"], ELEMENTWISE_WORKGROUP);

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    KERNEL,
];

shader_params! {
    /// The `Params` of `nonfinite.wgsl`.
    struct Params {
        n: u32,
        x_offset: u32,
        flags_offset: u32,
        /// The first element of the range this dispatch checks, up to `n` (a launch in ranges
        /// under a submission bound: the index found stays relative to `x`).
        start: u32,
    }
}

/// Records `flags = [0, NO_INDEX]` (nothing found yet); `flags` holds [`FLAG_WORDS`] words.
pub fn reset_flags(gpu: &Gpu, flags: DeviceSlice<'_>) -> Result<()> {
    flags.expect_len("nonfinite", "flags", FLAG_WORDS)?;
    fill_u32(gpu, flags.slice(0, 1)?, 0)?;
    fill_u32(gpu, flags.slice(1, 1)?, NO_INDEX)
}

/// Records a check of `x` into flags that are *not* reset: `flags[0]` becomes 1 if any element
/// is NaN or ±inf, and `flags[1]` is lowered to the smallest such index (relative to the start
/// of `x`; meaningful per tensor only when several slices share the flags).
pub fn accumulate(gpu: &Gpu, flags: DeviceSlice<'_>, x: DeviceSlice<'_>) -> Result<()> {
    flags.expect_len("nonfinite", "flags", FLAG_WORDS)?;
    let params = |start, end| Params {
        n: end,
        x_offset: x.index(),
        flags_offset: flags.index(),
        start,
    };
    launch_ranges(gpu, &KERNEL, &[], &[x, flags], x.len(), params)
}

/// Records [`reset_flags`] then [`accumulate`]: afterwards `flags` is
/// `reference::flags(x)`.
pub fn check(gpu: &Gpu, flags: DeviceSlice<'_>, x: DeviceSlice<'_>) -> Result<()> {
    reset_flags(gpu, flags)?;
    accumulate(gpu, flags, x)
}

/// Reads the two flag words (submitting the open batch and waiting within `deadline`): the first
/// non-finite index, or `None` if the checked slices were all finite.
pub fn read_flags(gpu: &Gpu, flags: DeviceSlice<'_>, deadline: Duration) -> Result<Option<u64>> {
    flags.expect_len("nonfinite", "flags", FLAG_WORDS)?;
    let words: Vec<u32> = gpu.read(flags.buffer(), flags.offset(), FLAG_WORDS, deadline)?;
    Ok(match words.as_slice() {
        [any, first] if *any != 0 => Some(u64::from(*first)),
        _ => None,
    })
}

/// Checks `x` and waits for the answer: the first NaN or infinity's index (relative to the start
/// of `x`), or `None`. Uses a two-word [`Category::Temporary`] flags buffer.
pub fn first_nonfinite(gpu: &Gpu, x: DeviceSlice<'_>, deadline: Duration) -> Result<Option<u64>> {
    let flags = gpu.alloc_elements(FLAG_WORDS, Category::Temporary, "nonfinite flags")?;
    check(gpu, flags.whole(), x)?;
    read_flags(gpu, flags.whole(), deadline)
}

/// CPU reference: whether a slice holds a NaN or an infinity, and the first such index. The
/// shader's flag buffer is `[any: u32, first_index: u32]`, initialised by the launcher to
/// `[0, NO_INDEX]`; several dispatches into the same flags accumulate.
pub mod reference {
    pub use super::NO_INDEX;

    /// Index of the first NaN or infinity, if any.
    pub fn first_nonfinite(x: &[f32]) -> Option<usize> {
        x.iter().position(|v| !v.is_finite())
    }

    /// The flag words the shader leaves after checking `x` from `[0, NO_INDEX]`:
    /// `[1, first index]` if some element is non-finite, else `[0, NO_INDEX]`.
    pub fn flags(x: &[f32]) -> [u32; 2] {
        match first_nonfinite(x) {
            Some(i) => [1, i as u32],
            None => [0, NO_INDEX],
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::NO_INDEX;
    use crate::Result;
    use crate::testing::{DEADLINE, gpu_and_rng, gpu_and_temporaries};
    use crate::{Category, Error};

    #[test]
    pub(crate) fn matches_reference() -> Result<()> {
        let (gpu, mut rng) = gpu_and_rng(81);
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
                let x_gpu = gpu.upload(&buf, Category::Gradient, "x")?;
                let flags_gpu = gpu
                    .upload(&[5u32, 5, 5, 5], Category::Temporary, "flags")
                    ?;
                let flags_s = flags_gpu.slice(1, 2)?;
                let x_s = x_gpu.slice(4, len as u64)?;
                super::check(&gpu, flags_s, x_s)?;
                let got: Vec<u32> = gpu.read_all(&flags_gpu, DEADLINE)?;
                let [any, first] = super::reference::flags(&x);
                assert_eq!(got, [5, any, first, 5], "nonfinite {what} len {len}");
                let found = super::read_flags(&gpu, flags_s, DEADLINE)?;
                let want = super::reference::first_nonfinite(&x).map(|i| i as u64);
                assert_eq!(found, want, "nonfinite {what} len {len} read_flags");
                let found = super::first_nonfinite(&gpu, x_s, DEADLINE)?;
                assert_eq!(found, want, "nonfinite {what} len {len} first_nonfinite");
            }
        }
        Ok(())
    }

    #[test]
    fn nonfinite_accumulates_over_several_ranges() -> Result<()> {
        let (gpu, mut rng) = gpu_and_rng(83);
        let mut x = rng.vec_f32(3000, -5.0, 5.0);
        let x_gpu = gpu.upload(&x, Category::Gradient, "grads")?;
        let flags_buf = gpu.alloc_elements(2, Category::Temporary, "flags")?;
        let flags = flags_buf.whole();
        // Three clean "tensors" in one buffer: nothing found.
        super::reset_flags(&gpu, flags)?;
        for (offset, len) in [(0, 1000), (1000, 1000), (2000, 1000)] {
            super::accumulate(&gpu, flags, x_gpu.slice(offset, len)?)?;
        }
        assert_eq!(super::read_flags(&gpu, flags, DEADLINE)?, None);
        let words: Vec<u32> = gpu.read_all(&flags_buf, DEADLINE)?;
        assert_eq!(words, [0, NO_INDEX]);
        // An infinity at element 1500 = index 500 of the second tensor.
        x[1500] = f32::INFINITY;
        gpu.write(&x_gpu, 1500, &x[1500..1501])?;
        super::reset_flags(&gpu, flags)?;
        for (offset, len) in [(0, 1000), (1000, 1000), (2000, 1000)] {
            super::accumulate(&gpu, flags, x_gpu.slice(offset, len)?)?;
        }
        assert_eq!(
            super::read_flags(&gpu, flags, DEADLINE)?,
            Some(500)
        );
        Ok(())
    }

    #[test]
    fn nonfinite_rejects_a_range_outside_the_buffer() -> Result<()> {
        let (gpu, [x, flags]) = gpu_and_temporaries([(10, "x"), (2, "flags")])?;
        // Flags from offset 1 of 2 words: no two-word slice; a one-word slice is refused.
        let err = flags.slice(1, 2).expect_err("must be refused");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        assert!(err.to_string().contains("outside buffer"), "{err}");
        let one = flags.slice(1, 1)?;
        let err = super::check(&gpu, one, x.whole()).expect_err("must be refused");
        assert!(err.to_string().contains("flags: 1 elements given"), "{err}");
        let refusals = [
            super::reset_flags(&gpu, one).expect_err("must be refused"),
            super::accumulate(&gpu, one, x.whole()).expect_err("must be refused"),
            super::read_flags(&gpu, one, DEADLINE).expect_err("must be refused"),
        ];
        for err in refusals {
            assert!(
                matches!(err, Error::InvalidArgument { .. })
                    && err.to_string().contains("flags: 1 elements given"),
                "{err}"
            );
        }
        // x = elements 3..11 of 10.
        let err = x.slice(3, 8).expect_err("must be refused");
        assert!(err.to_string().contains("outside buffer"), "{err}");
        // Empty range: the flags say "clean".
        super::check(&gpu, flags.whole(), x.slice(10, 0)?)?;
        assert_eq!(
            super::read_flags(&gpu, flags.whole(), DEADLINE)?,
            None
        );
        Ok(())
    }

    /// The reference by hand (moved from the reference checks).
    #[test]
    fn nonfinite_flags() {
        use super::reference as nonfinite;
        assert_eq!(
            nonfinite::flags(&[1.0, 2.0, f32::MAX]),
            [0, nonfinite::NO_INDEX]
        );
        assert_eq!(nonfinite::flags(&[1.0, f32::INFINITY, f32::NAN]), [1, 1]);
        assert_eq!(nonfinite::flags(&[f32::NAN]), [1, 0]);
        assert_eq!(
            nonfinite::first_nonfinite(&[0.0, -0.0, f32::NEG_INFINITY]),
            Some(2)
        );
    }
}
