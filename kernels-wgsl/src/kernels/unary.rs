//! `unary`: elementwise `y = f(x)` and its backward `dx = dy * f'(.)` for every [`UnaryOp`].
//! One pipeline per op (the WGSL `override OP`). Shader: `shaders/unary.wgsl`; reference:
//! [`crate::reference::unary`].

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::{ELEMENTWISE_WORKGROUP, check_range, grid_1d, segment_index};
use crate::pipeline::{Kernel, RuntimeChecks};
use crate::recorder::Dispatch;
pub use crate::reference::unary::UnaryOp;

/// The `forward` entry point: bindings `x`, `y`.
pub const FORWARD: Kernel = Kernel {
    stem: "unary",
    wgsl: include_str!("../../shaders/unary.wgsl"),
    entry: "forward",
    storage_bindings: 2,
    runtime_checks: RuntimeChecks::ON,
};

/// The `backward` entry point: bindings `saved`, `dy`, `dx`.
pub const BACKWARD: Kernel = Kernel {
    entry: "backward",
    storage_bindings: 3,
    ..FORWARD
};

/// Mirrors `Params` in `unary.wgsl` (shared by both entry points; unused offsets are 0).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    exponent: f32,
    x_offset: u32,
    y_offset: u32,
    saved_offset: u32,
    dy_offset: u32,
    dx_offset: u32,
    _pad0: u32,
}

fn overrides(op: UnaryOp) -> [(&'static str, f64); 1] {
    [("OP", f64::from(op.shader_code()))]
}

/// Records `y[y_offset + i] = f(x[x_offset + i])` for `i < len`. `exponent` is used only by
/// [`UnaryOp::Pow`]. `x` and `y` may be the same range (in place).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    gpu: &Gpu,
    op: UnaryOp,
    y: &DeviceBuffer,
    y_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
    exponent: f32,
) -> Result<()> {
    check_range("unary", "y", y, y_offset, len)?;
    check_range("unary", "x", x, x_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        n: len as u32,
        exponent,
        x_offset: segment_index(x, x_offset),
        y_offset: segment_index(y, y_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel: &FORWARD,
        overrides: &overrides(op),
        params: bytemuck::bytes_of(&params),
        buffers: &[x, y],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}

/// Records `dx[dx_offset + i] = dy[dy_offset + i] * f'(.)` for `i < len`, where `saved` holds the
/// forward *output* `y` if [`UnaryOp::backward_uses_output`] (exp, tanh, sigmoid) and the forward
/// *input* `x` otherwise. `dx` overwrites (callers accumulate with `binary` add).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    gpu: &Gpu,
    op: UnaryOp,
    dx: &DeviceBuffer,
    dx_offset: u64,
    saved: &DeviceBuffer,
    saved_offset: u64,
    dy: &DeviceBuffer,
    dy_offset: u64,
    len: u64,
    exponent: f32,
) -> Result<()> {
    check_range("unary_backward", "dx", dx, dx_offset, len)?;
    check_range("unary_backward", "saved", saved, saved_offset, len)?;
    check_range("unary_backward", "dy", dy, dy_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        n: len as u32,
        exponent,
        saved_offset: segment_index(saved, saved_offset),
        dy_offset: segment_index(dy, dy_offset),
        dx_offset: segment_index(dx, dx_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel: &BACKWARD,
        overrides: &overrides(op),
        params: bytemuck::bytes_of(&params),
        buffers: &[saved, dy, dx],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}
