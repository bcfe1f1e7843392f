//! `softmax`: softmax and log-softmax over the last axis of a row-major `[rows, cols]` matrix,
//! and their backwards (from the forward *output*). In one place: the shaders (`softmax.wgsl`, an
//! invocation per row, and `softmax_rows.wgsl`, a workgroup per row; beside this file), the
//! launchers, the CPU [`reference`](mod@reference) and the tests.
//!
//! One invocation per row (see the shader header for why); workgroups of [`ROW_WORKGROUP`].
//! Input and output may be the same range of the same buffer (each row is read before it is
//! written, by the invocation that owns it).

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{check_loop_limit, launch_rows, loop_passes, row_lanes, same_len};
use crate::pipeline::{Kernel, kernels, shader_params, shader_source};
use crate::slice::DeviceSlice;
use const_format::concatcp;

pub mod reference;
#[cfg(test)]
pub(crate) mod tests;

/// Workgroup size of every `softmax` entry point (`@workgroup_size(64)`).
pub use crate::kernels::ROW_WORKGROUP;

/// The invocation-per-row module: `softmax.wgsl`, its causal mask and the helpers it calls.
const WGSL: &str = concatcp!(
    include_str!("softmax.wgsl"),
    include_str!("softmax_mask.wgsl"),
    shader_source!("online_softmax", "indexing")
);

/// The workgroup-per-row module: `softmax_rows.wgsl`, the causal mask and the helpers it calls.
const WGSL_ROWS: &str = concatcp!(
    include_str!("softmax_rows.wgsl"),
    include_str!("softmax_mask.wgsl"),
    ROWS_HELPERS
);

/// The subgroup-per-row module: `softmax_rows.wgsl` placed a subgroup per row, the causal
/// mask and the helpers it calls.
const WGSL_SUBGROUP: &str = concatcp!(
    include_str!("softmax_rows.wgsl"),
    include_str!("softmax_mask.wgsl"),
    SUBGROUP_HELPERS
);

/// The shared helpers a workgroup-per-row kernel calls (this family's, `cross_entropy`'s and
/// `layer_norm`'s): its placement, the sums and online-softmax statistics combined over the
/// workgroup's tree.
pub(crate) const ROWS_HELPERS: &str = shader_source!(
    "online_softmax",
    "workgroup_reduce",
    "workgroup_softmax",
    "row_workgroup",
    "indexing"
);

/// The shared helpers a subgroup-per-row kernel calls (this family's, `cross_entropy`'s and
/// `layer_norm`'s): its placement, the sums and online-softmax statistics combined by subgroup
/// operations.
pub(crate) const SUBGROUP_HELPERS: &str =
    shader_source!("online_softmax", "row_subgroup", "indexing");

kernels! {
    "softmax", source: WGSL, workgroup: ROW_WORKGROUP;
    /// The `softmax_forward` entry point.
    SOFTMAX_FORWARD = "softmax_forward" [x, y];
    /// The `log_softmax_forward` entry point.
    LOG_SOFTMAX_FORWARD = "log_softmax_forward" [x, y];
    /// The `softmax_backward` entry point.
    SOFTMAX_BACKWARD = "softmax_backward" [y_saved, dy, dx];
    /// The `log_softmax_backward` entry point.
    LOG_SOFTMAX_BACKWARD = "log_softmax_backward" [y_saved, dy, dx];
}

kernels! {
    "softmax_rows", source: WGSL_ROWS, workgroup: ROW_WORKGROUP;
    /// The workgroup-per-row entry points (`softmax_rows.wgsl`, same bindings).
    SOFTMAX_FORWARD_ROWS = "softmax_forward_rows" [x, y];
    /// Log-softmax forward, a workgroup per row.
    LOG_SOFTMAX_FORWARD_ROWS = "log_softmax_forward_rows" [x, y];
    /// Softmax backward, a workgroup per row.
    SOFTMAX_BACKWARD_ROWS = "softmax_backward_rows" [y_saved, dy, dx];
    /// Log-softmax backward, a workgroup per row.
    LOG_SOFTMAX_BACKWARD_ROWS = "log_softmax_backward_rows" [y_saved, dy, dx];
}

