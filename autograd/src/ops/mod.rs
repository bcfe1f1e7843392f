//! The differentiable ops, as methods on [`crate::Tensor`], one module per family. Each forward
//! checks shapes (a [`crate::Error::ShapeMismatch`], never a panic), allocates its output
//! (`Activation` when it records, `Temporary` otherwise), records its kernels into the GPU's open
//! batch, and attaches a node only when `tape::records` says so.

pub mod elementwise;
pub mod linear;
pub mod matmul;
pub mod nn;
pub mod reduce;
pub mod shape;

use crate::error::Error;

/// A [`Error::ShapeMismatch`] for `op` over `lhs` and `rhs`.
pub(crate) fn mismatch(
    op: &'static str,
    lhs: &[usize],
    rhs: &[usize],
    hint: &'static str,
) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: lhs.to_vec(),
        rhs: rhs.to_vec(),
        hint,
    }
}
