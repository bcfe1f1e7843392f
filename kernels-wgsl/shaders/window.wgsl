// window.wgsl: the taps of a 2-D window walked over an image (convolution, pooling), from the
// module's `params`: in_h, in_w, out_h, out_w, k_w, stride_h, stride_w, pad_h, pad_w, dil_h,
// dil_w (each module that appends this file declares them in its Params).

// Element i of an output laid out [planes, out_h, out_w]: (plane, oh, ow).
fn output_position(i: u32) -> vec3<u32> {
    return vec3<u32>(i / (params.out_w * params.out_h), (i / params.out_w) % params.out_h,
                     i % params.out_w);
}

// Element i of an input laid out [planes, in_h, in_w]: (plane, ih, iw).
fn input_position(i: u32) -> vec3<u32> {
    return vec3<u32>(i / (params.in_w * params.in_h), (i / params.in_w) % params.in_h,
                     i % params.in_w);
}

// The input pixel tap (ky, kx) of output position (oh, ow) reads: (row, column, 1), or
// (row, column, 0) when it falls in the padding.
fn window_input(oh: u32, ow: u32, ky: u32, kx: u32) -> vec3<i32> {
    let ih = i32(oh * params.stride_h + ky * params.dil_h) - i32(params.pad_h);
    let iw = i32(ow * params.stride_w + kx * params.dil_w) - i32(params.pad_w);
    let inside = ih >= 0 && ih < i32(params.in_h) && iw >= 0 && iw < i32(params.in_w);
    return vec3<i32>(ih, iw, select(0, 1, inside));
}

// The output position whose tap k (ky * k_w + kx) reads input pixel (ih, iw): (oh, ow, 1), or
// (.., .., 0) when no output's tap k lands there (off the stride's grid, or past the output).
fn window_output(ih: u32, iw: u32, k: u32) -> vec3<u32> {
    let th = i32(ih + params.pad_h) - i32((k / params.k_w) * params.dil_h);
    let tw = i32(iw + params.pad_w) - i32((k % params.k_w) * params.dil_w);
    if (th < 0 || tw < 0) {
        return vec3<u32>(0u, 0u, 0u);
    }
    let oh = u32(th) / params.stride_h;
    let ow = u32(tw) / params.stride_w;
    let on_grid = u32(th) % params.stride_h == 0u && u32(tw) % params.stride_w == 0u;
    return vec3<u32>(oh, ow, select(0u, 1u, on_grid && oh < params.out_h && ow < params.out_w));
}