kernels! {
    "softmax_subgroup", source: WGSL_SUBGROUP, workgroup: ROW_WORKGROUP;
    /// The subgroup-per-row entry points (`softmax_rows.wgsl` placed by
    /// `row_subgroup.wgsl`, same bindings).
    SOFTMAX_FORWARD_SUBGROUP = "softmax_forward_rows" [x, y];
    /// Log-softmax forward, a subgroup per row.
    LOG_SOFTMAX_FORWARD_SUBGROUP = "log_softmax_forward_rows" [x, y];
    /// Softmax backward, a subgroup per row.
    SOFTMAX_BACKWARD_SUBGROUP = "softmax_backward_rows" [y_saved, dy, dx];
    /// Log-softmax backward, a subgroup per row.
    LOG_SOFTMAX_BACKWARD_SUBGROUP = "log_softmax_backward_rows" [y_saved, dy, dx];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    SOFTMAX_FORWARD,
    LOG_SOFTMAX_FORWARD,
    SOFTMAX_BACKWARD,
    LOG_SOFTMAX_BACKWARD,
    SOFTMAX_FORWARD_ROWS,
    LOG_SOFTMAX_FORWARD_ROWS,
    SOFTMAX_BACKWARD_ROWS,
    LOG_SOFTMAX_BACKWARD_ROWS,
    SOFTMAX_FORWARD_SUBGROUP,
    LOG_SOFTMAX_FORWARD_SUBGROUP,
    SOFTMAX_BACKWARD_SUBGROUP,
    LOG_SOFTMAX_BACKWARD_SUBGROUP,
];

pub use crate::kernels::{GPU_INVOCATION_PER_ROW_MIN_ROWS, RowLayout, row_layout};

/// Loop passes one invocation of any `softmax` entry point runs for rows of `cols` columns: two
/// unrolled column loops ([`crate::kernels::loop_passes`]; see "Loop limit on lavapipe" in
/// [`crate::kernels`]). The launchers refuse rows over the adapter's limit with
/// [`Error::LoopLimit`] (on lavapipe: `cols <= 262_071`).
pub const fn loop_iterations(cols: u64) -> u64 {
    2 * loop_passes(cols)
}

/// Loop passes one invocation of a workgroup-per-row entry point runs: two column loops of
/// `ceil(cols / 64)` passes and two trees of 6.
pub const fn loop_iterations_rows(cols: u64) -> u64 {
    2 * (cols.div_ceil(ROW_WORKGROUP as u64) + 1) + 2 * 7
}

