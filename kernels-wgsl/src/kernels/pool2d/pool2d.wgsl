// pool2d: PyTorch's MaxPool2d, AvgPool2d and AdaptiveAvgPool2d over the planes of NCHW tensors
// (every (n, c) plane pooled alone), forward and backward, one invocation per element written:
//
//   max:      y[p, oh, ow] = max over the window's taps inside the image (padding is -inf; a NaN
//             wins, as PyTorch), idx = the tap's position ih * W + iw in its plane
//   avg:      y[p, oh, ow] = sum over the window's taps inside the image / divisor, the divisor
//             KH * KW (`mode` 0: padding counted, PyTorch's default) or the taps inside (1)
//   adaptive: (`mode` 2) the mean over rows floor(oh H / OH) .. ceil((oh + 1) H / OH) and the
//             columns alike (no kernel, stride or padding)
//
// with the window of (oh, ow) at rows oh * stride_h - pad_h + ky * dil_h, ky < KH (columns
// alike). `max_backward` adds to each input the gradients of the outputs whose idx names it;
// `avg_backward` the gradients of the outputs whose window holds it, each / its divisor. Both
// write dx (=). Reference: mod.rs beside this file.
//
// Layout: x, dx [planes, H, W]; y, gy, idx [planes, OH, OW], row-major from their offsets
// (x_offset: x, dx; y_offset: y, gy; idx_offset: idx). Declared in mod.rs: `Params`
// (`shader_params!`) and the bindings (`kernels!`); the window's taps: shaders/window.wgsl.
// Dispatch: elementwise over the elements written, `first + t` for t < count; an invocation
// past `count` returns.

const WG: u32 = 256u;

// An adaptive window along one side: output o of `outs` over `size` inputs, [start, end).
fn adaptive(o: u32, outs: u32, size: u32) -> vec2<u32> {
    return vec2<u32>((o * size) / outs, ((o + 1u) * size + outs - 1u) / outs);
}

// The divisor of output (oh, ow) of an average.
fn divisor(oh: u32, ow: u32) -> f32 {
    if (params.mode == 2u) {
        let r = adaptive(oh, params.out_h, params.in_h);
        let c = adaptive(ow, params.out_w, params.in_w);
        return f32((r.y - r.x) * (c.y - c.x));
    }
    if (params.mode == 0u) {
        return f32(params.k_h * params.k_w);
    }
    var inside = 0u;
    for (var k = 0u; k < params.k_h * params.k_w; k = k + 1u) {
        inside += u32(window_input(oh, ow, k / params.k_w, k % params.k_w).z);
    }
    return f32(inside);
}

@compute @workgroup_size(256)
fn max_forward(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let out_at = output_position(i);
    let plane = out_at.x;
    let oh = out_at.y;
    let ow = out_at.z;
    let base = params.x_offset + plane * params.in_h * params.in_w;
    var best = 0.0;
    var at = 0xFFFFFFFFu;
    for (var k = 0u; k < params.k_h * params.k_w; k = k + 1u) {
        let tap = window_input(oh, ow, k / params.k_w, k % params.k_w);
        if (tap.z != 0) {
            let pos = u32(tap.x) * params.in_w + u32(tap.y);
            let v = x[base + pos];
            // The first tap, a larger one, or a NaN (as PyTorch: the last NaN's position).
            if (at == 0xFFFFFFFFu || v > best || is_nan(v)) {
                best = v;
                at = pos;
            }
        }
    }
    y[params.y_offset + i] = best;
    idx[params.idx_offset + i] = at;
}

@compute @workgroup_size(256)
fn max_backward(@builtin(global_invocation_id) gid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let pos = i % (params.in_h * params.in_w);
    let ih = pos / params.in_w;
    let iw = pos % params.in_w;
    let plane = i / (params.in_h * params.in_w);
    let out_base = plane * params.out_h * params.out_w;
    var acc = 0.0;
    for (var k = 0u; k < params.k_h * params.k_w; k = k + 1u) {
        let at = window_output(ih, iw, k);
        let o = out_base + at.x * params.out_w + at.y;
        if (at.z != 0u && idx[params.idx_offset + o] == pos) {
            acc += gy[params.y_offset + o];
        }
    }
    dx[params.x_offset + i] = acc;
}

@compute @workgroup_size(256)
fn avg_forward(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let out_at = output_position(i);
    let plane = out_at.x;
    let oh = out_at.y;
    let ow = out_at.z;
    let base = params.x_offset + plane * params.in_h * params.in_w;
    var acc = 0.0;
    if (params.mode == 2u) {
        let r = adaptive(oh, params.out_h, params.in_h);
        let c = adaptive(ow, params.out_w, params.in_w);
        let width = c.y - c.x;
        for (var k = 0u; k < (r.y - r.x) * width; k = k + 1u) {
            acc += x[base + (r.x + k / width) * params.in_w + c.x + k % width];
        }
    } else {
        for (var k = 0u; k < params.k_h * params.k_w; k = k + 1u) {
            let at = window_input(oh, ow, k / params.k_w, k % params.k_w);
            if (at.z != 0) {
                acc += x[base + u32(at.x) * params.in_w + u32(at.y)];
            }
        }
    }
    y[params.y_offset + i] = acc / divisor(oh, ow);
}

@compute @workgroup_size(256)
fn avg_backward(@builtin(global_invocation_id) gid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let pos = i % (params.in_h * params.in_w);
    let ih = pos / params.in_w;
    let iw = pos % params.in_w;
    let plane = i / (params.in_h * params.in_w);
    let out_base = params.y_offset + plane * params.out_h * params.out_w;
    var acc = 0.0;
    if (params.mode == 2u) {
        // Every output whose adaptive window holds (ih, iw).
        for (var o = 0u; o < params.out_h * params.out_w; o = o + 1u) {
            let oh = o / params.out_w;
            let ow = o % params.out_w;
            let r = adaptive(oh, params.out_h, params.in_h);
            let c = adaptive(ow, params.out_w, params.in_w);
            if (ih >= r.x && ih < r.y && iw >= c.x && iw < c.y) {
                acc += gy[out_base + o] / divisor(oh, ow);
            }
        }
    } else {
        for (var k = 0u; k < params.k_h * params.k_w; k = k + 1u) {
            let at = window_output(ih, iw, k);
            if (at.z != 0u) {
                acc += gy[out_base + at.x * params.out_w + at.y] / divisor(at.x, at.y);
            }
        }
    }
    dx[params.x_offset + i] = acc;
}
