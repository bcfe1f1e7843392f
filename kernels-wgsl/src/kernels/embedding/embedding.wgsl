// embedding: gather rows of a [vocab, dim] table by u32 ids, and the backward scatter-add into
// a [vocab, dim] table gradient. Reference: reference.rs, beside this file.
//
// A table may be one part of a larger one (a table past one binding is kept in parts): the
// part holds rows first .. first + vocab of a table of `total` rows, and an id refers to its
// row id - first when it falls in that range (the whole table: first 0, total = vocab). Each
// part's gather writes only its ids' rows (an id >= total: NaN, by the part at row 0), and its
// scatter-add sums only its ids.
//
//   gather:      out[t, j] = table[ids[t], j]; an id >= vocab gathers NaN (no out-of-bounds
//                read; the NaN reaches the loss, which the trainer's read-back refuses).
//   scatter_add: dtable[v, j] = sum over t with ids[t] == v of dy[t, j] (ascending t); rows no
//                id refers to get 0; WRITTEN (=), not accumulated. No float atomics (WGSL has
//                none), so the tokens are first sorted by id (a counting sort into `order`), and
//                then one invocation per dtable ELEMENT sums its row's tokens in ascending order:
//                the sum order is fixed and the result deterministic. Cost O(vocab * tokens)
//                compares for the sort (two passes) and O(tokens * dim) additions.
//
// The sort, four dispatches recorded in this order by kernels::embedding::scatter_add:
//   id_counts:    one invocation per row v: order[v + 1] = #{t : ids[t] == v}
//   id_starts:    one invocation: order[0] = 0, order[v + 1] += order[v] (the rows' starts)
//   id_lists:     one invocation per row v: its tokens, ascending, at order[vocab + 1 +
//                 order[v] ..] (order[v] .. order[v + 1] is row v's part of the list)
//   scatter_rows: one invocation per dtable element (v, j): the sum of dy[t, j] over row v's
//                 tokens t in the list, in the list's (ascending) order
//   `order` is a u32 scratch of vocab + 1 + tokens elements; an id >= vocab is in no row.
// Entry points (all @workgroup_size(256)): gather (count = tokens*dim), scatter_rows
// (count = vocab*dim), id_counts and id_lists (count = vocab), id_starts (count = 1).
//
// Params: declared in mod.rs (`shader_params!`), prepended with the bindings.
//   Element index of each tensor in its binding (the launcher's segment_index: block offset +
//   tensor offset): src = binding 1 (gather: table, scatter_add: dy), ids = binding 2,
//   dst = binding 3 (gather: out, scatter_add: dtable), order = binding 4.
// Bindings (group 0; all storage read_write, docs/wgpu.md §4; each the WHOLE segment buffer):
//   gather:      0 params, 1 table: array<f32> [vocab*dim], 2 ids: array<u32> [tokens],
//                3 out: array<f32> [tokens*dim]
//   the sort and scatter_rows: 0 params, 1 dy: array<f32> [tokens*dim], 2 ids: array<u32>
//                [tokens], 3 dtable: array<f32> [vocab*dim], 4 order: array<u32>
//
// Dispatch: groups = ceil(count / 256); (groups, 1, 1) if <= 65535 else
// (65535, ceil(groups / 65535), 1); index = gid.x + gid.y * num_workgroups.x * 256;
// `index >= count` returns.
//
// Loop limit (kernels/mod.rs, "Loop limit on lavapipe"): every loop over tokens (or, in
// id_starts, over rows) takes 8 per pass (in order) and the rest in a loop of 7 guarded steps:
// n / 8 + 1 + 8 passes (kernels::embedding::loop_iterations; the launcher refuses more than
// the adapter's limit).


const WG: u32 = 256u;

var<private> nan_bits: u32 = 0x7fc00000u;

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
    if (id >= params.total) {
        // Out of the whole table: NaN, written by the part that starts at row 0.
        if (params.first == 0u) {
            out[params.dst_offset + e] = bitcast<f32>(nan_bits);
        }
        return;
    }
    let row = id - params.first; // wraps past vocab for an id before this part
    if (row >= params.vocab) {
        return; // another part's row
    }
    out[params.dst_offset + e] = table[params.src_offset + row * params.dim + j];
}

