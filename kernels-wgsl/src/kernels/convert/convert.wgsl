// convert, packed path: f32 <-> IEEE binary16 storage, two halves per u32 word, element 2i in
// the LOW half of word i (the layout of a little-endian [u16]). Uses the core builtins
// pack2x16float / unpack2x16float: no SHADER_F16 feature (docs/wgpu.md §6). naga does require the
// CAPABILITY SHADER_FLOAT16_IN_FLOAT32, which wgpu grants on adapters with
// DownlevelFlags::SHADER_F16_IN_F32 (all Vulkan ones, lavapipe included; not WebGL2). The native
// path is convert_native.wgsl (same layout). Reference: reference.rs, beside this file.
//
// f32 -> f16 rounds to nearest (as the device's pack2x16float does; lavapipe: nearest even).
// WGSL leaves out-of-range values indeterminate, so |x| >= 65520 (which rounds to infinity in
// IEEE) is written as +-inf (0x7c00) and NaN as 0x7e00 explicitly, so overflow stays visible to
// the nonfinite check. Values in the f16 subnormal range may be flushed to zero by the device,
// on packing and on unpacking (the reference keeps subnormals: test with normal values).
//
// A run of halves may start and end in the middle of a word (a 2-byte tensor at an odd element
// offset): dst_offset and src_offset of the halves' binding count HALVES from the start of the
// binding (half h is word h / 2, low half when h is even).
//
// Entry points (both @workgroup_size(256)):
//   f32_to_f16: one invocation per destination WORD the run touches (words
//               dst_offset / 2 ..= (dst_offset + n - 1) / 2): it writes the halves of the run
//               and keeps the other half of the first and last word as it was, so no two
//               invocations write one word.
//   f16_to_f32: one invocation per element.
// Params: declared in mod.rs (`shader_params!`), prepended with the bindings.
//   n counts elements; the f32 side's offset counts f32 elements, the halves' side counts
//   halves; both include the block's offset in the segment (from the launcher).
// Bindings (group 0; all storage read_write, docs/wgpu.md §4; each binds a WHOLE segment, not the
// tensor, so bind groups are cached per segment; every index adds its binding's offset):
//   f32_to_f16: 0 params, 1 src: array<f32> [src_offset ..+ n],
//               2 dst_words: array<u32> (halves [dst_offset ..+ n])
//   f16_to_f32: 0 params, 1 src_words: array<u32> (halves [src_offset ..+ n]),
//               2 dst: array<f32> [dst_offset ..+ n]
// Dispatch: groups = ceil(invocations / 256); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); i = gid.x + gid.y * num_workgroups.x * 256; out-of-range
// invocations return.


const WG: u32 = 256u;


@compute @workgroup_size(256)
fn f32_to_f16(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let first_word = params.dst_offset / 2u;
    let end = params.dst_offset + params.n;           // one past the last half
    let w = first_word + flat_index(gid, nwg);
    if (params.n == 0u || 2u * w >= end) {
        return;
    }
    var halves = vec2<u32>(0u, 0u);
    var kept = 0u;                                    // the bits of halves outside the run
    for (var j = 0u; j < 2u; j++) {
        let h = 2u * w + j;
        if (h >= params.dst_offset && h < end) {
            halves[j] = half_bits(src[params.src_offset + h - params.dst_offset]);
        } else {
            kept = kept | (0xffffu << (16u * j));
        }
    }
    var word = halves.x | (halves.y << 16u);
    if (kept != 0u) {
        word = word | (dst_words[w] & kept);
    }
    dst_words[w] = word;
}

@compute @workgroup_size(256)
fn f16_to_f32(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let h = params.src_offset + i;
    let pair = unpack2x16float(src_words[h / 2u]);
    dst[params.dst_offset + i] = select(pair.x, pair.y, (h & 1u) == 1u);
}
