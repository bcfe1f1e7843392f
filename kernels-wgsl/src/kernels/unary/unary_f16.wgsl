
// unary_f16.wgsl: `y = f(x)` with x and y 16-bit, on the packed path (u32 words,
// unpack2x16float and f16_bits.wgsl's rounding: every adapter): unary_ops.wgsl's f in f32 (as
// PyTorch computes its f16 elementwise ops), rounded once to f16. Module `unary_f16`: this file,
// unary_ops.wgsl and f16_bits.wgsl (kernels::unary::FORWARD_F16). Bindings: x_w, y_w
// (array<u32>). Offsets and n count halves. One invocation per output word writes it whole,
// keeping the high half of a last word the run does not fill; y_offset is even (the launcher
// checks), so no two invocations share a word. i counts from params.start (even: a launch in
// ranges under a submission bound) and stops at n, the range's end.

fn value(i: u32) -> f32 {
    let h = params.x_offset + i;
    return apply(half_at(x_w[h >> 1u], h));
}

@compute @workgroup_size(256)
fn forward_f16(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + 2u * flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let w = (params.y_offset + i) >> 1u;
    var bits = half_bits(value(i));
    if (i + 1u < params.n) {
        bits = bits | (half_bits(value(i + 1u)) << 16u);
    } else {
        bits = bits | (y_w[w] & 0xffff0000u);
    }
    y_w[w] = bits;
}
