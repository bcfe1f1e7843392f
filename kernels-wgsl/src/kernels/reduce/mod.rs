//! `reduce`: sum, mean and max over one axis of a row-major tensor or over all of it; max also
//! writes the arg-max (`u32`) that [`max_backward`] scatters `dy` back to; and [`sum_to_shape`],
//! the backward of a broadcast, composed from `sum_axis` dispatches. In one place: the shader
//! (`reduce.wgsl`, beside this file), the launchers, the CPU [`reference`](mod@reference) and the
//! tests.
//!
//! An axis reduction views the tensor as `[outer, axis_len, inner]` ([`AxisView`]) and writes
//! `[outer, inner]`. Accumulation is `f32` on the GPU (the reference uses `f64`). Max rule: NaN
//! beats every number, and among equal values the smallest index wins.

use plimsoll_allocator::Category;

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{
    ELEMENTWISE_WORKGROUP, RowLayout, blocks_within_bound, check_loop_limit, copy, launch_units,
};
use crate::pipeline::{Kernel, kernel, kernels, shader_params, shader_source};
use const_format::concatcp;
use crate::recorder::Dispatch;
use crate::slice::DeviceSlice;

mod multi;
pub mod reference;
#[cfg(test)]
pub(crate) mod tests;

pub use multi::{SQUARES_MULTI, SquaresSource, sum_squares_many, sum_squares_many_in};

/// A tensor seen as `[outer, axis_len, inner]`, row-major; the reduced axis is the middle one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisView {
    /// Product of the dimensions before the axis.
    pub outer: usize,
    /// Extent of the reduced axis.
    pub axis_len: usize,
    /// Product of the dimensions after the axis.
    pub inner: usize,
}

impl AxisView {
    /// The view of a row-major tensor of `shape` reduced along `axis`; `None` if `axis` is out
    /// of range.
    pub fn of_shape(shape: &[usize], axis: usize) -> Option<AxisView> {
        let axis_len = *shape.get(axis)?;
        Some(AxisView {
            outer: shape[..axis].iter().product(),
            axis_len,
            inner: shape[axis + 1..].iter().product(),
        })
    }

    /// Number of input elements, `outer * axis_len * inner`.
    pub fn input_len(&self) -> usize {
        self.outer * self.axis_len * self.inner
    }

    /// Number of output elements, `outer * inner`.
    pub fn output_len(&self) -> usize {
        self.outer * self.inner
    }

    /// Input offset of `(o, k, i)`.
    pub(crate) fn offset(&self, o: usize, k: usize, i: usize) -> usize {
        (o * self.axis_len + k) * self.inner + i
    }
}

/// Workgroup size of the `*_axis` entry points (`ROW_WG` in the shader): one invocation loops
/// over a whole axis, so smaller groups keep several workgroups busy for small outputs.
pub const AXIS_WORKGROUP: u32 = 64;

/// Longest axis `sum_axis`/`mean_axis`/`max_axis` take (and so the longest merged run of summed
/// dimensions in [`sum_to_shape`]). Mesa's lavapipe silently stops a shader after 65535 loop
/// iterations per invocation; the axis loop reads 8 elements per iteration (see `reduce.wgsl`),
/// so this leaves margin below 8 * 65535. Longer axes are refused rather than summed wrongly:
/// reshape them into two axes and reduce twice.
pub const MAX_AXIS_LEN: usize = 524_000;

/// Loop passes one invocation of `sum_all`, `mean_all` or `max_all` runs for `len` elements (see
/// "Loop limit on lavapipe" in [`crate::kernels`]): the strided loop (4 elements of its 1024
/// per pass, `len / 1024 + 2` passes), its remainder loop (5) and the 8-step tree (9). The
/// launchers refuse more than the adapter's limit with [`Error::LoopLimit`] (on lavapipe about
/// 67 million elements, more than one binding holds there). The `*_axis` entry points run at
/// most `MAX_AXIS_LEN / 8 + 1 + 8` passes (8 elements per pass, remainder loop of up to 7).
pub const fn all_loop_iterations(len: u64) -> u64 {
    len / (4 * ALL_WORKGROUP) + 2 + 5 + 9
}

/// Invocations of the one workgroup of the `*_all` entry points (`ALL_WG` in the shader).
const ALL_WORKGROUP: u64 = 256;

