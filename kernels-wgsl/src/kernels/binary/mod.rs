//! `binary`: `out = a op b` with numpy broadcasting (rank <= 8), the scalar forms `a op s` and
//! `s op a`, and the backward at the output shape, for every [`BinaryOp`]. One pipeline per op
//! (the WGSL `override OP`). Shapes go through the reference's [`Broadcast::new`], so the launcher
//! and the CPU oracle share one broadcasting rule. In one place: the shaders (`binary.wgsl`, the
//! 16-bit `binary_f16.wgsl` and `binary_f16_native.wgsl` launched from `half.rs`, and
//! `binary_ops.wgsl`, the op and its math they share; all beside this file), the launchers, the
//! CPU [`reference`](mod@reference) and the tests.
//!
//! Operands are contiguous, row-major, and described by their own shapes; the gradient of a
//! broadcast operand is the output-shaped gradient summed down with
//! [`crate::kernels::reduce::sum_to_shape`].

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_ranges, launch_split, same_len};
use crate::pipeline::{Kernel, kernels, op_family, shader_params, shader_source};
use crate::slice::DeviceSlice;
use const_format::concatcp;

mod half;
pub mod reference;
#[cfg(test)]
pub(crate) mod tests;

pub use half::{
    BROADCAST_F16, BROADCAST_F16_NATIVE, SCALAR_F16, SCALAR_F16_NATIVE, broadcast_f16, scalar_f16,
};

op_family! {
    /// A binary op; [`BinaryOp::shader_code`] is the value of the `OP` override in
    /// `binary.wgsl`, whose switch names the ops as [`BinaryOp::WGSL`] declares them.
    pub enum BinaryOp {
        /// `a + b`
        Add => "add",
        /// `a - b`
        Sub => "sub",
        /// `a * b`
        Mul => "mul",
        /// `a / b`
        Div => "div",
        /// `max(a, b)`, NaN if either is NaN
        Max => "maximum",
        /// `min(a, b)`, NaN if either is NaN
        Min => "minimum",
    }
}

/// Row-major (C-contiguous) element strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut step = 1;
    for d in (0..shape.len()).rev() {
        strides[d] = step;
        step *= shape[d];
    }
    strides
}

/// A numpy broadcast of two operands: the output shape and, per output dimension, each
/// operand's element stride (0 where that operand is broadcast along the dimension).
/// These are exactly the `shape`/`a_strides`/`b_strides` fields of the WGSL `Params`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broadcast {
    /// Output shape, outermost first; its rank is the larger operand rank.
    pub out_shape: Vec<usize>,
    /// Stride of `a` per output dimension; 0 where `a` has extent 1 or lacks the dimension.
    pub a_strides: Vec<usize>,
    /// Stride of `b` per output dimension; 0 where `b` has extent 1 or lacks the dimension.
    pub b_strides: Vec<usize>,
}

impl Broadcast {
    /// Broadcasts contiguous operands of shapes `a_shape` and `b_shape` (numpy rules: align
    /// the trailing dimensions; extents must be equal or 1). `None` if they are incompatible.
    pub fn new(a_shape: &[usize], b_shape: &[usize]) -> Option<Broadcast> {
        let rank = a_shape.len().max(b_shape.len());
        // Left-pad both shapes with 1s to the output rank.
        let pad = |s: &[usize]| -> Vec<usize> {
            let mut p = vec![1; rank - s.len()];
            p.extend_from_slice(s);
            p
        };
        let (a, b) = (pad(a_shape), pad(b_shape));
        let (a_contig, b_contig) = (contiguous_strides(&a), contiguous_strides(&b));
        let mut out_shape = Vec::with_capacity(rank);
        let mut a_strides = Vec::with_capacity(rank);
        let mut b_strides = Vec::with_capacity(rank);
        for d in 0..rank {
            let extent = match (a[d], b[d]) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => return None,
            };
            out_shape.push(extent);
            a_strides.push(if a[d] == 1 { 0 } else { a_contig[d] });
            b_strides.push(if b[d] == 1 { 0 } else { b_contig[d] });
        }
        Some(Broadcast {
            out_shape,
            a_strides,
            b_strides,
        })
    }

    /// Number of output elements.
    pub fn len(&self) -> usize {
        self.out_shape.iter().product()
    }

    /// Whether the output has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element offsets into `a` and `b` of flat output index `i`.
    pub fn operand_offsets(&self, i: usize) -> (usize, usize) {
        let (mut rest, mut oa, mut ob) = (i, 0, 0);
        for d in (0..self.out_shape.len()).rev() {
            let idx = rest % self.out_shape[d];
            rest /= self.out_shape[d];
            oa += idx * self.a_strides[d];
            ob += idx * self.b_strides[d];
        }
        (oa, ob)
    }
}

