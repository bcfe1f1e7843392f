//! `unary`: elementwise `y = f(x)` and its backward `dx = dy * f'(.)` for every [`UnaryOp`].
//! One pipeline per op (the WGSL `override OP`). In one place: the shaders (`unary.wgsl`, the
//! 16-bit `unary_f16.wgsl` and `unary_f16_native.wgsl`, and `unary_ops.wgsl`, the op and its
//! math they share; all beside this file), the launchers, the CPU [`reference`](mod@reference)
//! and the tests.

use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::convert::{F16Path, Halves, expect_elementwise_halves};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_split, launch_units, same_len};
use crate::pipeline::{Kernel, kernel, kernels, op_family, shader_params, shader_source};
use crate::slice::DeviceSlice;
use const_format::concatcp;

pub mod reference;
#[cfg(test)]
pub(crate) mod tests;

op_family! {
    /// A unary op; [`UnaryOp::shader_code`] is the value of the `OP` override in
    /// `unary.wgsl`, whose switch names the ops as [`UnaryOp::WGSL`] declares them.
    pub enum UnaryOp {
        /// `-x`
        Neg => "neg",
        /// `exp(x)`
        Exp => "exp",
        /// natural `ln(x)`
        Log => "log",
        /// `sqrt(x)`
        Sqrt => "sqrt",
        /// `|x|`; derivative `sign(x)`, 0 at 0 (as PyTorch)
        Abs => "abs",
        /// `max(x, 0)`; derivative 0 at 0 (as PyTorch)
        Relu => "relu",
        /// GELU, tanh approximation
        Gelu => "gelu",
        /// `tanh(x)`
        Tanh => "tanh",
        /// `1 / (1 + exp(-x))`
        Sigmoid => "sigmoid",
        /// `x^p` with the exponent `p` passed as a scalar
        Pow => "pow",
        /// SiLU (swish), `x * sigmoid(x)`: the gate of a SwiGLU MLP
        Silu => "silu",
    }
}

impl UnaryOp {
    /// Whether the backward takes the forward output `y` (exp, tanh, sigmoid) rather than `x`.
    pub fn backward_uses_output(self) -> bool {
        matches!(self, UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Sigmoid)
    }
}

/// The op and its math (`unary_ops.wgsl`), shared by the f32 and the 16-bit modules.
const OPS: &str = include_str!("unary_ops.wgsl");

/// The module: `unary.wgsl` (entry points) and `unary_ops.wgsl` (the op and its math, shared
/// with the 16-bit modules).
const WGSL: &str = concatcp!(
    include_str!("unary.wgsl"),
    OPS,
    shader_source!("indexing"),
    UnaryOp::WGSL
);

kernels! {
    "unary", source: WGSL, workgroup: ELEMENTWISE_WORKGROUP;
    /// The `forward` entry point: bindings `x`, `y`.
    FORWARD = "forward" [x, y];
    /// The `backward` entry point: bindings `saved`, `dy`, `dx`.
    BACKWARD = "backward" [saved, dy, dx];
    /// The `forward_v4` entry point (four elements per invocation): bindings `x_v4`, `y_v4`.
    FORWARD_V4 = "forward_v4" [x_v4: "array<vec4<f32>>", y_v4: "array<vec4<f32>>"];
    /// The `backward_v4` entry point (four elements per invocation).
    BACKWARD_V4 = "backward_v4" [
        saved_v4: "array<vec4<f32>>",
        dy_v4: "array<vec4<f32>>",
        dx_v4: "array<vec4<f32>>",
    ];
}

/// `forward` on 16-bit x and y, packed path: `unary_f16.wgsl` with the op and the rounding.
pub const FORWARD_F16: Kernel = kernel!(
    "unary_f16",
    "forward_f16",
    source: concatcp!(
        include_str!("unary_f16.wgsl"),
        OPS,
        shader_source!("indexing", "f16_bits"),
        UnaryOp::WGSL
    ),
    params: Params,
    [x_w: "array<u32>", y_w: "array<u32>"],
    ELEMENTWISE_WORKGROUP
);