/// The module: `reduce.wgsl` and the helpers it calls.
const WGSL: &str = concatcp!(
    include_str!("reduce.wgsl"),
    shader_source!("workgroup_reduce", "indexing")
);

kernels! {
    "reduce", source: WGSL, workgroup: AXIS_WORKGROUP;
    /// The `sum_axis` entry point: bindings `src`, `dst`.
    SUM_AXIS = "sum_axis" [src, dst];
    /// The `mean_axis` entry point: bindings `src`, `dst`.
    MEAN_AXIS = "mean_axis" [src, dst];
    /// The `max_axis` entry point: bindings `src`, `dst`, `idx_out`.
    MAX_AXIS = "max_axis" [src, dst, idx_out: "array<u32>"];
}

/// The `max_backward` entry point: bindings `dy`, `idx_in`, `dx`.
pub const MAX_BACKWARD: Kernel = kernel!("reduce", "max_backward", source: WGSL, [dy, idx_in: "array<u32>", dx], ELEMENTWISE_WORKGROUP);

/// Elements per invocation (one sum each) of the `sum_squares_chunks` entry points (`SQ_CHUNK`
/// in the shader).
pub const SQUARES_CHUNK: u64 = 256;

kernels! {
    "reduce", source: WGSL, workgroup: ALL_WORKGROUP as u32;
    /// The `sum_all` entry point (one workgroup): bindings `src`, `dst`.
    SUM_ALL = "sum_all" [src, dst];
    /// The `sum_squares_chunks_v4` entry point (vec4 loads; `src` 4-aligned): bindings `src_v4`,
    /// `dst`.
    SUM_SQUARES_CHUNKS_V4 = "sum_squares_chunks_v4" [src_v4: "array<vec4<f32>>", dst];
    /// The `sum_squares_chunks` entry point: bindings `src`, `dst`.
    SUM_SQUARES_CHUNKS = "sum_squares_chunks" [src, dst];
    /// The `mean_all` entry point (one workgroup): bindings `src`, `dst`.
    MEAN_ALL = "mean_all" [src, dst];
    /// The `max_all` entry point (one workgroup): bindings `src`, `dst`, `idx_out`.
    MAX_ALL = "max_all" [src, dst, idx_out: "array<u32>"];
}

/// The subgroup-per-chunk module: `sum_squares_subgroup.wgsl`, placed by `row_subgroup.wgsl`.
const WGSL_SUBGROUP: &str = concatcp!(
    include_str!("sum_squares_subgroup.wgsl"),
    crate::kernels::softmax::SUBGROUP_HELPERS
);

kernels! {
    "reduce_subgroup", source: WGSL_SUBGROUP, workgroup: crate::kernels::ROW_WORKGROUP;
    /// `sum_squares_chunks` with a subgroup per chunk (the device needs `SUBGROUP`): bindings
    /// `src`, `dst`.
    SUM_SQUARES_CHUNKS_SUBGROUP = "sum_squares_chunks_subgroup" [src, dst];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    SUM_AXIS,
    MEAN_AXIS,
    MAX_AXIS,
    MAX_BACKWARD,
    SUM_ALL,
    SUM_SQUARES_CHUNKS,
    SUM_SQUARES_CHUNKS_V4,
    MEAN_ALL,
    MAX_ALL,
    SUM_SQUARES_CHUNKS_SUBGROUP,
    SQUARES_MULTI,
];

shader_params! {
    /// The `Params` of `reduce.wgsl` (shared by every entry point; unused offsets are 0).
    struct Params {
        outer: u32,
        axis_len: u32,
        inner: u32,
        src_offset: u32,
        dst_offset: u32,
        idx_out_offset: u32,
        dy_offset: u32,
        idx_in_offset: u32,
        dx_offset: u32,
        /// The axis entry points (`sum_axis`, `mean_axis`, `max_axis`, `max_backward`): the
        /// first invocation of the range this dispatch runs, and one past its last (a launch in
        /// ranges under a submission bound).
        start: u32,
        end: u32,
        _pad2: u32,
    }
}

impl Params {
    /// All of `x` as one axis (`outer = inner = 1`), into `out`: the `*_all` and chunked
    /// entry points' Params.
    fn whole(x: DeviceSlice<'_>, out: DeviceSlice<'_>) -> Params {
        Params {
            outer: 1,
            axis_len: x.len() as u32,
            inner: 1,
            src_offset: x.index(),
            dst_offset: out.index(),
            ..Params::default()
        }
    }

