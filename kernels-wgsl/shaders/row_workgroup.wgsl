// row_workgroup.wgsl: where a row kernel's invocation stands when a WORKGROUP takes each row
// (kernels::RowLayout::WorkgroupPerRow), for the families' `*_rows.wgsl` bodies, which
// row_subgroup.wgsl places a subgroup per row instead. A module appends it with
// workgroup_reduce.wgsl (and workgroup_softmax.wgsl where the body combines online-softmax
// statistics) and indexing.wgsl; it declares `const WG: u32 = 64u`, the entry points'
// @workgroup_size.
//
// An entry point takes `inv: RowInvocation`, calls `row_start(inv)` for its row (`r >=
// params.rows` returns at once, uniformly across the workgroup), then takes the columns
// j = lane, lane + lanes, ... and combines the row's partials with row_sum /
// row_softmax_stats, which every invocation of the workgroup must call (in uniform control
// flow: they hold barriers).

struct RowInvocation {
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
}

// The invocation's place among the row's: it takes the columns lane, lane + lanes, ...
var<private> lane: u32;
var<private> lanes: u32;

// The invocation's row (one per workgroup: r = wg.x + wg.y * num_workgroups.x); sets lane and
// lanes.
fn row_start(inv: RowInvocation) -> u32 {
    lane = inv.lid;
    lanes = WG;
    return row_of(inv.wg, inv.nwg);
}

// The componentwise sum of every invocation's v over the row (workgroup_reduce.wgsl's tree).
fn row_sum(v: vec4<f32>) -> vec4<f32> {
    return workgroup_sum(lane, v);
}

// The row's online-softmax statistics (max m, sum of exp(v - m), plain sum of v) from each
// invocation's (workgroup_softmax.wgsl's tree).
fn row_softmax_stats(st: vec3<f32>) -> vec3<f32> {
    return workgroup_softmax_stats(lane, st);
}
