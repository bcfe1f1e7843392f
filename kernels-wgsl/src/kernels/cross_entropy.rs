//! `cross_entropy`: fused log-softmax + negative log-likelihood over `[rows, cols]` logits with
//! `u32` class targets and optional label smoothing. Shader: `shaders/cross_entropy.wgsl`;
//! reference: [`crate::reference::cross_entropy`].
//!
//! Targets are *not* validated on the host: they live on the device, and checking them would
//! need a read-back that stalls the batch. A target `>= cols` makes that row's loss and all its
//! `dlogits` NaN (the shader never reads out of bounds); the `nonfinite` check reports it.

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{check_loop_limit, check_range, grid_1d, loop_passes, segment_index};
use crate::pipeline::Kernel;
use crate::recorder::Dispatch;

/// Workgroup size of both entry points (`@workgroup_size(64)`: one row per invocation).
pub const ROW_WORKGROUP: u32 = 64;

/// The `forward` entry point.
pub const FORWARD: Kernel = Kernel {
    stem: "cross_entropy",
    wgsl: include_str!("../../shaders/cross_entropy.wgsl"),
    entry: "forward",
    storage_bindings: 3,
    runtime_checks: crate::pipeline::RuntimeChecks::ON,
};

/// The `backward` entry point.
pub const BACKWARD: Kernel = Kernel {
    entry: "backward",
    storage_bindings: 4,
    ..FORWARD
};

/// Loop passes one invocation of [`forward`] or [`backward`] runs at most for rows of `cols`
/// classes: two unrolled column loops ([`crate::kernels::loop_passes`]; see "Loop limit on
/// lavapipe" in [`crate::kernels`]). Both refuse more than the adapter's limit with
/// [`Error::LoopLimit`] (on lavapipe: `cols <= 262_071`).
pub const fn loop_iterations(cols: u64) -> u64 {
    2 * loop_passes(cols)
}

/// Mirrors `Params` in `cross_entropy.wgsl` (shared by both entry points).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    dloss_stride: u32,
    smoothing: f32,
    scale: f32,
    logits_offset: u32,
    targets_offset: u32,
    losses_offset: u32,
    dloss_offset: u32,
    dlogits_offset: u32,
    _pad0: u32,
    _pad1: u32,
}

/// The buffers of [`forward`], each from its element offset.
#[derive(Debug, Clone, Copy)]
pub struct CrossEntropyForwardBuffers<'a> {
    /// `[rows, cols]` f32 logits.
    pub logits: &'a DeviceBuffer,
    /// Element offset of `logits`.
    pub logits_offset: u64,
    /// `[rows]` u32 class indices.
    pub targets: &'a DeviceBuffer,
    /// Element offset of `targets`.
    pub targets_offset: u64,
    /// `[rows]` f32 per-row losses, written.
    pub losses: &'a DeviceBuffer,
    /// Element offset of `losses`.
    pub losses_offset: u64,
}

/// What the loss gradient `dloss` of [`backward`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossGradient {
    /// One value (the gradient of a reduced loss, e.g. 1.0 from `backward()`), used for every row.
    Broadcast,
    /// `[rows]` values, one per row loss.
    PerRow,
}

/// The buffers of [`backward`], each from its element offset.
#[derive(Debug, Clone, Copy)]
pub struct CrossEntropyBackwardBuffers<'a> {
    /// `[rows, cols]` f32 logits (the forward's input).
    pub logits: &'a DeviceBuffer,
    /// Element offset of `logits`.
    pub logits_offset: u64,
    /// `[rows]` u32 class indices.
    pub targets: &'a DeviceBuffer,
    /// Element offset of `targets`.
    pub targets_offset: u64,
    /// f32 gradient of the loss: 1 or `[rows]` values, see [`LossGradient`].
    pub dloss: &'a DeviceBuffer,
    /// Element offset of `dloss`.
    pub dloss_offset: u64,
    /// `[rows, cols]` f32 gradient of the logits, written (=).
    pub dlogits: &'a DeviceBuffer,
    /// Element offset of `dlogits`.
    pub dlogits_offset: u64,
}

