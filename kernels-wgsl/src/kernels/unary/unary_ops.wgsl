
// unary_ops.wgsl: the unary ops' override OP and math, shared by unary.wgsl and the 16-bit
// modules (appended to each; see kernels::unary).

override OP: u32;

const WG: u32 = 256u;

// `Params` and the bindings are declared in mod.rs (`shader_params!`, `kernel!`)
// and prepended to this file when the module is created.

// Run-time NaN / infinity (a constant expression would be rejected as a non-finite literal).
var<private> nan_bits: u32 = 0x7fc00000u;
var<private> inf_bits: u32 = 0x7f800000u;

// sigmoid without overflow for either sign
fn sigmoid(v: f32) -> f32 {
    if (v >= 0.0) {
        return 1.0 / (1.0 + exp(-v));
    }
    let e = exp(v);
    return e / (1.0 + e);
}

// tanh: odd series near 0 (builtin loses relative accuracy there), ±1 beyond 15 (exp overflow)
fn stable_tanh(v: f32) -> f32 {
    let a = abs(v);
    if (a < 0.005) {
        return v * (1.0 - v * v / 3.0);
    }
    if (a > 15.0) {
        return sign(v);
    }
    return tanh(v);
}

const SQRT_2_OVER_PI: f32 = 0.7978845608028654;
const GELU_CUBIC: f32 = 0.044715;

// gelu(x) = x * sigmoid(2u), u = sqrt(2/pi)(x + c x^3)  (= 0.5 x (1 + tanh u))
fn gelu(v: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v);
    return v * sigmoid(2.0 * u);
}

// gelu'(x) = s + x s (1 - s) 2u', s = sigmoid(2u), u' = sqrt(2/pi)(1 + 3c x^2)
fn gelu_derivative(v: f32) -> f32 {
    if (abs(v) > 20.0) {
        return select(0.0, 1.0, v > 0.0);
    }
    let u = SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v);
    let s = sigmoid(2.0 * u);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * v * v);
    return s + v * s * (1.0 - s) * 2.0 * du;
}

// x^p with powf's sign rules: p == 0 -> 1; 0^p -> 0 (p > 0) or inf (p < 0);
// negative x: NaN unless p is an integer, negated for odd p.
fn pow_scalar(v: f32, p: f32) -> f32 {
    if (p == 0.0) {
        return 1.0;
    }
    let a = abs(v);
    var m: f32;
    if (a == 0.0) {
        m = select(bitcast<f32>(inf_bits), 0.0, p > 0.0);
    } else {
        m = pow(a, p);
    }
    if (v < 0.0) {
        if (fract(p) != 0.0) {
            return bitcast<f32>(nan_bits);
        }
        return select(m, -m, fract(p * 0.5) != 0.0);
    }
    return m;
}

fn apply(v: f32) -> f32 {
    var r: f32;
    switch OP {
        case Neg: { r = -v; }
        case Exp: { r = exp(v); }
        case Log: { r = log(v); }
        case Sqrt: { r = sqrt(v); }
        case Abs: { r = abs(v); }
        case Relu: { r = max(v, 0.0); }
        case Gelu: { r = gelu(v); }
        case Tanh: { r = stable_tanh(v); }
        case Sigmoid: { r = sigmoid(v); }
        case Pow: { r = pow_scalar(v, params.exponent); }
        case Silu: { r = v * sigmoid(v); }
        default: { r = bitcast<f32>(nan_bits); }
    }
    return r;
}

// s = saved (y for exp/tanh/sigmoid, x otherwise), g = dy
fn apply_backward(s: f32, g: f32) -> f32 {
    var r: f32;
    switch OP {
        case Neg: { r = -g; }                                  // d(-x) = -1
        case Exp: { r = g * s; }                               // d e^x = y
        case Log: { r = g / s; }                               // d ln x = 1/x
        case Sqrt: { r = g * 0.5 / sqrt(s); }                   // d sqrt x = 1/(2 sqrt x)
        case Abs: { r = g * sign(s); }                         // d|x| = sign(x), 0 at 0
        case Relu: { r = select(0.0, g, s > 0.0); }             // d relu = [x > 0]
        case Gelu: { r = g * gelu_derivative(s); }
        case Tanh: { r = g * (1.0 - s * s); }                   // d tanh = 1 - y^2
        case Sigmoid: { r = g * s * (1.0 - s); }                   // d sigmoid = y(1 - y)
        case Pow: {                                            // d x^p = p x^(p-1), 0 if p = 0
            let p = params.exponent;
            r = select(g * p * pow_scalar(s, p - 1.0), 0.0, p == 0.0);
        }
        case Silu: {                                           // d silu = s (1 + x (1 - s))
            let sg = sigmoid(s);
            r = g * sg * (1.0 + s * (1.0 - sg));
        }
        default: { r = bitcast<f32>(nan_bits); }
    }
    return r;
}

