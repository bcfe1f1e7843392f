
// matmul_coop_b.wgsl: matmul_coop.wgsl's loads of B when it holds f32 elements, four at a time
// (index i counts groups of four), and their rounding to f16 as autocast does (to_half: beyond
// f16's range +-inf, which the loss scaler's overflow check then sees).

alias CoopB4 = vec4<f32>;
fn coop_ldb(i: u32) -> CoopB4 { return b_v4[i]; }
fn coop_half_b(v: CoopB4) -> vec4<f16> {
    return vec4<f16>(to_half(v.x), to_half(v.y), to_half(v.z), to_half(v.w));
}
