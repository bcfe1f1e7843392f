//! `binary` on 16-bit operands (a child of [`super`], sharing its `Params`): the broadcast and
//! scalar forms on both 16-bit paths. Shaders: `binary_f16.wgsl` (packed) and
//! `binary_f16_native.wgsl` (native), each with `binary_ops.wgsl` (all beside this file).

use super::{
    BinaryDims, BinaryOp, OPS, Params, broadcast_shapes, elements, overrides, shaped_params,
};
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::convert::{F16Path, Halves, expect_elementwise_halves, expect_whole_words};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_units};
use crate::pipeline::Kernel;
use crate::slice::DeviceSlice;
use crate::pipeline::{kernels, shader_source};
use const_format::concatcp;

/// The `Params` declaration (the parent's).
const PARAMS_WGSL: &str = super::PARAMS_WGSL;

/// The packed 16-bit module: `binary_f16.wgsl`, the op and the rounding.
const WGSL_F16: &str = concatcp!(
    include_str!("binary_f16.wgsl"),
    OPS,
    shader_source!("indexing", "f16_bits"),
    BinaryOp::WGSL
);

/// The native 16-bit module: `enable f16;`, `binary_f16_native.wgsl`, the op and the
/// rounding.
const WGSL_F16_NATIVE: &str = concatcp!(
    "enable f16;\n",
    include_str!("binary_f16_native.wgsl"),
    OPS,
    shader_source!("indexing", "f16_native"),
    BinaryOp::WGSL
);

kernels! {
    "binary_f16", source: WGSL_F16, workgroup: ELEMENTWISE_WORKGROUP;
    /// `broadcast` on 16-bit operands, packed path: `binary_f16.wgsl` with the op and the
    /// rounding.
    BROADCAST_F16 = "broadcast_f16" [a_w: "array<u32>", b_w: "array<u32>", out_w: "array<u32>"];
    /// The scalar forms on 16-bit operands, packed path (`a op s`, or `s op a` with `period` 1).
    SCALAR_F16 = "scalar_f16" [a_w: "array<u32>", y_w: "array<u32>"];
}

kernels! {
    "binary_f16_native", source: WGSL_F16_NATIVE, workgroup: ELEMENTWISE_WORKGROUP;
    /// `broadcast` on 16-bit operands, native path (`SHADER_F16`): `binary_f16_native.wgsl`.
    BROADCAST_F16_NATIVE = "broadcast_f16" [
        a_h: "array<f16>",
        b_h: "array<f16>",
        out_h: "array<f16>",
    ];
    /// [`SCALAR_F16`] on the native path (`SHADER_F16`).
    SCALAR_F16_NATIVE = "scalar_f16" [a_h: "array<f16>", y_h: "array<f16>"];
}

/// [`super::broadcast`] on 16-bit operands and output: `out[i] = half(a[ia] op b[ib])`, on the
/// device's path ([`Gpu::f16_path`]): native `f16` arithmetic for add, sub, mul and div where
/// the device has `SHADER_F16`, else f32 arithmetic rounded once to f16 (the same bits for add,
/// sub and mul, and for max and min; division within WGSL's 2.5 ULP on either path). Errors: those of [`super::broadcast`], and
/// [`Error::InvalidArgument`] on the packed path when `out` starts in the high half of a word.
pub fn broadcast_f16(
    gpu: &Gpu,
    dims: &BinaryDims<'_>,
    out: Halves<'_>,
    a: Halves<'_>,
    b: Halves<'_>,
) -> Result<()> {
    let op = "binary_f16";
    let shape = broadcast_shapes(op, dims.a_shape, dims.b_shape)?;
    let len = elements(&shape.out_shape);
    for (name, halves, want) in [
        ("a", &a, elements(dims.a_shape)),
        ("b", &b, elements(dims.b_shape)),
        ("out", &out, len),
    ] {
        if halves.len() != want {
            return Err(Error::InvalidArgument {
                op,
                message: format!("{name}: {} halves given, {want} needed", halves.len()),
            });
        }
    }
    expect_whole_words(gpu, op, &out)?;
    let params = Params {
        a_offset: a.index(),
        b_offset: b.index(),
        out_offset: out.index(),
        ..shaped_params(&shape)
    };
    let buffers = [a.words(), b.words(), out.words()];
    let (kernel, per) = match gpu.f16_path() {
        F16Path::Native => (&BROADCAST_F16_NATIVE, 1),
        F16Path::Packed => (&BROADCAST_F16, 2),
    };
    launch_pairs(gpu, kernel, &overrides(dims.op), &buffers, [len, per], params)
}

/// Records a 16-bit binary launch over `len` elements in units of `per` (2 on the packed
/// path: an invocation writes a word), in ranges under a submission bound
/// ([`launch_units`]); `params` is the whole launch's (its `n` becomes each range's end).
fn launch_pairs(
    gpu: &Gpu,
    kernel: &Kernel,
    overrides: &[(&str, f64); 1],
    buffers: &[DeviceSlice<'_>],
    [len, per]: [u64; 2],
    params: Params,
) -> Result<()> {
    launch_units(gpu, kernel, overrides, buffers, len.div_ceil(per), |s, e| {
        let (start, end) = (s * per, (e * per).min(len));
        (params.range(start as u32, end as u32), e - s)
    })
}

/// `y = half(x op s)` (`rhs`) or `half(s op x)` (`!rhs`) over 16-bit `x` and `y`, `s` kept in
/// f32 (as PyTorch keeps a Python scalar), computed in f32 and rounded once, on the device's
/// path. Errors: [`Error::InvalidArgument`] when the lengths differ, or on the packed path when
/// `y` starts in the high half of a word.
pub fn scalar_f16(
    gpu: &Gpu,
    op: BinaryOp,
    y: Halves<'_>,
    x: Halves<'_>,
    s: f32,
    rhs: bool,
) -> Result<()> {
    expect_elementwise_halves(gpu, "binary_scalar_f16", &y, &x)?;
    let params = Params {
        n: x.len() as u32,
        scalar: s,
        a_offset: x.index(),
        out_offset: y.index(),
        period: u32::from(!rhs),
        ..Params::default()
    };
    let (kernel, per) = match gpu.f16_path() {
        F16Path::Native => (&SCALAR_F16_NATIVE, 1),
        F16Path::Packed => (&SCALAR_F16, 2),
    };
    let buffers = [x.words(), y.words()];
    launch_pairs(gpu, kernel, &overrides(op), &buffers, [x.len(), per], params)
}
