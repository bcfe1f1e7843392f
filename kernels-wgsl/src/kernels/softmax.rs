//! `softmax`: softmax and log-softmax over the last axis of a row-major `[rows, cols]` matrix,
//! and their backwards (from the forward *output*). Shader: `shaders/softmax.wgsl`; reference:
//! [`crate::reference::softmax`].
//!
//! One invocation per row (see the shader header for why); workgroups of [`ROW_WORKGROUP`].
//! Input and output may be the same range of the same buffer (each row is read before it is
//! written, by the invocation that owns it).

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{check_loop_limit, launch_1d, loop_passes, same_len};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// Workgroup size of every `softmax` entry point (`@workgroup_size(64)`: one row per invocation).
pub const ROW_WORKGROUP: u32 = 64;

/// The `softmax_forward` entry point.
pub const SOFTMAX_FORWARD: Kernel = kernel!("softmax", "softmax_forward", [x, y], ROW_WORKGROUP);

/// The `log_softmax_forward` entry point.
pub const LOG_SOFTMAX_FORWARD: Kernel =
    kernel!("softmax", "log_softmax_forward", [x, y], ROW_WORKGROUP);

/// The `softmax_backward` entry point.
pub const SOFTMAX_BACKWARD: Kernel = kernel!(
    "softmax",
    "softmax_backward",
    [y_saved, dy, dx],
    ROW_WORKGROUP
);

/// The `log_softmax_backward` entry point.
pub const LOG_SOFTMAX_BACKWARD: Kernel = kernel!(
    "softmax",
    "log_softmax_backward",
    [y_saved, dy, dx],
    ROW_WORKGROUP
);

/// Loop passes one invocation of any `softmax` entry point runs for rows of `cols` columns: two
/// unrolled column loops ([`crate::kernels::loop_passes`]; see "Loop limit on lavapipe" in
/// [`crate::kernels`]). The launchers refuse rows over the adapter's limit with
/// [`Error::LoopLimit`] (on lavapipe: `cols <= 262_071`).
pub const fn loop_iterations(cols: u64) -> u64 {
    2 * loop_passes(cols)
}

shader_params! {
    /// The `Params` of `softmax.wgsl` (shared by the four entry points).
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
}

/// Which of the two row normalisations a launch computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoftmaxKind {
    /// `softmax(x)_j = exp(x_j) / sum_k exp(x_k)`.
    Softmax,
    /// `log_softmax(x)_j = x_j - log sum_k exp(x_k)`.
    LogSoftmax,
}

/// Records `y = softmax(x)` (or `log_softmax(x)`) per row of the `[rows, cols]` matrices `x`
/// and `y`.
pub fn forward(
    gpu: &Gpu,
    kind: SoftmaxKind,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    let kernel = match kind {
        SoftmaxKind::Softmax => &SOFTMAX_FORWARD,
        SoftmaxKind::LogSoftmax => &LOG_SOFTMAX_FORWARD,
    };
    let op = kernel.entry;
    let len = checked_len(gpu, op, rows, cols)?;
    same_len(op, &[("y", y), ("x", x)])?;
    x.expect_len(op, "x", len)?;
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        x_offset: x.index(),
        y_offset: y.index(),
        ..Params::default()
    };
    launch_1d(gpu, kernel, &[], &params, &[x, y], rows.min(len))
}

/// Records the backward from the forward's *output* `y`, all `[rows, cols]`:
/// `dx = y * (dy - sum_j dy_j y_j)` for softmax, `dx = dy - exp(y) * sum_j dy_j` for
/// log-softmax.
pub fn backward(
    gpu: &Gpu,
    kind: SoftmaxKind,
    dx: DeviceSlice<'_>,
    y: DeviceSlice<'_>,
    dy: DeviceSlice<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    let kernel = match kind {
        SoftmaxKind::Softmax => &SOFTMAX_BACKWARD,
        SoftmaxKind::LogSoftmax => &LOG_SOFTMAX_BACKWARD,
    };
    let op = kernel.entry;
    let len = checked_len(gpu, op, rows, cols)?;
    same_len(op, &[("dx", dx), ("y", y), ("dy", dy)])?;
    y.expect_len(op, "y", len)?;
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        y_offset: y.index(),
        dy_offset: dy.index(),
        dx_offset: dx.index(),
        ..Params::default()
    };
    launch_1d(gpu, kernel, &[], &params, &[y, dy, dx], rows.min(len))
}

/// `rows * cols` after the loop-limit check, or an error naming `op` when it overflows.
fn checked_len(gpu: &Gpu, op: &'static str, rows: u64, cols: u64) -> Result<u64> {
    let len = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::InvalidArgument {
            op,
            message: format!("[{rows}, {cols}] has more than u64::MAX elements"),
        })?;
    if rows > 0 {
        check_loop_limit(gpu, op, "cols", cols, loop_iterations)?;
    }
    Ok(len)
}
