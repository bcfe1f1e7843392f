// conv2d: PyTorch's `nn.Conv2d` (cross-correlation) over NCHW tensors, with stride, zero
// padding, dilation and groups, and its two gradients, by direct summation (one invocation per
// element written; no unfolded input anywhere):
//
//   y[n, o, oh, ow] = bias[o] + sum_{c < C/g, ky, kx} x[n, g(o) C/g + c, ih, iw] w[o, c, ky, kx]
//   ih = oh * stride_h + ky * dil_h - pad_h,  iw = ow * stride_w + kx * dil_w - pad_w
//
// with g(o) = o / (O/g) the group of output channel o and x read as 0 outside the image.
// `backward_input` writes dx (each input element sums the outputs whose taps read it),
// `backward_weight` dw (each weight sums its taps over the batch range n_first..n_first+n_count)
// and `backward_bias` db (each channel sums its outputs over the same range); with
// `accumulate` those two add to what is there (a batch summed in ranges under lavapipe's loop
// budget). Reference: mod.rs beside this file.
//
// Layout: x, dx [N, C, H, W]; w, dw [O, C/g, KH, KW]; y, dy [N, O, OH, OW], row-major from their
// offsets: x_offset (x, dx, wx), w_offset (weight, dweight), b_offset (bias, dbias), y_offset
// (y, gy). Declared in mod.rs: `Params` (`shader_params!`) and the bindings (`kernels!`); the
// window's taps: shaders/window.wgsl.
// Dispatch: elementwise over the elements written, `first + t` for t < count (a launch in ranges
// under a submission bound); an invocation past `count` returns.

const WG: u32 = 256u;

// The flat index of x[n, c, ih, iw] and of y[n, o, oh, ow] (from the tensor's start).
fn x_index(n: u32, c: u32, ih: u32, iw: u32) -> u32 {
    return ((n * params.in_c + c) * params.in_h + ih) * params.in_w + iw;
}

fn y_index(n: u32, o: u32, oh: u32, ow: u32) -> u32 {
    return ((n * params.out_c + o) * params.out_h + oh) * params.out_w + ow;
}

@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let pos = output_position(i);
    let oh = pos.y;
    let ow = pos.z;
    let o = pos.x % params.out_c;
    let n = pos.x / params.out_c;
    let cg = params.in_c / params.groups;
    let c0 = (o / (params.out_c / params.groups)) * cg;
    let khw = params.k_h * params.k_w;
    let taps = cg * khw;
    var acc = 0.0;
    for (var r = 0u; r < taps; r = r + 1u) {
        let k = r % khw;
        let at = window_input(oh, ow, k / params.k_w, k % params.k_w);
        if (at.z != 0) {
            let xv = x[params.x_offset + x_index(n, c0 + r / khw, u32(at.x), u32(at.y))];
            acc += xv * weight[params.w_offset + o * taps + r];
        }
    }
    if (params.has_bias != 0u) {
        acc += bias[params.b_offset + o];
    }
    y[params.y_offset + i] = acc;
}

@compute @workgroup_size(256)
fn backward_input(@builtin(global_invocation_id) gid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let pos = input_position(i);
    let ih = pos.y;
    let iw = pos.z;
    let c = pos.x % params.in_c;
    let n = pos.x / params.in_c;
    let cg = params.in_c / params.groups;
    let og = params.out_c / params.groups;
    let o0 = (c / cg) * og;
    let khw = params.k_h * params.k_w;
    let taps = og * khw;
    var acc = 0.0;
    for (var r = 0u; r < taps; r = r + 1u) {
        let k = r % khw;
        let at = window_output(ih, iw, k);
        if (at.z != 0u) {
            let o = o0 + r / khw;
            let g = gy[params.y_offset + y_index(n, o, at.x, at.y)];
            acc += g * weight[params.w_offset + (o * cg + c % cg) * khw + k];
        }
    }
    dx[params.x_offset + i] = acc;
}

