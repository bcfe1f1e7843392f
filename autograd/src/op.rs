//! [`Op`]: what a node did (shapes, axes, scalars) and what it saved for its backward. A saved
//! tensor is a field of its variant, so `backward::backward_op` unpacks it by pattern: a
//! derivative cannot ask for a tensor its op did not save. Saved tensors are detached (they hold
//! storage, never graph) and are dropped with the op, right after the node's backward.

use std::sync::Arc;

use plimsoll_kernels_wgsl::kernels::binary::BinaryOp;
use plimsoll_kernels_wgsl::kernels::unary::UnaryOp;
use smallvec::SmallVec;

use crate::backward::Grads;
use crate::checkpoint::Segment;
use crate::error::Result;
use crate::tensor::{Shape, Tensor};

/// Axes of a reduction or a permutation.
pub type Axes = SmallVec<[usize; 6]>;

/// One recorded operation. Inputs are in the order the op took them.
#[derive(Debug, Clone)]
pub enum Op {
    /// `a + b`, broadcasting.
    Add {
        /// Shape of `a`.
        lhs: Shape,
        /// Shape of `b`.
        rhs: Shape,
    },
    /// `a - b`, broadcasting.
    Sub {
        /// Shape of `a`.
        lhs: Shape,
        /// Shape of `b`.
        rhs: Shape,
    },
    /// `a op b`, broadcasting, for the ops whose derivative reads the operands (mul, div,
    /// maximum, minimum).
    Binary {
        /// Which op.
        op: BinaryOp,
        /// `a` (its shape is the operand's).
        a: Tensor,
        /// `b`.
        b: Tensor,
    },
    /// `x + s`.
    AddScalar {
        /// `s`.
        scalar: f32,
    },
    /// `x * s`.
    MulScalar {
        /// `s`.
        scalar: f32,
    },
    /// `x / s`.
    DivScalar {
        /// `s`.
        scalar: f32,
    },
    /// `s - x`.
    ScalarSub {
        /// `s`.
        scalar: f32,
    },
    /// `s / x`.
    ScalarDiv {
        /// `s`.
        scalar: f32,
        /// `x`.
        x: Tensor,
    },
    /// `f(x)` elementwise, any [`UnaryOp`].
    Unary {
        /// Which function.
        op: UnaryOp,
        /// The exponent of `Pow` (0 otherwise).
        exponent: f32,
        /// The output `y` if [`UnaryOp::backward_uses_output`] (exp, tanh, sigmoid), else `x`.
        saved: Tensor,
    },
    /// Batched `a · b`: `[.., m, k] · [.., k, n]`, either side may be a 2-D matrix shared by every
    /// batch.
    Matmul {
        /// `a`.
        a: Tensor,
        /// `b`.
        b: Tensor,
    },
    /// `a · bᵀ`: `[.., k] · [n, k]ᵀ` (a linear layer's weight in PyTorch's layout).
    MatmulTransposed {
        /// `a`.
        a: Tensor,
        /// `b`, `[n, k]`.
        b: Tensor,
        /// The scale (1 for a plain product).
        alpha: f32,
    },
    /// `x · weightᵀ + bias` (inputs `x`, `weight`, `bias`), then ReLU when `relu_output` is
    /// saved: [`crate::Tensor::linear`].
    Linear {
        /// `x`, `[.., k]`.
        x: Tensor,
        /// The weight, `[n, k]`.
        weight: Tensor,
        /// The op's output when a ReLU followed (its derivative is `[y > 0]`).
        relu_output: Option<Tensor>,
    },
    /// Axes reordered: output axis `i` is input axis `perm[i]`.
    Permute {
        /// The permutation.
        perm: Axes,
    },
    /// Same elements, new shape (a view).
    Reshape {
        /// The input's shape.
        input: Shape,
    },
    /// Sum over `axes`.
    Sum {
        /// The input's shape.
        input: Shape,
        /// The reduced axes, ascending.
        axes: Axes,
    },
    /// Mean over `axes`.
    Mean {
        /// The input's shape.
        input: Shape,
        /// The reduced axes, ascending.
        axes: Axes,
    },
    /// Max over one axis.
    Max {
        /// The input's shape.
        input: Shape,
        /// The reduced axis.
        axis: usize,
        /// The arg-max along the axis (u32, the output's shape with the axis kept).
        indices: Tensor,
    },
    /// Softmax over the last axis.
    Softmax {
        /// Length of the last axis.
        cols: usize,
        /// The output.
        y: Tensor,
    },
    /// Log-softmax over the last axis.
    LogSoftmax {
        /// Length of the last axis.
        cols: usize,
        /// The output.
        y: Tensor,
    },
    /// Mean cross-entropy of `[rows, cols]` logits with u32 targets.
    CrossEntropy {
        /// Rows (samples).
        rows: usize,
        /// Classes.
        cols: usize,
        /// Label smoothing.
        smoothing: f32,
        /// The logits.
        logits: Tensor,
        /// The targets (u32).
        targets: Tensor,
    },
    /// Layer norm over the last axis with `gamma`, `beta`.
    LayerNorm {
        /// Rows (all but the last axis).
        rows: usize,
        /// Length of the last axis.
        cols: usize,
        /// The input.
        x: Tensor,
        /// The scale.
        gamma: Tensor,
        /// Each row's mean (`[rows]`).
        mean: Tensor,
        /// Each row's `1/sqrt(var + eps)` (`[rows]`).
        rstd: Tensor,
    },
    /// Rows of a `[vocab, dim]` table gathered by u32 ids.
    Embedding {
        /// Rows of the table.
        vocab: usize,
        /// Columns of the table.
        dim: usize,
        /// The ids (u32).
        ids: Tensor,
    },
    /// Inputs joined along `axis`.
    Concat {
        /// The axis.
        axis: usize,
        /// Each input's extent along `axis`.
        sizes: SmallVec<[usize; 4]>,
    },
    /// `len` entries from `start` along `axis`.
    Slice {
        /// The input's shape.
        input: Shape,
        /// The axis.
        axis: usize,
        /// First entry kept.
        start: usize,
    },
    /// An op whose derivative lives beside its forward, outside this list (a fused kernel's
    /// own module, in this crate or another): see [`Derivative`].
    Custom(Box<dyn Derivative>),
    /// A checkpointed segment; backward runs its function again with a tape.
    Checkpoint {
        /// The segment's inputs, on the device or (under
        /// [`crate::checkpoint::offload_inputs`]) in host memory.
        inputs: SmallVec<[crate::checkpoint::Kept; 4]>,
        /// Its function and the random state at its forward.
        replay: Replay,
    },
}

