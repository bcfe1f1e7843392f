//! [`LayerNorm`] over the last axis, with a learned scale (`weight`, ones) and shift (`bias`,
//! zeros).

use plimsoll_autograd::{Gpu, Tensor, TensorOptions};

use crate::error::{Error, Result};
use crate::module::Module;

/// `(x - mean) / sqrt(var + eps) * weight + bias` over the last axis (biased variance, as
/// PyTorch). Parameters: `weight` `[dim]`, `bias` `[dim]`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// `[dim]`, ones at creation.
    weight: Tensor,
    /// `[dim]`, zeros at creation.
    bias: Tensor,
    eps: f32,
    training: bool,
}

impl LayerNorm {
    /// A layer norm over `dim` features. Errors: `dim == 0` or `eps` not positive.
    pub fn new(gpu: &Gpu, dim: usize, eps: f32) -> Result<LayerNorm> {
        if dim == 0 || eps.is_nan() || eps <= 0.0 {
            return Err(Error::InvalidConfig {
                what: "LayerNorm::new",
                message: format!("dim {dim} must be >= 1 and eps {eps} > 0 (1e-5 is usual)"),
            });
        }
        Ok(LayerNorm {
            weight: Tensor::ones(gpu, &[dim], TensorOptions::parameter("layer_norm.weight"))?,
            bias: Tensor::zeros(gpu, &[dim], TensorOptions::parameter("layer_norm.bias"))?,
            eps,
            training: true,
        })
    }

    /// The scale, `[dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The shift, `[dim]`.
    pub fn bias(&self) -> &Tensor {
        &self.bias
    }

    /// The epsilon added to the variance.
    pub fn eps(&self) -> f32 {
        self.eps
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dim = self.weight.numel();
        if x.rank() == 0 || x.shape()[x.rank() - 1] != dim {
            return Err(Error::InputShape {
                module: "LayerNorm",
                expected: format!("[.., {dim}]"),
                found: x.shape().to_vec(),
            });
        }
        Ok(x.layer_norm(&self.weight, &self.bias, self.eps)?)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".to_string(), self.weight.clone()),
            ("bias".to_string(), self.bias.clone()),
        ]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
