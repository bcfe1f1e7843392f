//! CPU reference for [`matmul`](super): batched `C[b] = alpha · op(A[b]) · op(B[b])` (or `C[b] +=` that,
//! when [`MatmulDims::accumulate`] is set), row-major, where `op` is the identity or a transpose
//! chosen per operand. Plain loops, accumulation in `f64`; the oracle for `matmul.wgsl`
//! (the `f32` entry points) and for autograd's gradient checks and nn's module tests (`*_f64`).
//!
//! Shapes follow the shader's `Params`: the logical product is `M×K · K×N = M×N`. When
//! [`MatmulDims::trans_a`] is set the stored A is `K×M` (row-major), otherwise `M×K`; when
//! [`MatmulDims::trans_b`] is set the stored B is `N×K`, otherwise `K×N`. Batch `i` of an operand
//! starts at element `i * batch_stride` of its slice; a batch stride of 0 broadcasts that operand.

use super::MatmulDims;
use crate::kernels::widen;

/// [`matmul_into`] in `f64`: writes (or, with `accumulate`, adds) `alpha · op(A[b]) · op(B[b])`
/// into `c`, leaving the elements of `c` outside those positions untouched.
///
/// # Panics
/// If `a`, `b` or `c` is too short for the indices that `dims` describes.
pub fn matmul_into_f64(a: &[f64], b: &[f64], c: &mut [f64], dims: &MatmulDims) {
    for bi in 0..dims.batch {
        for i in 0..dims.m {
            for j in 0..dims.n {
                let mut sum = 0.0;
                for l in 0..dims.k {
                    sum += a[dims.a_index(bi, i, l)] * b[dims.b_index(bi, l, j)];
                }
                let product = f64::from(dims.alpha) * sum;
                let slot = &mut c[dims.c_index(bi, i, j)];
                *slot = if dims.accumulate {
                    *slot + product
                } else {
                    product
                };
            }
        }
    }
}

/// [`matmul`] in `f64`: `alpha · op(A[b]) · op(B[b])` for every batch, in a fresh vector of
/// [`MatmulDims::c_len`] elements (positions that are not written are 0.0).
///
/// # Panics
/// If `a` or `b` is too short for the indices that `dims` describes.
pub fn matmul_f64(a: &[f64], b: &[f64], dims: &MatmulDims) -> Vec<f64> {
    let mut c = vec![0.0; dims.c_len()];
    matmul_into_f64(a, b, &mut c, dims);
    c
}

/// [`matmul_into_f64`] on `f32` data: each written element is rounded once to `f32` (after the
/// add when accumulating); the others are left as they were.
///
/// # Panics
/// If `a`, `b` or `c` is too short for the indices that `dims` describes.
pub fn matmul_into(a: &[f32], b: &[f32], c: &mut [f32], dims: &MatmulDims) {
    let mut c64 = widen(c);
    matmul_into_f64(&widen(a), &widen(b), &mut c64, dims);
    for (out, v) in c.iter_mut().zip(c64) {
        *out = v as f32;
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
