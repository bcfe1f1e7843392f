// workgroup_softmax.wgsl: a row's online-softmax statistics combined over a workgroup, for the
// workgroup-per-row softmax and cross-entropy; on workgroup_reduce.wgsl's tree, with
// online_softmax.wgsl's rescale (a module appends all three).

// Every invocation's statistics (max m, sum of exp(v - m), plain sum of v) of its columns,
// combined (in workgroup_reduce.wgsl's order); every invocation of the workgroup must call it.
fn workgroup_softmax_stats(lid: u32, st: vec3<f32>) -> vec3<f32> {
    workgroupBarrier();   // tree may still be read from a previous reduction
    tree[lid] = vec4<f32>(st, 0.0);
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            let a = tree[lid];
            let b = tree[lid + stride];
            let m = max(a.x, b.x);
            tree[lid] = vec4<f32>(m, a.y * rescale(a.x, m) + b.y * rescale(b.x, m), a.z + b.z, 0.0);
        }
        workgroupBarrier();
    }
    return tree[0].xyz;
}