/// The derivative of an op recorded as [`Op::Custom`] (PyTorch's `autograd.Function`): the op
/// is a struct of what it saved, its forward records it with [`Tensor::from_op`], and its
/// backward is here. A new fused op is then its own module, with no arm in this crate's `Op`
/// or `backward_op`.
pub trait Derivative: DerivativeClone + std::fmt::Debug + Send + Sync {
    /// The gradients of the op's inputs, in input order (`None`: none for that input, such as
    /// integer ids), given `g`, the gradient of its output. `needs[i]` says whether input `i`
    /// wants one (an op may skip that work). It runs with grad mode off, so the tensor ops it
    /// uses record nothing and allocate `Temporary` scratch.
    fn backward(&self, g: &Tensor, needs: &[bool]) -> Result<Grads>;

    /// [`Derivative::backward`] where `into[i]`, when there is one, is the gradient input `i`
    /// has received so far (of its shape, f32, and held by nothing else): the op may take it,
    /// add its gradient for that input into it in its own kernel (no addition after, no
    /// temporary), and return it as that input's gradient. One it leaves is added to as usual.
    /// By default the op takes none and runs [`Derivative::backward`].
    fn backward_into(
        &self,
        g: &Tensor,
        needs: &[bool],
        into: &mut [Option<Tensor>],
    ) -> Result<Grads> {
        let _ = into;
        self.backward(g, needs)
    }

    /// The saved tensors that may be stored in f16 under [`crate::half::f16_activations`]
    /// (operands and outputs; not statistics, ids or indices). None by default.
    fn saved_activations(&mut self) -> Vec<&mut Tensor> {
        Vec::new()
    }

    /// Whether the op's output is an activation that [`crate::half::f16_activations`] stores in
    /// f16 (not a view, a reduction, a log-probability or a loss). True by default.
    fn outputs_activation(&self) -> bool {
        true
    }

