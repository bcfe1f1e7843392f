// augment: a batch of u8 images into normalised f32, with torchvision's RandomCrop(padding)
// and RandomHorizontalFlip drawn per image from (seed, image):
//   out[n, c, y, x] = (v / 255 - mean[c]) * inv_std[c],
//   v = pixel(n, c, y + oy - pad, (flip ? w - 1 - x : x) + ox - pad), 0 outside the image,
// oy, ox in [0, 2 pad] and flip from the image's hash (`shaders/counter_hash.wgsl`'s pcg, keyed
// as dropout's): h1 = pcg(n ^ key), h2 = pcg(h1), oy = h1 % (2 pad + 1), ox = h2 % (2 pad + 1),
// flip = flips && (pcg(h2) & 1) == 1. pad 0 and no flips is the plain conversion.
//
// Declared in mod.rs beside this file: `Params` (`shader_params!`) and the bindings pixels
// (u32 words, four u8 pixels each, little-endian: byte b of the batch is bits 8 (b % 4) of word
// b / 4, from word `pixels_offset`; the batch is [n, c, h, w] bytes) and out, prepended.
// Dispatch: elementwise (`kernels::launch_ranges`): i counts from `params.start`, and
// invocations with i >= len (the range's end) return.

const WORKGROUP_SIZE: u32 = 256u;

fn channel_value(v: vec4<f32>, c: u32) -> f32 {
    return v[min(c, 3u)];
}

@compute @workgroup_size(256)
fn augment(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = params.start + gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    if i >= params.len {
        return;
    }
    let w = params.width;
    let h = params.height;
    let c = params.channels;
    let x = i % w;
    let y = (i / w) % h;
    let ch = (i / (w * h)) % c;
    let n = i / (w * h * c);
    let key = dropout_key(params.seed_lo, params.seed_hi);
    let h1 = pcg(n ^ key);
    let h2 = pcg(h1);
    let span = 2u * params.pad + 1u;
    let oy = h1 % span;
    let ox = h2 % span;
    let flip = params.flips != 0u && (pcg(h2) & 1u) == 1u;
    let xs = select(x, w - 1u - x, flip);
    // Signed positions in the image: the padding lies outside it.
    let ay = i32(y + oy) - i32(params.pad);
    let ax = i32(xs + ox) - i32(params.pad);
    var v = 0.0;
    if ay >= 0 && ay < i32(h) && ax >= 0 && ax < i32(w) {
        let byte = ((n * c + ch) * h + u32(ay)) * w + u32(ax);
        let word = pixels[params.pixels_offset + byte / 4u];
        v = f32((word >> (8u * (byte % 4u))) & 255u) / 255.0;
    }
    let mean = vec4<f32>(params.mean0, params.mean1, params.mean2, params.mean3);
    let inv_std = vec4<f32>(params.inv_std0, params.inv_std1, params.inv_std2, params.inv_std3);
    out[params.out_offset + i] = (v - channel_value(mean, ch)) * channel_value(inv_std, ch);
}
