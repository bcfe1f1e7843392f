
// matmul_coop_c.wgsl: matmul_coop.wgsl's accessors of C when it holds f32 elements (groups of
// four, from the start of the binding: `main_coop` stores four columns at a time).

fn ldc4(i: u32) -> vec4<f32> { return c_v4[i]; }
fn stc4(i: u32, v: vec4<f32>) { c_v4[i] = v; }
