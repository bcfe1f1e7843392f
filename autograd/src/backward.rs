//! The derivative of every [`Op`]: one exhaustive `match` (no catch-all arm, so a new op does
//! not compile until its derivative exists), one line of math per arm. It runs with grad mode
//! off, so the tensor ops used here record nothing and allocate `Temporary` scratch.
//!
//! Convention: `g` is the gradient of the node's output; the result holds one entry per input,
//! in input order (`None`: no gradient for that input, e.g. integer targets).

use plimsoll_kernels_wgsl::kernels::reduce;
use plimsoll_kernels_wgsl::kernels::unary::UnaryOp;
use plimsoll_kernels_wgsl::{Category, Gpu};
use smallvec::{SmallVec, smallvec};

use crate::error::Result;
use crate::op::Op;
use crate::ops::elementwise::{binary_grads, sum_to, unary_grad};
use crate::ops::matmul::{matmul_grads, matmul_transposed_grads};
use crate::ops::nn::{cross_entropy_grad, embedding_grad, layer_norm_grads, softmax_grad};
use crate::ops::reduce::{max_grad, mean_grad, sum_grad};
use crate::ops::shape::{inverse, pad_slice, split};
use crate::tensor::{GradSlot, Tensor};

/// Gradients of a node's inputs, in input order (`None`: no gradient for that input). Build one
/// with `Grads::from_iter([..])` or `[..].into_iter().collect()`.
pub type Grads = SmallVec<[Option<Tensor>; 3]>;

fn one(dx: Tensor) -> Result<Grads> {
    Ok(smallvec![Some(dx)])
}

fn two((da, db): (Tensor, Tensor)) -> Result<Grads> {
    Ok(smallvec![Some(da), Some(db)])
}

/// Where a kernel writes a whole gradient of `shape`: for a leaf input (`leaf` is its slot, of
/// that shape) the slot's [`GradSlot::target`], else a new temporary; [`landed`] then finishes.
fn grad_target<'a>(
    gpu: &Gpu,
    leaf: Option<&'a GradSlot>,
    shape: &[usize],
) -> Result<(Tensor, Option<&'a GradSlot>)> {
    match leaf.filter(|slot| slot.shape[..] == shape[..]) {
        Some(slot) => Ok((slot.target()?, Some(slot))),
        None => Ok((
            Tensor::empty(gpu, shape, Category::Temporary, "grad")?,
            None,
        )),
    }
}

/// A written [`grad_target`]: landed in its leaf's slot (`None`: nothing left to pass on), or
/// the gradient to pass on.
fn landed(written: Tensor, slot: Option<&GradSlot>) -> Result<Option<Tensor>> {
    match slot {
        Some(slot) => slot.land(written).map(|()| None),
        None => Ok(Some(written)),
    }
}

/// A gradient of `shape` that `write` computes into the tensor it is given: straight into the
/// slot of a leaf input (`leaf`), or into a new temporary that is returned
/// ([`grad_target`], [`landed`]).
fn written_grad(
    gpu: &Gpu,
    leaf: Option<&GradSlot>,
    shape: &[usize],
    write: impl FnOnce(&Tensor) -> Result<()>,
) -> Result<Option<Tensor>> {
    let (target, slot) = grad_target(gpu, leaf, shape)?;
    write(&target)?;
    landed(target, slot)
}

/// `g` summed to `shape` (the gradient of an input broadcast to `g`'s shape), written straight
/// into `leaf`'s slot when the input is a leaf ([`written_grad`]); `g` itself when nothing was
/// broadcast.
fn sum_to_grad(g: &Tensor, shape: &[usize], leaf: Option<&GradSlot>) -> Result<Option<Tensor>> {
    if g.shape[..] == shape[..] {
        return Ok(Some(g.clone()));
    }
    written_grad(&g.gpu, leaf, shape, |out| {
        reduce::sum_to_shape(&g.gpu, out.elements()?, g.elements()?, &g.shape, shape)?;
        Ok(())
    })
}

/// [`wanted`] for a gradient that may have gone straight into a leaf's slot (`None`).
fn wanted_opt(
    needs: &[bool],
    i: usize,
    grad: impl FnOnce() -> Result<Option<Tensor>>,
) -> Result<Option<Tensor>> {
    match needs.get(i).copied().unwrap_or(true) {
        true => grad(),
        false => Ok(None),
    }
}

/// Input `i`'s gradient slot when it is a leaf.
fn leaf<'a>(leaves: &[Option<&'a GradSlot>], i: usize) -> Option<&'a GradSlot> {
    leaves.get(i).copied().flatten()
}

/// `grad()` when input `i` needs a gradient (`needs[i]`, true when absent), else `None`.
fn wanted(
    needs: &[bool],
    i: usize,
    grad: impl FnOnce() -> Result<Tensor>,
) -> Result<Option<Tensor>> {
    match needs.get(i).copied().unwrap_or(true) {
        true => grad().map(Some),
        false => Ok(None),
    }
}

