// workgroup_reduce.wgsl: a tree reduction over the WG invocations of one workgroup (WG: the
// module's `const WG: u32`, a power of two, the @workgroup_size of the entry points that call
// it), appended to each module that uses it (see the kernels' source declarations;
// workgroup_softmax.wgsl combines online-softmax statistics on the same tree). Each invocation
// passes its partial; the partials meet in workgroup memory in a fixed order (log2(WG) barrier
// steps: deterministic, in another order of additions than one invocation's loop), and every
// invocation gets the total. Every invocation of the workgroup must call it, in uniform control
// flow.

var<workgroup> tree: array<vec4<f32>, WG>;

// The componentwise sum of every invocation's v.
fn workgroup_sum(lid: u32, v: vec4<f32>) -> vec4<f32> {
    workgroupBarrier();   // tree may still be read from a previous reduction
    tree[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            tree[lid] += tree[lid + stride];
        }
        workgroupBarrier();
    }
    return tree[0];
}
