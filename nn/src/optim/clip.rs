//! Gradient norms: [`grad_norm`] (global L2 norm, summed on the GPU, one read-back) and
//! [`clip_grad_norm`] (scales every gradient in place when the norm is above a maximum).

use plimsoll_autograd::ops::reduce::SquaresOf;
use plimsoll_autograd::{Tensor, no_grad};
use plimsoll_kernels_wgsl::kernels::binary::{BinaryOp, scalar_rhs};

use crate::error::{Error, Result};

/// The global L2 norm `sqrt(sum over every gradient element of g^2)` of the gradients of
/// `params` (parameters without a gradient count as zero). The squares are summed on the GPU by
/// chunks of each tensor, read back in one wait and added up in f64 on the host; a gradient in
/// host memory (parameter streaming, [`Tensor::evict`]) is summed there. 0 when no parameter
/// has a gradient.
pub fn grad_norm(params: &[(String, Tensor)]) -> Result<f32> {
    let _no_grad = no_grad();
    let (grads, on_host): (Vec<Tensor>, Vec<Tensor>) = params
        .iter()
        .filter_map(|(_, p)| p.grad())
        .partition(Tensor::is_resident);
    let mut squares = 0.0f64;
    for g in &on_host {
        squares += g
            .to_vec()?
            .iter()
            .map(|&v| f64::from(v).powi(2))
            .sum::<f64>();
    }
    if !grads.is_empty() {
        let refs: Vec<SquaresOf<'_>> = grads.iter().map(SquaresOf::Tensor).collect();
        let (sums, _) = Tensor::with_sums_of_squares(None, &refs)?;
        drop(grads);
        squares += sums.to_vec()?.iter().map(|&v| f64::from(v)).sum::<f64>();
    }
    Ok(squares.sqrt() as f32)
}

/// Clips the gradients of `params` to a global L2 norm of at most `max_norm` (PyTorch's
/// `clip_grad_norm_`): when the norm exceeds it, every gradient is multiplied in place by
/// `max_norm / (norm + 1e-6)`. Returns the norm before clipping. A non-finite norm (an overflow
/// under mixed precision) is returned as it is and the gradients are left alone, so the caller
/// can skip the step. Errors: `max_norm` not positive and finite.
pub fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f32) -> Result<f32> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::InvalidConfig {
            what: "clip_grad_norm",
            message: format!("max_norm {max_norm} must be positive and finite (1.0 is usual)"),
        });
    }
    let norm = grad_norm(params)?;
    if norm.is_finite() && norm > max_norm {
        let coefficient = max_norm / (norm + 1e-6);
        for (_, p) in params {
            let Some(g) = p.grad() else { continue };
            if !g.is_resident() {
                // In host memory: scaled there (the device's kernel rounds alike, one multiply).
                let scaled: Vec<f32> = g.to_vec()?.iter().map(|&v| v * coefficient).collect();
                g.write_from_slice(&scaled)?;
                continue;
            }
            let elements = g.elements()?;
            scalar_rhs(g.gpu(), BinaryOp::Mul, elements, elements, coefficient)?;
        }
    }
    Ok(norm)
}
