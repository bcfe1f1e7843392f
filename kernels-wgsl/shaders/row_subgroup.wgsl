// row_subgroup.wgsl: where a row kernel's invocation stands when a SUBGROUP takes each row
// (kernels::RowLayout::SubgroupPerRow; the device needs wgpu's SUBGROUP feature), for the same
// `*_rows.wgsl` bodies as row_workgroup.wgsl. The row's partials are combined by the subgroup
// operations (subgroupAdd, subgroupMax), with no workgroup memory and no barrier; the order of
// the additions is the hardware's (rounding only). A module appends it, online_softmax.wgsl
// where the body combines softmax statistics, and indexing.wgsl; it declares `const WG: u32 =
// 64u`, the entry points' @workgroup_size.
//
// Workgroup g holds num_subgroups subgroups and takes the rows g * num_subgroups + subgroup_id.
// The launcher sizes the grid for 64 / (the adapter's largest subgroup size) rows per
// workgroup: subgroups are never larger, so every row has a subgroup (smaller ones leave the
// grid's last workgroups idle). Lanes count the subgroup's active invocations (subgroupAdd of
// 1), so a partial subgroup would still take every column. `r >= params.rows` returns at once,
// uniformly across the subgroup.

struct RowInvocation {
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) sgs: u32,
}

// The invocation's place among the row's: it takes the columns lane, lane + lanes, ...
var<private> lane: u32;
var<private> lanes: u32;

// The invocation's row; sets lane and lanes.
fn row_start(inv: RowInvocation) -> u32 {
    lane = subgroupExclusiveAdd(1u);
    lanes = subgroupAdd(1u);
    return row_of(inv.wg, inv.nwg) * inv.sgs + inv.sg;
}

// The componentwise sum of every lane's v over the row.
fn row_sum(v: vec4<f32>) -> vec4<f32> {
    return subgroupAdd(v);
}

// The row's online-softmax statistics (max m, sum of exp(v - m), plain sum of v) from each
// lane's.
fn row_softmax_stats(st: vec3<f32>) -> vec3<f32> {
    let m = subgroupMax(st.x);
    return vec3<f32>(m, subgroupAdd(st.y * rescale(st.x, m)), subgroupAdd(st.z));
}