// Token t's row in this part (past `vocab` when it is another part's, or out of the table).
fn id_of(t: u32) -> u32 {
    let id = ids[params.ids_offset + t];
    return select(id - params.first, 0xffffffffu, id >= params.total);
}

// 1 if token t has id v, else 0.
fn is_row(t: u32, v: u32) -> u32 {
    return select(0u, 1u, id_of(t) == v);
}

@compute @workgroup_size(256)
fn id_counts(@builtin(global_invocation_id) gid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let v = flat_index(gid, nwg);
    if (v >= params.vocab) {
        return;
    }
    let n = params.tokens;
    var count = 0u;
    var t = 0u;
    for (; t + 8u <= n; t += 8u) {
        count += is_row(t, v) + is_row(t + 1u, v) + is_row(t + 2u, v) + is_row(t + 3u, v);
        count += is_row(t + 4u, v) + is_row(t + 5u, v) + is_row(t + 6u, v) + is_row(t + 7u, v);
    }
    for (var i = 0u; i < 7u; i++) {
        if (t + i < n) { count += is_row(t + i, v); }
    }
    order[params.order_offset + v + 1u] = count;
}

@compute @workgroup_size(256)
fn id_starts(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x != 0u || gid.y != 0u) {
        return;
    }
    let o = params.order_offset;
    let n = params.vocab;
    order[o] = 0u;
    var v = 0u;
    for (; v + 8u <= n; v += 8u) {   // unrolled: a nested loop would count 8 passes
        let b = o + v;
        order[b + 1u] += order[b];
        order[b + 2u] += order[b + 1u];
        order[b + 3u] += order[b + 2u];
        order[b + 4u] += order[b + 3u];
        order[b + 5u] += order[b + 4u];
        order[b + 6u] += order[b + 5u];
        order[b + 7u] += order[b + 6u];
        order[b + 8u] += order[b + 7u];
    }
    for (var i = 1u; i <= 7u; i++) {
        if (v + i <= n) { order[o + v + i] += order[o + v + i - 1u]; }
    }
}

// Appends t to row v's part of the list when token t has id v.
fn list_token(t: u32, v: u32, at: ptr<function, u32>) {
    if (id_of(t) == v) {
        order[params.order_offset + params.vocab + 1u + *at] = t;
        *at += 1u;
    }
}

@compute @workgroup_size(256)
fn id_lists(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let v = flat_index(gid, nwg);
    if (v >= params.vocab) {
        return;
    }
    let n = params.tokens;
    var at = order[params.order_offset + v];
    var t = 0u;
    for (; t + 8u <= n; t += 8u) {
        list_token(t, v, &at);
        list_token(t + 1u, v, &at);
        list_token(t + 2u, v, &at);
        list_token(t + 3u, v, &at);
        list_token(t + 4u, v, &at);
        list_token(t + 5u, v, &at);
        list_token(t + 6u, v, &at);
        list_token(t + 7u, v, &at);
    }
    for (var i = 0u; i < 7u; i++) {
        if (t + i < n) { list_token(t + i, v, &at); }
    }
}

// dy[t, j] for the k-th token of the list.
fn listed_term(k: u32, j: u32) -> f32 {
    let t = order[params.order_offset + params.vocab + 1u + k];
    return dy[params.src_offset + t * params.dim + j];
}

@compute @workgroup_size(256)
fn scatter_rows(@builtin(global_invocation_id) gid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = flat_index(gid, nwg);
    if (e >= params.vocab * params.dim) {
        return;
    }
    let v = e / params.dim;
    let j = e % params.dim;
    let last = order[params.order_offset + v + 1u];
    var acc = 0.0;
    var k = order[params.order_offset + v];
    for (; k + 8u <= last; k += 8u) {
        acc += listed_term(k, j);
        acc += listed_term(k + 1u, j);
        acc += listed_term(k + 2u, j);
        acc += listed_term(k + 3u, j);
        acc += listed_term(k + 4u, j);
        acc += listed_term(k + 5u, j);
        acc += listed_term(k + 6u, j);
        acc += listed_term(k + 7u, j);
    }
    for (var i = 0u; i < 7u; i++) {
        if (k + i < last) { acc += listed_term(k + i, j); }
    }
    dtable[params.dst_offset + e] = acc;
}
