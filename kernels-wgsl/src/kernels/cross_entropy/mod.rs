//! `cross_entropy`: fused log-softmax + negative log-likelihood over `[rows, cols]` logits with
//! `u32` class targets and optional label smoothing. In one place: the shaders
//! (`cross_entropy.wgsl`, an invocation per row, and `cross_entropy_rows.wgsl`, a workgroup per
//! row; beside this file), the launchers, the CPU [`reference`](mod@reference) and the tests.
//!
//! Targets are *not* validated on the host: they live on the device, and checking them would
//! need a read-back that stalls the batch. A target `>= cols` makes that row's loss and all its
//! `dlogits` NaN (the shader never reads out of bounds): the loss is NaN, which the caller sees
//! in its read-back (the trainer's step refuses a non-finite loss).

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{RowLayout, check_loop_limit, launch_rows, row_lanes, row_layout};
use crate::pipeline::{Kernel, kernels, shader_params, shader_source};
use crate::slice::DeviceSlice;
use const_format::concatcp;

pub mod reference;
#[cfg(test)]
pub(crate) mod tests;

/// Workgroup size of both entry points (`@workgroup_size(64)`: one row per invocation).
pub const ROW_WORKGROUP: u32 = 64;

/// The invocation-per-row module: `cross_entropy.wgsl` and the helpers it calls.
const WGSL: &str = concatcp!(
    include_str!("cross_entropy.wgsl"),
    shader_source!("online_softmax", "indexing")
);

/// The workgroup-per-row module: `cross_entropy_rows.wgsl` and the helpers it calls.
const WGSL_ROWS: &str = concatcp!(
    include_str!("cross_entropy_rows.wgsl"),
    crate::kernels::softmax::ROWS_HELPERS
);

/// The subgroup-per-row module: `cross_entropy_rows.wgsl` placed a subgroup per row.
const WGSL_SUBGROUP: &str = concatcp!(
    include_str!("cross_entropy_rows.wgsl"),
    crate::kernels::softmax::SUBGROUP_HELPERS
);

kernels! {
    "cross_entropy", source: WGSL, workgroup: ROW_WORKGROUP;
    /// The `forward` entry point.
    FORWARD = "forward" [logits, targets: "array<u32>", losses];
    /// The `backward` entry point.
    BACKWARD = "backward" [logits, targets: "array<u32>", dloss, dlogits];
}

kernels! {
    "cross_entropy_rows", source: WGSL_ROWS, workgroup: ROW_WORKGROUP;
    /// `forward` with a workgroup per row (`cross_entropy_rows.wgsl`).
    FORWARD_ROWS = "forward_rows" [logits, targets: "array<u32>", losses];
    /// `backward` with a workgroup per row.
    BACKWARD_ROWS = "backward_rows" [logits, targets: "array<u32>", dloss, dlogits];
}

kernels! {
    "cross_entropy_subgroup", source: WGSL_SUBGROUP, workgroup: ROW_WORKGROUP;
    /// `forward` with a subgroup per row (`cross_entropy_rows.wgsl` placed by
    /// `row_subgroup.wgsl`).
    FORWARD_SUBGROUP = "forward_rows" [logits, targets: "array<u32>", losses];
    /// `backward` with a subgroup per row.
    BACKWARD_SUBGROUP = "backward_rows" [logits, targets: "array<u32>", dloss, dlogits];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    FORWARD,
    BACKWARD,
    FORWARD_ROWS,
    BACKWARD_ROWS,
    FORWARD_SUBGROUP,
    BACKWARD_SUBGROUP,
];

/// Loop passes one invocation of a workgroup-per-row entry point runs: two column loops of
/// `ceil(cols / 64)` passes and a tree of 6.
pub const fn loop_iterations_rows(cols: u64) -> u64 {
    2 * (cols.div_ceil(ROW_WORKGROUP as u64) + 1) + 7
}

/// Loop passes one invocation of [`forward`] or [`backward`] runs at most for rows of `cols`
/// classes: the same two unrolled column loops as softmax's (the row max, then the sum of
/// exponentials), so [`crate::kernels::softmax::loop_iterations`]. Both refuse more than the
/// adapter's limit with [`Error::LoopLimit`] (on lavapipe: `cols <= 262_071`).
pub const fn loop_iterations(cols: u64) -> u64 {
    crate::kernels::softmax::loop_iterations(cols)
}

shader_params! {
    /// The `Params` of `cross_entropy.wgsl` (shared by both entry points).
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
}

/// The shape and smoothing of a cross-entropy launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropyDims {
    /// Rows (samples).
    pub rows: u64,
    /// Classes.
    pub cols: u64,
    /// Label smoothing `eps` in `[0, 1]` (PyTorch's `label_smoothing`).
    pub smoothing: f32,
}

