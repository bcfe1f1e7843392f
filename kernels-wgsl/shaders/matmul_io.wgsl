
// matmul_io.wgsl: how matmul.wgsl's body reads A and B and reads and writes C, for f32
// operands (appended to matmul.wgsl to make the module; kernels::matmul::MAIN). Indices count
// elements (lda, ldb, ldc, stc) or groups of four elements (lda4, ldb4, ldc4, stc4) from the
// start of the operand's binding.

fn lda4(i: u32) -> vec4<f32> { return a_v4[i]; }
fn ldb4(i: u32) -> vec4<f32> { return b_v4[i]; }
fn ldc4(i: u32) -> vec4<f32> { return c_v4[i]; }
fn stc4(i: u32, v: vec4<f32>) { c_v4[i] = v; }
fn lda(i: u32) -> f32 { return a[i]; }
fn ldb(i: u32) -> f32 { return b[i]; }
fn ldc(i: u32) -> f32 { return c[i]; }
fn stc(i: u32, v: f32) { c[i] = v; }
