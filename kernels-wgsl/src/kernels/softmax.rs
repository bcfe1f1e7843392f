//! `softmax`: softmax and log-softmax over the last axis of a row-major `[rows, cols]` matrix,
//! and their backwards (from the forward *output*). Shader: `shaders/softmax.wgsl`; reference:
//! [`crate::reference::softmax`].
//!
//! One invocation per row (see the shader header for why); workgroups of [`ROW_WORKGROUP`].
//! Input and output may be the same range of the same buffer (each row is read before it is
//! written, by the invocation that owns it).

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{check_loop_limit, check_range, grid_1d, loop_passes, segment_index};
use crate::pipeline::Kernel;
use crate::recorder::Dispatch;

/// Workgroup size of every `softmax` entry point (`@workgroup_size(64)`: one row per invocation).
pub const ROW_WORKGROUP: u32 = 64;

/// The `softmax_forward` entry point.
pub const SOFTMAX_FORWARD: Kernel = Kernel {
    stem: "softmax",
    wgsl: include_str!("../../shaders/softmax.wgsl"),
    entry: "softmax_forward",
    storage_bindings: 2,
    runtime_checks: crate::pipeline::RuntimeChecks::ON,
};

/// The `log_softmax_forward` entry point.
pub const LOG_SOFTMAX_FORWARD: Kernel = Kernel {
    entry: "log_softmax_forward",
    ..SOFTMAX_FORWARD
};

/// The `softmax_backward` entry point.
pub const SOFTMAX_BACKWARD: Kernel = Kernel {
    entry: "softmax_backward",
    storage_bindings: 3,
    ..SOFTMAX_FORWARD
};

/// The `log_softmax_backward` entry point.
pub const LOG_SOFTMAX_BACKWARD: Kernel = Kernel {
    entry: "log_softmax_backward",
    ..SOFTMAX_BACKWARD
};

/// Loop passes one invocation of any `softmax` entry point runs for rows of `cols` columns: two
/// unrolled column loops ([`crate::kernels::loop_passes`]; see "Loop limit on lavapipe" in
/// [`crate::kernels`]). The launchers refuse rows over the adapter's limit with
/// [`Error::LoopLimit`] (on lavapipe: `cols <= 262_071`).
pub const fn loop_iterations(cols: u64) -> u64 {
    2 * loop_passes(cols)
}

/// Mirrors `Params` in `softmax.wgsl` (shared by the four entry points).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    x_offset: u32,
    y_offset: u32,
    dy_offset: u32,
    dx_offset: u32,
    _pad0: u32,
    _pad1: u32,
}

/// The buffers of a softmax or log-softmax backward, each `[rows, cols]` from its element offset.
#[derive(Debug, Clone, Copy)]
pub struct SoftmaxBackwardBuffers<'a> {
    /// The forward's *output* (softmax, or log-softmax for [`log_softmax_backward`]).
    pub y: &'a DeviceBuffer,
    /// Element offset of `y`.
    pub y_offset: u64,
    /// Gradient of the output.
    pub dy: &'a DeviceBuffer,
    /// Element offset of `dy`.
    pub dy_offset: u64,
    /// Gradient of the input, written (=).
    pub dx: &'a DeviceBuffer,
    /// Element offset of `dx`.
    pub dx_offset: u64,
}

/// Records `y = softmax(x)` per row of the `[rows, cols]` matrices at `x[x_offset..]` and
/// `y[y_offset..]`.
pub fn softmax_forward(
    gpu: &Gpu,
    x: &DeviceBuffer,
    x_offset: u64,
    y: &DeviceBuffer,
    y_offset: u64,
    rows: u64,
    cols: u64,
) -> Result<()> {
    forward(gpu, &SOFTMAX_FORWARD, x, x_offset, y, y_offset, rows, cols)
}

/// Records `y = log_softmax(x)` per row, as [`softmax_forward`].
pub fn log_softmax_forward(
    gpu: &Gpu,
    x: &DeviceBuffer,
    x_offset: u64,
    y: &DeviceBuffer,
    y_offset: u64,
    rows: u64,
    cols: u64,
) -> Result<()> {
    forward(
        gpu,
        &LOG_SOFTMAX_FORWARD,
        x,
        x_offset,
        y,
        y_offset,
        rows,
        cols,
    )
}

/// Records `dx = y * (dy - sum_j dy_j y_j)` per row (`y` the softmax output).
pub fn softmax_backward(
    gpu: &Gpu,
    buffers: &SoftmaxBackwardBuffers<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    backward(gpu, &SOFTMAX_BACKWARD, buffers, rows, cols)
}

/// Records `dx = dy - exp(y) * sum_j dy_j` per row (`y` the log-softmax output).
pub fn log_softmax_backward(
    gpu: &Gpu,
    buffers: &SoftmaxBackwardBuffers<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    backward(gpu, &LOG_SOFTMAX_BACKWARD, buffers, rows, cols)
}

/// `rows * cols`, or an error naming `op` when it overflows.
fn matrix_len(op: &'static str, rows: u64, cols: u64) -> Result<u64> {
    rows.checked_mul(cols)
        .ok_or_else(|| Error::InvalidArgument {
            op,
            message: format!("[{rows}, {cols}] has more than u64::MAX elements"),
        })
}

#[allow(clippy::too_many_arguments)] // private: the two public forwards differ only in `kernel`
fn forward(
    gpu: &Gpu,
    kernel: &'static Kernel,
    x: &DeviceBuffer,
    x_offset: u64,
    y: &DeviceBuffer,
    y_offset: u64,
    rows: u64,
    cols: u64,
) -> Result<()> {
    let op = kernel.entry;
    let len = matrix_len(op, rows, cols)?;
    if rows > 0 {
        check_loop_limit(gpu, op, "cols", cols, loop_iterations)?;
    }
    check_range(op, "x", x, x_offset, len)?;
    check_range(op, "y", y, y_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        x_offset: segment_index(x, x_offset),
        y_offset: segment_index(y, y_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[x, y],
        workgroups: grid_1d(gpu, rows, ROW_WORKGROUP)?,
    })
}

fn backward(
    gpu: &Gpu,
    kernel: &'static Kernel,
    b: &SoftmaxBackwardBuffers<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    let op = kernel.entry;
    let len = matrix_len(op, rows, cols)?;
    if rows > 0 {
        check_loop_limit(gpu, op, "cols", cols, loop_iterations)?;
    }
    check_range(op, "y", b.y, b.y_offset, len)?;
    check_range(op, "dy", b.dy, b.dy_offset, len)?;
    check_range(op, "dx", b.dx, b.dx_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        y_offset: segment_index(b.y, b.y_offset),
        dy_offset: segment_index(b.dy, b.dy_offset),
        dx_offset: segment_index(b.dx, b.dx_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[b.y, b.dy, b.dx],
        workgroups: grid_1d(gpu, rows, ROW_WORKGROUP)?,
    })
}