    /// These `Params` for the invocations `start..end` of an axis launch.
    fn range(self, start: u64, end: u64) -> Params {
        Params {
            start: start as u32,
            end: end as u32,
            ..self
        }
    }

    fn of_view(view: AxisView) -> Params {
        Params {
            outer: view.outer as u32,
            axis_len: view.axis_len as u32,
            inner: view.inner as u32,
            ..Params::default()
        }
    }
}

/// Element count of `shape`, saturating (an absurd shape then fails `check_range`).
fn elements(shape: &[usize]) -> u64 {
    shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64))
}

/// The `[outer, axis_len, inner]` view of `shape` along `axis`, or an error naming both.
fn view_of(op: &'static str, shape: &[usize], axis: usize) -> Result<AxisView> {
    let invalid = || Error::InvalidArgument {
        op,
        message: format!(
            "axis {axis} out of range for shape {shape:?} (rank {})",
            shape.len()
        ),
    };
    if elements(shape) > u64::from(u32::MAX) {
        return Err(Error::InvalidArgument {
            op,
            message: format!("shape {shape:?} has more than u32::MAX elements"),
        });
    }
    AxisView::of_shape(shape, axis).ok_or_else(invalid)
}

/// Refuses axes longer than [`MAX_AXIS_LEN`].
fn check_axis_len(op: &'static str, view: AxisView) -> Result<()> {
    if view.axis_len > MAX_AXIS_LEN {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "axis of {} elements is longer than MAX_AXIS_LEN = {MAX_AXIS_LEN} (lavapipe's \
                 loop limit); split it into two axes and reduce twice",
                view.axis_len
            ),
        });
    }
    Ok(())
}

/// `out[o, i] = reduce_k x[o, k, i]` with `kernel` (sum or mean) over a checked view.
fn axis_reduction(
    gpu: &Gpu,
    op: &'static str,
    kernel: &Kernel,
    out: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    view: AxisView,
) -> Result<()> {
    let count = checked_axis(op, view, x, &[("out", out)])?;
    let params = Params {
        src_offset: x.index(),
        dst_offset: out.index(),
        ..Params::of_view(view)
    };
    launch_axis(gpu, kernel, params, &[x, out], count)
}

