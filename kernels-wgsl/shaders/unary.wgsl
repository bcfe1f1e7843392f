// unary: elementwise y = f(x) and its backward dx = dy * f'(.), for ONE op chosen by the
// pipeline-overridable constant OP. Specialising the pipeline per op (WGSL `override`) lets the
// compiler drop the switch: no per-element branch on a uniform, one cached pipeline per op.
// Reference: src/reference/unary.rs (UnaryOp::shader_code gives OP).
//
// OP (override, u32, no default: a pipeline without it fails to build, loudly):
//   0 neg, 1 exp, 2 log, 3 sqrt, 4 abs, 5 relu, 6 gelu (TANH APPROXIMATION, computed as
//   x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3)), 7 tanh, 8 sigmoid, 9 pow (x^p, p =
//   params.exponent).
//
// Entry points (both @workgroup_size(256)):
//   forward:  y[i]  = f(x[i])
//   backward: dx[i] = dy[i] * f'(.) evaluated from `saved`, which is the forward OUTPUT y for
//             exp (1), tanh (7), sigmoid (8) and the forward INPUT x for every other op.
//
// Params (uniform, 32 bytes): { n: u32, exponent: f32, x_offset: u32, y_offset: u32,
//                               saved_offset: u32, dy_offset: u32, dx_offset: u32, _pad0: u32 }
//   n = element count; exponent used only by pow. Each *_offset is the element offset of that
//   tensor in the segment its binding holds (block offset + tensor offset, from the launcher);
//   forward reads x_offset, y_offset; backward saved_offset, dy_offset, dx_offset.
// Bindings (group 0; all storage bindings read_write, see docs/wgpu.md §4; each binds a WHOLE
// segment, not the tensor, so bind groups are cached per segment; every index adds its offset):
//   forward:  0 params, 1 x: array<f32> [x_offset ..+ n], 2 y: array<f32> [y_offset ..+ n]
//   backward: 0 params, 1 saved: array<f32> [saved_offset ..+ n],
//             2 dy: array<f32> [dy_offset ..+ n], 3 dx: array<f32> [dx_offset ..+ n]
//
// Dispatch (elementwise, 256 invocations per workgroup: a multiple of every common subgroup
// width, and few workgroups for large n): groups = ceil(n / 256); dispatch (groups, 1, 1) when
// groups <= 65535, else (65535, ceil(groups / 65535), 1). Flat index
// i = gid.x + gid.y * num_workgroups.x * 256; the bounds check `i >= n` returns.
//
// Domain edges follow IEEE where the device does (log of 0, sqrt of a negative); pow handles
// negative bases with integer exponents, 0^p and p = 0 explicitly (WGSL pow leaves them
// indeterminate); tanh and gelu' are guarded for large |x| (no exp overflow to NaN).


override OP: u32;

const WG: u32 = 256u;

// `Params` and the bindings are declared in src/kernels/unary.rs (`shader_params!`, `kernel!`)
// and prepended to this file when the module is created.

// Run-time NaN / infinity (a constant expression would be rejected as a non-finite literal).
var<private> nan_bits: u32 = 0x7fc00000u;
var<private> inf_bits: u32 = 0x7f800000u;

fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

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
        case 0u: { r = -v; }
        case 1u: { r = exp(v); }
        case 2u: { r = log(v); }
        case 3u: { r = sqrt(v); }
        case 4u: { r = abs(v); }
        case 5u: { r = max(v, 0.0); }
        case 6u: { r = gelu(v); }
        case 7u: { r = stable_tanh(v); }
        case 8u: { r = sigmoid(v); }
        case 9u: { r = pow_scalar(v, params.exponent); }
        default: { r = bitcast<f32>(nan_bits); }
    }
    return r;
}

// s = saved (y for exp/tanh/sigmoid, x otherwise), g = dy
fn apply_backward(s: f32, g: f32) -> f32 {
    var r: f32;
    switch OP {
        case 0u: { r = -g; }                                  // d(-x) = -1
        case 1u: { r = g * s; }                               // d e^x = y
        case 2u: { r = g / s; }                               // d ln x = 1/x
        case 3u: { r = g * 0.5 / sqrt(s); }                   // d sqrt x = 1/(2 sqrt x)
        case 4u: { r = g * sign(s); }                         // d|x| = sign(x), 0 at 0
        case 5u: { r = select(0.0, g, s > 0.0); }             // d relu = [x > 0]
        case 6u: { r = g * gelu_derivative(s); }
        case 7u: { r = g * (1.0 - s * s); }                   // d tanh = 1 - y^2
        case 8u: { r = g * s * (1.0 - s); }                   // d sigmoid = y(1 - y)
        case 9u: {                                            // d x^p = p x^(p-1), 0 if p = 0
            let p = params.exponent;
            r = select(g * p * pow_scalar(s, p - 1.0), 0.0, p == 0.0);
        }
        default: { r = bitcast<f32>(nan_bits); }
    }
    return r;
}

@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y[params.y_offset + i] = apply(x[params.x_offset + i]);
}

@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    dx[params.dx_offset + i] =
        apply_backward(saved[params.saved_offset + i], dy[params.dy_offset + i]);
}

// forward_v4 / backward_v4: the same, four elements per invocation through vec4 views of the
// same bindings (n and every offset in vec4s; the launcher's split, kernels::launch_split).
fn apply4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(apply(v.x), apply(v.y), apply(v.z), apply(v.w));
}

@compute @workgroup_size(256)
fn forward_v4(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y_v4[params.y_offset + i] = apply4(x_v4[params.x_offset + i]);
}

@compute @workgroup_size(256)
fn backward_v4(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let s = saved_v4[params.saved_offset + i];
    let g = dy_v4[params.dy_offset + i];
    dx_v4[params.dx_offset + i] = vec4<f32>(apply_backward(s.x, g.x), apply_backward(s.y, g.y),
                                            apply_backward(s.z, g.z), apply_backward(s.w, g.w));
}
