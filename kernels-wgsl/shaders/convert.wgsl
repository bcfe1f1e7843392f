// convert: f32 <-> IEEE binary16 storage, two halves per u32 word, element 2i in the LOW half
// of word i (the layout of a little-endian [u16]); an odd count leaves the last word's high
// half 0. Uses the core builtins pack2x16float / unpack2x16float: no SHADER_F16 feature
// (docs/wgpu.md §6). naga does require the CAPABILITY SHADER_FLOAT16_IN_FLOAT32, which wgpu grants
// on adapters with DownlevelFlags::SHADER_F16_IN_F32 (all Vulkan ones, lavapipe included; not
// WebGL2). Reference: src/reference/convert.rs.
//
// f32 -> f16 rounds to nearest (as the device's pack2x16float does; lavapipe: nearest even).
// WGSL leaves out-of-range values indeterminate, so |x| >= 65520 (which rounds to infinity in
// IEEE) is written as +-inf (0x7c00) and NaN as 0x7e00 explicitly, so overflow stays visible to
// the nonfinite check. Values in the f16 subnormal range may be flushed to zero by the device,
// on packing and on unpacking (the reference keeps subnormals: test with normal values).
//
// Entry points (both @workgroup_size(256), one invocation per u32 WORD, words = ceil(n / 2)):
//   f32_to_f16: words[w] = half(src[2w]) | half(src[2w + 1]) << 16
//   f16_to_f32: dst[2w] = low half of words[w], dst[2w + 1] = high half (if 2w + 1 < n)
// Params (uniform, 16 bytes):
//   { n: u32 (element count), src_offset: u32, dst_offset: u32, _pad0: u32 }
//   src_offset, dst_offset: element (f32 or u32 word) offsets of binding 1 and binding 2's tensors
//   in the segments those bindings hold (block offset + tensor offset, from the launcher).
// Bindings (group 0; all storage read_write, docs/wgpu.md §4; each binds a WHOLE segment, not the
// tensor, so bind groups are cached per segment; every index adds its binding's offset):
//   f32_to_f16: 0 params, 1 src: array<f32> [src_offset ..+ n],
//               2 dst_words: array<u32> [dst_offset ..+ ceil(n/2)]
//   f16_to_f32: 0 params, 1 src_words: array<u32> [src_offset ..+ ceil(n/2)],
//               2 dst: array<f32> [dst_offset ..+ n]
// Dispatch: groups = ceil(words / 256); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); w = gid.x + gid.y * num_workgroups.x * 256;
// `w >= words` returns.


const WG: u32 = 256u;

// `Params` and the bindings are declared in src/kernels/convert.rs (`shader_params!`, `kernel!`)
// and prepended to this file when the module is created.

fn word_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// binary16 bits of v in the low 16 bits
fn half_bits(v: f32) -> u32 {
    let bits = bitcast<u32>(v);
    let sign = (bits >> 16u) & 0x8000u;
    let magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        return sign | 0x7e00u;                  // NaN
    }
    if (magnitude >= 0x477ff000u) {
        return sign | 0x7c00u;                  // >= 65520 rounds to infinity
    }
    return pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu;
}

@compute @workgroup_size(256)
fn f32_to_f16(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = word_index(gid, nwg);
    if (w >= (params.n + 1u) / 2u) {
        return;
    }
    let lo = half_bits(src[params.src_offset + 2u * w]);
    var hi = 0u;
    if (2u * w + 1u < params.n) {
        hi = half_bits(src[params.src_offset + 2u * w + 1u]);
    }
    dst_words[params.dst_offset + w] = lo | (hi << 16u);
}

@compute @workgroup_size(256)
fn f16_to_f32(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = word_index(gid, nwg);
    if (w >= (params.n + 1u) / 2u) {
        return;
    }
    let pair = unpack2x16float(src_words[params.src_offset + w]);
    dst[params.dst_offset + 2u * w] = pair.x;
    if (2u * w + 1u < params.n) {
        dst[params.dst_offset + 2u * w + 1u] = pair.y;
    }
}