@compute @workgroup_size(256)
fn backward_weight(@builtin(global_invocation_id) gid: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let khw = params.k_h * params.k_w;
    let cg = params.in_c / params.groups;
    let k = i % khw;
    let ky = k / params.k_w;
    let kx = k % params.k_w;
    let o = i / (khw * cg);
    let c = (o / (params.out_c / params.groups)) * cg + (i / khw) % cg;
    let plane = params.out_h * params.out_w;
    let positions = params.n_count * plane;
    var acc = 0.0;
    for (var p = 0u; p < positions; p = p + 1u) {
        let n = params.n_first + p / plane;
        let oh = (p % plane) / params.out_w;
        let ow = p % params.out_w;
        let at = window_input(oh, ow, ky, kx);
        if (at.z != 0) {
            let g = gy[params.y_offset + y_index(n, o, oh, ow)];
            acc += g * wx[params.x_offset + x_index(n, c, u32(at.x), u32(at.y))];
        }
    }
    if (params.accumulate != 0u) {
        acc += dweight[params.w_offset + i];
    }
    dweight[params.w_offset + i] = acc;
}

@compute @workgroup_size(256)
fn backward_bias(@builtin(global_invocation_id) gid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let o = params.first + t;
    let plane = params.out_h * params.out_w;
    var acc = 0.0;
    for (var p = 0u; p < params.n_count * plane; p = p + 1u) {
        let n = params.n_first + p / plane;
        acc += gy[params.y_offset + y_index(n, o, (p % plane) / params.out_w, p % params.out_w)];
    }
    if (params.accumulate != 0u) {
        acc += dbias[params.b_offset + o];
    }
    dbias[params.b_offset + o] = acc;
}

// ---- The convolution as a matmul (groups = 1): columns of the input's taps, K = C KH KW rows
// by the output positions P = OH OW, for `nb` images from n_first; `image_major` lays them out
// [nb, K, P] (a batched product per image lands in y's NCHW order), else [K, nb, P] (one
// product over every image's positions: the weight's gradient). `c_offset`: the columns' (or,
// in `channels_first`, the permuted gradient's) offset.

@compute @workgroup_size(256)
fn im2col(@builtin(global_invocation_id) gid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let khw = params.k_h * params.k_w;
    let rows = params.in_c * khw;
    let plane = params.out_h * params.out_w;
    let p = i % plane;
    var k = i / (plane * params.nb);
    var n = (i / plane) % params.nb;
    if (params.image_major != 0u) {
        k = (i / plane) % rows;
        n = i / (plane * rows);
    }
    let tap = k % khw;
    let at = window_input(p / params.out_w, p % params.out_w, tap / params.k_w, tap % params.k_w);
    var v = 0.0;
    if (at.z != 0) {
        v = x[params.x_offset + x_index(params.n_first + n, k / khw, u32(at.x), u32(at.y))];
    }
    cols[params.c_offset + i] = v;
}

// dx of `nb` images from image-major columns' gradients: each input pixel sums the column
// entries of the taps that read it.
@compute @workgroup_size(256)
fn col2im(@builtin(global_invocation_id) gid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let pos = input_position(i);
    let ih = pos.y;
    let iw = pos.z;
    let c = pos.x % params.in_c;
    let n = pos.x / params.in_c;
    let khw = params.k_h * params.k_w;
    let plane = params.out_h * params.out_w;
    var acc = 0.0;
    for (var k = 0u; k < khw; k = k + 1u) {
        let at = window_output(ih, iw, k);
        if (at.z != 0u) {
            let row = (n * params.in_c + c) * khw + k;
            acc += dcols[params.c_offset + row * plane + at.x * params.out_w + at.y];
        }
    }
    let image = params.in_c * params.in_h * params.in_w;
    xgrad[params.x_offset + params.n_first * image + i] = acc;
}

// gy of `nb` images from n_first, [nb, O, P], permuted to [O, nb, P].
@compute @workgroup_size(256)
fn channels_first(@builtin(global_invocation_id) gid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let plane = params.out_h * params.out_w;
    let n = (i / plane) % params.nb;
    let o = i / (plane * params.nb);
    gyt[params.c_offset + i] = gy[params.y_offset + y_index(params.n_first + n, o, 0u, 0u) + i % plane];
}

// y += bias, each output channel's over its positions.
@compute @workgroup_size(256)
fn bias_add(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_index(gid, nwg);
    if (t >= params.count) {
        return;
    }
    let i = params.first + t;
    let channel = (i / (params.out_h * params.out_w)) % params.out_c;
    out_y[params.y_offset + i] += out_bias[params.b_offset + channel];
}
