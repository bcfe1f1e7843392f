// squares_multi: the read-back's sums of squares of many tensors in one dispatch
// (reduce::sum_squares_many). Each source writes consecutive elements ("units") of `dst`:
// - a tensor: one sum of squares per SQ_CHUNK elements, as `sum_squares_chunks_v4` (source on
//   a multiple of 4 elements) or `sum_squares_chunks` (elsewhere) computes it, the same
//   additions in the same order;
// - partial sums already computed (a weight-gradient matmul's squares): copied, one per unit.
//
// Bindings (group 0; all storage read_write, docs/wgpu.md §4): 0 params; 1-16 slot_0 ..
// slot_15, the sources' segments (shaders/slots.wgsl); 17 dst (array<f32>); 18 table
// (array<u32>), 4 words per source from element params.table_offset:
//   0: its slot, plus 256 when it is copied; 1: its element index in that slot; 2: its length;
//   3: its first unit.
// Sources are in unit order, the first at unit params.first_unit or before.
//
// Dispatch: one invocation per unit (grid_1d, @workgroup_size(256)); invocation k writes unit
// params.first_unit + k, for k < params.units, at dst[params.dst_offset + unit]. Its source
// is found by binary search over the params.tensors table entries (at most 32 passes).

const WG: u32 = 256u;
const SQ_CHUNK: u32 = 256u;   // reduce::SQUARES_CHUNK
const COPIED: u32 = 256u;

@compute @workgroup_size(256)
fn squares_multi(@builtin(global_invocation_id) gid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = flat_index(gid, nwg);
    if (k >= squares_params.units) {
        return;
    }
    let unit = squares_params.first_unit + k;
    // The last source whose first unit is at most `unit`.
    var lo = 0u;
    var hi = squares_params.tensors;
    for (var step = 0u; step < 32u && hi - lo > 1u; step++) {
        let mid = lo + (hi - lo) / 2u;
        if (table[squares_params.table_offset + 4u * mid + 3u] <= unit) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let entry = squares_params.table_offset + 4u * lo;
    let slot = table[entry] & 255u;
    let base = table[entry + 1u];
    let len = table[entry + 2u];
    let j = unit - table[entry + 3u];
    var out = 0.0;
    if ((table[entry] & COPIED) != 0u) {
        out = slot_element(slot, base + j);
    } else {
        let start = j * SQ_CHUNK;
        let end = min(len, start + SQ_CHUNK);
        if (base % 4u == 0u) {
            // sum_squares_chunks_v4's order: vec4s, the last one's components past the end 0.
            let base4 = (base + start) / 4u;
            let n4 = (end - min(start, end) + 3u) / 4u;
            for (var i = 0u; i < n4; i++) {
                let first = start + 4u * i;
                let inside = vec4<bool>(first < end, first + 1u < end, first + 2u < end,
                                        first + 3u < end);
                let v = select(vec4<f32>(0.0), slot_load(slot, base4 + i), inside);
                out += dot(v, v);
            }
        } else {
            // sum_squares_chunks' order: one element at a time.
            for (var i = start; i < end; i++) {
                let v = slot_element(slot, base + i);
                out += v * v;
            }
        }
    }
    dst[squares_params.dst_offset + unit] = out;
}
