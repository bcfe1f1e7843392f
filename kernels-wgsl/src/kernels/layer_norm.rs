//! `layer_norm` over the last axis of a row-major `[rows, cols]` matrix, as PyTorch's
//! `nn.LayerNorm(cols, eps)` (biased variance, per-column `gamma`, `beta`). Shader:
//! `shaders/layer_norm.wgsl`; reference: [`crate::reference::layer_norm`].
//!
//! [`forward`] also writes each row's mean and `rstd = 1/sqrt(var + eps)` for the backward.
//! [`backward`] records two dispatches: `dx` (one invocation per row) and `dgamma`, `dbeta` (one
//! per column, looping over the rows in order: deterministic, no atomics). All gradients are
//! written (=), not accumulated.

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{check_loop_limit, check_range, grid_1d, loop_passes, segment_index};
use crate::pipeline::Kernel;
use crate::recorder::Dispatch;

/// Workgroup size of every entry point (`@workgroup_size(64)`: each invocation loops over a whole
/// row or column).
pub const WORKGROUP: u32 = 64;

/// The `forward` entry point.
pub const FORWARD: Kernel = Kernel {
    stem: "layer_norm",
    wgsl: include_str!("../../shaders/layer_norm.wgsl"),
    entry: "forward",
    storage_bindings: 6,
    runtime_checks: crate::pipeline::RuntimeChecks::ON,
};

/// The `backward_input` entry point (`dx`).
pub const BACKWARD_INPUT: Kernel = Kernel {
    entry: "backward_input",
    ..FORWARD
};

/// The `backward_params` entry point (`dgamma`, `dbeta`).
pub const BACKWARD_PARAMS: Kernel = Kernel {
    entry: "backward_params",
    ..FORWARD
};

/// Loop passes one invocation of `forward` or `backward_input` (one row each) runs at most for
/// rows of `cols` columns: three unrolled column loops ([`crate::kernels::loop_passes`]; see
/// "Loop limit on lavapipe" in [`crate::kernels`]). On lavapipe: `cols <= 174_695`.
pub const fn row_loop_iterations(cols: u64) -> u64 {
    3 * loop_passes(cols)
}

/// Loop passes one invocation of `backward_params` (one column, summing over the rows) runs for
/// `rows` rows. On lavapipe: `rows <= 524_215`.
pub const fn column_loop_iterations(rows: u64) -> u64 {
    loop_passes(rows)
}

/// Mirrors `Params` in `layer_norm.wgsl` (shared by the three entry points).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    x_offset: u32,
    gamma_offset: u32,
    beta_offset: u32,
    y_offset: u32,
    mean_offset: u32,
    rstd_offset: u32,
    dy_offset: u32,
    dx_offset: u32,
    dgamma_offset: u32,
    dbeta_offset: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

/// The buffers of [`forward`], each from its element offset (all f32).
#[derive(Debug, Clone, Copy)]
pub struct LayerNormBuffers<'a> {
    /// `[rows, cols]` input.
    pub x: &'a DeviceBuffer,
    /// Element offset of `x`.
    pub x_offset: u64,
    /// `[cols]` scale.
    pub gamma: &'a DeviceBuffer,
    /// Element offset of `gamma`.
    pub gamma_offset: u64,
    /// `[cols]` shift.
    pub beta: &'a DeviceBuffer,
    /// Element offset of `beta`.
    pub beta_offset: u64,
    /// `[rows, cols]` output, written.
    pub y: &'a DeviceBuffer,
    /// Element offset of `y`.
    pub y_offset: u64,
    /// `[rows]` row means, written (saved for the backward).
    pub mean: &'a DeviceBuffer,
    /// Element offset of `mean`.
    pub mean_offset: u64,
    /// `[rows]` `1/sqrt(var + eps)`, written (saved for the backward).
    pub rstd: &'a DeviceBuffer,
    /// Element offset of `rstd`.
    pub rstd_offset: u64,
}

/// The buffers of [`backward`], each from its element offset (all f32).
#[derive(Debug, Clone, Copy)]
pub struct LayerNormGradBuffers<'a> {
    /// `[rows, cols]` forward input.
    pub x: &'a DeviceBuffer,
    /// Element offset of `x`.
    pub x_offset: u64,
    /// `[cols]` scale.
    pub gamma: &'a DeviceBuffer,
    /// Element offset of `gamma`.
    pub gamma_offset: u64,
    /// `[rows]` row means saved by [`forward`].
    pub mean: &'a DeviceBuffer,
    /// Element offset of `mean`.
    pub mean_offset: u64,
    /// `[rows]` `rstd` saved by [`forward`].
    pub rstd: &'a DeviceBuffer,
    /// Element offset of `rstd`.
    pub rstd_offset: u64,
    /// `[rows, cols]` gradient of the output.
    pub dy: &'a DeviceBuffer,
    /// Element offset of `dy`.
    pub dy_offset: u64,
    /// `[rows, cols]` gradient of `x`, written (=).
    pub dx: &'a DeviceBuffer,
    /// Element offset of `dx`.
    pub dx_offset: u64,
    /// `[cols]` gradient of `gamma`, written (=).
    pub dgamma: &'a DeviceBuffer,
    /// Element offset of `dgamma`.
    pub dgamma_offset: u64,
    /// `[cols]` gradient of `beta`, written (=).
    pub dbeta: &'a DeviceBuffer,
    /// Element offset of `dbeta`.
    pub dbeta_offset: u64,
}

