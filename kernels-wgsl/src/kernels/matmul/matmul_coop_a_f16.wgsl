
// matmul_coop_a_f16.wgsl: matmul_coop.wgsl's loads of A when it holds f16 elements, four at a
// time (index i counts groups of four halves).

alias CoopA4 = vec4<f16>;
fn coop_lda(i: u32) -> CoopA4 { return a_h4[i]; }
fn coop_half_a(v: CoopA4) -> vec4<f16> { return v; }
