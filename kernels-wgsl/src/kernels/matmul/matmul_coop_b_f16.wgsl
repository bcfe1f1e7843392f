
// matmul_coop_b_f16.wgsl: matmul_coop.wgsl's loads of B when it holds f16 elements, four at a
// time (index i counts groups of four halves).

alias CoopB4 = vec4<f16>;
fn coop_ldb(i: u32) -> CoopB4 { return b_h4[i]; }
fn coop_half_b(v: CoopB4) -> vec4<f16> { return v; }
