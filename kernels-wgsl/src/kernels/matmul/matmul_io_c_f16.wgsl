
// matmul_io_c_f16.wgsl: matmul.wgsl's accessors of C when it holds WGSL `f16` elements (the
// native 16-bit path: the module starts with `enable f16;` and needs SHADER_F16). Indices count
// halves (or groups of four). Loads convert to f32: a product of two halves is exact in f32, as
// on a tensor core, and sums accumulate in f32.

// C is rounded once, after alpha, accumulate and the epilogue, and stored one f16 at a time
// (16-bit stores: no two invocations share a store whatever the offset). |v| >= 65520 becomes
// +-inf and NaN stays NaN (to_half, f16_native.wgsl), so the loss scaler's overflow
// check still sees them.

fn ldc4(i: u32) -> vec4<f32> { return vec4<f32>(c_h4[i]); }
fn stc4(i: u32, v: vec4<f32>) {
    c_h4[i] = vec4<f16>(to_half(v.x), to_half(v.y), to_half(v.z), to_half(v.w));
}
fn ldc(i: u32) -> f32 { return f32(c_h[i]); }
fn stc(i: u32, v: f32) { c_h[i] = to_half(v); }

