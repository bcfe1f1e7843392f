// attention_io_f16.wgsl: attention.wgsl's loads from packed f16 bindings (u32 words of two
// halves; the module `attention_f16`, with f16_bits.wgsl's `half_at`): `i` counts halves from
// the start of the binding, so each offset in Params is in halves.

fn ld_q(i: u32) -> f32 {
    return half_at(q_h[i >> 1u], i);
}

fn ld_k(i: u32) -> f32 {
    return half_at(k_h[i >> 1u], i);
}

fn ld_v(i: u32) -> f32 {
    return half_at(v_h[i >> 1u], i);
}

fn ld_o(i: u32) -> f32 {
    return half_at(o_h[i >> 1u], i);
}