/// Checks the dimensions and the slices shared by both entry points; returns `rows * cols`.
fn check_common(
    gpu: &Gpu,
    op: &'static str,
    layout: RowLayout,
    dims: &CrossEntropyDims,
    logits: DeviceSlice<'_>,
    targets: DeviceSlice<'_>,
) -> Result<u64> {
    let CrossEntropyDims {
        rows,
        cols,
        smoothing,
    } = *dims;
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
    let lanes = row_lanes(gpu, op, layout)?;
    if rows > 0 {
        let passes: &dyn Fn(u64) -> u64 = match layout {
            RowLayout::InvocationPerRow => &loop_iterations,
            RowLayout::WorkgroupPerRow => &loop_iterations_rows,
            RowLayout::SubgroupPerRow => {
                &|c| crate::kernels::softmax::loop_iterations_subgroup(c, lanes)
            }
        };
        check_loop_limit(gpu, op, "cols", cols, passes)?;
    }
    logits.expect_len(op, "logits", len)?;
    targets.expect_len(op, "targets", rows)?;
    Ok(len)
}

/// Records `losses[r] = (1 - eps)(lse_r - x[r, t_r]) + eps (lse_r - mean_j x[r, j])` for the
/// `[rows, cols]` f32 `logits` and `[rows]` u32 `targets`, into `[rows]` f32 `losses`. Per-row
/// losses: a mean loss is a reduction on top. An out-of-range target gives NaN (module docs).
pub fn forward(
    gpu: &Gpu,
    dims: &CrossEntropyDims,
    losses: DeviceSlice<'_>,
    logits: DeviceSlice<'_>,
    targets: DeviceSlice<'_>,
) -> Result<()> {
    let layout = row_layout(gpu, dims.rows, dims.cols);
    forward_in(gpu, layout, dims, losses, [logits, targets])
}

/// [`forward`] in the given layout (for tests and benchmarks); `[logits, targets]`.
pub fn forward_in(
    gpu: &Gpu,
    layout: RowLayout,
    dims: &CrossEntropyDims,
    losses: DeviceSlice<'_>,
    [logits, targets]: [DeviceSlice<'_>; 2],
) -> Result<()> {
    let op = "cross_entropy::forward";
    let len = check_common(gpu, op, layout, dims, logits, targets)?;
    losses.expect_len(op, "losses", dims.rows)?;
    let c = dims.cols as u32;
    let params = |first: u32, count: u32| Params {
        rows: count,
        cols: c,
        smoothing: dims.smoothing,
        logits_offset: logits.index() + first * c,
        targets_offset: targets.index() + first,
        losses_offset: losses.index() + first,
        ..Params::default()
    };
    let buffers = [logits, targets, losses];
    let kernel = match layout {
        RowLayout::InvocationPerRow => &FORWARD,
        RowLayout::WorkgroupPerRow => &FORWARD_ROWS,
        RowLayout::SubgroupPerRow => &FORWARD_SUBGROUP,
    };
    launch_rows(gpu, layout, kernel, &buffers, [dims.rows.min(len), 1], params)
}

/// Records `dlogits[r, j] = (softmax(x_r)_j - q_j) * dloss[r or 0] * scale`, with
/// `q = (1 - eps) onehot(t_r) + eps / cols`. `dloss` holds one value (the gradient of a reduced
/// loss, used for every row) or `rows` values (one per row loss). `scale` is `1 / rows` for a
/// mean reduction of the loss, 1 for a sum. An out-of-range target gives a row of NaN (module
/// docs).
pub fn backward(
    gpu: &Gpu,
    dims: &CrossEntropyDims,
    dlogits: DeviceSlice<'_>,
    logits: DeviceSlice<'_>,
    targets: DeviceSlice<'_>,
    dloss: DeviceSlice<'_>,
    scale: f32,
) -> Result<()> {
    let layout = row_layout(gpu, dims.rows, dims.cols);
    backward_in(gpu, layout, dims, dlogits, [logits, targets, dloss], scale)
}

/// [`backward`] in the given layout (for tests and benchmarks); `[logits, targets, dloss]`.
pub fn backward_in(
    gpu: &Gpu,
    layout: RowLayout,
    dims: &CrossEntropyDims,
    dlogits: DeviceSlice<'_>,
    [logits, targets, dloss]: [DeviceSlice<'_>; 3],
    scale: f32,
) -> Result<()> {
    let op = "cross_entropy::backward";
    let len = check_common(gpu, op, layout, dims, logits, targets)?;
    let dloss_stride = match dloss.len() {
        n if n == dims.rows => 1,
        1 => 0,
        n => {
            return Err(Error::InvalidArgument {
                op,
                message: format!(
                    "dloss: {n} elements given ({dloss:?}); 1 (a reduced loss) or rows = {} \
                     (per-row losses) needed",
                    dims.rows
                ),
            });
        }
    };
    dlogits.expect_len(op, "dlogits", len)?;
    let c = dims.cols as u32;
    let params = |first: u32, count: u32| Params {
        rows: count,
        cols: c,
        dloss_stride,
        smoothing: dims.smoothing,
        scale,
        logits_offset: logits.index() + first * c,
        targets_offset: targets.index() + first,
        dloss_offset: dloss.index() + first * dloss_stride,
        dlogits_offset: dlogits.index() + first * c,
        ..Params::default()
    };
    let buffers = [logits, targets, dloss, dlogits];
    let kernel = match layout {
        RowLayout::InvocationPerRow => &BACKWARD,
        RowLayout::WorkgroupPerRow => &BACKWARD_ROWS,
        RowLayout::SubgroupPerRow => &BACKWARD_SUBGROUP,
    };
    launch_rows(gpu, layout, kernel, &buffers, [dims.rows.min(len), 1], params)
}