/// Checks the dimensions; returns `rows * cols`.
fn matrix_len(op: &'static str, rows: u64, cols: u64) -> Result<u64> {
    let invalid = |message: String| Error::InvalidArgument { op, message };
    if rows > 0 && cols == 0 {
        return Err(invalid(format!(
            "{rows} rows of 0 columns: a row's mean and variance need at least one column"
        )));
    }
    rows.checked_mul(cols)
        .ok_or_else(|| invalid(format!("[{rows}, {cols}] has more than u64::MAX elements")))
}

/// Records `y = (x - mean_r) * rstd_r * gamma + beta` per row of the `[rows, cols]` input, and
/// writes `mean`, `rstd` (`rstd_r = 1/sqrt(var_r + eps)`, biased variance).
pub fn forward(gpu: &Gpu, b: &LayerNormBuffers<'_>, rows: u64, cols: u64, eps: f32) -> Result<()> {
    let op = "layer_norm::forward";
    let len = matrix_len(op, rows, cols)?;
    if rows > 0 {
        check_loop_limit(gpu, op, "cols", cols, row_loop_iterations)?;
    }
    check_range(op, "x", b.x, b.x_offset, len)?;
    check_range(op, "gamma", b.gamma, b.gamma_offset, cols)?;
    check_range(op, "beta", b.beta, b.beta_offset, cols)?;
    check_range(op, "y", b.y, b.y_offset, len)?;
    check_range(op, "mean", b.mean, b.mean_offset, rows)?;
    check_range(op, "rstd", b.rstd, b.rstd_offset, rows)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        eps,
        x_offset: segment_index(b.x, b.x_offset),
        gamma_offset: segment_index(b.gamma, b.gamma_offset),
        beta_offset: segment_index(b.beta, b.beta_offset),
        y_offset: segment_index(b.y, b.y_offset),
        mean_offset: segment_index(b.mean, b.mean_offset),
        rstd_offset: segment_index(b.rstd, b.rstd_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel: &FORWARD,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[b.x, b.gamma, b.beta, b.y, b.mean, b.rstd],
        workgroups: grid_1d(gpu, rows, WORKGROUP)?,
    })
}

/// Records the backward: with `xhat = (x - mean) rstd` and `g = dy * gamma`,
/// `dx = rstd (g - mean_j g - xhat mean_j(g xhat))`, `dgamma = sum_r dy xhat`,
/// `dbeta = sum_r dy` (two dispatches).
pub fn backward(gpu: &Gpu, b: &LayerNormGradBuffers<'_>, rows: u64, cols: u64) -> Result<()> {
    let op = "layer_norm::backward";
    let len = matrix_len(op, rows, cols)?;
    if rows > 0 {
        check_loop_limit(gpu, op, "cols", cols, row_loop_iterations)?;
    }
    if cols > 0 {
        check_loop_limit(gpu, op, "rows", rows, column_loop_iterations)?;
    }
    check_range(op, "x", b.x, b.x_offset, len)?;
    check_range(op, "gamma", b.gamma, b.gamma_offset, cols)?;
    check_range(op, "mean", b.mean, b.mean_offset, rows)?;
    check_range(op, "rstd", b.rstd, b.rstd_offset, rows)?;
    check_range(op, "dy", b.dy, b.dy_offset, len)?;
    check_range(op, "dx", b.dx, b.dx_offset, len)?;
    check_range(op, "dgamma", b.dgamma, b.dgamma_offset, cols)?;
    check_range(op, "dbeta", b.dbeta, b.dbeta_offset, cols)?;
    if cols == 0 {
        return Ok(());
    }
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        x_offset: segment_index(b.x, b.x_offset),
        gamma_offset: segment_index(b.gamma, b.gamma_offset),
        mean_offset: segment_index(b.mean, b.mean_offset),
        rstd_offset: segment_index(b.rstd, b.rstd_offset),
        dy_offset: segment_index(b.dy, b.dy_offset),
        dx_offset: segment_index(b.dx, b.dx_offset),
        dgamma_offset: segment_index(b.dgamma, b.dgamma_offset),
        dbeta_offset: segment_index(b.dbeta, b.dbeta_offset),
        ..Params::default()
    };
    if rows > 0 {
        gpu.dispatch(Dispatch {
            kernel: &BACKWARD_INPUT,
            overrides: &[],
            params: bytemuck::bytes_of(&params),
            buffers: &[b.x, b.gamma, b.mean, b.rstd, b.dy, b.dx],
            workgroups: grid_1d(gpu, rows, WORKGROUP)?,
        })?;
    }
    // With rows == 0 this writes dgamma = dbeta = 0 (empty sums), as the reference does.
    gpu.dispatch(Dispatch {
        kernel: &BACKWARD_PARAMS,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[b.x, b.mean, b.rstd, b.dy, b.dgamma, b.dbeta],
        workgroups: grid_1d(gpu, cols, WORKGROUP)?,
    })
}
