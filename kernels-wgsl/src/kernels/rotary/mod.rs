//! `rotary`: rotary position embeddings (RoPE) applied to queries or keys, in Hugging Face
//! Llama's "rotate half" layout, forward and backward (the inverse rotation). The family in one
//! place: its shader (`rotary.wgsl`, beside this file: the formula), its launcher, its CPU
//! [`reference`](mod@reference) and its kernel test.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_blocks};
use crate::pipeline::{Kernel, kernel, shader_params, shader_source};
use crate::slice::DeviceSlice;

/// The `rotary` entry point.
pub const KERNEL: Kernel = kernel!(
    "rotary",
    "rotary",
    source: const_format::concatcp!(include_str!("rotary.wgsl"), shader_source!("indexing")),
    [x, y],
    ELEMENTWISE_WORKGROUP
);

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    KERNEL,
];

shader_params! {
    /// The `Params` of `rotary.wgsl`.
    struct Params {
        rows: u32,
        time: u32,
        half: u32,
        offset: u32,
        log2_base_per_pair: f32,
        sign: f32,
        x_offset: u32,
        y_offset: u32,
    }
}

/// The largest position (`offset + time - 1`) whose angle the kernel computes exactly: every
/// integer up to 2^24 is an `f32`.
pub const MAX_POSITION: u64 = 1 << 24;

/// The shape of a rotary launch over `[rows, head_dim]` rows, `rows = heads_batch x time`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RotaryDims {
    /// Rows: every (batch, head, position).
    pub rows: u64,
    /// Positions per sequence (a row's position is `row % time + offset`).
    pub time: u64,
    /// Features per row (even: feature `c` pairs with `c + head_dim / 2`).
    pub head_dim: u64,
    /// The wavelength base (Llama: 10,000; Llama 3: 500,000).
    pub base: f32,
    /// The position of each sequence's first row (the tokens before it, when sampling with a
    /// cache; 0 in training).
    pub offset: u64,
}

impl RotaryDims {
    /// Refuses an odd or zero head dimension, rows that are not whole sequences, a base that is
    /// not a finite number above 0, and positions past [`MAX_POSITION`].
    fn check(&self) -> Result<()> {
        let op = "rotary";
        let invalid = |message: String| Err(Error::InvalidArgument { op, message });
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return invalid(format!(
                "head dimension {} must be even and positive (feature c pairs with c + {})",
                self.head_dim,
                self.head_dim / 2
            ));
        }
        if self.time == 0 || !self.rows.is_multiple_of(self.time) {
            return invalid(format!(
                "{} rows are not whole sequences of {} positions",
                self.rows, self.time
            ));
        }
        if !(self.base.is_finite() && self.base > 0.0) {
            return invalid(format!(
                "base {} must be a finite number above 0 (Llama uses 10000)",
                self.base
            ));
        }
        if self.offset + self.time > MAX_POSITION {
            return invalid(format!(
                "positions up to {} pass 2^24 = {MAX_POSITION}, the largest an f32 angle holds \
                 exactly",
                self.offset + self.time - 1
            ));
        }
        if self.rows * self.head_dim > u64::from(u32::MAX) {
            return invalid(format!(
                "{} rows of {} features pass 2^32 - 1 elements; split the batch",
                self.rows, self.head_dim
            ));
        }
        Ok(())
    }
}

/// Records `y = rope(x)` over `[rows, head_dim]` (the shader's formula), or with `inverse` the
/// opposite rotation (the backward: `dx = rope⁻¹(dy)`). `y` may be `x`.
pub fn rotary(
    gpu: &Gpu,
    dims: &RotaryDims,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    inverse: bool,
) -> Result<()> {
    dims.check()?;
    let len = dims.rows * dims.head_dim;
    x.expect_len("rotary", "x", len)?;
    y.expect_len("rotary", "y", len)?;
    let half = dims.head_dim / 2;
    let params = |first: u32, count: u32| Params {
        rows: count,
        time: dims.time as u32,
        half: half as u32,
        offset: dims.offset as u32,
        log2_base_per_pair: (f64::from(dims.base).log2() / half as f64) as f32,
        sign: if inverse { -1.0 } else { 1.0 },
        x_offset: x.index() + first * dims.head_dim as u32,
        y_offset: y.index() + first * dims.head_dim as u32,
    };
    // In blocks of whole sequences under a submission bound (row r is position r % time in
    // every block too): the same values whatever the blocks.
    let rows = [dims.rows, dims.time];
    launch_blocks(gpu, &KERNEL, &[], &[x, y], rows, |s, e| {
        (params(s as u32, (e - s) as u32), (e - s) * half)
    })
}

/// CPU reference, in `f64`.
pub mod reference {
    use super::RotaryDims;

