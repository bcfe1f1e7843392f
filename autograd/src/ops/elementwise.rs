//! Elementwise ops: `add`, `sub`, `mul`, `div` with numpy broadcasting, their scalar forms, and
//! the unary functions (neg, exp, log, sqrt, pow, relu, gelu, tanh, sigmoid).
//! Kernels: `binary` (broadcast forward and backward at the output shape, then `reduce`'s
//! `sum_to_shape` for broadcast operands) and `unary`.

use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::kernels::binary::{self, BinaryDims, BinaryOp, Broadcast};
use plimsoll_kernels_wgsl::kernels::reduce;
use plimsoll_kernels_wgsl::kernels::unary::{self, UnaryOp};

use crate::error::Result;
use crate::half::{any_f16, output_dtype};
use crate::op::Op;
use crate::ops::mismatch;
use crate::tape::{output_category, record, records};
use crate::tensor::{DType, Tensor};

fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Max => "maximum",
        BinaryOp::Min => "minimum",
    }
}

/// The broadcast of `a` and `b`, each of `dtype`.
fn broadcast_of(op: &'static str, a: &Tensor, b: &Tensor, dtype: DType) -> Result<Broadcast> {
    a.expect_dtype(op, dtype)?;
    b.expect_dtype(op, dtype)?;
    Broadcast::new(&a.shape, &b.shape).ok_or_else(|| {
        mismatch(
            op,
            &a.shape,
            &b.shape,
            "trailing extents must be equal or 1",
        )
    })
}

/// `a op b` over the broadcast shape, recorded when needed.
fn binary(a: &Tensor, b: &Tensor, op: BinaryOp) -> Result<Tensor> {
    if any_f16(&[a, b]) {
        let category = output_category(records(&[a, b]));
        let both = a.dtype == DType::F16 && b.dtype == DType::F16;
        let numel = crate::tensor::numel(&a.shape).max(crate::tensor::numel(&b.shape));
        if both && output_dtype(category, numel) == DType::F16 {
            return binary_f16(a, b, op, category);
        }
        return binary(&a.widened()?, &b.widened()?, op);
    }
    let name = binary_name(op);
    let shape = broadcast_of(name, a, b, DType::F32)?;
    let recording = records(&[a, b]);
    let out = Tensor::empty(&a.gpu, &shape.out_shape, output_category(recording), name)?;
    let dims = BinaryDims {
        op,
        a_shape: &a.shape,
        b_shape: &b.shape,
    };
    binary::broadcast(&a.gpu, &dims, out.elements()?, a.elements()?, b.elements()?)?;
    record(out, &[a, b], || binary_op(op, a, b))
}

/// The node of `a op b`: the shapes, or the operands when the derivative reads them.
fn binary_op(op: BinaryOp, a: &Tensor, b: &Tensor) -> Op {
    let (lhs, rhs) = (a.shape.clone(), b.shape.clone());
    match op {
        BinaryOp::Add => Op::Add { lhs, rhs },
        BinaryOp::Sub => Op::Sub { lhs, rhs },
        BinaryOp::Mul | BinaryOp::Div | BinaryOp::Max | BinaryOp::Min => Op::Binary {
            op,
            a: a.detach(),
            b: b.detach(),
        },
    }
}

/// [`binary`] of two f16 tensors into an f16 output (under `f16_activations`): the 16-bit
/// kernel, with no f32 copies.
fn binary_f16(a: &Tensor, b: &Tensor, op: BinaryOp, category: Category) -> Result<Tensor> {
    let name = binary_name(op);
    let shape = broadcast_of(name, a, b, DType::F16)?;
    let out = Tensor::empty_typed(&a.gpu, &shape.out_shape, DType::F16, category, name)?;
    let dims = BinaryDims {
        op,
        a_shape: &a.shape,
        b_shape: &b.shape,
    };
    binary::broadcast_f16(&a.gpu, &dims, out.halves()?, a.halves()?, b.halves()?)?;
    record(out, &[a, b], || binary_op(op, a, b))
}

