//! `fill`: set a range of a buffer to a constant. Shader: `shaders/fill.wgsl`;
//! reference: [`crate::reference::fill`].

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::{ELEMENTWISE_WORKGROUP, check_range, grid_1d, segment_index};
use crate::pipeline::{Kernel, RuntimeChecks};
use crate::recorder::Dispatch;

/// The `fill` entry point.
pub const KERNEL: Kernel = Kernel {
    stem: "fill",
    wgsl: include_str!("../../shaders/fill.wgsl"),
    entry: "fill",
    storage_bindings: 1,
    runtime_checks: RuntimeChecks::ON,
};

/// Mirrors `Params` in `fill.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    offset: u32,
    len: u32,
    value_bits: u32,
    _pad: u32,
}

/// Records `out[offset..offset + len] = value` (f32).
pub fn fill(gpu: &Gpu, out: &DeviceBuffer, offset: u64, len: u64, value: f32) -> Result<()> {
    fill_u32(gpu, out, offset, len, value.to_bits())
}

/// Records `out[offset..offset + len] = value` (u32 words: indices, targets, packed f16).
pub fn fill_u32(gpu: &Gpu, out: &DeviceBuffer, offset: u64, len: u64, value: u32) -> Result<()> {
    check_range("fill", "out", out, offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        offset: segment_index(out, offset),
        len: len as u32,
        value_bits: value,
        _pad: 0,
    };
    gpu.dispatch(Dispatch {
        kernel: &KERNEL,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[out],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}
