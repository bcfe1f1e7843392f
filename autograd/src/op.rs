//! [`Op`]: what a node did, as plain data (shapes, axes, scalars). The derivative of each variant
//! is one arm of `backward::backward_op`; what each variant saves is written on it
//! (saved tensors live in the node, not here).

use plimsoll_kernels_wgsl::kernels::unary::UnaryOp;
use smallvec::SmallVec;

use crate::tensor::Shape;

/// Axes of a reduction or a permutation.
pub type Axes = SmallVec<[usize; 6]>;

/// One recorded operation. Inputs are in the order the op took them.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `a + b`, broadcasting. Saves nothing.
    Add {
        /// Shape of `a`.
        lhs: Shape,
        /// Shape of `b`.
        rhs: Shape,
    },
    /// `a - b`, broadcasting. Saves nothing.
    Sub {
        /// Shape of `a`.
        lhs: Shape,
        /// Shape of `b`.
        rhs: Shape,
    },
    /// `a * b`, broadcasting. Saves `a`, `b`.
    Mul {
        /// Shape of `a`.
        lhs: Shape,
        /// Shape of `b`.
        rhs: Shape,
    },
    /// `a / b`, broadcasting. Saves `a`, `b`.
    Div {
        /// Shape of `a`.
        lhs: Shape,
        /// Shape of `b`.
        rhs: Shape,
    },
    /// `max(a, b)`, broadcasting. Saves `a`, `b`.
    Maximum {
        /// Shape of `a`.
        lhs: Shape,
        /// Shape of `b`.
        rhs: Shape,
    },
    /// `min(a, b)`, broadcasting. Saves `a`, `b`.
    Minimum {
        /// Shape of `a`.
        lhs: Shape,
        /// Shape of `b`.
        rhs: Shape,
    },
    /// `x + s`. Saves nothing.
    AddScalar {
        /// `s`.
        scalar: f32,
    },
    /// `x * s`. Saves nothing.
    MulScalar {
        /// `s`.
        scalar: f32,
    },
    /// `x / s`. Saves nothing.
    DivScalar {
        /// `s`.
        scalar: f32,
    },
    /// `s - x`. Saves nothing.
    ScalarSub {
        /// `s`.
        scalar: f32,
    },
    /// `s / x`. Saves `x`.
    ScalarDiv {
        /// `s`.
        scalar: f32,
    },
    /// `f(x)` elementwise (neg, exp, log, sqrt, pow, relu, gelu, tanh, sigmoid). Saves the output
    /// for exp, tanh and sigmoid, else the input (`UnaryOp::backward_uses_output`).
    Unary {
        /// Which function.
        op: UnaryOp,
        /// The exponent of `Pow` (0 otherwise).
        exponent: f32,
    },
    /// Batched `a · b`: `[.., m, k] · [.., k, n]`, either side may be a 2-D matrix shared by every
    /// batch. Saves `a`, `b`.
    Matmul {
        /// Shape of `a`.
        lhs: Shape,
        /// Shape of `b`.
        rhs: Shape,
    },
    /// Axes reordered: output axis `i` is input axis `perm[i]`. Saves nothing.
    Permute {
        /// The permutation.
        perm: Axes,
    },
    /// Same elements, new shape (a view). Saves nothing.
    Reshape {
        /// The input's shape.
        input: Shape,
    },
    /// Sum over `axes`. Saves nothing.
    Sum {
        /// The input's shape.
        input: Shape,
        /// The reduced axes, ascending.
        axes: Axes,
    },
    /// Mean over `axes`. Saves nothing.
    Mean {
        /// The input's shape.
        input: Shape,
        /// The reduced axes, ascending.
        axes: Axes,
    },
    /// Max over one axis. Saves the arg-max indices (u32).
    Max {
        /// The input's shape.
        input: Shape,
        /// The reduced axis.
        axis: usize,
    },
    /// Softmax over the last axis. Saves the output.
    Softmax {
        /// Length of the last axis.
        cols: usize,
    },
    /// Log-softmax over the last axis. Saves the output.
    LogSoftmax {
        /// Length of the last axis.
        cols: usize,
    },
    /// Mean cross-entropy of `[rows, cols]` logits with u32 targets. Saves logits and targets.
    CrossEntropy {
        /// Rows (samples).
        rows: usize,
        /// Classes.
        cols: usize,
        /// Label smoothing.
        smoothing: f32,
    },
    /// Layer norm over the last axis with `gamma`, `beta`. Saves `x`, `gamma`, mean, rstd.
    LayerNorm {
        /// Rows (all but the last axis).
        rows: usize,
        /// Length of the last axis.
        cols: usize,
    },
    /// Rows of a `[vocab, dim]` table gathered by u32 ids. Saves the ids.
    Embedding {
        /// Rows of the table.
        vocab: usize,
        /// Columns of the table.
        dim: usize,
    },
    /// Inverted dropout with the mask of `seed`. Saves nothing: backward redraws the same mask.
    Dropout {
        /// Probability of zeroing an element.
        p: f32,
        /// The mask's seed.
        seed: u64,
    },
    /// Inputs joined along `axis`. Saves nothing.
    Concat {
        /// The axis.
        axis: usize,
        /// Each input's extent along `axis`.
        sizes: SmallVec<[usize; 4]>,
    },
    /// `len` entries from `start` along `axis`. Saves nothing.
    Slice {
        /// The input's shape.
        input: Shape,
        /// The axis.
        axis: usize,
        /// First entry kept.
        start: usize,
    },
    /// A checkpointed segment. Saves its inputs, its function and the random state; backward
    /// runs the function again with a tape.
    Checkpoint {
        /// Number of inputs.
        inputs: usize,
    },
}
