
// binary_ops.wgsl: the binary ops' override OP and math, shared by binary.wgsl and the 16-bit
// modules (appended to each; see kernels::binary).

override OP: u32;

const WG: u32 = 256u;

// `Params` and the bindings are declared in mod.rs (`shader_params!`, `kernel!`)
// and prepended to this file when the module is created.

var<private> nan_bits: u32 = 0x7fc00000u;

// is_nan: shaders/float_bits.wgsl.

// Indices into a and b (offsets included) of output element i (row-major over the output shape).
// Rank 0 is the same-shape fast path: both operands contiguous like the output, no index
// arithmetic (a true scalar, n = 1, gives the same indices).
fn operand_offsets(i: u32) -> vec2<u32> {
    if (params.rank == 0u) {
        return vec2<u32>(params.a_offset + i, params.b_offset + i);
    }
    var rest = i;
    var offsets = vec2<u32>(params.a_offset, params.b_offset);
    for (var k = 0u; k < params.rank; k++) {
        let d = params.rank - 1u - k;
        let extent = params.shape[d / 4u][d % 4u];
        let idx = rest % extent;
        rest = rest / extent;
        offsets.x += idx * params.a_strides[d / 4u][d % 4u];
        offsets.y += idx * params.b_strides[d / 4u][d % 4u];
    }
    return offsets;
}

fn apply(l: f32, r: f32) -> f32 {
    var v: f32;
    switch OP {
        case Add: { v = l + r; }
        case Sub: { v = l - r; }
        case Mul: { v = l * r; }
        case Div: { v = l / r; }
        case Max: { v = select(max(l, r), bitcast<f32>(nan_bits), is_nan(l) || is_nan(r)); }
        case Min: { v = select(min(l, r), bitcast<f32>(nan_bits), is_nan(l) || is_nan(r)); }
        default: { v = bitcast<f32>(nan_bits); }
    }
    return v;
}

// dy to the winner, dy/2 each on a tie
fn split_by_winner(l_wins: bool, r_wins: bool, g: f32) -> vec2<f32> {
    if (l_wins) {
        return vec2<f32>(g, 0.0);
    }
    if (r_wins) {
        return vec2<f32>(0.0, g);
    }
    return vec2<f32>(0.5 * g, 0.5 * g);
}

// (dy * d(l op r)/dl, dy * d(l op r)/dr)
fn apply_backward(l: f32, r: f32, g: f32) -> vec2<f32> {
    var v: vec2<f32>;
    switch OP {
        case Add: { v = vec2<f32>(g, g); }                      // d(l+r) = (1, 1)
        case Sub: { v = vec2<f32>(g, -g); }                     // d(l-r) = (1, -1)
        case Mul: { v = vec2<f32>(g * r, g * l); }              // d(lr) = (r, l)
        case Div: { v = vec2<f32>(g / r, -g * l / (r * r)); }   // d(l/r) = (1/r, -l/r^2)
        case Max: { v = split_by_winner(l > r, r > l, g); }
        case Min: { v = split_by_winner(l < r, r < l, g); }
        default: { v = vec2<f32>(bitcast<f32>(nan_bits)); }
    }
    return v;
}

