//! `layer_norm` over the last axis of a row-major `[rows, cols]` matrix, as PyTorch's
//! `nn.LayerNorm(cols, eps)` (biased variance, per-column `gamma`, `beta`), or with
//! [`LayerNormDims::rms`] as `nn.RMSNorm(cols, eps)` (no centering, no shift). In one place: the
//! shaders (`layer_norm.wgsl`, an invocation per row, and `layer_norm_rows.wgsl`, a workgroup per
//! row; beside this file), the launchers, the CPU [`reference`](mod@reference) and the tests.
//!
//! [`forward`] also writes each row's mean and `rstd = 1/sqrt(var + eps)` for the backward.
//! [`backward`] records two dispatches: `dx` (one invocation per row) and `dgamma`, `dbeta` (one
//! per column, looping over the rows in order: deterministic, no atomics). All gradients are
//! written (=), not accumulated, except `dx` by [`backward_adding`]. [`forward_add`] is a
//! residual addition and [`forward`] of its sum in one dispatch.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{
    RowLayout, check_loop_limit, launch_rows, launch_units, loop_passes, row_lanes, row_layout,
};
use crate::pipeline::{Kernel, kernels, shader_params, shader_source};
use crate::slice::DeviceSlice;
use const_format::concatcp;

pub mod reference;
#[cfg(test)]
pub(crate) mod tests;

/// Workgroup size of every entry point (`@workgroup_size(64)`: each invocation loops over a whole
/// row or column).
pub const WORKGROUP: u32 = 64;

/// The invocation-per-row module: `layer_norm.wgsl` and the helpers it calls.
const WGSL: &str = concatcp!(include_str!("layer_norm.wgsl"), shader_source!("indexing"));

/// The workgroup-per-row module: `layer_norm_rows.wgsl` and the helpers it calls.
const WGSL_ROWS: &str = concatcp!(
    include_str!("layer_norm_rows.wgsl"),
    crate::kernels::softmax::ROWS_HELPERS
);

/// The subgroup-per-row module: `layer_norm_rows.wgsl` placed a subgroup per row.
const WGSL_SUBGROUP: &str = concatcp!(
    include_str!("layer_norm_rows.wgsl"),
    crate::kernels::softmax::SUBGROUP_HELPERS
);

kernels! {
    "layer_norm", source: WGSL, workgroup: WORKGROUP;
    /// The `forward` entry point.
    FORWARD = "forward" [x, gamma, beta, y, mean_out, rstd_out];
    /// The `forward_add` entry point: `x = a + b` written, then `forward` over it.
    FORWARD_ADD = "forward_add" [x, gamma, beta, y, mean_out, rstd_out, add_a, add_b];
    /// The `backward_input` entry point (`dx`).
    BACKWARD_INPUT = "backward_input" [x, gamma, bi_mean, bi_rstd, bi_dy, dx];
    /// The `backward_params` entry point (`dgamma`, `dbeta`).
    BACKWARD_PARAMS = "backward_params" [x, bp_mean, bp_rstd, bp_dy, dgamma, dbeta];
}

kernels! {
    "layer_norm_rows", source: WGSL_ROWS, workgroup: WORKGROUP;
    /// `forward` with a workgroup per row (`layer_norm_rows.wgsl`).
    FORWARD_ROWS = "forward_rows" [x, gamma, beta, y, mean_out, rstd_out];
    /// `forward_add` with a workgroup per row.
    FORWARD_ADD_ROWS = "forward_add_rows" [x, gamma, beta, y, mean_out, rstd_out, add_a, add_b];
    /// `backward_input` with a workgroup per row.
    BACKWARD_INPUT_ROWS = "backward_input_rows" [x, gamma, bi_mean, bi_rstd, bi_dy, dx];
}

