//! CPU reference for `copy` (contiguous) and `strided_copy` (an N-d gather by strides). Generic
//! over the element: the kernel tests copy `f32`, the gradient checks `f64`.

/// `dst[dst_offset + i] = src[src_offset + i]` for `i` in `0..len`.
///
/// # Panics
/// If a range is out of bounds (a test bug).
pub fn copy<T: Copy>(src: &[T], src_offset: usize, dst: &mut [T], dst_offset: usize, len: usize) {
    dst[dst_offset..dst_offset + len].copy_from_slice(&src[src_offset..src_offset + len]);
}

/// `dst[dst_offset + i] = src[src_offset + Σ_d coord_d(i) * src_strides[d]]`, where `coord(i)`
/// unravels `i` row-major over `shape`; writes `shape.iter().product()` elements.
/// Example: transposing a row-major (R, C) matrix is `shape = [C, R]`, `src_strides = [1, C]`.
///
/// # Panics
/// If `shape` and `src_strides` differ in length or an index is out of bounds (a test bug).
pub fn strided_copy<T: Copy>(
    src: &[T],
    src_offset: usize,
    shape: &[usize],
    src_strides: &[usize],
    dst: &mut [T],
    dst_offset: usize,
) {
    assert_eq!(shape.len(), src_strides.len(), "one stride per dimension");
    let len: usize = shape.iter().product();
    for i in 0..len {
        let mut rem = i;
        let mut at = src_offset;
        for d in (0..shape.len()).rev() {
            at += (rem % shape[d]) * src_strides[d];
            rem /= shape[d];
        }
        dst[dst_offset + i] = src[at];
    }
}
