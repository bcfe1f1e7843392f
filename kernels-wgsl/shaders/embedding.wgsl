// embedding: gather rows of a [vocab, dim] table by u32 ids, and the backward scatter-add into
// a [vocab, dim] table gradient. Reference: src/reference/embedding.rs.
//
//   gather:      out[t, j] = table[ids[t], j]; an id >= vocab gathers NaN (no out-of-bounds
//                read; the NaN reaches the loss, which the trainer's read-back refuses).
//   scatter_add: dtable[v, j] = sum over t with ids[t] == v of dy[t, j] (ascending t); rows no
//                id refers to get 0; WRITTEN (=), not accumulated. No float atomics (WGSL has
//                none): one invocation per dtable ELEMENT loops over all ids, so the sum order is
//                fixed and the result deterministic. Cost O(vocab * dim * tokens) compares; fine
//                for the vocabularies here, a sort-by-id variant would replace it for large ones.
//
// Entry points (both @workgroup_size(256)): gather (count = tokens*dim), scatter_add
// (count = vocab*dim); one invocation per output element.
//
// Params (uniform, 32 bytes): { tokens: u32, dim: u32, vocab: u32, src_offset: u32,
//   ids_offset: u32, dst_offset: u32, _pad0: u32, _pad1: u32 }
//   Element index of each tensor in its binding (the launcher's segment_index: block offset +
//   tensor offset): src = binding 1 (gather: table, scatter_add: dy), ids = binding 2,
//   dst = binding 3 (gather: out, scatter_add: dtable).
// Bindings (group 0; all storage read_write, docs/wgpu.md §4; each the WHOLE segment buffer):
//   gather:      0 params, 1 table: array<f32> [vocab*dim], 2 ids: array<u32> [tokens],
//                3 out: array<f32> [tokens*dim]
//   scatter_add: 0 params, 1 dy: array<f32> [tokens*dim], 2 ids: array<u32> [tokens],
//                3 dtable: array<f32> [vocab*dim]
//
// Dispatch: groups = ceil(count / 256); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); index = gid.x + gid.y * num_workgroups.x * 256;
// `index >= count` returns.
//
// Loop limit (kernels/mod.rs, "Loop limit on lavapipe"): scatter_add's token loop takes 8 tokens
// per pass (in order) and the rest in a loop of 7 guarded steps: tokens / 8 + 1 + 8 passes
// (kernels::embedding::loop_iterations; the launcher refuses more than the adapter's limit).


const WG: u32 = 256u;

// `Params` and the bindings are declared in src/kernels/embedding.rs (`shader_params!`, `kernel!`)
// and prepended to this file when the module is created.

var<private> nan_bits: u32 = 0x7fc00000u;

fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = flat_index(gid, nwg);
    if (e >= params.tokens * params.dim) {
        return;
    }
    let t = e / params.dim;
    let j = e % params.dim;
    let id = ids[params.ids_offset + t];
    if (id >= params.vocab) {
        out[params.dst_offset + e] = bitcast<f32>(nan_bits);
        return;
    }
    out[params.dst_offset + e] = table[params.src_offset + id * params.dim + j];
}

// dy[t, j] if token t has id v, else 0 (adding 0.0 leaves the sum unchanged, even -0.0 + 0.0
// aside: the reference also starts from +0.0).
fn token_term(t: u32, v: u32, j: u32) -> f32 {
    if (ids[params.ids_offset + t] == v) {
        return dy[params.src_offset + t * params.dim + j];
    }
    return 0.0;
}

@compute @workgroup_size(256)
fn scatter_add(@builtin(global_invocation_id) gid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = flat_index(gid, nwg);
    if (e >= params.vocab * params.dim) {
        return;
    }
    let v = e / params.dim;
    let j = e % params.dim;
    let n = params.tokens;
    var acc = 0.0;
    var t = 0u;
    for (; t + 8u <= n; t += 8u) {
        acc += token_term(t, v, j);
        acc += token_term(t + 1u, v, j);
        acc += token_term(t + 2u, v, j);
        acc += token_term(t + 3u, v, j);
        acc += token_term(t + 4u, v, j);
        acc += token_term(t + 5u, v, j);
        acc += token_term(t + 6u, v, j);
        acc += token_term(t + 7u, v, j);
    }
    for (var i = 0u; i < 7u; i++) {
        if (t + i < n) { acc += token_term(t + i, v, j); }
    }
    dtable[params.dst_offset + e] = acc;
}