/// `x op s` (`rhs`) or `s op x` (`!rhs`), recorded as `recorded()` when needed.
fn scalar(
    x: &Tensor,
    op: BinaryOp,
    s: f32,
    rhs: bool,
    recorded: impl FnOnce() -> Op,
) -> Result<Tensor> {
    let name = binary_name(op);
    let category = output_category(records(&[x]));
    if x.dtype == DType::F16 {
        if output_dtype(category, x.numel()) == DType::F32 {
            return scalar(&x.widened()?, op, s, rhs, recorded);
        }
        // Under `f16_activations`: the 16-bit kernel, `s` kept in f32.
        let out = Tensor::empty_typed(&x.gpu, &x.shape, DType::F16, category, name)?;
        binary::scalar_f16(&x.gpu, op, out.halves()?, x.halves()?, s, rhs)?;
        return record(out, &[x], recorded);
    }
    x.expect_dtype(name, DType::F32)?;
    let out = Tensor::empty(&x.gpu, &x.shape, category, name)?;
    if rhs {
        binary::scalar_rhs(&x.gpu, op, out.elements()?, x.elements()?, s)?;
    } else {
        binary::scalar_lhs(&x.gpu, op, out.elements()?, s, x.elements()?)?;
    }
    record(out, &[x], recorded)
}

/// `f(x)` elementwise, recorded when needed.
fn unary(x: &Tensor, op: UnaryOp, exponent: f32) -> Result<Tensor> {
    let name = op.name();
    let category = output_category(records(&[x]));
    let half = x.dtype == DType::F16;
    if half && output_dtype(category, x.numel()) == DType::F32 {
        return unary(&x.widened()?, op, exponent);
    }
    let out = match half {
        // Under `f16_activations`: the 16-bit kernel, f16 in and out.
        true => {
            let out = Tensor::empty_typed(&x.gpu, &x.shape, DType::F16, category, name)?;
            unary::forward_f16(&x.gpu, op, out.halves()?, x.halves()?, exponent)?;
            out
        }
        false => {
            x.expect_dtype(name, DType::F32)?;
            let out = Tensor::empty(&x.gpu, &x.shape, category, name)?;
            unary::forward(&x.gpu, op, out.elements()?, x.elements()?, exponent)?;
            out
        }
    };
    let saved = if op.backward_uses_output() {
        out.detach()
    } else {
        x.detach()
    };
    record(out, &[x], || Op::Unary {
        op,
        exponent,
        saved,
    })
}

impl Tensor {
    /// `self + rhs`, broadcasting.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, BinaryOp::Add)
    }

    /// `self - rhs`, broadcasting.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, BinaryOp::Sub)
    }

    /// `self * rhs`, broadcasting.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, BinaryOp::Mul)
    }

    /// `max(self, rhs)` elementwise, broadcasting; NaN if either is NaN (PyTorch's `maximum`).
    /// On a tie the gradient is split evenly between both sides.
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, BinaryOp::Max)
    }

    /// `min(self, rhs)` elementwise, broadcasting; NaN if either is NaN (PyTorch's `minimum`).
    /// On a tie the gradient is split evenly between both sides.
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, BinaryOp::Min)
    }

    /// `op(self)` for any [`UnaryOp`] (`exponent` is used by [`UnaryOp::Pow`] only): what the
    /// named methods below call, and how a test visits every op.
    pub fn unary(&self, op: UnaryOp, exponent: f32) -> Result<Tensor> {
        unary(self, op, exponent)
    }

    /// `self / rhs`, broadcasting.
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        binary(self, rhs, BinaryOp::Div)
    }

    /// `self + s`.
    pub fn add_scalar(&self, s: f32) -> Result<Tensor> {
        scalar(self, BinaryOp::Add, s, true, || Op::AddScalar { scalar: s })
    }

    /// `self - s`.
    pub fn sub_scalar(&self, s: f32) -> Result<Tensor> {
        self.add_scalar(-s)
    }

    /// `self * s`.
    pub fn mul_scalar(&self, s: f32) -> Result<Tensor> {
        scalar(self, BinaryOp::Mul, s, true, || Op::MulScalar { scalar: s })
    }

    /// `self / s`.
    pub fn div_scalar(&self, s: f32) -> Result<Tensor> {
        scalar(self, BinaryOp::Div, s, true, || Op::DivScalar { scalar: s })
    }

    /// `s - self`.
    pub fn scalar_sub(&self, s: f32) -> Result<Tensor> {
        scalar(self, BinaryOp::Sub, s, false, || Op::ScalarSub {
            scalar: s,
        })
    }

    /// `s / self`.
    pub fn scalar_div(&self, s: f32) -> Result<Tensor> {
        let recorded = || Op::ScalarDiv {
            scalar: s,
            x: self.detach(),
        };
        scalar(self, BinaryOp::Div, s, false, recorded)
    }

    /// `self ^ exponent` elementwise.
    pub fn powf(&self, exponent: f32) -> Result<Tensor> {
        unary(self, UnaryOp::Pow, exponent)
    }
}

