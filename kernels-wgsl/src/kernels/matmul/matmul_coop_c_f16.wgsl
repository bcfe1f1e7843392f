
// matmul_coop_c_f16.wgsl: matmul_coop.wgsl's accessors of C when it holds f16 elements (groups
// of four halves): C is rounded once, after alpha, accumulate and the epilogue, with
// f16_native.wgsl's to_half (|v| >= 65520 becomes +-inf, NaN stays NaN).

fn ldc4(i: u32) -> vec4<f32> { return vec4<f32>(c_h4[i]); }
fn stc4(i: u32, v: vec4<f32>) {
    c_h4[i] = vec4<f16>(to_half(v.x), to_half(v.y), to_half(v.z), to_half(v.w));
}
