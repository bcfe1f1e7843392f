//! CPU reference for [`unary`](super): elementwise `y = f(x)` and the backward `dx = dy * f'(.)`.
//!
//! GELU is the **tanh approximation** (`approximate="tanh"` in PyTorch), written in the
//! equivalent, better-conditioned form `x * sigmoid(2u)` with `u = sqrt(2/pi) (x + 0.044715 x^3)`
//! (since `0.5 (1 + tanh(u)) = sigmoid(2u)`). Values are computed in `f64` and rounded to `f32`.
//!
//! The backward of [`UnaryOp::Exp`], [`UnaryOp::Tanh`] and [`UnaryOp::Sigmoid`] takes the forward
//! *output* `y`; every other op takes the forward *input* `x` (see [`UnaryOp::backward_uses_output`]).

use super::UnaryOp;

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_CUBIC: f64 = 0.044_715;

/// Logistic sigmoid, `1 / (1 + e^-x)`, evaluated without overflow for either sign.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// GELU (tanh approximation): `x * sigmoid(2u)`, `u = sqrt(2/pi) (x + 0.044715 x^3)`.
pub fn gelu(x: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    x * sigmoid(2.0 * u)
}

/// Derivative of [`gelu`]: `s + x s (1 - s) 2 u'`, `s = sigmoid(2u)`, `u' = sqrt(2/pi)(1 + 3c x^2)`.
pub fn gelu_derivative(x: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    let s = sigmoid(2.0 * u);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
    s + x * s * (1.0 - s) * 2.0 * du
}

/// `x^p` with the sign rules of `powf` (negative base with an odd integer exponent is negative,
/// with a non-integer exponent NaN; `x^0 = 1`, also for `x = 0`).
pub fn pow_scalar(x: f64, p: f64) -> f64 {
    x.powf(p)
}

/// `f(x)` for one element, in `f64`.
pub fn apply(op: UnaryOp, x: f64, exponent: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => gelu(x),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Pow => pow_scalar(x, exponent),
        UnaryOp::Silu => x * sigmoid(x),
    }
}

/// `dx = dy * f'(.)` for one element; `saved` is `y` for exp/tanh/sigmoid and `x` otherwise.
pub fn apply_backward(op: UnaryOp, saved: f64, dy: f64, exponent: f64) -> f64 {
    match op {
        // d(-x)/dx = -1
        UnaryOp::Neg => -dy,
        // d e^x/dx = e^x = y
        UnaryOp::Exp => dy * saved,
        // d ln x/dx = 1/x
        UnaryOp::Log => dy / saved,
        // d sqrt(x)/dx = 1 / (2 sqrt(x))
        UnaryOp::Sqrt => dy * 0.5 / saved.sqrt(),
        // d|x|/dx = sign(x), 0 at 0
        UnaryOp::Abs => {
            if saved > 0.0 {
                dy
            } else if saved < 0.0 {
                -dy
            } else {
                0.0
            }
        }
        // d relu/dx = [x > 0]
        UnaryOp::Relu => {
            if saved > 0.0 {
                dy
            } else {
                0.0
            }
        }
        UnaryOp::Gelu => dy * gelu_derivative(saved),
        // d tanh/dx = 1 - y^2
        UnaryOp::Tanh => dy * (1.0 - saved * saved),
        // d sigmoid/dx = y (1 - y)
        UnaryOp::Sigmoid => dy * saved * (1.0 - saved),
        // d x^p/dx = p x^(p-1), and 0 for p = 0
        UnaryOp::Pow => {
            if exponent == 0.0 {
                0.0
            } else {
                dy * exponent * pow_scalar(saved, exponent - 1.0)
            }
        }
        // d silu/dx = s (1 + x (1 - s)), s = sigmoid(x)
        UnaryOp::Silu => {
            let s = sigmoid(saved);
            dy * s * (1.0 + saved * (1.0 - s))
        }
    }
}

/// `y[i] = f(x[i])`. `exponent` is used only by [`UnaryOp::Pow`].
pub fn forward(op: UnaryOp, x: &[f32], exponent: f32) -> Vec<f32> {
    x.iter()
        .map(|&v| apply(op, f64::from(v), f64::from(exponent)) as f32)
        .collect()
}

/// `dx[i] = dy[i] * f'(.)`, where `saved` is the forward output `y` if
/// [`UnaryOp::backward_uses_output`] and the forward input `x` otherwise.
///
/// # Panics
/// If `saved` and `dy` differ in length (an internal invariant of the caller).
pub fn backward(op: UnaryOp, saved: &[f32], dy: &[f32], exponent: f32) -> Vec<f32> {
    assert_eq!(
        saved.len(),
        dy.len(),
        "unary backward: saved and dy lengths differ"
    );
    saved
        .iter()
        .zip(dy)
        .map(|(&s, &g)| apply_backward(op, f64::from(s), f64::from(g), f64::from(exponent)) as f32)
        .collect()
}
