//! The checkpoint (recompute) mechanism: [`checkpoint`] runs a segment without saving its
//! intermediates and records one node that keeps only the segment's inputs, its function and the
//! random state; backward runs the function again with a tape and back-propagates through it.
//! Which segments to checkpoint is the trainer's decision, not this crate's.
//!
//! Parameters the function captures (rather than takes as inputs) receive their gradients
//! directly during the recomputation's backward, as in PyTorch's `torch.utils.checkpoint`.

use std::sync::Arc;

use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::kernels::copy;

use crate::backward::Grads;
use crate::error::Result;
use crate::grad_mode::{enable_grad, is_grad_enabled, no_grad, rng_state, set_rng_state};
use crate::half::{f16_activations, saves_f16_activations};
use crate::op::{Op, Replay};
use crate::tape::{attach, backward_from};
use crate::tensor::{Autograd, Tensor};

/// A recomputable segment: a pure function of its inputs (and of captured tensors that do not
/// change between forward and backward). Implemented for every suitable closure.
pub trait Segment: Send + Sync {
    /// Runs the segment.
    fn run(&self, inputs: &[Tensor]) -> Result<Tensor>;
}

impl<F> Segment for F
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync,
{
    fn run(&self, inputs: &[Tensor]) -> Result<Tensor> {
        self(inputs)
    }
}

/// Runs `f(inputs)` without saving its intermediates; backward recomputes it (with the same
/// dropout masks: the thread's random state is saved and restored around the recomputation).
/// Outside grad mode this is just `f(inputs)`.
///
/// The output is copied into an `Activation` buffer (one copy per segment), because it is what
/// the rest of the graph saves, and the segment ran with recording off (`Temporary` outputs).
pub fn checkpoint<F>(inputs: &[&Tensor], f: F) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    let values: Vec<Tensor> = inputs.iter().map(|t| t.detach()).collect();
    if !is_grad_enabled() {
        return f(&values);
    }
    let rng = rng_state();
    let out = {
        let _no_grad = no_grad();
        // A segment that returns an input as it came may hand back an f16 tensor.
        f(&values)?.widened()?
    };
    let kept = Tensor::empty_typed(
        &out.gpu,
        &out.shape,
        out.dtype,
        Category::Activation,
        "checkpoint",
    )?;
    copy::copy(&out.gpu, kept.elements()?, out.elements()?)?;
    let op = Op::Checkpoint {
        inputs: values.into_iter().collect(),
        replay: Replay {
            function: Arc::new(f),
            rng,
            f16: saves_f16_activations(),
        },
    };
    attach(kept, op, inputs)
}

/// Backward of a checkpoint node: recompute with a tape from fresh leaves, back-propagate `g`,
/// and return the leaves' gradients.
pub(crate) fn backward(
    inputs: &[Tensor],
    replay: &Replay,
    g: &Tensor,
    needs: &[bool],
) -> Result<Grads> {
    let leaves: Vec<Tensor> = inputs
        .iter()
        .zip(needs.iter().chain(std::iter::repeat(&false)))
        .map(|(t, &need)| {
            let t = t.detach();
            if need {
                t.into_leaf(Category::Temporary)
            } else {
                t
            }
        })
        .collect();
    let outer_rng = rng_state();
    set_rng_state(replay.rng);
    let out = {
        let _grad = enable_grad();
        let _again = crate::grad_mode::recomputing();
        // Recomputed as first computed: in f16 when its forward ran under f16_activations.
        let _half = replay.f16.then(f16_activations);
        replay.function.run(&leaves)
    };
    set_rng_state(outer_rng);
    let out = out?;
    match &out.autograd {
        Autograd::Node(node) => backward_from(node, g.clone(), false)?,
        Autograd::Leaf(slot) => slot.accumulate(g)?,
        Autograd::None => {}
    }
    // Dropping the recomputed activations returns their blocks to the allocator at once (later
    // recorded work may reuse them, see kernels-wgsl's host/GPU ordering rule), so the next
    // segment recomputes into the same memory, which is the point of checkpointing.
    drop(out);
    Ok(leaves.iter().map(Tensor::grad).collect())
}