    /// The angle of feature pair `c` at position `pos`: `pos * base^(-2c / head_dim)`.
    pub fn angle(dims: &RotaryDims, pos: u64, c: u64) -> f64 {
        let exponent = -2.0 * c as f64 / dims.head_dim as f64;
        pos as f64 * f64::from(dims.base).powf(exponent)
    }

    /// `y = rope(x)` (or its inverse) over `[rows, head_dim]`.
    pub fn rotary(dims: &RotaryDims, x: &[f32], inverse: bool) -> Vec<f32> {
        let (d, half) = (dims.head_dim as usize, dims.head_dim as usize / 2);
        let mut y = vec![0.0f32; x.len()];
        for r in 0..dims.rows as usize {
            let pos = r as u64 % dims.time + dims.offset;
            for c in 0..half {
                let theta = angle(dims, pos, c as u64);
                let (sin, cos) = theta.sin_cos();
                let sin = if inverse { -sin } else { sin };
                let (a, b) = (f64::from(x[r * d + c]), f64::from(x[r * d + c + half]));
                y[r * d + c] = (a * cos - b * sin) as f32;
                y[r * d + c + half] = (b * cos + a * sin) as f32;
            }
        }
        y
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{RotaryDims, reference};
    use crate::testing::{DEADLINE, assert_close, gpu_and_rng, scratch};
    use crate::{Category, Error, Result};

    /// Forward and inverse against the reference at offsets inside buffers, for head dimensions
    /// of 2, 6 (not a multiple of 8), 64 and 128, positions from 0 and from an offset of 1000,
    /// in place; and the inverse undoing the forward.
    #[test]
    pub(crate) fn matches_reference() -> Result<()> {
        let (gpu, mut rng) = gpu_and_rng(41);
        for (heads_batch, time, head_dim, base, offset) in [
            (1u64, 1u64, 2u64, 10_000.0f32, 0u64),
            (3, 7, 6, 10_000.0, 0),
            (2, 33, 64, 10_000.0, 1000),
            (1, 300, 128, 500_000.0, 0),
            (2, 5, 16, 2.0, 3),
        ] {
            let dims = RotaryDims {
                rows: heads_batch * time,
                time,
                head_dim,
                base,
                offset,
            };
            let n = (dims.rows * head_dim) as usize;
            let x = rng.vec_f32(n, -2.0, 2.0);
            let name = format!("rotary [{heads_batch} x {time}, {head_dim}] base {base} +{offset}");
            for inverse in [false, true] {
                let x_gpu = gpu.upload(&x, Category::Temporary, "x")?;
                let y_gpu = scratch(&gpu, n as u64 + 5, "y");
                let y = y_gpu.slice(5, n as u64)?;
                super::rotary(&gpu, &dims, y, x_gpu.whole(), inverse)?;
                let got: Vec<f32> = gpu.read(&y_gpu, 5, n as u64, DEADLINE)?;
                let want = reference::rotary(&dims, &x, inverse);
                // The angle is an f32 product (and 2 pi an f32) on the device: at position
                // 1000 its rounding is about 1e-4 of a radian.
                assert_close(&format!("{name} inverse {inverse}"), &got, &want, 3e-4, 1e-4);
                // In place, then back: the input again.
                super::rotary(&gpu, &dims, x_gpu.whole(), x_gpu.whole(), inverse)?;
                super::rotary(&gpu, &dims, x_gpu.whole(), x_gpu.whole(), !inverse)?;
                let back: Vec<f32> = gpu.read(&x_gpu, 0, n as u64, DEADLINE)?;
                assert_close(&format!("{name} round trip"), &back, &x, 1e-5, 1e-5);
            }
        }
        Ok(())
    }

    /// Odd head dimensions, partial sequences, a base of 0 and positions past 2^24 are refused
    /// with the figures.
    #[test]
    fn refuses_bad_shapes() -> Result<()> {
        let (gpu, _) = gpu_and_rng(1);
        let buffer = scratch(&gpu, 64, "rotary");
        let good = RotaryDims {
            rows: 4,
            time: 2,
            head_dim: 4,
            base: 10_000.0,
            offset: 0,
        };
        for (dims, needle) in [
            (RotaryDims { head_dim: 5, rows: 4, ..good }, "even"),
            (RotaryDims { rows: 3, ..good }, "whole sequences"),
            (RotaryDims { base: 0.0, ..good }, "base"),
            (RotaryDims { offset: 1 << 24, ..good }, "2^24"),
        ] {
            let len = dims.rows * dims.head_dim;
            let s = buffer.slice(0, len)?;
            let err = super::rotary(&gpu, &dims, s, s, false).expect_err("must be refused");
            assert!(
                matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains(needle),
                "{needle}: {err}"
            );
        }
        Ok(())
    }
}
