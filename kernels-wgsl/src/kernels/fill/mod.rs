//! `fill`: set a range of a buffer to a constant. The family in one place: its shader
//! (`fill.wgsl`, beside this file), its launcher, its CPU [`reference`](mod@reference) and its kernel test.

use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_ranges};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// The `fill` entry point.
pub const KERNEL: Kernel = kernel!(
    "fill",
    "fill",
    source: include_str!("fill.wgsl"),
    [out: "array<u32>"],
    ELEMENTWISE_WORKGROUP
);

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    KERNEL,
];

shader_params! {
    /// The `Params` of `fill.wgsl`.
    struct Params {
        offset: u32,
        len: u32,
        value_bits: u32,
        _pad: u32,
    }
}

/// Records `out[i] = value` for every element of `out` (f32).
pub fn fill(gpu: &Gpu, out: DeviceSlice<'_>, value: f32) -> Result<()> {
    fill_u32(gpu, out, value.to_bits())
}

/// Records `out[i] = value` for every element of `out` (u32 words: indices, targets, packed f16).
pub fn fill_u32(gpu: &Gpu, out: DeviceSlice<'_>, value: u32) -> Result<()> {
    // Each range fills its own elements: the offset advanced, the length the range's.
    let params = |start: u32, end: u32| Params {
        offset: out.index() + start,
        len: end - start,
        value_bits: value,
        _pad: 0,
    };
    launch_ranges(gpu, &KERNEL, &[], &[out], out.len(), params)
}

/// CPU reference: `out[offset + i] = value` for `i` in `0..len`.
pub mod reference {
    /// Sets `len` elements of `out` from `offset` to `value`.
    ///
    /// # Panics
    /// If `offset + len > out.len()` (a test bug).
    pub fn fill(out: &mut [f32], offset: usize, len: usize, value: f32) {
        out[offset..offset + len].fill(value);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::Result;
    use crate::testing::{DEADLINE, assert_exact, gpu, gpu_and_rng};
    use crate::{Category, Error};

    /// The kernel against [`super::reference`] at odd lengths (70,001 needs a 2-D grid's
    /// worth of workgroups on small limits), inside a larger buffer.
    #[test]
    pub(crate) fn matches_reference() -> Result<()> {
        let (gpu, mut rng) = gpu_and_rng(11);
        for len in [1usize, 255, 257, 1000, 70_001] {
            let initial = rng.vec_f32(len + 9, -3.0, 3.0);
            let buf = gpu
                .upload(&initial, Category::Temporary, "fill out")
                ?;
            let (offset, count) = (3usize, len);
            let value = rng.f32_in(-5.0, 5.0);
            let out = buf.slice(offset as u64, count as u64)?;
            super::fill(&gpu, out, value)?;
            let got: Vec<f32> = gpu.read_all(&buf, DEADLINE)?;
            let mut want = initial.clone();
            super::reference::fill(&mut want, offset, count, value);
            assert_exact(&format!("fill len {len}"), &got, &want);
        }
        Ok(())
    }

    #[test]
    fn fill_u32_writes_exact_words_and_rejects_out_of_range() -> Result<()> {
        let gpu = gpu();
        let buf = gpu.alloc_elements(333, Category::Input, "targets")?;
        super::fill_u32(&gpu, buf.slice(0, 333)?, 0xDEAD_BEEF)?;
        let got: Vec<u32> = gpu.read_all(&buf, DEADLINE)?;
        assert!(got.iter().all(|&w| w == 0xDEAD_BEEF));
        // Elements 300..334 of a 333-element buffer: refused when the slice is made.
        let err = buf.slice(300, 34).expect_err("must be refused");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        assert!(err.to_string().contains("outside buffer"), "{err}");
        // A sub-slice past the end of its slice is refused too.
        let tail = buf.slice(300, 33)?;
        let err = tail.slice(1, 33).expect_err("must be refused");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        Ok(())
    }
}
