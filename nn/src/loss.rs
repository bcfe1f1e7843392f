//! Losses, each a scalar mean: [`cross_entropy`] over rows (fused kernel, optional label
//! smoothing) and [`mse`] over elements.

use plimsoll_autograd::{DType, Tensor};

use crate::error::{Error, Result};

/// Mean cross-entropy of `[.., classes]` `logits` against u32 `targets` (one per row, shape
/// `logits.shape()[..rank-1]` or flat), with label smoothing in `[0, 1]`:
/// `(1 - s) * -log p[target] + s * mean_c(-log p[c])`, averaged over rows.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, label_smoothing: f32) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&label_smoothing) {
        return Err(Error::InvalidConfig {
            what: "cross_entropy",
            message: format!("label_smoothing {label_smoothing} must be in [0, 1] (0.1 is usual)"),
        });
    }
    if targets.dtype() != DType::U32 {
        return Err(Error::InputShape {
            module: "cross_entropy",
            expected: "u32 class targets (Tensor::from_indices)".to_string(),
            found: targets.shape().to_vec(),
        });
    }
    Ok(logits.cross_entropy(targets, label_smoothing)?)
}

/// Mean squared error `mean((pred - target)^2)` over every element; the shapes must be equal
/// (no broadcasting, which would silently average the wrong pairs).
pub fn mse(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    if pred.shape() != target.shape() {
        return Err(Error::InputShape {
            module: "mse",
            expected: format!("the target's shape {:?}", target.shape()),
            found: pred.shape().to_vec(),
        });
    }
    let diff = pred.sub(target)?;
    Ok(diff.mul(&diff)?.mean_all()?)
}
