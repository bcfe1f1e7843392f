//! `reduce`: sum, mean and max over one axis of a row-major tensor or over all of it; max also
//! writes the arg-max (`u32`) that [`max_backward`] scatters `dy` back to; and [`sum_to_shape`],
//! the backward of a broadcast, composed from `sum_axis` dispatches. Shader: `shaders/reduce.wgsl`;
//! reference: [`crate::reference::reduce`].
//!
//! An axis reduction views the tensor as `[outer, axis_len, inner]` ([`AxisView`]) and writes
//! `[outer, inner]`. Accumulation is `f32` on the GPU (the reference uses `f64`). Max rule: NaN
//! beats every number, and among equal values the smallest index wins.

use plimsoll_allocator::Category;

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{
    ELEMENTWISE_WORKGROUP, check_loop_limit, check_range, copy, grid_1d, segment_index,
};
use crate::pipeline::{Kernel, RuntimeChecks};
use crate::recorder::Dispatch;
pub use crate::reference::reduce::AxisView;

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

/// The `sum_axis` entry point: bindings `src`, `dst`.
pub const SUM_AXIS: Kernel = Kernel {
    stem: "reduce",
    wgsl: include_str!("../../shaders/reduce.wgsl"),
    entry: "sum_axis",
    storage_bindings: 2,
    runtime_checks: RuntimeChecks::ON,
};

/// The `mean_axis` entry point: bindings `src`, `dst`.
pub const MEAN_AXIS: Kernel = Kernel {
    entry: "mean_axis",
    ..SUM_AXIS
};

/// The `max_axis` entry point: bindings `src`, `dst`, `idx_out`.
pub const MAX_AXIS: Kernel = Kernel {
    entry: "max_axis",
    storage_bindings: 3,
    ..SUM_AXIS
};

/// The `max_backward` entry point: bindings `dy`, `idx_in`, `dx`.
pub const MAX_BACKWARD: Kernel = Kernel {
    entry: "max_backward",
    storage_bindings: 3,
    ..SUM_AXIS
};

/// The `sum_all` entry point (one workgroup): bindings `src`, `dst`.
pub const SUM_ALL: Kernel = Kernel {
    entry: "sum_all",
    ..SUM_AXIS
};

/// The `mean_all` entry point (one workgroup): bindings `src`, `dst`.
pub const MEAN_ALL: Kernel = Kernel {
    entry: "mean_all",
    ..SUM_AXIS
};

/// The `max_all` entry point (one workgroup): bindings `src`, `dst`, `idx_out`.
pub const MAX_ALL: Kernel = Kernel {
    entry: "max_all",
    storage_bindings: 3,
    ..SUM_AXIS
};

/// Mirrors `Params` in `reduce.wgsl` (shared by every entry point; unused offsets are 0).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
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
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

