// rotary: rotary position embeddings (RoFormer, Su et al. 2021) in the "rotate half" layout of
// Hugging Face's Llama: feature c of a row is paired with feature c + D/2, and the pair is
// turned by the angle pos * base^(-2c / D), pos = (row % time) + offset:
//
//   y[c]       = x[c] cos - x[c + D/2] sin
//   y[c + D/2] = x[c + D/2] cos + x[c] sin
//
// `params.sign` = -1 turns the other way: the backward (the rotation's transpose is its
// inverse). Reference: mod.rs beside this file.
//
// Layout: x and y are [rows, D] row-major from their `*_offset`, rows = (batch x heads) x time;
// y may be x (each invocation reads its pair before writing it). Declared in mod.rs:
// `Params` (`shader_params!`) and the bindings x, y (`kernel!`), prepended.
// Dispatch: elementwise over the rows x D/2 pairs (in blocks of whole sequences under a
// submission bound, each with its own offsets and rows); an index past them returns. The angle is reduced to [0, 2 pi) before cos and sin, so a GPU's fast sine is
// accurate for every position.

const TAU: f32 = 6.283185307179586;
const WG: u32 = 256u;

@compute @workgroup_size(256)
fn rotary(@builtin(global_invocation_id) gid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    let half = params.half;
    if (i >= params.rows * half) {
        return;
    }
    let r = i / half;
    let c = i % half;
    let pos = r % params.time + params.offset;
    let inv_freq = exp2(-f32(c) * params.log2_base_per_pair);
    let turns = f32(pos) * inv_freq * (1.0 / TAU);
    let angle = (turns - floor(turns)) * TAU;
    let cs = cos(angle);
    let sn = sin(angle) * params.sign;
    let at = r * 2u * half + c;
    let a = x[params.x_offset + at];
    let b = x[params.x_offset + at + half];
    y[params.y_offset + at] = a * cs - b * sn;
    y[params.y_offset + at + half] = b * cs + a * sn;
}