/// A buffer the backward walk lends an op for one input's gradient ([`backward_op`]).
pub(crate) enum Lent {
    /// The gradient the input (a node) has received so far, held by nothing else: the op may
    /// add its gradient into it in its own kernel and return it.
    Sum(Tensor),
    /// The input's place in the buffer its parent's gradient will be (the input is a
    /// leading-axis slice of the parent, or a reshape of one), not yet written: the op may write
    /// its whole gradient there and return it, so the slices' gradients tile the parent's
    /// without copies.
    Blank(Tensor),
}

/// Takes `lent[i]` when it is a [`Lent::Sum`] of `shape`.
fn lent_sum(lent: &mut [Option<Lent>], i: usize, shape: &[usize]) -> Option<Tensor> {
    let slot = lent.get_mut(i)?;
    match slot.take_if(|l| matches!(l, Lent::Sum(t) if t.shape[..] == shape[..]))? {
        Lent::Sum(t) | Lent::Blank(t) => Some(t),
    }
}

/// Whether `op`'s backward may take a [`Lent::Blank`] for input `i` (so the walk allocates a
/// parent's buffer only for ops that write into it).
pub(crate) fn writes_blank(op: &Op, i: usize) -> bool {
    match op {
        Op::Matmul { .. } | Op::MatmulTransposed { .. } => i < 2,
        Op::Linear { .. } => i == 0,
        _ => false,
    }
}