/// Checks the dimensions and the ranges shared by both entry points; returns `rows * cols`.
fn check_common(
    gpu: &Gpu,
    op: &'static str,
    logits: (&DeviceBuffer, u64),
    targets: (&DeviceBuffer, u64),
    rows: u64,
    cols: u64,
    smoothing: f32,
) -> Result<u64> {
    let invalid = |message: String| Error::InvalidArgument { op, message };
    if rows > 0 && cols == 0 {
        return Err(invalid(format!(
            "{rows} rows of 0 classes: cross-entropy needs at least one class"
        )));
    }
    if !(0.0..=1.0).contains(&smoothing) {
        return Err(invalid(format!(
            "label smoothing {smoothing} outside [0, 1]"
        )));
    }
    let len = rows
        .checked_mul(cols)
        .ok_or_else(|| invalid(format!("[{rows}, {cols}] has more than u64::MAX elements")))?;
    if rows > 0 {
        check_loop_limit(gpu, op, "cols", cols, loop_iterations)?;
    }
    check_range(op, "logits", logits.0, logits.1, len)?;
    check_range(op, "targets", targets.0, targets.1, rows)?;
    Ok(len)
}

/// Records `losses[r] = (1 - eps)(lse_r - x[r, t_r]) + eps (lse_r - mean_j x[r, j])` for the
/// `[rows, cols]` logits, `eps = smoothing` in `[0, 1]` (PyTorch's `label_smoothing`). Per-row
/// losses: a mean loss is a reduction on top. An out-of-range target gives NaN (module docs).
pub fn forward(
    gpu: &Gpu,
    b: &CrossEntropyForwardBuffers<'_>,
    rows: u64,
    cols: u64,
    smoothing: f32,
) -> Result<()> {
    let op = "cross_entropy::forward";
    let len = check_common(
        gpu,
        op,
        (b.logits, b.logits_offset),
        (b.targets, b.targets_offset),
        rows,
        cols,
        smoothing,
    )?;
    check_range(op, "losses", b.losses, b.losses_offset, rows)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        smoothing,
        logits_offset: segment_index(b.logits, b.logits_offset),
        targets_offset: segment_index(b.targets, b.targets_offset),
        losses_offset: segment_index(b.losses, b.losses_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel: &FORWARD,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[b.logits, b.targets, b.losses],
        workgroups: grid_1d(gpu, rows, ROW_WORKGROUP)?,
    })
}

/// Records `dlogits[r, j] = (softmax(x_r)_j - q_j) * dloss[r or 0] * scale`, with
/// `q = (1 - eps) onehot(t_r) + eps / cols`. `scale` is `1 / rows` for a mean reduction of the
/// loss, 1 for a sum. An out-of-range target gives a row of NaN (module docs).
pub fn backward(
    gpu: &Gpu,
    b: &CrossEntropyBackwardBuffers<'_>,
    rows: u64,
    cols: u64,
    smoothing: f32,
    dloss: LossGradient,
    scale: f32,
) -> Result<()> {
    let op = "cross_entropy::backward";
    let len = check_common(
        gpu,
        op,
        (b.logits, b.logits_offset),
        (b.targets, b.targets_offset),
        rows,
        cols,
        smoothing,
    )?;
    let (dloss_len, dloss_stride) = match dloss {
        LossGradient::Broadcast => (1, 0),
        LossGradient::PerRow => (rows, 1),
    };
    check_range(op, "dloss", b.dloss, b.dloss_offset, dloss_len)?;
    check_range(op, "dlogits", b.dlogits, b.dlogits_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        dloss_stride,
        smoothing,
        scale,
        logits_offset: segment_index(b.logits, b.logits_offset),
        targets_offset: segment_index(b.targets, b.targets_offset),
        dloss_offset: segment_index(b.dloss, b.dloss_offset),
        dlogits_offset: segment_index(b.dlogits, b.dlogits_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel: &BACKWARD,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[b.logits, b.targets, b.dloss, b.dlogits],
        workgroups: grid_1d(gpu, rows, ROW_WORKGROUP)?,
    })
}
