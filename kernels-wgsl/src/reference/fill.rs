//! CPU reference for `fill`: `out[offset + i] = value` for `i` in `0..len`.

/// Sets `len` elements of `out` from `offset` to `value`.
///
/// # Panics
/// If `offset + len > out.len()` (a test bug).
pub fn fill(out: &mut [f32], offset: usize, len: usize, value: f32) {
    out[offset..offset + len].fill(value);
}