/// Most output dimensions a broadcast takes (the shader's `shape_lo`/`shape_hi`).
pub const MAX_RANK: usize = 8;

/// The op and its math (`binary_ops.wgsl`), shared by the f32 and the 16-bit modules.
const OPS: &str = concatcp!(include_str!("binary_ops.wgsl"), shader_source!("float_bits"));

/// The module: `binary.wgsl` (entry points) and `binary_ops.wgsl` (the op and its math, shared
/// with the 16-bit modules).
const WGSL: &str = concatcp!(
    include_str!("binary.wgsl"),
    OPS,
    shader_source!("indexing"),
    BinaryOp::WGSL
);

kernels! {
    "binary", source: WGSL, workgroup: ELEMENTWISE_WORKGROUP;
    /// The `broadcast` entry point: bindings `a`, `b`, `out`.
    BROADCAST = "broadcast" [a, b, out];
    /// The `scalar_rhs` entry point (`a op s`): bindings `a`, `y`.
    SCALAR_RHS = "scalar_rhs" [a, y];
    /// The `scalar_lhs` entry point (`s op a`): bindings `a`, `y`.
    SCALAR_LHS = "scalar_lhs" [a, y];
    /// The `backward` entry point: bindings `a`, `b`, `dy`, `da`, `db`.
    BACKWARD = "backward" [a, b, dy, da, db];
    /// The `same_v4` entry point (same-shape `broadcast`, four elements per invocation).
    SAME_V4 = "same_v4" [
        a_v4: "array<vec4<f32>>",
        b_v4: "array<vec4<f32>>",
        out_v4: "array<vec4<f32>>",
    ];
    /// The `suffix_v4` entry point (b broadcast along a's leading dimensions, four per invocation).
    SUFFIX_V4 = "suffix_v4" [
        a_v4: "array<vec4<f32>>",
        b_v4: "array<vec4<f32>>",
        out_v4: "array<vec4<f32>>",
    ];
    /// The `scalar_rhs_v4` entry point.
    SCALAR_RHS_V4 = "scalar_rhs_v4" [a_v4: "array<vec4<f32>>", y_v4: "array<vec4<f32>>"];
    /// The `scalar_lhs_v4` entry point.
    SCALAR_LHS_V4 = "scalar_lhs_v4" [a_v4: "array<vec4<f32>>", y_v4: "array<vec4<f32>>"];
    /// The `backward_same_v4` entry point (same-shape `backward`, four elements per invocation).
    BACKWARD_SAME_V4 = "backward_same_v4" [
        a_v4: "array<vec4<f32>>",
        b_v4: "array<vec4<f32>>",
        dy_v4: "array<vec4<f32>>",
        da_v4: "array<vec4<f32>>",
        db_v4: "array<vec4<f32>>",
    ];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    BROADCAST,
    SCALAR_RHS,
    SCALAR_LHS,
    BACKWARD,
    SAME_V4,
    SUFFIX_V4,
    SCALAR_RHS_V4,
    SCALAR_LHS_V4,
    BACKWARD_SAME_V4,
    BROADCAST_F16,
    BROADCAST_F16_NATIVE,
    SCALAR_F16,
    SCALAR_F16_NATIVE,
];

