//! CPU reference for `matmul`: batched `C[b] = alpha · op(A[b]) · op(B[b])` (or `C[b] +=` that,
//! when [`MatmulDims::accumulate`] is set), row-major, where `op` is the identity or a transpose
//! chosen per operand. Plain loops, accumulation in `f64`; the oracle for `shaders/matmul.wgsl`.
//!
//! Shapes follow the shader's `Params`: the logical product is `M×K · K×N = M×N`. When
//! [`MatmulDims::trans_a`] is set the stored A is `K×M` (row-major), otherwise `M×K`; when
//! [`MatmulDims::trans_b`] is set the stored B is `N×K`, otherwise `K×N`. Batch `i` of an operand
//! starts at element `i * batch_stride` of its slice; a batch stride of 0 broadcasts that operand.

use crate::kernels::matmul::MatmulDims;

/// Writes (or, with `accumulate`, adds) `alpha · op(A[b]) · op(B[b])` into `c` at the positions
/// described by `dims`; elements of `c` outside those positions are left untouched.
///
/// # Panics
/// If `a`, `b` or `c` is too short for the indices that `dims` describes.
pub fn matmul_into(a: &[f32], b: &[f32], c: &mut [f32], dims: &MatmulDims) {
    for bi in 0..dims.batch {
        for i in 0..dims.m {
            for j in 0..dims.n {
                let mut sum = 0.0f64;
                for l in 0..dims.k {
                    sum +=
                        f64::from(a[dims.a_index(bi, i, l)]) * f64::from(b[dims.b_index(bi, l, j)]);
                }
                let scaled = f64::from(dims.alpha) * sum;
                let slot = &mut c[dims.c_index(bi, i, j)];
                *slot = if dims.accumulate {
                    (f64::from(*slot) + scaled) as f32
                } else {
                    scaled as f32
                };
            }
        }
    }
}

/// Returns `alpha · op(A[b]) · op(B[b])` for every batch in a fresh vector of
/// [`MatmulDims::c_len`] elements (positions that are not written are 0.0). With `accumulate`
/// set this adds onto zeros, i.e. gives the same result as without it; use [`matmul_into`] to
/// accumulate into an existing C.
///
/// # Panics
/// If `a` or `b` is too short for the indices that `dims` describes.
pub fn matmul(a: &[f32], b: &[f32], dims: &MatmulDims) -> Vec<f32> {
    let mut c = vec![0.0f32; dims.c_len()];
    matmul_into(a, b, &mut c, dims);
    c
}
