//! `dropout`: inverted dropout whose mask is a counter-based hash of `(seed, element index)`, so
//! the same seed gives the same mask on the GPU and in [`reference`](mod@reference), in the forward, the
//! backward (`dx = dropout(dy)` with the same seed) and a recomputation. In one place: the
//! shader (`dropout.wgsl`, beside this file), the launcher, the CPU reference and the test.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_ranges, same_len};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// The `dropout` entry point.
pub const KERNEL: Kernel = kernel!(
    "dropout",
    "dropout",
    source: const_format::concatcp!(
        include_str!("dropout.wgsl"),
        crate::pipeline::shader_source!("counter_hash")
    ),
    [x, y],
    ELEMENTWISE_WORKGROUP
);

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    KERNEL,
];

shader_params! {
    /// The `Params` of `dropout.wgsl`.
    struct Params {
        len: u32,
        x_offset: u32,
        y_offset: u32,
        seed_lo: u32,
        seed_hi: u32,
        p: f32,
        scale: f32,
        /// The first element of the range this dispatch computes, up to `len` (a launch in
        /// ranges under a submission bound: the mask stays the whole launch's).
        start: u32,
    }
}

/// Records `y[i] = keep(seed, i) ? x[i] / (1 - p) : 0` for every element (the lengths must
/// match), `keep` as in [`reference::keep`]; `p` in `[0, 1)`. In place allowed.
pub fn dropout(gpu: &Gpu, y: DeviceSlice<'_>, x: DeviceSlice<'_>, p: f32, seed: u64) -> Result<()> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::InvalidArgument {
            op: "dropout",
            message: format!("probability {p} outside [0, 1)"),
        });
    }
    let len = same_len("dropout", &[("y", y), ("x", x)])?;
    let params = |start, end| Params {
        len: end,
        x_offset: x.index(),
        y_offset: y.index(),
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        p,
        scale: reference::scale(p),
        start,
    };
    launch_ranges(gpu, &KERNEL, &[], &[x, y], len, params)
}

/// CPU reference: inverted dropout with a counter-based hash mask, bit-identical to
/// `dropout.wgsl` (see its header for the hash).
pub mod reference {
    /// PCG's output permutation on `u32` (wrapping), as in the shader.
    pub fn pcg(v: u32) -> u32 {
        let state = v.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
        let word = ((state >> ((state >> 28) + 4)) ^ state).wrapping_mul(277_803_737);
        (word >> 22) ^ word
    }

    /// Whether element `i` survives dropout with probability `p` under `seed`.
    pub fn keep(seed: u64, i: u32, p: f32) -> bool {
        let key = pcg((seed as u32) ^ pcg((seed >> 32) as u32));
        let h = pcg(i ^ key);
        (h >> 8) as f32 * (1.0 / 16_777_216.0) >= p
    }

    /// The scale of kept elements, `1 / (1 - p)`, rounded to f32 once (the launcher passes it).
    pub fn scale(p: f32) -> f32 {
        1.0 / (1.0 - p)
    }

    /// `y[i] = keep(seed, i, p) ? x[i] * scale(p) : 0`.
    pub fn dropout(x: &[f32], p: f32, seed: u64) -> Vec<f32> {
        let s = scale(p);
        x.iter()
            .enumerate()
            .map(|(i, &v)| if keep(seed, i as u32, p) { v * s } else { 0.0 })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::Result;
    use crate::testing::{DEADLINE, assert_exact, gpu_and_rng, scratch};
    use crate::{Category, Error};

    #[test]
    pub(crate) fn matches_reference() -> Result<()> {
        let (gpu, mut rng) = gpu_and_rng(23);
        for (len, p, seed) in [
            (1usize, 0.5f32, 1u64),
            (257, 0.1, 7),
            (1000, 0.5, u64::MAX),
            (70_001, 0.9, 42),
        ] {
            let x = rng.vec_f32(len, -2.0, 2.0);
            let x_gpu = gpu.upload(&x, Category::Temporary, "x")?;
            let y_gpu = scratch(&gpu, len as u64 + 3, "y");
            let y = y_gpu.slice(3, len as u64)?;
            super::dropout(&gpu, y, x_gpu.whole(), p, seed)?;
            let got: Vec<f32> = gpu.read(&y_gpu, 3, len as u64, DEADLINE)?;
            let want = super::reference::dropout(&x, p, seed);
            assert_exact(&format!("dropout len {len} p {p}"), &got, &want);
            if len > 1000 {
                let dropped = want.iter().filter(|&&v| v == 0.0).count() as f32 / len as f32;
                assert!((dropped - p).abs() < 0.02, "dropped {dropped}, p {p}");
            }
        }
        let buf = gpu.alloc_elements(4, Category::Temporary, "b")?;
        let err = super::dropout(&gpu, buf.whole(), buf.whole(), 1.0, 0).expect_err("must be refused");
        assert!(
            matches!(err, Error::InvalidArgument { .. })
                && err.to_string().contains("probability 1 outside [0, 1)"),
            "{err}"
        );
        // y and x of different lengths are refused.
        let short = buf.slice(0, 3)?;
        let err = super::dropout(&gpu, short, buf.whole(), 0.5, 0).expect_err("must be refused");
        assert!(
            matches!(err, Error::InvalidArgument { .. })
                && err.to_string().contains("x: 4 elements given")
                && err.to_string().contains("3 needed"),
            "{err}"
        );
        Ok(())
    }
}
