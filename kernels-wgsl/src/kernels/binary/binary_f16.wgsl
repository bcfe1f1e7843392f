
// binary_f16.wgsl: `out = a op b` with a, b and out 16-bit, on the packed path (u32 words,
// unpack2x16float and f16_bits.wgsl's rounding: every adapter), with binary_ops.wgsl's
// broadcasting (operand_offsets) and op, computed in f32 and rounded once to f16. For +, -, *
// that is f16 arithmetic's result bit for bit: f32 has 24 >= 2 * 11 + 2 significand bits, so
// rounding a correctly rounded f32 sum, difference or product to f16 is rounding once (division
// is within WGSL's 2.5 ULP on either path). Module `binary_f16`: this file,
// binary_ops.wgsl and f16_bits.wgsl (kernels::binary::BROADCAST_F16).
// Bindings: a_w, b_w, out_w (array<u32>). Offsets and n count halves. One invocation per output
// word writes it whole, keeping the high half of a last word the run does not fill; out_offset
// is even (the launcher checks), so no two invocations share a word. i counts from params.start
// (even) and stops at n: a range of the launch under a submission bound (kernels::launch_units).

fn value(i: u32) -> f32 {
    let o = operand_offsets(i);
    return apply(half_at(a_w[o.x >> 1u], o.x), half_at(b_w[o.y >> 1u], o.y));
}

@compute @workgroup_size(256)
fn broadcast_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + 2u * flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let w = (params.out_offset + i) >> 1u;
    var bits = half_bits(value(i));
    if (i + 1u < params.n) {
        bits = bits | (half_bits(value(i + 1u)) << 16u);
    } else {
        bits = bits | (out_w[w] & 0xffff0000u);
    }
    out_w[w] = bits;
}

// scalar_f16: y = a op s (params.period 0) or s op a (1), a and y 16-bit, s the f32
// params.scalar (as PyTorch keeps a Python scalar in f32), in f32 rounded once to f16. Bindings
// a_w, y_w; a_offset, out_offset and n count halves; out_offset even, one word per invocation.
fn scalar_value(i: u32) -> f32 {
    let h = params.a_offset + i;
    let x = half_at(a_w[h >> 1u], h);
    if (params.period == 0u) {
        return apply(x, params.scalar);
    }
    return apply(params.scalar, x);
}

@compute @workgroup_size(256)
fn scalar_f16(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = params.start + 2u * flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let w = (params.out_offset + i) >> 1u;
    var bits = half_bits(scalar_value(i));
    if (i + 1u < params.n) {
        bits = bits | (half_bits(scalar_value(i + 1u)) << 16u);
    } else {
        bits = bits | (y_w[w] & 0xffff0000u);
    }
    y_w[w] = bits;
}