/// Checks an axis reduction's view and slices (`outputs` one element per output); returns
/// the number of outputs.
fn checked_axis(
    op: &'static str,
    view: AxisView,
    x: DeviceSlice<'_>,
    outputs: &[(&str, DeviceSlice<'_>)],
) -> Result<u64> {
    check_axis_len(op, view)?;
    let count = view.output_len() as u64;
    for (name, slice) in outputs {
        slice.expect_len(op, name, count)?;
    }
    x.expect_len(op, "x", view.input_len() as u64)?;
    Ok(count)
}

/// Records an axis entry point over `count` invocations, in ranges under a submission bound
/// (`params.start..params.end` each).
fn launch_axis(
    gpu: &Gpu,
    kernel: &Kernel,
    params: Params,
    buffers: &[DeviceSlice<'_>],
    count: u64,
) -> Result<()> {
    launch_units(gpu, kernel, &[], buffers, count, |s, e| {
        (params.range(s, e), e - s)
    })
}

/// Records `out` (shape `shape` without `axis`, i.e. `[outer, inner]`) `= sum` of `x`
/// (row-major `shape`) along `axis`. An empty axis gives zeros.
pub fn sum_axis(
    gpu: &Gpu,
    out: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    shape: &[usize],
    axis: usize,
) -> Result<()> {
    let view = view_of("sum_axis", shape, axis)?;
    axis_reduction(gpu, "sum_axis", &SUM_AXIS, out, x, view)
}

/// Like [`sum_axis`], divided by the axis extent (an empty axis gives NaN, as 0/0).
pub fn mean_axis(
    gpu: &Gpu,
    out: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    shape: &[usize],
    axis: usize,
) -> Result<()> {
    let view = view_of("mean_axis", shape, axis)?;
    axis_reduction(gpu, "mean_axis", &MEAN_AXIS, out, x, view)
}

/// Records the max of `x` (row-major `shape`) along `axis` into `out` and its position along
/// the axis (`u32`) into `indices`, both `[outer, inner]`. NaN wins; ties go to the smallest
/// index; an empty axis gives `-inf` and `u32::MAX`.
pub fn max_axis(
    gpu: &Gpu,
    out: DeviceSlice<'_>,
    indices: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    shape: &[usize],
    axis: usize,
) -> Result<()> {
    let op = "max_axis";
    let view = view_of(op, shape, axis)?;
    let count = checked_axis(op, view, x, &[("out", out), ("indices", indices)])?;
    let params = Params {
        src_offset: x.index(),
        dst_offset: out.index(),
        idx_out_offset: indices.index(),
        ..Params::of_view(view)
    };
    launch_axis(gpu, &MAX_AXIS, params, &[x, out, indices], count)
}

/// Records the backward of [`max_axis`]: `dx[o, k, i] = dy[o, i]` where `k == indices[o, i]`, else
/// 0. Writes every element of `dx` (shape `shape`): no zero-fill needed, and it overwrites.
pub fn max_backward(
    gpu: &Gpu,
    dx: DeviceSlice<'_>,
    dy: DeviceSlice<'_>,
    indices: DeviceSlice<'_>,
    shape: &[usize],
    axis: usize,
) -> Result<()> {
    let op = "max_backward";
    let view = view_of(op, shape, axis)?;
    let (count, reduced) = (view.input_len() as u64, view.output_len() as u64);
    dx.expect_len(op, "dx", count)?;
    dy.expect_len(op, "dy", reduced)?;
    indices.expect_len(op, "indices", reduced)?;
    let params = Params {
        dy_offset: dy.index(),
        idx_in_offset: indices.index(),
        dx_offset: dx.index(),
        ..Params::of_view(view)
    };
    launch_axis(gpu, &MAX_BACKWARD, params, &[dy, indices, dx], count)
}

/// One-workgroup reduction of `x` into the one element of `out` (and the flat arg-max into the
/// one element of `index` for `max_all`). Dispatched even for an empty `x`: the output is one
/// element (sum 0, mean NaN, max `-inf` with index `u32::MAX`).
fn all_reduction(
    gpu: &Gpu,
    op: &'static str,
    kernel: &Kernel,
    out: DeviceSlice<'_>,
    index: Option<DeviceSlice<'_>>,
    x: DeviceSlice<'_>,
) -> Result<()> {
    check_loop_limit(gpu, op, "len", x.len(), all_loop_iterations)?;
    out.expect_len(op, "out", 1)?;
    let mut params = Params::whole(x, out);
    let mut buffers = vec![x, out];
    if let Some(index) = index {
        index.expect_len(op, "index", 1)?;
        params.idx_out_offset = index.index();
        buffers.push(index);
    }
    gpu.dispatch(Dispatch {
        kernel,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &buffers,
        also_uses: &[],
        // Exactly one workgroup: a fixed-order tree, so the result is deterministic.
        workgroups: [1, 1, 1],
        work: crate::recorder::Work::of_slices(&buffers),
    })
}

/// Records `out[0] = sum of x` (f32, one workgroup, fixed order); `out` holds one element.
pub fn sum_all(gpu: &Gpu, out: DeviceSlice<'_>, x: DeviceSlice<'_>) -> Result<()> {
    all_reduction(gpu, "sum_all", &SUM_ALL, out, None, x)
}

/// How many sums [`sum_squares_chunks`] writes for `len` elements: one per [`SQUARES_CHUNK`]
/// elements, at least one.
pub const fn squares_chunks(len: u64) -> u64 {
    if len == 0 {
        1
    } else {
        len.div_ceil(SQUARES_CHUNK)
    }
}

/// Records `out[c] = sum of x[i]²` over chunk `c` of `x` (elements `c * SQUARES_CHUNK ..`), one
/// invocation per chunk and no barrier; `out` holds [`squares_chunks`]`(x.len())` elements
/// (their sum is the sum of squares of `x`; with one chunk, `out[0]` is it). The squares are
/// not stored: a gradient norm's terms in one pass over `x`, spread over the device. The chunks
/// depend on the length alone, so the result is deterministic. Reads `x` as `vec4`s when it
/// starts on a multiple of 4 elements.
/// On a GPU with subgroups, a subgroup per chunk ([`sum_squares_chunks_in`]).
pub fn sum_squares_chunks(gpu: &Gpu, out: DeviceSlice<'_>, x: DeviceSlice<'_>) -> Result<()> {
    sum_squares_chunks_in(gpu, squares_layout(gpu), out, x)
}

/// The layout [`sum_squares_chunks`] uses on `gpu`: [`RowLayout::SubgroupPerRow`] (a subgroup
/// per chunk, reading it in contiguous runs) on a GPU with subgroups
/// ([`crate::kernels::subgroup_rows`]; not measured on a GPU yet, `cargo xtask bench kernels
/// rows` prints both), else [`RowLayout::InvocationPerRow`]: on lavapipe the invocation per
/// chunk's vec4 loads were faster (the same bench over 4 Mi elements, three runs: 7.2-8.7 GB/s
/// against 5.6-6.2 with 8-lane subgroups).
pub fn squares_layout(gpu: &Gpu) -> RowLayout {
    match crate::kernels::subgroup_rows(gpu) {
        Some(_) if !gpu.is_cpu() => RowLayout::SubgroupPerRow,
        _ => RowLayout::InvocationPerRow,
    }
}

/// [`sum_squares_chunks`] in `layout`: an invocation per chunk, or a subgroup per chunk
/// ([`RowLayout::SubgroupPerRow`], where [`crate::kernels::subgroup_rows`] says the device can);
/// the same chunks either way, their sums in another order of additions (rounding only).
/// [`RowLayout::WorkgroupPerRow`] is [`Error::InvalidArgument`].
pub fn sum_squares_chunks_in(
    gpu: &Gpu,
    layout: RowLayout,
    out: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
) -> Result<()> {
    let op = "sum_squares_chunks";
    let chunks = squares_chunks(x.len());
    out.expect_len(op, "out", chunks)?;
    // Chunks per workgroup: one per invocation, or one per subgroup of the largest size.
    let per_group = match layout {
        RowLayout::InvocationPerRow => ALL_WORKGROUP,
        RowLayout::SubgroupPerRow => {
            let (_, most) = crate::kernels::subgroup_rows_for(gpu, op)?;
            u64::from(crate::kernels::ROW_WORKGROUP / most).max(1)
        }
        RowLayout::WorkgroupPerRow => {
            return Err(Error::InvalidArgument {
                op,
                message: "a chunk of 256 squares takes an invocation or a subgroup, not a \
                          workgroup: use RowLayout::InvocationPerRow or SubgroupPerRow"
                    .to_string(),
            });
        }
    };
    let workgroups = chunks.div_ceil(per_group);
    let max = u64::from(gpu.limits().max_compute_workgroups_per_dimension);
    if x.len() > u64::from(u32::MAX) || workgroups > max {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "{} elements need {workgroups} workgroups, more than the device's {max}: split \
                 the tensor",
                x.len()
            ),
        });
    }
    let kernel = if layout == RowLayout::SubgroupPerRow {
        &SUM_SQUARES_CHUNKS_SUBGROUP
    } else if x.index().is_multiple_of(4) {
        &SUM_SQUARES_CHUNKS_V4
    } else {
        &SUM_SQUARES_CHUNKS
    };
    let buffers = [x, out];
    let whole = crate::recorder::Work::of_slices(&buffers);
    // In blocks of whole chunks under a submission bound: each block its own part of x (a
    // multiple of 4 elements on), the same chunks and sums whatever the blocks.
    for (first, count, work) in blocks_within_bound(gpu, kernel, [chunks, 1], whole) {
        let from = first * SQUARES_CHUNK;
        let params = Params {
            axis_len: (x.len().saturating_sub(from)).min(count * SQUARES_CHUNK) as u32,
            src_offset: x.index() + from as u32,
            dst_offset: out.index() + first as u32,
            ..Params::whole(x, out)
        };
        gpu.dispatch(Dispatch {
            kernel,
            overrides: &[],
            params: bytemuck::bytes_of(&params),
            buffers: &buffers,
            also_uses: &[],
            workgroups: [count.div_ceil(per_group) as u32, 1, 1],
            work,
        })?;
    }
    Ok(())
}