/// `forward` on 16-bit x and y, native path (`SHADER_F16`): `unary_f16_native.wgsl`.
pub const FORWARD_F16_NATIVE: Kernel = kernel!(
    "unary_f16_native",
    "forward_f16",
    source: concatcp!(
        "enable f16;\n",
        include_str!("unary_f16_native.wgsl"),
        OPS,
        shader_source!("indexing", "f16_native"),
        UnaryOp::WGSL
    ),
    params: Params,
    [x_h: "array<f16>", y_h: "array<f16>"],
    ELEMENTWISE_WORKGROUP
);

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    FORWARD,
    BACKWARD,
    FORWARD_V4,
    BACKWARD_V4,
    FORWARD_F16,
    FORWARD_F16_NATIVE,
];

shader_params! {
    /// The `Params` of `unary.wgsl` (shared by both entry points; unused offsets are 0).
    struct Params {
        n: u32,
        exponent: f32,
        x_offset: u32,
        y_offset: u32,
        saved_offset: u32,
        dy_offset: u32,
        dx_offset: u32,
        /// The 16-bit entry points: the first element of the range this dispatch computes,
        /// up to `n` (a launch in ranges under a submission bound).
        start: u32,
    }
}

/// The override constants of `op`'s pipelines.
pub(crate) fn overrides(op: UnaryOp) -> [(&'static str, f64); 1] {
    [("OP", f64::from(op.shader_code()))]
}

/// Records `y[i] = f(x[i])` for every element (the lengths must match). `exponent` is used
/// only by [`UnaryOp::Pow`]. `x` and `y` may be the same slice (in place).
pub fn forward(
    gpu: &Gpu,
    op: UnaryOp,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    exponent: f32,
) -> Result<()> {
    let len = same_len("unary", &[("y", y), ("x", x)])?;
    let kernels = [&FORWARD_V4, &FORWARD];
    launch_split(gpu, kernels, &overrides(op), &[x, y], len, |part| Params {
        n: part.count,
        exponent,
        x_offset: part.offset(x.index()),
        y_offset: part.offset(y.index()),
        ..Params::default()
    })
}

/// Records `dx[i] = dy[i] * f'(.)` for every element (the lengths must match), where `saved`
/// holds the forward *output* `y` if [`UnaryOp::backward_uses_output`] (exp, tanh, sigmoid) and
/// the forward *input* `x` otherwise. `dx` is overwritten (callers accumulate with `binary` add).
pub fn backward(
    gpu: &Gpu,
    op: UnaryOp,
    dx: DeviceSlice<'_>,
    saved: DeviceSlice<'_>,
    dy: DeviceSlice<'_>,
    exponent: f32,
) -> Result<()> {
    let len = same_len(
        "unary_backward",
        &[("dx", dx), ("saved", saved), ("dy", dy)],
    )?;
    let kernels = [&BACKWARD_V4, &BACKWARD];
    let buffers = [saved, dy, dx];
    launch_split(gpu, kernels, &overrides(op), &buffers, len, |part| Params {
        n: part.count,
        exponent,
        saved_offset: part.offset(saved.index()),
        dy_offset: part.offset(dy.index()),
        dx_offset: part.offset(dx.index()),
        ..Params::default()
    })
}

/// [`forward`] on 16-bit `x` and `y`: `y = half(f(x))`, `f` computed in f32 (as PyTorch computes
/// its f16 elementwise ops), on the device's path ([`Gpu::f16_path`]; the same values on both).
/// Errors: [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the lengths differ,
/// or on the packed path when `y` starts in the high half of a word.
pub fn forward_f16(
    gpu: &Gpu,
    op: UnaryOp,
    y: Halves<'_>,
    x: Halves<'_>,
    exponent: f32,
) -> Result<()> {
    expect_elementwise_halves(gpu, "unary_f16", &y, &x)?;
    let params = Params {
        n: x.len() as u32,
        exponent,
        x_offset: x.index(),
        y_offset: y.index(),
        ..Params::default()
    };
    let (kernel, per) = match gpu.f16_path() {
        F16Path::Native => (&FORWARD_F16_NATIVE, 1),
        F16Path::Packed => (&FORWARD_F16, 2),
    };
    let buffers = [x.words(), y.words()];
    let len = x.len();
    // Units of `per` elements, one invocation each (a packed invocation writes a word).
    launch_units(gpu, kernel, &overrides(op), &buffers, len.div_ceil(per), |s, e| {
        let (start, end) = (s * per, (e * per).min(len));
        let range = Params {
            n: end as u32,
            start: start as u32,
            ..params
        };
        (range, e - s)
    })
}
