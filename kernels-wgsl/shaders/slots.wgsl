// slots.wgsl: the segments a multi-tensor kernel binds, read and written by number. The kernel
// binds 16 segments as `slot_0` .. `slot_15` (array<vec4<f32>>, in its bindings; a segment used
// by several tensors is bound once, unused slots repeat slot_0) and names a tensor's operand by
// its slot and its offset there, from a table it uploads. A tensor's slot is the same for a
// whole workgroup (or, in `squares_multi`, for neighbouring invocations), so the switches do not
// diverge where it matters. Appended to `optimizer.wgsl` and `squares_multi.wgsl`; the Rust
// side is `kernels::MultiSlots`.

fn slot_load(slot: u32, i: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    switch slot {
        case 0u: { r = slot_0[i]; }
        case 1u: { r = slot_1[i]; }
        case 2u: { r = slot_2[i]; }
        case 3u: { r = slot_3[i]; }
        case 4u: { r = slot_4[i]; }
        case 5u: { r = slot_5[i]; }
        case 6u: { r = slot_6[i]; }
        case 7u: { r = slot_7[i]; }
        case 8u: { r = slot_8[i]; }
        case 9u: { r = slot_9[i]; }
        case 10u: { r = slot_10[i]; }
        case 11u: { r = slot_11[i]; }
        case 12u: { r = slot_12[i]; }
        case 13u: { r = slot_13[i]; }
        case 14u: { r = slot_14[i]; }
        case 15u: { r = slot_15[i]; }
        default: {}
    }
    return r;
}

fn slot_store(slot: u32, i: u32, v: vec4<f32>) {
    switch slot {
        case 0u: { slot_0[i] = v; }
        case 1u: { slot_1[i] = v; }
        case 2u: { slot_2[i] = v; }
        case 3u: { slot_3[i] = v; }
        case 4u: { slot_4[i] = v; }
        case 5u: { slot_5[i] = v; }
        case 6u: { slot_6[i] = v; }
        case 7u: { slot_7[i] = v; }
        case 8u: { slot_8[i] = v; }
        case 9u: { slot_9[i] = v; }
        case 10u: { slot_10[i] = v; }
        case 11u: { slot_11[i] = v; }
        case 12u: { slot_12[i] = v; }
        case 13u: { slot_13[i] = v; }
        case 14u: { slot_14[i] = v; }
        case 15u: { slot_15[i] = v; }
        default: {}
    }
}

// Element `e` (a 4-byte element index) of slot `slot`, through its vec4.
fn slot_element(slot: u32, e: u32) -> f32 {
    return slot_load(slot, e / 4u)[e % 4u];
}