/// Records `out[0] = sum of x[i]²` (f32, fixed order; the squares are not stored): a gradient
/// norm's term in one pass over `x` instead of a product and a sum. Up to [`SQUARES_CHUNK`]
/// elements this is one [`sum_squares_chunks`] workgroup; beyond, the chunks' sums go to a
/// [`Category::Temporary`] scratch buffer that [`sum_all`] adds up.
pub fn sum_squares_all(gpu: &Gpu, out: DeviceSlice<'_>, x: DeviceSlice<'_>) -> Result<()> {
    out.expect_len("sum_squares_all", "out", 1)?;
    let chunks = squares_chunks(x.len());
    if chunks == 1 {
        return sum_squares_chunks(gpu, out, x);
    }
    let sums = gpu.alloc_elements(chunks, Category::Temporary, "sum_squares_all chunks")?;
    sum_squares_chunks(gpu, sums.whole(), x)?;
    sum_all(gpu, out, sums.whole())
}

/// Records `out[0] = mean of x` (NaN for an empty `x`).
pub fn mean_all(gpu: &Gpu, out: DeviceSlice<'_>, x: DeviceSlice<'_>) -> Result<()> {
    all_reduction(gpu, "mean_all", &MEAN_ALL, out, None, x)
}

/// Records `out[0] = max of x` and `index[0]` = its flat index within `x` (NaN wins; ties go
/// to the smallest index). Its backward is [`max_backward`] with `shape = [len]`, `axis = 0`.
pub fn max_all(
    gpu: &Gpu,
    out: DeviceSlice<'_>,
    index: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
) -> Result<()> {
    all_reduction(gpu, "max_all", &MAX_ALL, out, Some(index), x)
}

