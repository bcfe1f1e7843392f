// attention_io.wgsl: attention.wgsl's loads from f32 bindings (the module `attention`).

fn ld_q(i: u32) -> f32 {
    return q[i];
}

fn ld_k(i: u32) -> f32 {
    return k[i];
}

fn ld_v(i: u32) -> f32 {
    return v[i];
}

fn ld_o(i: u32) -> f32 {
    return o[i];
}