/// The gradients of `op`'s inputs given `g`, the gradient of its output. `needs[i]` says whether
/// input `i` wants one (checkpoints, matmuls and additions use it to skip work; elsewhere it is
/// cheap to compute and dropped).
/// `leaves[i]` is input `i`'s gradient slot when it is a leaf: an op may accumulate into it
/// directly and return `None` for that input (matmul does, saving a temporary and a copy).
/// `lent[i]` is a buffer the walk lends for input `i`'s gradient ([`Lent`]): an op may take it
/// and return it as that input's gradient, added into (layer norm's `dx` into a residual
/// stream's gradient; a product's with its accumulate flag) or written (a product's into its
/// place in the parent of a slice); one it leaves is given back.
pub(crate) fn backward_op(
    op: &Op,
    g: &Tensor,
    needs: &[bool],
    leaves: &[Option<&GradSlot>],
    lent: &mut [Option<Lent>],
) -> Result<Grads> {
    match op {
        // d(a+b)/da = 1, d(a+b)/db = 1, each summed over the axes it was broadcast along
        // (an input that needs none, such as a constant mask, gets no reduction)
        Op::Add { lhs, rhs } => Ok(smallvec![
            wanted_opt(needs, 0, || sum_to_grad(g, lhs, leaf(leaves, 0)))?,
            wanted_opt(needs, 1, || sum_to_grad(g, rhs, leaf(leaves, 1)))?,
        ]),
        // d(a-b)/da = 1, d(a-b)/db = -1
        Op::Sub { lhs, rhs } => Ok(smallvec![
            wanted(needs, 0, || sum_to(g, lhs))?,
            wanted(needs, 1, || sum_to(&g.neg()?, rhs))?,
        ]),
        // d(a*b) = (b, a); d(a/b) = (1/b, -a/b²); d max(a,b) = ([a > b], [b > a]) and
        // d min(a,b) = ([a < b], [b < a]), a tie splitting g evenly: the binary kernel's rule at
        // the output shape, then each summed over the axes it was broadcast along
        Op::Binary { op, a, b } => {
            let (da, db) = binary_grads(*op, a, b, g)?;
            two((sum_to(&da, &a.shape)?, sum_to(&db, &b.shape)?))
        }
        // d(x+s)/dx = 1
        Op::AddScalar { .. } => one(g.clone()),
        // d(x*s)/dx = s
        Op::MulScalar { scalar } => one(g.mul_scalar(*scalar)?),
        // d(x/s)/dx = 1/s
        Op::DivScalar { scalar } => one(g.div_scalar(*scalar)?),
        // d(s-x)/dx = -1
        Op::ScalarSub { .. } => one(g.neg()?),
        // d(s/x)/dx = -s/x²
        Op::ScalarDiv { scalar, x } => one(g.mul(&x.powf(-2.0)?)?.mul_scalar(-scalar)?),
        // d f(x)/dx = f'(x), from the saved x (or y = f(x) for exp, tanh, sigmoid)
        Op::Unary {
            op,
            exponent,
            saved,
        } => one(unary_grad(*op, *exponent, saved, g)?),
        // dA = G·Bᵀ, dB = Aᵀ·G (summed over the batch for a shared operand)
        Op::Matmul { a, b } => {
            let (da, db) = matmul_grads(g, a, b, needs, leaves, lent)?;
            Ok(smallvec![da, db])
        }
        // C = alpha·A·Bᵀ: dA = alpha·G·B, dB = alpha·Gᵀ·A (the rows of A folded into one matrix)
        Op::MatmulTransposed { a, b, alpha } => {
            let (da, db) = matmul_transposed_grads(g, [a, b], *alpha, needs, leaves, lent)?;
            Ok(smallvec![da, db])
        }
        // y = relu(z), z = x·Wᵀ + b: dz = g ⊙ [y > 0] (g without the ReLU); then db = Σ_rows dz
        // and (dx, dW) as for x·Wᵀ
        Op::Linear {
            x,
            weight,
            relu_output,
        } => {
            let dz = match relu_output {
                Some(y) => unary_grad(UnaryOp::Relu, 0.0, y, g)?,
                None => g.clone(),
            };
            let n = weight.shape[0];
            let db = wanted_opt(needs, 2, || sum_to_grad(&dz, &[n], leaf(leaves, 2)))?;
            let (dx, dw) = matmul_transposed_grads(&dz, [x, weight], 1.0, needs, leaves, lent)?;
            Ok(smallvec![dx, dw, db])
        }
        // dx = permute(g, perm⁻¹)
        Op::Permute { perm } => one(g.permute(&inverse(perm))?),
        // dx = reshape(g, input shape)
        Op::Reshape { input } => one(g.reshape(input)?),
        // d(Σ_axes x)/dx = 1: g repeated along the reduced axes
        Op::Sum { input, axes } => one(sum_grad(g, input, axes)?),
        // d(mean_axes x)/dx = 1/n: g/n repeated along the reduced axes
        Op::Mean { input, axes } => one(mean_grad(g, input, axes)?),
        // d(max_k x)/dx_k = 1 at the arg-max, 0 elsewhere
        Op::Max {
            input,
            axis,
            indices,
        } => one(max_grad(g, indices, input, *axis)?),
        // dx = y ⊙ (g - Σ_j g_j y_j) per row
        Op::Softmax { cols, y } => one(softmax_grad(g, y, *cols, false)?),
        // dx = g - softmax(x) Σ_j g_j per row
        Op::LogSoftmax { cols, y } => one(softmax_grad(g, y, *cols, true)?),
        // dlogits = (softmax(x) - q) · g / rows; the integer targets get none
        Op::CrossEntropy {
            rows,
            cols,
            smoothing,
            logits,
            targets,
        } => {
            let dlogits = cross_entropy_grad(g, logits, targets, (*rows, *cols), *smoothing)?;
            Ok(smallvec![Some(dlogits), None])
        }
        // dx = rstd (ĝ - mean ĝ - x̂ mean(ĝ x̂)) with ĝ = g γ; dγ = Σ_rows g x̂; dβ = Σ_rows g
        Op::LayerNorm {
            rows,
            cols,
            x,
            gamma,
            mean,
            rstd,
        } => {
            // dγ and dβ straight into the parameters' slots when they are leaves
            let (dgamma, gamma_slot) = grad_target(&g.gpu, leaf(leaves, 1), &[*cols])?;
            let (dbeta, beta_slot) = grad_target(&g.gpu, leaf(leaves, 2), &[*cols])?;
            let sum = lent_sum(lent, 0, &x.shape);
            let saved = [x, gamma, mean, rstd];
            let dx = layer_norm_grads(g, saved, [&dgamma, &dbeta], *rows, *cols, sum)?;
            Ok(smallvec![
                Some(dx),
                landed(dgamma, gamma_slot)?,
                landed(dbeta, beta_slot)?
            ])
        }
        // dtable[v] = Σ_{t: ids[t] = v} g[t] (straight into the table's slot when it is a
        // leaf); the ids get none
        Op::Embedding { vocab, dim, ids } => {
            let dtable = written_grad(&g.gpu, leaf(leaves, 0), &[*vocab, *dim], |out| {
                embedding_grad(out, g, ids, *vocab, *dim)
            })?;
            Ok(smallvec![dtable, None])
        }
        // dx_i = the slice of g along the axis where input i went
        Op::Concat { axis, sizes } => Ok(split(g, *axis, sizes)?.into_iter().map(Some).collect()),
        // dx = g placed in zeros at the slice's position
        Op::Slice { input, axis, start } => one(pad_slice(g, input, *axis, *start)?),
        // the op's own derivative, beside its forward
        Op::Custom(derivative) => {
            // A custom op is lent sums only (its `backward_into` takes plain tensors).
            let mut into: SmallVec<[Option<Tensor>; 4]> = (lent.iter_mut())
                .map(|slot| match slot.take_if(|l| matches!(l, Lent::Sum(_))) {
                    Some(Lent::Sum(t) | Lent::Blank(t)) => Some(t),
                    None => None,
                })
                .collect();
            let grads = derivative.backward_into(g, needs, &mut into);
            for (slot, left) in lent.iter_mut().zip(into) {
                if let Some(t) = left {
                    *slot = Some(Lent::Sum(t));
                }
            }
            grads
        }
        // the segment run again with a tape, and back-propagated through
        Op::Checkpoint { inputs, replay } => crate::checkpoint::backward(inputs, replay, g, needs),
    }
}