/// Records `out` (to_shape) `= x` (from_shape) summed over every
/// dimension that a numpy broadcast from `to_shape` to `from_shape` expanded: the leading extra
/// dimensions and those where `to_shape` has extent 1. This is the gradient of a broadcast operand
/// (see [`crate::kernels::binary::backward`]). Errors if `to_shape` does not broadcast to
/// `from_shape`.
///
/// How: dimensions of extent 1 are dropped, adjacent summed dimensions are merged into one axis,
/// and each merged run is one [`sum_axis`] dispatch over the current shape; the intermediate
/// results live in [`Category::Temporary`] scratch buffers allocated here and dropped on return
/// (a dropped buffer's bytes may go to later recorded work at once, which the GPU runs in order;
/// an upload into them submits the open batch first, see [`crate::recorder`]). The last dispatch writes `out`; with nothing to sum, `x` is
/// copied. The reference sums one dimension at a time in `f64`; merging only changes the `f32`
/// summation order.
pub fn sum_to_shape(
    gpu: &Gpu,
    out: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    from_shape: &[usize],
    to_shape: &[usize],
) -> Result<()> {
    let op = "sum_to_shape";
    let mismatch = || Error::InvalidArgument {
        op,
        message: format!("shape {to_shape:?} does not broadcast to {from_shape:?}"),
    };
    if to_shape.len() > from_shape.len() {
        return Err(mismatch());
    }
    let (from_len, to_len) = (elements(from_shape), elements(to_shape));
    out.expect_len(op, "out", to_len)?;
    x.expect_len(op, "x", from_len)?;
    // Runs of (extent, summed) over the dimensions of extent != 1, adjacent equal flags merged.
    let lead = from_shape.len() - to_shape.len();
    let mut runs: Vec<(usize, bool)> = Vec::new();
    for (d, &extent) in from_shape.iter().enumerate() {
        let target = if d < lead { 1 } else { to_shape[d - lead] };
        if extent != target && target != 1 {
            return Err(mismatch());
        }
        if extent == 1 {
            continue;
        }
        let summed = extent != target;
        match runs.last_mut() {
            Some((e, s)) if *s == summed => *e *= extent,
            _ => runs.push((extent, summed)),
        }
    }
    if to_len == 0 {
        return Ok(());
    }
    let summed_runs = runs.iter().filter(|(_, s)| *s).count();
    if summed_runs == 0 {
        return copy::copy(gpu, out, x);
    }
    // Intermediate sums live in scratch buffers, each dropped once the next one is read from it.
    let mut scratch: Option<DeviceBuffer> = None;
    let mut done = 0;
    while let Some(at) = runs.iter().position(|(_, s)| *s) {
        let shape: Vec<usize> = runs.iter().map(|(e, _)| *e).collect();
        let view = view_of(op, &shape, at)?;
        runs.remove(at);
        done += 1;
        let src = match &scratch {
            Some(b) => b.whole(),
            None => x,
        };
        if done == summed_runs {
            return axis_reduction(gpu, op, &SUM_AXIS, out, src, view);
        }
        let next = gpu.alloc_elements(
            view.output_len() as u64,
            Category::Temporary,
            "sum_to_shape scratch",
        )?;
        axis_reduction(gpu, op, &SUM_AXIS, next.whole(), src, view)?;
        scratch = Some(next);
    }
    Ok(())
}
