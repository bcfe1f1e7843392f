//! Plimsoll's autograd: [`Tensor`] (shape, dtype, device storage shared by views, place in the
//! graph), the differentiable ops as methods on it, the tape ([`tape`]: nodes in execution order,
//! backward in reverse without recursion, eager release of saved tensors), the one derivative
//! `match` ([`backward`]), [`no_grad`], [`Tensor::detach`], and the [`checkpoint()`] (recompute)
//! mechanism. It is not a module system or an optimizer (that is `plimsoll-nn`), and it does not
//! choose what to checkpoint (that is `plimsoll-trainer`).
//!
//! Memory is visible in the allocator's categories: saved tensors (outputs of recorded ops) are
//! `Activation`, backward's scratch and unrecorded outputs `Temporary`, leaf gradients
//! `Gradient`; user tensors choose theirs ([`TensorOptions`]). Every kernel launch records into
//! the GPU's open batch; reading back ([`Tensor::to_vec`], [`Tensor::item`]) waits with a
//! deadline.
//!
//! Map: [`tensor`], [`ops`] (elementwise, matmul, reduce, shape, nn), [`op`] ([`Op`], plain
//! data), [`tape`], [`backward`], [`checkpoint`](mod@checkpoint), [`grad_mode`], [`error`].

pub mod backward;
pub mod checkpoint;
pub mod error;
pub mod grad_mode;
pub mod half;
pub mod op;
pub mod ops;
mod pending;
pub mod tape;
pub mod tensor;

pub use backward::Grads;
pub use checkpoint::{
    Segment, checkpoint, checkpoint_with, offload_inputs, offloaded_host_bytes,
    reset_offloaded_peak,
};
pub use error::{Error, Result};
pub use grad_mode::{
    NoGradGuard, enable_grad, is_grad_enabled, is_recomputing, manual_seed, no_grad,
};
pub use half::{
    F16ActivationsGuard, F16WeightCopiesGuard, f16_activations, f16_weight_copies,
    forget_weight_copies, saves_f16_activations,
};
pub use op::{Derivative, Op};
pub use plimsoll_kernels_wgsl::{Category, Gpu};
pub use tensor::{DType, Shape, Tensor, TensorOptions};