impl Params {
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
#[allow(clippy::too_many_arguments)]
fn axis_reduction(
    gpu: &Gpu,
    op: &'static str,
    kernel: &Kernel,
    out: &DeviceBuffer,
    out_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    view: AxisView,
) -> Result<()> {
    check_axis_len(op, view)?;
    let count = view.output_len() as u64;
    check_range(op, "out", out, out_offset, count)?;
    check_range(op, "x", x, x_offset, view.input_len() as u64)?;
    if count == 0 {
        return Ok(());
    }
    let params = Params {
        src_offset: segment_index(x, x_offset),
        dst_offset: segment_index(out, out_offset),
        ..Params::of_view(view)
    };
    gpu.dispatch(Dispatch {
        kernel,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[x, out],
        workgroups: grid_1d(gpu, count, AXIS_WORKGROUP)?,
    })
}

/// Records `out[out_offset ..]` (shape `shape` without `axis`, i.e. `[outer, inner]`) `= sum` of
/// `x[x_offset ..]` (row-major `shape`) along `axis`. An empty axis gives zeros.
#[allow(clippy::too_many_arguments)]
pub fn sum_axis(
    gpu: &Gpu,
    out: &DeviceBuffer,
    out_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    shape: &[usize],
    axis: usize,
) -> Result<()> {
    let view = view_of("sum_axis", shape, axis)?;
    axis_reduction(
        gpu, "sum_axis", &SUM_AXIS, out, out_offset, x, x_offset, view,
    )
}

/// Like [`sum_axis`], divided by the axis extent (an empty axis gives NaN, as 0/0).
#[allow(clippy::too_many_arguments)]
pub fn mean_axis(
    gpu: &Gpu,
    out: &DeviceBuffer,
    out_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    shape: &[usize],
    axis: usize,
) -> Result<()> {
    let view = view_of("mean_axis", shape, axis)?;
    axis_reduction(
        gpu,
        "mean_axis",
        &MEAN_AXIS,
        out,
        out_offset,
        x,
        x_offset,
        view,
    )
}

/// Records the max of `x` (row-major `shape`) along `axis` into `out[out_offset ..]` and its
/// position along the axis (`u32`) into `indices[indices_offset ..]`, both `[outer, inner]`.
/// NaN wins; ties go to the smallest index; an empty axis gives `-inf` and `u32::MAX`.
#[allow(clippy::too_many_arguments)]
pub fn max_axis(
    gpu: &Gpu,
    out: &DeviceBuffer,
    out_offset: u64,
    indices: &DeviceBuffer,
    indices_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    shape: &[usize],
    axis: usize,
) -> Result<()> {
    let view = view_of("max_axis", shape, axis)?;
    check_axis_len("max_axis", view)?;
    let count = view.output_len() as u64;
    check_range("max_axis", "out", out, out_offset, count)?;
    check_range("max_axis", "indices", indices, indices_offset, count)?;
    check_range("max_axis", "x", x, x_offset, view.input_len() as u64)?;
    if count == 0 {
        return Ok(());
    }
    let params = Params {
        src_offset: segment_index(x, x_offset),
        dst_offset: segment_index(out, out_offset),
        idx_out_offset: segment_index(indices, indices_offset),
        ..Params::of_view(view)
    };
    gpu.dispatch(Dispatch {
        kernel: &MAX_AXIS,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[x, out, indices],
        workgroups: grid_1d(gpu, count, AXIS_WORKGROUP)?,
    })
}

/// Records the backward of [`max_axis`]: `dx[o, k, i] = dy[o, i]` where `k == indices[o, i]`, else
/// 0. Writes every element of `dx` (shape `shape`): no zero-fill needed, and it overwrites.
#[allow(clippy::too_many_arguments)]
pub fn max_backward(
    gpu: &Gpu,
    dx: &DeviceBuffer,
    dx_offset: u64,
    dy: &DeviceBuffer,
    dy_offset: u64,
    indices: &DeviceBuffer,
    indices_offset: u64,
    shape: &[usize],
    axis: usize,
) -> Result<()> {
    let view = view_of("max_backward", shape, axis)?;
    let (count, reduced) = (view.input_len() as u64, view.output_len() as u64);
    check_range("max_backward", "dx", dx, dx_offset, count)?;
    check_range("max_backward", "dy", dy, dy_offset, reduced)?;
    check_range("max_backward", "indices", indices, indices_offset, reduced)?;
    if count == 0 {
        return Ok(());
    }
    let params = Params {
        dy_offset: segment_index(dy, dy_offset),
        idx_in_offset: segment_index(indices, indices_offset),
        dx_offset: segment_index(dx, dx_offset),
        ..Params::of_view(view)
    };
    gpu.dispatch(Dispatch {
        kernel: &MAX_BACKWARD,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[dy, indices, dx],
        workgroups: grid_1d(gpu, count, ELEMENTWISE_WORKGROUP)?,
    })
}

/// One-workgroup reduction of `x[x_offset .. + len]` into `out[out_offset]` (and the flat arg-max
/// into `index[index_offset]` for `max_all`). Dispatched even for `len == 0`: the output is one
/// element (sum 0, mean NaN, max `-inf` with index `u32::MAX`).
#[allow(clippy::too_many_arguments)]
fn all_reduction(
    gpu: &Gpu,
    op: &'static str,
    kernel: &Kernel,
    out: &DeviceBuffer,
    out_offset: u64,
    index: Option<(&DeviceBuffer, u64)>,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
) -> Result<()> {
    check_loop_limit(gpu, op, "len", len, all_loop_iterations)?;
    check_range(op, "out", out, out_offset, 1)?;
    check_range(op, "x", x, x_offset, len)?;
    let mut params = Params {
        outer: 1,
        axis_len: len as u32,
        inner: 1,
        src_offset: segment_index(x, x_offset),
        dst_offset: segment_index(out, out_offset),
        ..Params::default()
    };
    let mut buffers = vec![x, out];
    if let Some((index, index_offset)) = index {
        check_range(op, "index", index, index_offset, 1)?;
        params.idx_out_offset = segment_index(index, index_offset);
        buffers.push(index);
    }
    gpu.dispatch(Dispatch {
        kernel,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &buffers,
        // Exactly one workgroup: a fixed-order tree, so the result is deterministic.
        workgroups: [1, 1, 1],
    })
}

/// Records `out[out_offset] = sum of x[x_offset .. + len]` (f32, one workgroup, fixed order).
pub fn sum_all(
    gpu: &Gpu,
    out: &DeviceBuffer,
    out_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
) -> Result<()> {
    all_reduction(
        gpu, "sum_all", &SUM_ALL, out, out_offset, None, x, x_offset, len,
    )
}

/// Records `out[out_offset] = mean of x[x_offset .. + len]` (NaN for `len == 0`).
pub fn mean_all(
    gpu: &Gpu,
    out: &DeviceBuffer,
    out_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
) -> Result<()> {
    all_reduction(
        gpu, "mean_all", &MEAN_ALL, out, out_offset, None, x, x_offset, len,
    )
}

/// Records `out[out_offset] = max of x[x_offset .. + len]` and `index[index_offset]` = its flat
/// index within the range (NaN wins; ties go to the smallest index). Its backward is
/// [`max_backward`] with `shape = [len]`, `axis = 0`.
#[allow(clippy::too_many_arguments)]
pub fn max_all(
    gpu: &Gpu,
    out: &DeviceBuffer,
    out_offset: u64,
    index: &DeviceBuffer,
    index_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
) -> Result<()> {
    let index = Some((index, index_offset));
    all_reduction(
        gpu, "max_all", &MAX_ALL, out, out_offset, index, x, x_offset, len,
    )
}

/// Records `out[out_offset ..] (to_shape) = x[x_offset ..] (from_shape)` summed over every
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
#[allow(clippy::too_many_arguments)]
pub fn sum_to_shape(
    gpu: &Gpu,
    out: &DeviceBuffer,
    out_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
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
    check_range(op, "out", out, out_offset, to_len)?;
    check_range(op, "x", x, x_offset, from_len)?;
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
        return copy::copy(gpu, x, x_offset, out, out_offset, to_len);
    }
    // The tensor currently read: (buffer, offset); scratch keeps intermediate buffers alive.
    let mut scratch: Option<DeviceBuffer> = None;
    let mut done = 0;
    while let Some(at) = runs.iter().position(|(_, s)| *s) {
        let shape: Vec<usize> = runs.iter().map(|(e, _)| *e).collect();
        let view = view_of(op, &shape, at)?;
        runs.remove(at);
        done += 1;
        let (src, src_offset) = match &scratch {
            Some(b) => (b, 0),
            None => (x, x_offset),
        };
        if done == summed_runs {
            return axis_reduction(gpu, op, &SUM_AXIS, out, out_offset, src, src_offset, view);
        }
        let next = gpu.alloc_elements(
            view.output_len() as u64,
            Category::Temporary,
            "sum_to_shape scratch",
        )?;
        axis_reduction(gpu, op, &SUM_AXIS, &next, 0, src, src_offset, view)?;
        scratch = Some(next);
    }
    Ok(())
}
