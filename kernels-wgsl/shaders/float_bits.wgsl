// float_bits.wgsl: tests on an f32's bits, which hold where the compiler may assume that no
// value is NaN (lavapipe drops `v != v`), appended to each module that calls them (see the
// kernels' source declarations).

// Whether v is a NaN (exponent all ones, mantissa not zero).
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}