kernels! {
    "layer_norm_subgroup", source: WGSL_SUBGROUP, workgroup: WORKGROUP;
    /// `forward` with a subgroup per row (`layer_norm_rows.wgsl` placed by
    /// `row_subgroup.wgsl`).
    FORWARD_SUBGROUP = "forward_rows" [x, gamma, beta, y, mean_out, rstd_out];
    /// `forward_add` with a subgroup per row.
    FORWARD_ADD_SUBGROUP = "forward_add_rows" [x, gamma, beta, y, mean_out, rstd_out, add_a, add_b];
    /// `backward_input` with a subgroup per row.
    BACKWARD_INPUT_SUBGROUP = "backward_input_rows" [x, gamma, bi_mean, bi_rstd, bi_dy, dx];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    FORWARD,
    FORWARD_ADD,
    BACKWARD_INPUT,
    BACKWARD_PARAMS,
    FORWARD_ROWS,
    FORWARD_ADD_ROWS,
    BACKWARD_INPUT_ROWS,
    FORWARD_SUBGROUP,
    FORWARD_ADD_SUBGROUP,
    BACKWARD_INPUT_SUBGROUP,
];

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

/// The shape of a layer-norm launch: `rows` rows of `cols` columns, normalised with `eps`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormDims {
    /// Rows (every axis but the last).
    pub rows: u64,
    /// Length of the last axis.
    pub cols: u64,
    /// Added to the variance (PyTorch's default is 1e-5; unused by the backward).
    pub eps: f32,
    /// RMSNorm instead: no centering and no shift, `y = x / sqrt(mean(x²) + eps) * gamma`
    /// (PyTorch's `nn.RMSNorm`, Llama's norm). The launchers then ignore `beta` (pass any
    /// `[cols]` slice) and write `dbeta = sum_r dy`, which the caller discards; `mean` is 0.
    pub rms: bool,
}

shader_params! {
    /// The `Params` of `layer_norm.wgsl` (shared by the three entry points).
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
        rms: u32,
        /// `forward_add`: where `a` and `b` start (their sum goes to `x_offset`).
        a_offset: u32,
        b_offset: u32,
        /// `backward_input`: 1 adds `dx` to what its binding holds instead of writing it.
        add_dx: u32,
        /// `backward_params`: the first column of the range this dispatch sums, and one past
        /// its last (a launch in ranges under a submission bound).
        start: u32,
        end: u32,
        _pad0: u32,
    }
}

/// Loop passes one invocation of a workgroup-per-row entry point runs: three column loops of
/// `ceil(cols / 64)` passes and two trees of 6.
pub const fn row_loop_iterations_rows(cols: u64) -> u64 {
    3 * (cols.div_ceil(WORKGROUP as u64) + 1) + 2 * 7
}

/// Loop passes one lane of a subgroup-per-row entry point runs, its subgroup `lanes` wide:
/// three column loops of `ceil(cols / lanes)` passes.
pub const fn row_loop_iterations_subgroup(cols: u64, lanes: u64) -> u64 {
    3 * (cols.div_ceil(lanes) + 1)
}

/// Which launch [`matrix_len`] checks.
#[derive(Clone, Copy, PartialEq)]
enum Pass {
    Forward,
    ForwardAdd,
    Backward,
}

/// Checks the dimensions and the loop limits; returns `rows * cols`.
fn matrix_len(
    gpu: &Gpu,
    op: &'static str,
    layout: RowLayout,
    (rows, cols): (u64, u64),
    kind: Pass,
) -> Result<u64> {
    let invalid = |message: String| Error::InvalidArgument { op, message };
    if rows > 0 && cols == 0 {
        return Err(invalid(format!(
            "{rows} rows of 0 columns: a row's mean and variance need at least one column"
        )));
    }
    let len = rows
        .checked_mul(cols)
        .ok_or_else(|| invalid(format!("[{rows}, {cols}] has more than u64::MAX elements")))?;
    let lanes = row_lanes(gpu, op, layout)?;
    if rows > 0 {
        let passes: &dyn Fn(u64) -> u64 = match layout {
            RowLayout::InvocationPerRow => &row_loop_iterations,
            RowLayout::WorkgroupPerRow => &row_loop_iterations_rows,
            RowLayout::SubgroupPerRow => &|c| row_loop_iterations_subgroup(c, lanes),
        };
        // forward_add's loop writing the sum comes first, one more column loop.
        let add_passes = |c: u64| match layout {
            RowLayout::InvocationPerRow => loop_passes(c),
            _ => c.div_ceil(lanes.max(1)) + 1,
        };
        let total = |c: u64| passes(c) + if kind == Pass::ForwardAdd { add_passes(c) } else { 0 };
        check_loop_limit(gpu, op, "cols", cols, total)?;
    }
    if kind == Pass::Backward && cols > 0 {
        check_loop_limit(gpu, op, "rows", rows, column_loop_iterations)?;
    }
    Ok(len)
}

