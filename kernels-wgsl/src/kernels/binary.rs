//! `binary`: `out = a op b` with numpy broadcasting (rank <= 8), the scalar forms `a op s` and
//! `s op a`, and the backward at the output shape, for every [`BinaryOp`]. One pipeline per op
//! (the WGSL `override OP`). Shapes go through the reference's [`Broadcast::new`], so the launcher
//! and the CPU oracle share one broadcasting rule. Shader: `shaders/binary.wgsl`; reference:
//! [`crate::reference::binary`].
//!
//! Operands are contiguous, row-major, and described by their own shapes; the gradient of a
//! broadcast operand is the output-shaped gradient summed down with
//! [`crate::kernels::reduce::sum_to_shape`].

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, check_range, grid_1d, segment_index};
use crate::pipeline::{Kernel, RuntimeChecks};
use crate::recorder::Dispatch;
pub use crate::reference::binary::{BinaryOp, Broadcast};

/// Most output dimensions a broadcast takes (the shader's `shape_lo`/`shape_hi`).
pub const MAX_RANK: usize = 8;

/// The `broadcast` entry point: bindings `a`, `b`, `out`.
pub const BROADCAST: Kernel = Kernel {
    stem: "binary",
    wgsl: include_str!("../../shaders/binary.wgsl"),
    entry: "broadcast",
    storage_bindings: 3,
    runtime_checks: RuntimeChecks::ON,
};

/// The `scalar_rhs` entry point (`a op s`): bindings `a`, `y`.
pub const SCALAR_RHS: Kernel = Kernel {
    entry: "scalar_rhs",
    storage_bindings: 2,
    ..BROADCAST
};

/// The `scalar_lhs` entry point (`s op a`): bindings `a`, `y`.
pub const SCALAR_LHS: Kernel = Kernel {
    entry: "scalar_lhs",
    storage_bindings: 2,
    ..BROADCAST
};

/// The `backward` entry point: bindings `a`, `b`, `dy`, `da`, `db`.
pub const BACKWARD: Kernel = Kernel {
    entry: "backward",
    storage_bindings: 5,
    ..BROADCAST
};

/// Mirrors `Params` in `binary.wgsl` (shared by every entry point; unused fields are 0).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    rank: u32,
    scalar: f32,
    a_offset: u32,
    b_offset: u32,
    out_offset: u32,
    y_offset: u32,
    dy_offset: u32,
    da_offset: u32,
    db_offset: u32,
    _pad0: u32,
    _pad1: u32,
    shape: [u32; MAX_RANK],
    a_strides: [u32; MAX_RANK],
    b_strides: [u32; MAX_RANK],
}

fn overrides(op: BinaryOp) -> [(&'static str, f64); 1] {
    [("OP", f64::from(op.shader_code()))]
}

/// Validates two operand shapes for `op` and returns their broadcast (rank <= [`MAX_RANK`]).
pub fn broadcast_shapes(
    op: &'static str,
    a_shape: &[usize],
    b_shape: &[usize],
) -> Result<Broadcast> {
    let shape = Broadcast::new(a_shape, b_shape).ok_or_else(|| Error::InvalidArgument {
        op,
        message: format!(
            "shapes {a_shape:?} and {b_shape:?} do not broadcast (trailing extents must be equal \
             or 1)"
        ),
    })?;
    if shape.out_shape.len() > MAX_RANK {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "broadcast of {a_shape:?} and {b_shape:?} has rank {}, more than {MAX_RANK}",
                shape.out_shape.len()
            ),
        });
    }
    Ok(shape)
}

/// `Params` with the shape and strides of `shape` (checked to fit the shader's 8 dims).
fn shaped_params(shape: &Broadcast) -> Params {
    let mut params = Params {
        n: elements(&shape.out_shape) as u32,
        rank: shape.out_shape.len() as u32,
        ..Params::default()
    };
    let rank = shape.out_shape.len();
    for (dst, src) in [
        (&mut params.shape, &shape.out_shape),
        (&mut params.a_strides, &shape.a_strides),
        (&mut params.b_strides, &shape.b_strides),
    ] {
        for (d, s) in dst[..rank].iter_mut().zip(src) {
            *d = *s as u32;
        }
    }
    params
}

/// Element count of `shape`, saturating (an absurd shape then fails `check_range`, not overflows).
fn elements(shape: &[usize]) -> u64 {
    shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64))
}

