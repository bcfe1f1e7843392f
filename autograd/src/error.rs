//! The one error type of `plimsoll-autograd`: structured variants that name the op and the shapes.

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in autograd. Bad input is always one of these, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Operand shapes that do not fit the op (broadcast, matmul inner dimension, concat, ...).
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not fit ({hint})")]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// Shape of the first operand (or the input).
        lhs: Vec<usize>,
        /// Shape of the second operand (or what was asked for).
        rhs: Vec<usize>,
        /// What the op needs.
        hint: &'static str,
    },
    /// An axis (or permutation) that does not exist for the tensor's rank.
    #[error("{op}: axis {axis} out of range for shape {shape:?}")]
    BadAxis {
        /// The op.
        op: &'static str,
        /// The axis asked for.
        axis: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// An argument outside its domain (dropout probability, slice range, empty concat, ...).
    #[error("{op}: {message}")]
    InvalidArgument {
        /// The op.
        op: &'static str,
        /// What is wrong, with the numbers.
        message: String,
    },
    /// A tensor of the wrong element type for the op (e.g. f32 ids for `embedding`).
    #[error("{op}: expected {expected:?} data, got {got:?}")]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// What the op takes.
        expected: crate::DType,
        /// What it got.
        got: crate::DType,
    },
    /// `backward` through a graph whose saved tensors a previous backward already released.
    #[error(
        "backward through a graph that a previous backward already freed; pass \
         retain_graph = true to the first backward to run it twice"
    )]
    BackwardTwice,
    /// `backward` from a tensor with more than one element and no seed gradient.
    #[error(
        "backward from a non-scalar tensor of shape {shape:?} needs a seed gradient of that \
         shape (Tensor::backward_with), or reduce it to a scalar first (sum, mean)"
    )]
    NonScalarBackward {
        /// Shape of the tensor backward was called on.
        shape: Vec<usize>,
    },
    /// `backward` from a tensor that is not part of any graph.
    #[error(
        "backward from a tensor that does not require grad (created under no_grad, detached, \
         or computed only from tensors without requires_grad)"
    )]
    NoGraph,
    /// A seed gradient of the wrong shape.
    #[error("seed gradient of shape {seed:?} for a tensor of shape {shape:?}")]
    SeedShape {
        /// The tensor's shape.
        shape: Vec<usize>,
        /// The seed's shape.
        seed: Vec<usize>,
    },
    /// A read-back that expected one element.
    #[error("item() on a tensor of shape {shape:?}: it has {len} elements, not 1")]
    NotAScalar {
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Its element count.
        len: usize,
    },
    /// The GPU layer failed (out of memory, timeout, device lost, ...).
    #[error(transparent)]
    Kernel(#[from] plimsoll_kernels_wgsl::Error),
}
