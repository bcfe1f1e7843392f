
// matmul_coop_a.wgsl: matmul_coop.wgsl's loads of A when it holds f32 elements, four at a time
// (index i counts groups of four), and their rounding to f16 as autocast does (to_half: beyond
// f16's range +-inf, which the loss scaler's overflow check then sees).

alias CoopA4 = vec4<f32>;
fn coop_lda(i: u32) -> CoopA4 { return a_v4[i]; }
fn coop_half_a(v: CoopA4) -> vec4<f16> {
    return vec4<f16>(to_half(v.x), to_half(v.y), to_half(v.z), to_half(v.w));
}
