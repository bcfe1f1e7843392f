
// matmul_io_b_f16.wgsl: matmul.wgsl's accessors of B when it holds WGSL `f16` elements (the
// native 16-bit path: the module starts with `enable f16;` and needs SHADER_F16). Indices count
// halves (or groups of four). Loads convert to f32: a product of two halves is exact in f32, as
// on a tensor core, and sums accumulate in f32.

fn ldb4(i: u32) -> vec4<f32> { return vec4<f32>(b_h4[i]); }
fn ldb(i: u32) -> f32 { return f32(b_h[i]); }
