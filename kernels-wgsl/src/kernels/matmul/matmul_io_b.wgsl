
// matmul_io_b.wgsl: matmul.wgsl's accessors of B when it holds f32 elements (indices count
// elements, or groups of four for the vec4 forms, from the start of the binding). The f32 module
// is matmul.wgsl and the three f32 files; a native 16-bit module (kernels::matmul::
// native_kernels) takes the `_f16` file of each 16-bit operand instead.

fn ldb4(i: u32) -> vec4<f32> { return b_v4[i]; }
fn ldb(i: u32) -> f32 { return b[i]; }
