//! [`Linear`]: `y = x · W + b` with `W` of shape `[in, out]` (row-major inputs multiply it
//! directly, no transpose), seeded initialisation ([`Init`]).

use plimsoll_autograd::{Gpu, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::random::{GOLDEN_GAMMA, mix};

use crate::error::{Error, Result};
use crate::module::Module;

/// Weight initialisation, drawn from a seed (the same seed gives the same weights everywhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// He/Kaiming uniform for ReLU-like activations: `U(-b, b)`, `b = sqrt(6 / fan_in)`
    /// (gain `sqrt(2)`).
    KaimingUniform,
    /// Glorot/Xavier uniform for tanh/sigmoid: `U(-b, b)`, `b = sqrt(6 / (fan_in + fan_out))`.
    XavierUniform,
}

impl Init {
    /// The bound `b` of the uniform distribution for a `[fan_in, fan_out]` weight.
    pub fn bound(self, fan_in: usize, fan_out: usize) -> f32 {
        match self {
            Init::KaimingUniform => (6.0 / fan_in as f64).sqrt() as f32,
            Init::XavierUniform => (6.0 / (fan_in + fan_out) as f64).sqrt() as f32,
        }
    }
}

/// A fully connected layer. Parameters: `weight` `[in, out]`, `bias` `[out]` (optional).
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[in_features, out_features]`.
    weight: Tensor,
    /// `[out_features]`, when the layer has a bias.
    bias: Option<Tensor>,
    training: bool,
}

/// A seed derived from `seed` for a second tensor of the same module: output `index + 1` of
/// the SplitMix64 stream seeded with `seed`, computed directly.
pub(crate) fn derive_seed(seed: u64, index: u64) -> u64 {
    mix(seed.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)))
}

impl Linear {
    /// A layer mapping `in_features` to `out_features`. The weight is drawn with `init` from
    /// `seed`; the bias (if any) from `U(-1/sqrt(in), 1/sqrt(in))` (PyTorch's default) with a
    /// seed derived from `seed`. Errors: a zero extent.
    pub fn new(
        gpu: &Gpu,
        in_features: usize,
        out_features: usize,
        bias: bool,
        init: Init,
        seed: u64,
    ) -> Result<Linear> {
        if in_features == 0 || out_features == 0 {
            return Err(Error::InvalidConfig {
                what: "Linear::new",
                message: format!(
                    "in_features {in_features} and out_features {out_features} must both be \
                     at least 1"
                ),
            });
        }
        let b = init.bound(in_features, out_features);
        let weight = Tensor::uniform(
            gpu,
            &[in_features, out_features],
            -b,
            b,
            seed,
            TensorOptions::parameter("linear.weight"),
        )?;
        let bias = if bias {
            let b = 1.0 / (in_features as f32).sqrt();
            Some(Tensor::uniform(
                gpu,
                &[out_features],
                -b,
                b,
                derive_seed(seed, 0),
                TensorOptions::parameter("linear.bias"),
            )?)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            training: true,
        })
    }

    /// A layer with the given weight `[in, out]` and bias `[out]` (taken as they are: pass
    /// parameter leaves to train them). Errors: shapes that do not fit.
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        let ok = weight.rank() == 2
            && bias
                .as_ref()
                .is_none_or(|b| b.shape() == [weight.shape()[1]]);
        if !ok {
            return Err(Error::InvalidConfig {
                what: "Linear::from_tensors",
                message: format!(
                    "weight {:?} must be [in, out] and bias {:?} [out]",
                    weight.shape(),
                    bias.as_ref().map(|b| b.shape().to_vec())
                ),
            });
        }
        Ok(Linear {
            weight,
            bias,
            training: true,
        })
    }

    /// The weight, `[in, out]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias, `[out]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[1]
    }
}

impl Module for Linear {
    /// `x · W + b` for `x` of shape `[.., in]`, giving `[.., out]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() == 0 || x.shape()[x.rank() - 1] != self.in_features() {
            return Err(Error::InputShape {
                module: "Linear",
                expected: format!("[.., {}]", self.in_features()),
                found: x.shape().to_vec(),
            });
        }
        // (.., in) · (in, out): matmul takes the shared right operand as one matrix.
        let y = if x.rank() == 1 {
            x.reshape(&[1, self.in_features()])?
                .matmul(&self.weight)?
                .reshape(&[self.out_features()])?
        } else {
            x.matmul(&self.weight)?
        };
        match &self.bias {
            Some(b) => Ok(y.add(b)?),
            None => Ok(y),
        }
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            p.push(("bias".to_string(), b.clone()));
        }
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
