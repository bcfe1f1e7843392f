
// matmul_io_c.wgsl: matmul.wgsl's accessors of C when it holds f32 elements (indices count
// elements, or groups of four for the vec4 forms, from the start of the binding). The f32 module
// is matmul.wgsl and the three f32 files; a native 16-bit module (kernels::matmul::
// native_kernels) takes the `_f16` file of each 16-bit operand instead.

fn ldc4(i: u32) -> vec4<f32> { return c_v4[i]; }
fn stc4(i: u32, v: vec4<f32>) { c_v4[i] = v; }
fn ldc(i: u32) -> f32 { return c[i]; }
fn stc(i: u32, v: f32) { c[i] = v; }