/// Records `out[out_offset + i] = a[a_offset + ia] op b[b_offset + ib]` over the numpy broadcast of
/// `a_shape` and `b_shape` (row-major, contiguous operands); `out` receives
/// `Broadcast::new(a_shape, b_shape).len()` elements. Errors on incompatible shapes, rank > 8, or
/// ranges outside the buffers.
#[allow(clippy::too_many_arguments)]
pub fn broadcast(
    gpu: &Gpu,
    op: BinaryOp,
    out: &DeviceBuffer,
    out_offset: u64,
    a: &DeviceBuffer,
    a_offset: u64,
    a_shape: &[usize],
    b: &DeviceBuffer,
    b_offset: u64,
    b_shape: &[usize],
) -> Result<()> {
    let shape = broadcast_shapes("binary", a_shape, b_shape)?;
    let len = elements(&shape.out_shape);
    check_range("binary", "out", out, out_offset, len)?;
    check_range("binary", "a", a, a_offset, elements(a_shape))?;
    check_range("binary", "b", b, b_offset, elements(b_shape))?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        a_offset: segment_index(a, a_offset),
        b_offset: segment_index(b, b_offset),
        out_offset: segment_index(out, out_offset),
        ..shaped_params(&shape)
    };
    gpu.dispatch(Dispatch {
        kernel: &BROADCAST,
        overrides: &overrides(op),
        params: bytemuck::bytes_of(&params),
        buffers: &[a, b, out],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}

#[allow(clippy::too_many_arguments)]
fn scalar(
    gpu: &Gpu,
    kernel: &Kernel,
    op: BinaryOp,
    out: &DeviceBuffer,
    out_offset: u64,
    a: &DeviceBuffer,
    a_offset: u64,
    len: u64,
    scalar: f32,
) -> Result<()> {
    check_range("binary", "out", out, out_offset, len)?;
    check_range("binary", "a", a, a_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        n: len as u32,
        scalar,
        a_offset: segment_index(a, a_offset),
        y_offset: segment_index(out, out_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel,
        overrides: &overrides(op),
        params: bytemuck::bytes_of(&params),
        buffers: &[a, out],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}

/// Records `out[out_offset + i] = a[a_offset + i] op s` for `i < len` (in place allowed).
#[allow(clippy::too_many_arguments)]
pub fn scalar_rhs(
    gpu: &Gpu,
    op: BinaryOp,
    out: &DeviceBuffer,
    out_offset: u64,
    a: &DeviceBuffer,
    a_offset: u64,
    len: u64,
    s: f32,
) -> Result<()> {
    scalar(gpu, &SCALAR_RHS, op, out, out_offset, a, a_offset, len, s)
}

/// Records `out[out_offset + i] = s op a[a_offset + i]` for `i < len` (in place allowed).
#[allow(clippy::too_many_arguments)]
pub fn scalar_lhs(
    gpu: &Gpu,
    op: BinaryOp,
    out: &DeviceBuffer,
    out_offset: u64,
    s: f32,
    a: &DeviceBuffer,
    a_offset: u64,
    len: u64,
) -> Result<()> {
    scalar(gpu, &SCALAR_LHS, op, out, out_offset, a, a_offset, len, s)
}

/// Records the backward of [`broadcast`] at the *output* shape: for each output element `i`,
/// `da[da_offset + i] = dy[dy_offset + i] * d(a op b)/da` and likewise `db`, evaluated at the
/// operands of element `i`. `da`, `db` and `dy` all hold `Broadcast::new(a_shape, b_shape).len()`
/// elements; sum each down to its operand's shape with [`crate::kernels::reduce::sum_to_shape`].
/// max/min give `dy` to the winner and `dy / 2` to each side on a tie.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    gpu: &Gpu,
    op: BinaryOp,
    da: &DeviceBuffer,
    da_offset: u64,
    db: &DeviceBuffer,
    db_offset: u64,
    a: &DeviceBuffer,
    a_offset: u64,
    a_shape: &[usize],
    b: &DeviceBuffer,
    b_offset: u64,
    b_shape: &[usize],
    dy: &DeviceBuffer,
    dy_offset: u64,
) -> Result<()> {
    let shape = broadcast_shapes("binary_backward", a_shape, b_shape)?;
    let len = elements(&shape.out_shape);
    check_range("binary_backward", "da", da, da_offset, len)?;
    check_range("binary_backward", "db", db, db_offset, len)?;
    check_range("binary_backward", "dy", dy, dy_offset, len)?;
    check_range("binary_backward", "a", a, a_offset, elements(a_shape))?;
    check_range("binary_backward", "b", b, b_offset, elements(b_shape))?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        a_offset: segment_index(a, a_offset),
        b_offset: segment_index(b, b_offset),
        dy_offset: segment_index(dy, dy_offset),
        da_offset: segment_index(da, da_offset),
        db_offset: segment_index(db, db_offset),
        ..shaped_params(&shape)
    };
    gpu.dispatch(Dispatch {
        kernel: &BACKWARD,
        overrides: &overrides(op),
        params: bytemuck::bytes_of(&params),
        buffers: &[a, b, dy, da, db],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}
