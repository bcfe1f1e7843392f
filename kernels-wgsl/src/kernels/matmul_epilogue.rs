//! The matmul's extras, launched by [`super::matmul`]'s one launcher: an epilogue (a bias per
//! column, then ReLU) in the same pass as the product, and the squares of C per block.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::matmul::{
    Extra, MAIN, MAIN_SCALAR, MatmulDims, MatmulEntry, Operand, entry_point, launch, matmul,
};
use crate::slice::DeviceSlice;

/// What a matmul does to each element of C after the product ([`matmul_bias`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// Nothing: C is the product.
    None,
    /// `C[.., i, j] += bias[j]`.
    Bias,
    /// `C[.., i, j] = max(C[.., i, j] + bias[j], 0)`: a linear layer and its ReLU.
    BiasRelu,
}

/// [`matmul`], then `epilogue` on every element of C in the same pass: `C[b][i][j] =
/// op(alpha · op(A)·op(B)[i][j] + bias[j])` with `op` the identity or ReLU, one pass over C
/// instead of three. With `alpha` 1 the same values as a plain matmul followed by a bias add
/// and a ReLU (the same additions in the same order); with another `alpha` a driver that fuses
/// the multiply and the bias add into one FMA may round the last bit differently. `bias` holds
/// `n` elements.
///
/// # Errors
/// Those of [`matmul`], and [`Error::InvalidArgument`] when `bias` does not hold `n` elements,
/// overlaps C, or `dims.accumulate` is set (an epilogue applies to a fresh product only).
pub fn matmul_bias<'a>(
    gpu: &Gpu,
    dims: &MatmulDims,
    epilogue: Epilogue,
    out: impl Into<Operand<'a>>,
    lhs: impl Into<Operand<'a>>,
    rhs: impl Into<Operand<'a>>,
    bias: DeviceSlice<'_>,
) -> Result<()> {
    let (out, lhs, rhs) = (out.into(), lhs.into(), rhs.into());
    if epilogue == Epilogue::None {
        return matmul(gpu, dims, out, lhs, rhs);
    }
    let invalid = |message: String| Error::InvalidArgument {
        op: "matmul_bias",
        message,
    };
    bias.expect_len("matmul_bias", "bias", dims.n as u64)?;
    if dims.accumulate {
        return Err(invalid(
            "an epilogue applies to a fresh product: accumulate must be off".to_string(),
        ));
    }
    if out.words().overlaps(&bias) {
        return Err(invalid(format!(
            "out (C) {out:?} overlaps the bias {bias:?}; write the product to a separate buffer"
        )));
    }
    let kernels = [MAIN, MAIN_SCALAR];
    launch(
        gpu,
        dims,
        [out, lhs, rhs],
        kernels,
        None,
        Extra::Bias(bias, epilogue),
    )
}

/// The entry point a launch of `dims` on these slices takes ([`entry_point`], demoted to
/// `main_scalar` when an operand does not start on a multiple of 4 elements).
pub fn launch_entry(dims: &MatmulDims, [out, lhs, rhs]: [Operand<'_>; 3]) -> MatmulEntry {
    if [lhs, rhs, out].iter().all(|s| s.index().is_multiple_of(4)) {
        entry_point(dims)
    } else {
        MatmulEntry::MainScalar
    }
}

/// How many partial sums [`matmul_squares`] writes for `dims` on `entry`: one per block of
/// outputs one invocation stores (16×16 on `main`, 4×4 on `main_scalar`), per batch.
pub fn squares_len(dims: &MatmulDims, entry: MatmulEntry) -> u64 {
    let size = match entry {
        MatmulEntry::Main => 16,
        MatmulEntry::MainScalar => 4,
    };
    let blocks = |x: usize| (x as u64).div_ceil(size);
    dims.batch as u64 * blocks(dims.m) * blocks(dims.n)
}

/// [`matmul`] that also writes, into `squares`, the sums of the squares of what it stored in C
/// (after `accumulate`: the values C then holds), one per block of outputs an invocation stores
/// ([`squares_len`] of [`launch_entry`]); their sum is C's squared norm. For a gradient's norm
/// with no pass over the gradient. Errors: those of [`matmul`], and [`Error::InvalidArgument`]
/// when `squares` does not hold that many elements or overlaps C, A or B.
pub fn matmul_squares<'a>(
    gpu: &Gpu,
    dims: &MatmulDims,
    out: impl Into<Operand<'a>>,
    lhs: impl Into<Operand<'a>>,
    rhs: impl Into<Operand<'a>>,
    squares: DeviceSlice<'_>,
) -> Result<()> {
    let (out, lhs, rhs) = (out.into(), lhs.into(), rhs.into());
    let len = squares_len(dims, launch_entry(dims, [out, lhs, rhs]));
    squares.expect_len("matmul_squares", "squares", len)?;
    for (name, operand) in [("out (C)", out), ("lhs (A)", lhs), ("rhs (B)", rhs)] {
        if operand.words().overlaps(&squares) {
            return Err(Error::InvalidArgument {
                op: "matmul_squares",
                message: format!("{name} {operand:?} overlaps the squares {squares:?}"),
            });
        }
    }
    let kernels = [MAIN, MAIN_SCALAR];
    launch(
        gpu,
        dims,
        [out, lhs, rhs],
        kernels,
        None,
        Extra::Squares(squares),
    )
}
