// matmul_epilogue.wgsl: what every matmul module's entry points do to C after the product
// (alpha, accumulate, the bias and ReLU of the epilogue, the squares per block); appended to
// matmul.wgsl's modules and to matmul_coop.wgsl's (see matmul.wgsl's header for the flags).

fn epilogue_bias() -> bool {
    return (params.flags & 8u) != 0u;
}

// bias[4 * col4 .. +3] (from offset_bias), for main's epilogue: loaded once per column group.
fn bias4(col4: u32) -> vec4<f32> {
    let o = params.offset_bias + 4u * col4;
    return vec4<f32>(bias[o], bias[o + 1u], bias[o + 2u], bias[o + 3u]);
}

fn store4(index4: u32, v: vec4<f32>, b: vec4<f32>) -> f32 {
    // writes C[4 * index4 .. +3] through C's vec4 view, alpha, accumulate and the epilogue
    // (+ b, the columns' bias, then ReLU) applied; the load is always made (C is in bounds) and
    // its value used only when accumulating. Returns the sum of the squares of what it wrote.
    let old = ldc4(index4);
    var r = v * params.alpha + select(vec4<f32>(0.0), old, (params.flags & 1u) != 0u);
    if (epilogue_bias()) {
        r += b;
        if ((params.flags & 16u) != 0u) { r = max(r, vec4<f32>(0.0)); }
    }
    stc4(index4, r);
    return dot(r, r);
}

// Flag bit 5: each invocation writes the sum of the squares of the C elements it stored (after
// accumulate and epilogue: the values now in C) to binding 4 at offset_bias + its block's index
// (batch, row block, column block of `size` x `size` outputs, row-major): a gradient's squared
// norm in partial sums, with no pass over it (kernels::matmul::squares_len).
fn put_squares(wg: vec3<u32>, row_block: u32, col_block: u32, size: u32, sq: f32) {
    if ((params.flags & 32u) != 0u) {
        let rows = (params.m + size - 1u) / size;
        let cols = (params.n + size - 1u) / size;
        bias[params.offset_bias + (wg.z * rows + row_block) * cols + col_block] = sq;
    }
}
