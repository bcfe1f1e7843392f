//! CPU reference for `matmul`: batched `C[b] = alpha · op(A[b]) · op(B[b])` (or `C[b] +=` that,
//! when [`MatmulDims::accumulate`] is set), row-major, where `op` is the identity or a transpose
//! chosen per operand. Plain loops, accumulation in `f64`; the oracle for `shaders/matmul.wgsl`.
//!
//! Shapes follow the shader's `Params`: the logical product is `M×K · K×N = M×N`. When
//! [`MatmulDims::trans_a`] is set the stored A is `K×M` (row-major), otherwise `M×K`; when
//! [`MatmulDims::trans_b`] is set the stored B is `N×K`, otherwise `K×N`. Batch `i` of an operand
//! starts at `offset + i * batch_stride` elements; a batch stride of 0 broadcasts that operand.

/// Shape, layout and options of one batched matmul, mirroring the shader's `Params`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulDims {
    /// Number of products in the batch (0 is allowed and does nothing).
    pub batch: usize,
    /// Rows of `op(A)` and of `C`.
    pub m: usize,
    /// Columns of `op(B)` and of `C`.
    pub n: usize,
    /// Inner dimension: columns of `op(A)`, rows of `op(B)`.
    pub k: usize,
    /// `true`: the stored A is `K×M` and is used transposed.
    pub trans_a: bool,
    /// `true`: the stored B is `N×K` and is used transposed.
    pub trans_b: bool,
    /// Elements between consecutive batches of A (0 = the same A for every batch).
    pub batch_stride_a: usize,
    /// Elements between consecutive batches of B (0 = the same B for every batch).
    pub batch_stride_b: usize,
    /// Elements between consecutive batches of C (normally `m * n`).
    pub batch_stride_c: usize,
    /// Element offset of batch 0 of A inside the `a` slice.
    pub offset_a: usize,
    /// Element offset of batch 0 of B inside the `b` slice.
    pub offset_b: usize,
    /// Element offset of batch 0 of C inside the output (see [`matmul_into`]).
    pub offset_c: usize,
    /// Scale applied to the product: `C = alpha · op(A)·op(B)` (1.0 for a plain matmul).
    pub alpha: f32,
    /// `true`: add into the existing C (`C += alpha · op(A)·op(B)`), e.g. gradient accumulation.
    pub accumulate: bool,
}

impl MatmulDims {
    /// A dense, non-transposed, non-accumulating batched matmul: contiguous batches
    /// (`batch_stride_a = m*k`, `batch_stride_b = k*n`, `batch_stride_c = m*n`), zero offsets,
    /// `alpha = 1`.
    pub fn dense(batch: usize, m: usize, n: usize, k: usize) -> Self {
        Self {
            batch,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            batch_stride_a: m * k,
            batch_stride_b: k * n,
            batch_stride_c: m * n,
            offset_a: 0,
            offset_b: 0,
            offset_c: 0,
            alpha: 1.0,
            accumulate: false,
        }
    }

    /// Element index of logical `op(A)[i][l]` for batch `bi`.
    fn a_index(&self, bi: usize, i: usize, l: usize) -> usize {
        let base = self.offset_a + bi * self.batch_stride_a;
        if self.trans_a {
            base + l * self.m + i
        } else {
            base + i * self.k + l
        }
    }

    /// Element index of logical `op(B)[l][j]` for batch `bi`.
    fn b_index(&self, bi: usize, l: usize, j: usize) -> usize {
        let base = self.offset_b + bi * self.batch_stride_b;
        if self.trans_b {
            base + j * self.k + l
        } else {
            base + l * self.n + j
        }
    }

    /// Element index of `C[i][j]` for batch `bi`.
    fn c_index(&self, bi: usize, i: usize, j: usize) -> usize {
        self.offset_c + bi * self.batch_stride_c + i * self.n + j
    }

    /// Number of elements an output slice must hold: one past the last element of C written.
    pub fn c_len(&self) -> usize {
        if self.batch == 0 || self.m == 0 || self.n == 0 {
            return self.offset_c;
        }
        self.c_index(self.batch - 1, self.m - 1, self.n - 1) + 1
    }
}

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