/// Checks that each slice holds `len` elements.
fn expect_lens(op: &'static str, slices: &[(&str, DeviceSlice<'_>, u64)]) -> Result<()> {
    slices
        .iter()
        .try_for_each(|(name, slice, len)| slice.expect_len(op, name, *len))
}

/// Records `y = (x - mean_r) * rstd_r * gamma + beta` per row of the `[rows, cols]` input `x`
/// with `[cols]` `gamma`, `beta`, and writes the `[rows]` `mean` and `rstd`
/// (`rstd_r = 1/sqrt(var_r + eps)`, biased variance), all f32.
pub fn forward(
    gpu: &Gpu,
    dims: &LayerNormDims,
    outputs: [DeviceSlice<'_>; 3],
    x: DeviceSlice<'_>,
    gamma: DeviceSlice<'_>,
    beta: DeviceSlice<'_>,
) -> Result<()> {
    let layout = row_layout(gpu, dims.rows, dims.cols);
    forward_in(gpu, layout, dims, outputs, [x, gamma, beta])
}

/// [`forward`] in the given layout (for tests and benchmarks); inputs `[x, gamma, beta]`.
pub fn forward_in(
    gpu: &Gpu,
    layout: RowLayout,
    dims: &LayerNormDims,
    outputs: [DeviceSlice<'_>; 3],
    [x, gamma, beta]: [DeviceSlice<'_>; 3],
) -> Result<()> {
    record_forward(gpu, layout, dims, outputs, [x, gamma, beta], None)
}

/// A residual add and the layer norm of its result in one dispatch (the "add and norm" of a
/// pre-norm transformer block): writes `sum = a + b` (elementwise, `[rows, cols]`), then
/// [`forward`] of `sum`: `y`, `mean` and `rstd`. The same values as a separate addition and
/// [`forward`], bit for bit; one pass less over the sum. `sum` may be `b` itself (in place),
/// and must not otherwise overlap `a` or `b`.
pub fn forward_add(
    gpu: &Gpu,
    dims: &LayerNormDims,
    outputs: [DeviceSlice<'_>; 3],
    [sum, a, b]: [DeviceSlice<'_>; 3],
    gamma: DeviceSlice<'_>,
    beta: DeviceSlice<'_>,
) -> Result<()> {
    let layout = row_layout(gpu, dims.rows, dims.cols);
    forward_add_in(gpu, layout, dims, outputs, [sum, a, b], [gamma, beta])
}

/// [`forward_add`] in the given layout (for tests and benchmarks).
pub fn forward_add_in(
    gpu: &Gpu,
    layout: RowLayout,
    dims: &LayerNormDims,
    outputs: [DeviceSlice<'_>; 3],
    [sum, a, b]: [DeviceSlice<'_>; 3],
    [gamma, beta]: [DeviceSlice<'_>; 2],
) -> Result<()> {
    record_forward(gpu, layout, dims, outputs, [sum, gamma, beta], Some([a, b]))
}

/// [`forward_in`], or with `add` [`forward_add_in`] (`x` is then the sum it writes).
fn record_forward(
    gpu: &Gpu,
    layout: RowLayout,
    dims: &LayerNormDims,
    [y, mean, rstd]: [DeviceSlice<'_>; 3],
    [x, gamma, beta]: [DeviceSlice<'_>; 3],
    add: Option<[DeviceSlice<'_>; 2]>,
) -> Result<()> {
    let op = match add {
        None => "layer_norm::forward",
        Some(_) => "layer_norm::forward_add",
    };
    let LayerNormDims {
        rows,
        cols,
        eps,
        rms,
    } = *dims;
    let kind = match add {
        None => Pass::Forward,
        Some(_) => Pass::ForwardAdd,
    };
    let len = matrix_len(gpu, op, layout, (rows, cols), kind)?;
    let (x_name, addends) = match add {
        None => ("x", vec![]),
        Some([a, b]) => ("sum", vec![("a", a, len), ("b", b, len)]),
    };
    let mut lens = vec![
        ("y", y, len),
        ("mean", mean, rows),
        ("rstd", rstd, rows),
        (x_name, x, len),
        ("gamma", gamma, cols),
        ("beta", beta, cols),
    ];
    lens.extend(addends);
    expect_lens(op, &lens)?;
    if let Some([a, b]) = add {
        // The sum may be written over b itself (each element read before it is written, by
        // the same invocation), not over a part of either.
        let over_b = x.buffer().segment_uid() == b.buffer().segment_uid()
            && x.index() == b.index()
            && x.len() == b.len();
        for (name, input) in [("a", a), ("b", b)] {
            if x.overlaps(&input) && !(name == "b" && over_b) {
                return Err(Error::InvalidArgument {
                    op,
                    message: format!(
                        "the sum {x:?} overlaps {name} {input:?}; write it to a separate buffer"
                    ),
                });
            }
        }
    }
    let c = cols as u32;
    let params = |first: u32, count: u32| Params {
        rows: count,
        cols: c,
        eps,
        x_offset: x.index() + first * c,
        gamma_offset: gamma.index(),
        beta_offset: beta.index(),
        y_offset: y.index() + first * c,
        mean_offset: mean.index() + first,
        rstd_offset: rstd.index() + first,
        rms: u32::from(rms),
        a_offset: add.map_or(0, |[a, _]| a.index() + first * c),
        b_offset: add.map_or(0, |[_, b]| b.index() + first * c),
        ..Params::default()
    };
    // Per layout: the plain forward's entry point, and the one that writes the sum first.
    let [plain, adding] = match layout {
        RowLayout::InvocationPerRow => [&FORWARD, &FORWARD_ADD],
        RowLayout::WorkgroupPerRow => [&FORWARD_ROWS, &FORWARD_ADD_ROWS],
        RowLayout::SubgroupPerRow => [&FORWARD_SUBGROUP, &FORWARD_ADD_SUBGROUP],
    };
    let mut buffers = vec![x, gamma, beta, y, mean, rstd];
    let kernel = match add {
        None => plain,
        Some(addends) => {
            buffers.extend(addends);
            adding
        }
    };
    launch_rows(gpu, layout, kernel, &buffers, [rows.min(len), 1], params)
}

/// Records the backward: with `xhat = (x - mean) rstd` and `g = dy * gamma`,
/// `dx = rstd (g - mean_j g - xhat mean_j(g xhat))`, `dgamma = sum_r dy xhat`,
/// `dbeta = sum_r dy` (two dispatches). `x`, `dy`, `dx` are `[rows, cols]`; `gamma`, `dgamma`,
/// `dbeta` `[cols]`; `mean`, `rstd` the `[rows]` figures [`forward`] saved.
pub fn backward(
    gpu: &Gpu,
    dims: &LayerNormDims,
    outputs: [DeviceSlice<'_>; 3],
    saved: [DeviceSlice<'_>; 4],
    dy: DeviceSlice<'_>,
) -> Result<()> {
    let layout = row_layout(gpu, dims.rows, dims.cols);
    backward_in(gpu, layout, dims, outputs, saved, dy)
}

/// [`backward`] with `dx` in the given layout (for tests and benchmarks).
pub fn backward_in(
    gpu: &Gpu,
    layout: RowLayout,
    dims: &LayerNormDims,
    outputs: [DeviceSlice<'_>; 3],
    saved: [DeviceSlice<'_>; 4],
    dy: DeviceSlice<'_>,
) -> Result<()> {
    record_backward(gpu, layout, dims, outputs, saved, dy, false)
}

/// [`backward`] that adds `dx` to what `outputs[0]` holds (`dx += ..`: the gradient of a
/// tensor that also reached it another way, a residual stream's) instead of writing it: the
/// same values as [`backward`] into a new buffer and an addition, bit for bit, without the
/// addition's dispatch and buffer. `dgamma` and `dbeta` are written as in [`backward`].
pub fn backward_adding(
    gpu: &Gpu,
    dims: &LayerNormDims,
    outputs: [DeviceSlice<'_>; 3],
    saved: [DeviceSlice<'_>; 4],
    dy: DeviceSlice<'_>,
) -> Result<()> {
    let layout = row_layout(gpu, dims.rows, dims.cols);
    backward_adding_in(gpu, layout, dims, outputs, saved, dy)
}

/// [`backward_adding`] in the given layout (for tests and benchmarks).
pub fn backward_adding_in(
    gpu: &Gpu,
    layout: RowLayout,
    dims: &LayerNormDims,
    outputs: [DeviceSlice<'_>; 3],
    saved: [DeviceSlice<'_>; 4],
    dy: DeviceSlice<'_>,
) -> Result<()> {
    record_backward(gpu, layout, dims, outputs, saved, dy, true)
}

/// [`backward_in`], or with `add_dx` [`backward_adding_in`].
fn record_backward(
    gpu: &Gpu,
    layout: RowLayout,
    dims: &LayerNormDims,
    [dx, dgamma, dbeta]: [DeviceSlice<'_>; 3],
    [x, gamma, mean, rstd]: [DeviceSlice<'_>; 4],
    dy: DeviceSlice<'_>,
    add_dx: bool,
) -> Result<()> {
    let op = "layer_norm::backward";
    let LayerNormDims { rows, cols, rms, .. } = *dims;
    let len = matrix_len(gpu, op, layout, (rows, cols), Pass::Backward)?;
    expect_lens(
        op,
        &[
            ("dx", dx, len),
            ("dgamma", dgamma, cols),
            ("dbeta", dbeta, cols),
            ("x", x, len),
            ("gamma", gamma, cols),
            ("mean", mean, rows),
            ("rstd", rstd, rows),
            ("dy", dy, len),
        ],
    )?;
    let c = cols as u32;
    let params = |first: u32, count: u32| Params {
        rows: count,
        cols: c,
        x_offset: x.index() + first * c,
        gamma_offset: gamma.index(),
        mean_offset: mean.index() + first,
        rstd_offset: rstd.index() + first,
        dy_offset: dy.index() + first * c,
        dx_offset: dx.index() + first * c,
        dgamma_offset: dgamma.index(),
        dbeta_offset: dbeta.index(),
        rms: u32::from(rms),
        add_dx: u32::from(add_dx),
        ..Params::default()
    };
    let buffers = [x, gamma, mean, rstd, dy, dx];
    let kernel = match layout {
        RowLayout::InvocationPerRow => &BACKWARD_INPUT,
        RowLayout::WorkgroupPerRow => &BACKWARD_INPUT_ROWS,
        RowLayout::SubgroupPerRow => &BACKWARD_INPUT_SUBGROUP,
    };
    launch_rows(gpu, layout, kernel, &buffers, [rows.min(len), 1], params)?;
    // With rows == 0 this writes dgamma = dbeta = 0 (empty sums), as the reference does. Column
    // sums over every row, in ranges of columns under a submission bound.
    let buffers = [x, mean, rstd, dy, dgamma, dbeta];
    let whole = params(0, rows as u32);
    launch_units(gpu, &BACKWARD_PARAMS, &[], &buffers, cols, |s, e| {
        let range = Params {
            start: s as u32,
            end: e as u32,
            ..whole
        };
        (range, e - s)
    })
}
