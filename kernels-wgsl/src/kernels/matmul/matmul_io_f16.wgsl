
// matmul_io_f16.wgsl: matmul.wgsl's accessors on the packed 16-bit path, when an operand may
// hold 16-bit floats (IEEE binary16, two to a u32 word, half h in word h / 2, the low half when
// h is even), converted with pack2x16float / unpack2x16float (core WGSL: every adapter).
// Appended to matmul.wgsl to make the module `matmul_f16` (the native path, where the device
// has SHADER_F16, is matmul_io_{a,b,c}_f16.wgsl instead). The override constants A_F16, B_F16 and C_F16 say which operands are 16-bit (one pipeline per
// combination); the others are f32. Element indices of a 16-bit operand count halves.
// Arithmetic is f32: a product of two halves is exact in f32, as on a tensor core, and the sums
// accumulate in f32; a 16-bit C is rounded once, after alpha, accumulate and the epilogue.
//
// Views: naga allows one variable per binding in an entry point, so each binding has one view
// per entry point, of u32 words, whatever the operand's width: `main` reads and writes
// vec4<u32> (a_q, b_q, c_q: four f32 elements, or eight halves), `main_scalar` u32 words (a_w,
// b_w) and C through atomics (c_atomic). f32 elements are bitcast.
//
// Stores: `main` writes C four elements at a time: four words, or two words (one half of a
// vec4<u32>, its offsets and strides being multiples of 4 elements), so no two invocations
// share a word. `main_scalar` writes one element at a time at any offset, so two invocations may
// own the two halves of one word: it clears and sets its own half with atomicAnd / atomicOr,
// which leave the other half to its owner.

override A_F16: bool = false;
override B_F16: bool = false;
override C_F16: bool = false;

// Halves 4i .. 4i + 3 of a vec4<u32> view: the low or the high two words of element i / 2.
fn pair(q: vec4<u32>, i: u32) -> vec2<u32> {
    return select(q.xy, q.zw, (i & 1u) != 0u);
}

fn lda4(i: u32) -> vec4<f32> {
    if (A_F16) { return halves4(pair(a_q[i >> 1u], i)); }
    return bitcast<vec4<f32>>(a_q[i]);
}

fn ldb4(i: u32) -> vec4<f32> {
    if (B_F16) { return halves4(pair(b_q[i >> 1u], i)); }
    return bitcast<vec4<f32>>(b_q[i]);
}

fn ldc4(i: u32) -> vec4<f32> {
    if (C_F16) { return halves4(pair(c_q[i >> 1u], i)); }
    return bitcast<vec4<f32>>(c_q[i]);
}

fn stc4(i: u32, v: vec4<f32>) {
    if (C_F16) {
        let lo = pack_halves(v.x, v.y);
        let hi = pack_halves(v.z, v.w);
        let j = i >> 1u;
        if ((i & 1u) == 0u) {
            c_q[j].x = lo;
            c_q[j].y = hi;
        } else {
            c_q[j].z = lo;
            c_q[j].w = hi;
        }
        return;
    }
    c_q[i] = bitcast<vec4<u32>>(v);
}

fn lda(i: u32) -> f32 {
    if (A_F16) { return half_at(a_w[i >> 1u], i); }
    return bitcast<f32>(a_w[i]);
}

fn ldb(i: u32) -> f32 {
    if (B_F16) { return half_at(b_w[i >> 1u], i); }
    return bitcast<f32>(b_w[i]);
}

fn ldc(i: u32) -> f32 {
    if (C_F16) { return half_at(atomicLoad(&c_atomic[i >> 1u]), i); }
    return bitcast<f32>(atomicLoad(&c_atomic[i]));
}

fn stc(i: u32, v: f32) {
    if (C_F16) {
        let shift = 16u * (i & 1u);
        atomicAnd(&c_atomic[i >> 1u], ~(0xffffu << shift));
        atomicOr(&c_atomic[i >> 1u], half_bits(v) << shift);
        return;
    }
    atomicStore(&c_atomic[i], bitcast<u32>(v));
}

fn halves4(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// x in the low half, y in the high half (f16_bits.wgsl's rounding).
fn pack_halves(x: f32, y: f32) -> u32 {
    return half_bits(x) | (half_bits(y) << 16u);
}
