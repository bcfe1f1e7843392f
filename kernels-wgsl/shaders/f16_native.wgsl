
// f16_native.wgsl: rounding f32 to WGSL `f16` (the native 16-bit path; the module starts with
// `enable f16;`), appended to every module that stores f16 (convert_native, the native matmul
// modules with a 16-bit C, binary_f16_native, unary_f16_native).

// f32 to f16 with WGSL's indeterminate cases made definite: a NaN is converted as the quiet NaN
// 0x7fc00000 (0x7e00 in f16), and a finite |v| >= 65520 as the infinity of its sign (a float
// conversion keeps infinities and NaNs; naga does not take a bitcast to vec2<f16> apart).
fn to_half(v: f32) -> f16 {
    let bits = bitcast<u32>(v);
    let sign = bits & 0x80000000u;
    let magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        return f16(bitcast<f32>(sign | 0x7fc00000u));    // NaN
    }
    if (magnitude >= 0x477ff000u) {
        return f16(bitcast<f32>(sign | 0x7f800000u));    // >= 65520 rounds to infinity
    }
    return f16(v);
}