/// The named methods of the unary ops without a parameter: `name => UnaryOp variant`.
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> Result<Tensor> {
                    unary(self, UnaryOp::$op, 0.0)
                }
            )*
        }
    };
}

unary_methods! {
    /// `|self|` (gradient `sign(x)`, 0 at 0, as PyTorch).
    abs => Abs,
    /// `-self`.
    neg => Neg,
    /// `exp(self)`.
    exp => Exp,
    /// Natural logarithm.
    log => Log,
    /// Square root.
    sqrt => Sqrt,
    /// `max(self, 0)`.
    relu => Relu,
    /// GELU (tanh approximation).
    gelu => Gelu,
    /// `tanh(self)`.
    tanh => Tanh,
    /// `1 / (1 + exp(-self))`.
    sigmoid => Sigmoid,
    /// SiLU (swish), `self * sigmoid(self)`.
    silu => Silu,
}

// ---- helpers of backward (grad mode is off there, so nothing below records) ----

/// `g` summed down to `shape` (the gradient of an operand broadcast to `g`'s shape).
pub(crate) fn sum_to(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape.as_slice() == shape {
        return Ok(g.clone());
    }
    let out = Tensor::empty(&g.gpu, shape, Category::Temporary, "sum_to_shape")?;
    reduce::sum_to_shape(&g.gpu, out.elements()?, g.elements()?, &g.shape, shape)?;
    Ok(out)
}

/// The gradients of `a op b` with respect to `a` and `b`, at the output shape (`binary` backward
/// kernel).
pub(crate) fn binary_grads(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    g: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let da = Tensor::empty(&g.gpu, &g.shape, Category::Temporary, "binary grad")?;
    let db = Tensor::empty(&g.gpu, &g.shape, Category::Temporary, "binary grad")?;
    let dims = BinaryDims {
        op,
        a_shape: &a.shape,
        b_shape: &b.shape,
    };
    let (a, b) = (a.elements()?, b.elements()?);
    binary::backward(
        &g.gpu,
        &dims,
        da.elements()?,
        db.elements()?,
        a,
        b,
        g.elements()?,
    )?;
    Ok((da, db))
}

/// `dx = g * f'(.)` for a unary op (`s` = `x`, or `y` when the op's backward uses its output).
pub(crate) fn unary_grad(op: UnaryOp, exponent: f32, s: &Tensor, g: &Tensor) -> Result<Tensor> {
    let dx = Tensor::empty(&g.gpu, &g.shape, Category::Temporary, "unary grad")?;
    unary::backward(
        &g.gpu,
        op,
        dx.elements()?,
        s.elements()?,
        g.elements()?,
        exponent,
    )?;
    Ok(dx)
}

/// `a + b` (same shapes) into a new `Temporary` tensor, never recorded.
pub(crate) fn add_raw(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let _no_grad = crate::grad_mode::no_grad();
    a.add(b)
}

/// `target += g` in place (same shapes): the `+=` of leaf gradients.
pub(crate) fn add_into(target: &Tensor, g: &Tensor) -> Result<()> {
    if target.shape != g.shape {
        return Err(mismatch(
            "grad +=",
            &target.shape,
            &g.shape,
            "gradient shape must match",
        ));
    }
    let dims = BinaryDims {
        op: BinaryOp::Add,
        a_shape: &target.shape,
        b_shape: &g.shape,
    };
    let target_elements = target.elements()?;
    binary::broadcast(
        &g.gpu,
        &dims,
        target_elements,
        target_elements,
        g.elements()?,
    )?;
    Ok(())
}
