// indexing.wgsl: where an invocation stands in the launchers' grids (kernels::grid_1d: one row
// of workgroups, or (65535, ceil(groups / 65535), 1) past 65535), appended to each module that
// uses it (the kernel's source declaration in src/kernels/<stem>.rs). A module that appends it
// declares `const WG: u32`, the @workgroup_size (along x) of its entry points that call
// flat_index.

// The invocation's index in a grid of nwg workgroups of WG invocations: gid.x + gid.y *
// num_workgroups.x * WG (an element, or a row of an invocation-per-row kernel).
fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// The workgroup's index in a grid of nwg workgroups: the row of a workgroup-per-row kernel.
fn row_of(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.x + wg.y * nwg.x;
}
