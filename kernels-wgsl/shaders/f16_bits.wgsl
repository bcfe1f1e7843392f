
// f16_bits.wgsl: rounding f32 to binary16 bits in core WGSL (the packed 16-bit path), appended
// to every module that stores packed halves (convert, matmul_f16, binary_f16, unary_f16).

// binary16 bits of v in the low 16 bits
fn half_bits(v: f32) -> u32 {
    let bits = bitcast<u32>(v);
    let sign = (bits >> 16u) & 0x8000u;
    let magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        return sign | 0x7e00u;                  // NaN
    }
    if (magnitude >= 0x477ff000u) {
        return sign | 0x7c00u;                  // >= 65520 rounds to infinity
    }
    return pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu;
}

// Half h % 2 of `word` (half h of a run of packed halves), as f32.
fn half_at(word: u32, h: u32) -> f32 {
    let v = unpack2x16float(word);
    return select(v.x, v.y, (h & 1u) != 0u);
}