shader_params! {
    /// The `Params` of `binary.wgsl` (shared by every entry point; unused fields are 0).
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
        /// `suffix_v4`: b's length in `vec4`s; `scalar_f16`: 1 for `s op a`, 0 for `a op s`.
        period: u32,
        /// `broadcast`, `suffix_v4`, `backward`: the first element (or `vec4`) of the range
        /// this dispatch computes, up to `n` (a launch split under a submission bound).
        start: u32,
        shape: [u32; MAX_RANK] = "array<vec4<u32>, 2>",
        a_strides: [u32; MAX_RANK] = "array<vec4<u32>, 2>",
        b_strides: [u32; MAX_RANK] = "array<vec4<u32>, 2>",
    }
}

impl Params {
    /// These `Params` for the range `start..end` of a launch ([`launch_ranges`]).
    pub(super) fn range(mut self, start: u32, end: u32) -> Params {
        self.start = start;
        self.n = end;
        self
    }
}

/// The override constants of `op`'s pipelines.
pub(crate) fn overrides(op: BinaryOp) -> [(&'static str, f64); 1] {
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

/// `Params` with the shape and strides of `shape` (checked to fit the shader's 8 dims). When
/// neither operand is broadcast, rank 0: the shader's same-shape path, without per-element
/// index arithmetic.
fn shaped_params(shape: &Broadcast) -> Params {
    let same_shape = shape.a_strides == shape.b_strides
        && shape.a_strides == contiguous_strides(&shape.out_shape);
    let mut params = Params {
        n: elements(&shape.out_shape) as u32,
        rank: shape.out_shape.len() as u32,
        ..Params::default()
    };
    if same_shape {
        params.rank = 0;
        return params;
    }
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

/// What a broadcast launch computes: the op and the shapes of its two contiguous, row-major
/// operands (the output shape is their numpy broadcast).
#[derive(Debug, Clone, Copy)]
pub struct BinaryDims<'a> {
    /// The op.
    pub op: BinaryOp,
    /// Shape of `a`.
    pub a_shape: &'a [usize],
    /// Shape of `b`.
    pub b_shape: &'a [usize],
}

/// Checks `a` and `b` against their shapes and returns the broadcast and its element count.
fn checked(
    op: &'static str,
    dims: &BinaryDims<'_>,
    a: DeviceSlice<'_>,
    b: DeviceSlice<'_>,
) -> Result<(Broadcast, u64)> {
    let shape = broadcast_shapes(op, dims.a_shape, dims.b_shape)?;
    a.expect_len(op, "a", elements(dims.a_shape))?;
    b.expect_len(op, "b", elements(dims.b_shape))?;
    let len = elements(&shape.out_shape);
    Ok((shape, len))
}

/// Records `out[i] = a[ia] op b[ib]` over the numpy broadcast of `dims`' shapes; `out` holds
/// the broadcast's elements. Errors on incompatible shapes, rank > 8, or slice lengths that do
/// not match the shapes.
pub fn broadcast(
    gpu: &Gpu,
    dims: &BinaryDims<'_>,
    out: DeviceSlice<'_>,
    a: DeviceSlice<'_>,
    b: DeviceSlice<'_>,
) -> Result<()> {
    let (shape, len) = checked("binary", dims, a, b)?;
    out.expect_len("binary", "out", len)?;
    let shaped = shaped_params(&shape);
    let overrides = overrides(dims.op);
    let buffers = [a, b, out];
    if shaped.rank == 0 {
        // Same shapes: four elements per invocation where aligned.
        return launch_split(
            gpu,
            [&SAME_V4, &BROADCAST],
            &overrides,
            &buffers,
            len,
            |part| Params {
                n: part.count,
                a_offset: part.offset(a.index()),
                b_offset: part.offset(b.index()),
                out_offset: part.offset(out.index()),
                ..Params::default() // rank 0: the same-shape path
            },
        );
    }
    let period = elements(dims.b_shape);
    // b without its leading 1s is a's trailing dimensions (and a is the output's shape).
    let b_core = &dims.b_shape[dims.b_shape.iter().take_while(|&&d| d == 1).count()..];
    let b_is_suffix = dims.a_shape == shape.out_shape.as_slice() && dims.a_shape.ends_with(b_core);
    let aligned = buffers.iter().all(|s| s.index().is_multiple_of(4));
    if b_is_suffix && aligned && period > 0 && period.is_multiple_of(4) {
        // A bias row: b repeats along a's leading dimensions, one period of whole vec4s.
        let mut whole = shaped;
        whole.a_offset = a.index() / 4;
        whole.b_offset = b.index() / 4;
        whole.out_offset = out.index() / 4;
        whole.period = (period / 4) as u32;
        let params = |start, end| whole.range(start, end);
        return launch_ranges(gpu, &SUFFIX_V4, &overrides, &buffers, len / 4, params);
    }
    let mut whole = shaped;
    whole.a_offset = a.index();
    whole.b_offset = b.index();
    whole.out_offset = out.index();
    let params = |start, end| whole.range(start, end);
    launch_ranges(gpu, &BROADCAST, &overrides, &buffers, len, params)
}

fn scalar(
    gpu: &Gpu,
    kernels: [&Kernel; 2],
    op: BinaryOp,
    out: DeviceSlice<'_>,
    a: DeviceSlice<'_>,
    scalar: f32,
) -> Result<()> {
    let len = same_len("binary", &[("out", out), ("a", a)])?;
    launch_split(gpu, kernels, &overrides(op), &[a, out], len, |part| {
        Params {
            n: part.count,
            scalar,
            a_offset: part.offset(a.index()),
            y_offset: part.offset(out.index()),
            ..Params::default()
        }
    })
}

/// Records `out[i] = a[i] op s` for every element (the lengths must match; in place allowed).
pub fn scalar_rhs(
    gpu: &Gpu,
    op: BinaryOp,
    out: DeviceSlice<'_>,
    a: DeviceSlice<'_>,
    s: f32,
) -> Result<()> {
    scalar(gpu, [&SCALAR_RHS_V4, &SCALAR_RHS], op, out, a, s)
}

/// Records `out[i] = s op a[i]` for every element (the lengths must match; in place allowed).
pub fn scalar_lhs(
    gpu: &Gpu,
    op: BinaryOp,
    out: DeviceSlice<'_>,
    s: f32,
    a: DeviceSlice<'_>,
) -> Result<()> {
    scalar(gpu, [&SCALAR_LHS_V4, &SCALAR_LHS], op, out, a, s)
}

/// Records the backward of [`broadcast`] at the *output* shape: for each output element `i`,
/// `da[i] = dy[i] * d(a op b)/da` and likewise `db`, evaluated at the operands of element `i`.
/// `da`, `db` and `dy` all hold the broadcast's elements; sum each down to its operand's shape
/// with [`crate::kernels::reduce::sum_to_shape`]. max/min give `dy` to the winner and `dy / 2` to
/// each side on a tie.
pub fn backward(
    gpu: &Gpu,
    dims: &BinaryDims<'_>,
    da: DeviceSlice<'_>,
    db: DeviceSlice<'_>,
    a: DeviceSlice<'_>,
    b: DeviceSlice<'_>,
    dy: DeviceSlice<'_>,
) -> Result<()> {
    let op = "binary_backward";
    let (shape, len) = checked(op, dims, a, b)?;
    same_len(op, &[("dy", dy), ("da", da), ("db", db)])?;
    dy.expect_len(op, "dy", len)?;
    let shaped = shaped_params(&shape);
    let overrides = overrides(dims.op);
    let buffers = [a, b, dy, da, db];
    if shaped.rank == 0 {
        let kernels = [&BACKWARD_SAME_V4, &BACKWARD];
        return launch_split(gpu, kernels, &overrides, &buffers, len, |part| Params {
            n: part.count,
            a_offset: part.offset(a.index()),
            b_offset: part.offset(b.index()),
            dy_offset: part.offset(dy.index()),
            da_offset: part.offset(da.index()),
            db_offset: part.offset(db.index()),
            ..Params::default() // rank 0: the same-shape path
        });
    }
    let mut whole = shaped;
    whole.a_offset = a.index();
    whole.b_offset = b.index();
    whole.dy_offset = dy.index();
    whole.da_offset = da.index();
    whole.db_offset = db.index();
    let params = |start, end| whole.range(start, end);
    launch_ranges(gpu, &BACKWARD, &overrides, &buffers, len, params)
}
