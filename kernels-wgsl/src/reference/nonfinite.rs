//! CPU reference for `nonfinite`: whether a slice holds a NaN or an infinity, and the first
//! such index. The shader's flag buffer is `[any: u32, first_index: u32]`, initialised by the
//! launcher to `[0, NO_INDEX]`; several dispatches into the same flags accumulate.

pub use crate::kernels::nonfinite::NO_INDEX;

/// Index of the first NaN or infinity, if any.
pub fn first_nonfinite(x: &[f32]) -> Option<usize> {
    x.iter().position(|v| !v.is_finite())
}

/// The flag words the shader leaves after checking `x` from `[0, NO_INDEX]`:
/// `[1, first index]` if some element is non-finite, else `[0, NO_INDEX]`.
pub fn flags(x: &[f32]) -> [u32; 2] {
    match first_nonfinite(x) {
        Some(i) => [1, i as u32],
        None => [0, NO_INDEX],
    }
}