    /// Whether [`Derivative::backward`] reads its saved activations in f16 itself (its kernels
    /// take halves), so they are not widened to f32 temporaries before it runs. False by
    /// default.
    fn reads_saved_f16(&self) -> bool {
        false
    }
}

/// Cloning a boxed [`Derivative`] (an `Op` is `Clone`); implemented for every `Clone` one.
pub trait DerivativeClone {
    /// A boxed copy.
    fn clone_box(&self) -> Box<dyn Derivative>;
}

impl<T: Derivative + Clone + 'static> DerivativeClone for T {
    fn clone_box(&self) -> Box<dyn Derivative> {
        Box::new(self.clone())
    }
}

impl Clone for Box<dyn Derivative> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

/// What a checkpoint needs to run its segment again: the function and the thread's random
/// state when it first ran (so dropout draws the same masks).
#[derive(Clone)]
pub struct Replay {
    /// The segment.
    pub(crate) function: Arc<dyn Segment>,
    /// [`crate::grad_mode::rng_state`] at the forward.
    pub(crate) rng: u64,
    /// Whether the forward ran under [`crate::f16_activations`] (the recomputation does too).
    pub(crate) f16: bool,
    /// The parameters the segment captures that were in host memory when its forward ran
    /// ([`crate::checkpoint_with`]): restored with their gradients for the recomputation, and
    /// evicted again after it, the gradients read back.
    pub(crate) streamed: Vec<Tensor>,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay").field("rng", &self.rng).finish()
    }
}

impl Op {
    /// The tensors this op saved that may be stored in f16 under
    /// [`crate::half::f16_activations`] (the caller keeps only f32 activations): its operands
    /// and outputs, not layer norm's statistics, the ids, or the arg-max indices.
    pub(crate) fn saved_activations(&mut self) -> SmallVec<[&mut Tensor; 4]> {
        let mut saved: SmallVec<[&mut Tensor; 4]> = SmallVec::new();
        match self {
            Op::Binary { a, b, .. } | Op::Matmul { a, b } | Op::MatmulTransposed { a, b, .. } => {
                saved.push(a);
                saved.push(b);
            }
            Op::ScalarDiv { x, .. } => saved.push(x),
            Op::Unary { saved: s, .. } => saved.push(s),
            Op::Linear { x, relu_output, .. } => {
                saved.push(x);
                saved.extend(relu_output.as_mut());
            }
            // Log-probabilities stay f32 (their output is not stored in f16 either).
            Op::Softmax { y, .. } => saved.push(y),
            Op::CrossEntropy { logits, .. } => saved.push(logits),
            Op::LayerNorm { x, .. } => saved.push(x),
            Op::Checkpoint { inputs, .. } => saved.extend(
                inputs
                    .iter_mut()
                    .filter_map(crate::checkpoint::Kept::on_device),
            ),
            Op::Custom(derivative) => saved.extend(derivative.saved_activations()),
            Op::LogSoftmax { .. }
            | Op::Add { .. }
            | Op::Sub { .. }
            | Op::AddScalar { .. }
            | Op::MulScalar { .. }
            | Op::DivScalar { .. }
            | Op::ScalarSub { .. }
            | Op::Permute { .. }
            | Op::Reshape { .. }
            | Op::Sum { .. }
            | Op::Mean { .. }
            | Op::Max { .. }
            | Op::Embedding { .. }
            | Op::Concat { .. }
            | Op::Slice { .. } => {}
        }
        saved
    }

    /// Whether the op's output is an activation that [`crate::half::f16_activations`] stores
    /// in f16: not a view (reshape, slice: its input's type), a reduction, log-probabilities or
    /// a loss (f32, as autocast keeps them).
    pub(crate) fn outputs_activation(&self) -> bool {
        if let Op::Custom(derivative) = self {
            return derivative.outputs_activation();
        }
        !matches!(
            self,
            Op::Reshape { .. }
                | Op::Slice { .. }
                | Op::Sum { .. }
                | Op::Mean { .. }
                | Op::Max { .. }
                | Op::LogSoftmax { .. }
                | Op::CrossEntropy { .. }
        )
    }
}
