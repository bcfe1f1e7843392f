//! `dropout`: inverted dropout whose mask is a counter-based hash of `(seed, element index)`, so
//! the same seed gives the same mask on the GPU and in [`crate::reference::dropout`], in the
//! forward, the backward (`dx = dropout(dy)` with the same seed) and a recomputation.
//! Shader: `shaders/dropout.wgsl`.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_1d, same_len};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// The `dropout` entry point.
pub const KERNEL: Kernel = kernel!("dropout", "dropout", [x, y], ELEMENTWISE_WORKGROUP);

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
        _pad: u32,
    }
}

/// Records `y[i] = keep(seed, i) ? x[i] / (1 - p) : 0` for every element (the lengths must
/// match), `keep` as in [`crate::reference::dropout::keep`]; `p` in `[0, 1)`. In place allowed.
pub fn dropout(gpu: &Gpu, y: DeviceSlice<'_>, x: DeviceSlice<'_>, p: f32, seed: u64) -> Result<()> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::InvalidArgument {
            op: "dropout",
            message: format!("probability {p} outside [0, 1)"),
        });
    }
    let len = same_len("dropout", &[("y", y), ("x", x)])?;
    let params = Params {
        len: len as u32,
        x_offset: x.index(),
        y_offset: y.index(),
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        p,
        scale: crate::reference::dropout::scale(p),
        _pad: 0,
    };
    launch_1d(gpu, &KERNEL, &[], &params, &[x, y], len)
}