/// Loop passes one lane of a subgroup-per-row entry point runs, its subgroup `lanes` wide: two
/// column loops of `ceil(cols / lanes)` passes.
pub const fn loop_iterations_subgroup(cols: u64, lanes: u64) -> u64 {
    2 * (cols.div_ceil(lanes) + 1)
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
        causal: u32,
        _pad0: u32,
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
/// and `y`, in the layout [`row_layout`] picks.
pub fn forward(
    gpu: &Gpu,
    kind: SoftmaxKind,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    forward_in(gpu, row_layout(gpu, rows, cols), kind, y, x, rows, cols)
}

/// [`forward`] in the given layout (for tests and benchmarks that compare the two).
pub fn forward_in(
    gpu: &Gpu,
    layout: RowLayout,
    kind: SoftmaxKind,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    launch_forward(gpu, layout, kind, [y, x], [rows, cols], 0)
}

/// Records the causal softmax of `[rows, cols]` attention scores `x` (rows of `[.., T, T]`
/// scores, `T = cols`: row `r` is query position `r % T`) into `y`: `y[r, j] = softmax over
/// j' <= r % T of x[r, j']` for `j <= r % T` and 0 after, in the layout [`row_layout`] picks.
/// The same values as adding a mask of `-1e9` above the diagonal and then [`forward`] (the
/// masked terms' exponentials are 0 either way), in one pass and without the mask. Its backward
/// is [`backward`]'s softmax one (the zeros stay zero).
pub fn forward_causal(
    gpu: &Gpu,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    forward_causal_in(gpu, row_layout(gpu, rows, cols), y, x, rows, cols)
}

/// [`forward_causal`] in the given layout.
pub fn forward_causal_in(
    gpu: &Gpu,
    layout: RowLayout,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    // cols fits u32 once checked_len has passed (launch_forward checks before dispatching).
    let period = u32::try_from(cols).unwrap_or(u32::MAX);
    launch_forward(
        gpu,
        layout,
        SoftmaxKind::Softmax,
        [y, x],
        [rows, cols],
        period,
    )
}

/// Validates and records a forward; `causal` is the mask's period (0: none).
fn launch_forward(
    gpu: &Gpu,
    layout: RowLayout,
    kind: SoftmaxKind,
    [y, x]: [DeviceSlice<'_>; 2],
    [rows, cols]: [u64; 2],
    causal: u32,
) -> Result<()> {
    let kernel = match (layout, kind) {
        (RowLayout::InvocationPerRow, SoftmaxKind::Softmax) => &SOFTMAX_FORWARD,
        (RowLayout::InvocationPerRow, SoftmaxKind::LogSoftmax) => &LOG_SOFTMAX_FORWARD,
        (RowLayout::WorkgroupPerRow, SoftmaxKind::Softmax) => &SOFTMAX_FORWARD_ROWS,
        (RowLayout::WorkgroupPerRow, SoftmaxKind::LogSoftmax) => &LOG_SOFTMAX_FORWARD_ROWS,
        (RowLayout::SubgroupPerRow, SoftmaxKind::Softmax) => &SOFTMAX_FORWARD_SUBGROUP,
        (RowLayout::SubgroupPerRow, SoftmaxKind::LogSoftmax) => &LOG_SOFTMAX_FORWARD_SUBGROUP,
    };
    let op = kernel.entry;
    let len = checked_len(gpu, op, layout, rows, cols)?;
    same_len(op, &[("y", y), ("x", x)])?;
    x.expect_len(op, "x", len)?;
    let c = cols as u32;
    let period = u64::from(causal);
    launch_rows(gpu, layout, kernel, &[x, y], [rows.min(len), period], |first, count| Params {
        rows: count,
        cols: c,
        x_offset: x.index() + first * c,
        y_offset: y.index() + first * c,
        causal,
        ..Params::default()
    })
}

/// Records the backward from the forward's *output* `y`, all `[rows, cols]`:
/// `dx = y * (dy - sum_j dy_j y_j)` for softmax, `dx = dy - exp(y) * sum_j dy_j` for
/// log-softmax, in the layout [`row_layout`] picks.
pub fn backward(
    gpu: &Gpu,
    kind: SoftmaxKind,
    dx: DeviceSlice<'_>,
    y: DeviceSlice<'_>,
    dy: DeviceSlice<'_>,
    rows: u64,
    cols: u64,
) -> Result<()> {
    backward_in(
        gpu,
        row_layout(gpu, rows, cols),
        kind,
        [dx, y, dy],
        rows,
        cols,
    )
}

/// [`backward`] in the given layout; `[dx, y, dy]`.
pub fn backward_in(
    gpu: &Gpu,
    layout: RowLayout,
    kind: SoftmaxKind,
    [dx, y, dy]: [DeviceSlice<'_>; 3],
    rows: u64,
    cols: u64,
) -> Result<()> {
    let kernel = match (layout, kind) {
        (RowLayout::InvocationPerRow, SoftmaxKind::Softmax) => &SOFTMAX_BACKWARD,
        (RowLayout::InvocationPerRow, SoftmaxKind::LogSoftmax) => &LOG_SOFTMAX_BACKWARD,
        (RowLayout::WorkgroupPerRow, SoftmaxKind::Softmax) => &SOFTMAX_BACKWARD_ROWS,
        (RowLayout::WorkgroupPerRow, SoftmaxKind::LogSoftmax) => &LOG_SOFTMAX_BACKWARD_ROWS,
        (RowLayout::SubgroupPerRow, SoftmaxKind::Softmax) => &SOFTMAX_BACKWARD_SUBGROUP,
        (RowLayout::SubgroupPerRow, SoftmaxKind::LogSoftmax) => &LOG_SOFTMAX_BACKWARD_SUBGROUP,
    };
    let op = kernel.entry;
    let len = checked_len(gpu, op, layout, rows, cols)?;
    same_len(op, &[("dx", dx), ("y", y), ("dy", dy)])?;
    y.expect_len(op, "y", len)?;
    let c = cols as u32;
    launch_rows(gpu, layout, kernel, &[y, dy, dx], [rows.min(len), 1], |first, count| Params {
        rows: count,
        cols: c,
        y_offset: y.index() + first * c,
        dy_offset: dy.index() + first * c,
        dx_offset: dx.index() + first * c,
        ..Params::default()
    })
}

/// `rows * cols` after the loop-limit check, or an error naming `op` when it overflows.
fn checked_len(
    gpu: &Gpu,
    op: &'static str,
    layout: RowLayout,
    rows: u64,
    cols: u64,
) -> Result<u64> {
    let len = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::InvalidArgument {
            op,
            message: format!("[{rows}, {cols}] has more than u64::MAX elements"),
        })?;
    let lanes = row_lanes(gpu, op, layout)?;
    if rows > 0 {
        let passes: &dyn Fn(u64) -> u64 = match layout {
            RowLayout::InvocationPerRow => &loop_iterations,
            RowLayout::WorkgroupPerRow => &loop_iterations_rows,
            RowLayout::SubgroupPerRow => &|c| loop_iterations_subgroup(c, lanes),
        };
        check_loop_limit(gpu, op, "cols", cols, passes)?;
    }
    Ok(len)
}
