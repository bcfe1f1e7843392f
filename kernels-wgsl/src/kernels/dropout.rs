//! `dropout`: inverted dropout whose mask is a counter-based hash of `(seed, element index)`, so
//! the same seed gives the same mask on the GPU and in [`crate::reference::dropout`], in the
//! forward, the backward (`dx = dropout(dy)` with the same seed) and a recomputation.
//! Shader: `shaders/dropout.wgsl`.

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, check_range, grid_1d, segment_index};
use crate::pipeline::{Kernel, RuntimeChecks};
use crate::recorder::Dispatch;

/// The `dropout` entry point.
pub const KERNEL: Kernel = Kernel {
    stem: "dropout",
    wgsl: include_str!("../../shaders/dropout.wgsl"),
    entry: "dropout",
    storage_bindings: 2,
    runtime_checks: RuntimeChecks::ON,
};

/// Mirrors `Params` in `dropout.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
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

/// Records `y[y_offset + i] = keep(seed, i) ? x[x_offset + i] / (1 - p) : 0` for `i < len`,
/// `keep` as in [`crate::reference::dropout::keep`]; `p` in `[0, 1)`. In place allowed.
#[allow(clippy::too_many_arguments)]
pub fn dropout(
    gpu: &Gpu,
    y: &DeviceBuffer,
    y_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
    p: f32,
    seed: u64,
) -> Result<()> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::InvalidArgument {
            op: "dropout",
            message: format!("probability {p} outside [0, 1)"),
        });
    }
    check_range("dropout", "y", y, y_offset, len)?;
    check_range("dropout", "x", x, x_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        len: len as u32,
        x_offset: segment_index(x, x_offset),
        y_offset: segment_index(y, y_offset),
        seed_lo: seed as u32,
        seed_hi: (seed >> 32) as u32,
        p,
        scale: crate::reference::dropout::scale(p),
        _pad: 0,
    };
    gpu.dispatch(Dispatch {
        kernel: &KERNEL,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[x, y],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}
