//! `fill`: set a range of a buffer to a constant. Shader: `shaders/fill.wgsl`;
//! reference: [`crate::reference::fill`].

use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_1d};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// The `fill` entry point.
pub const KERNEL: Kernel = kernel!("fill", "fill", [out: "array<u32>"], ELEMENTWISE_WORKGROUP);

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
    let params = Params {
        offset: out.index(),
        len: out.len() as u32,
        value_bits: value,
        _pad: 0,
    };
    launch_1d(gpu, &KERNEL, &[], &params, &[out], out.len())
}
