//! [`Linear`]: `y = x · Wᵀ + b` with `W` of shape `[out, in]`, PyTorch's `nn.Linear` layout
//! (so saved weights load into a PyTorch model as they are; the transpose is the matmul kernel's
//! flag, never a copy), seeded initialisation ([`Init`]).

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
    /// The bound `b` of the uniform distribution for a weight with `fan_in` inputs and `fan_out`
    /// outputs.
    pub fn bound(self, fan_in: usize, fan_out: usize) -> f32 {
        match self {
            Init::KaimingUniform => (6.0 / fan_in as f64).sqrt() as f32,
            Init::XavierUniform => (6.0 / (fan_in + fan_out) as f64).sqrt() as f32,
        }
    }
}

/// A fully connected layer. Parameters: `weight` `[out, in]`, `bias` `[out]` (optional). A
/// weight larger than one binding is kept in parts of whole rows ([`Linear::in_parts`]:
/// `weight.part0`, `bias.part0`, ...), each part's product made apart and the outputs joined.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out_features, in_features]` (the first part's rows, for a layer in parts).
    weight: Tensor,
    /// `[out_features]`, when the layer has a bias.
    bias: Option<Tensor>,
    /// The further parts of a layer in parts: weight rows and their bias, in order.
    rest: Vec<(Tensor, Option<Tensor>)>,
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
        let shape = [out_features, in_features];
        let options = TensorOptions::parameter("linear.weight");
        let weight = if gpu.is_planning() {
            // A plan needs the allocation only: no values drawn (see `Tensor::unwritten`).
            Tensor::unwritten(gpu, &shape, options)?
        } else {
            // Drawn in [in, out] order and stored transposed: a seed gives the same layer it
            // gave before the weight moved to PyTorch's [out, in] layout.
            let drawn = Tensor::uniform_values(in_features * out_features, -b, b, seed);
            let mut values = vec![0.0; drawn.len()];
            for (i, row) in drawn.chunks(out_features).enumerate() {
                for (o, &v) in row.iter().enumerate() {
                    values[o * in_features + i] = v;
                }
            }
            Tensor::from_slice_with(gpu, &values, &shape, options)?
        };
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
            rest: Vec::new(),
            training: true,
        })
    }

    /// A layer whose weight (and bias) are kept in `parts` of whole output rows, in order
    /// (each `[rows, in]` of one `in`, with a `[rows]` bias on every part or on none): what a
    /// weight larger than one binding needs. Pass parameter leaves to train them. Errors: no
    /// part, or parts that do not fit together.
    pub fn in_parts(parts: Vec<(Tensor, Option<Tensor>)>) -> Result<Linear> {
        let inputs = parts.first().and_then(|(w, _)| w.shape().get(1).copied());
        let biased = parts.first().is_some_and(|(_, b)| b.is_some());
        let fits = !parts.is_empty()
            && parts.iter().all(|(w, b)| {
                w.rank() == 2
                    && w.shape().get(1).copied() == inputs
                    && b.is_some() == biased
                    && b.as_ref().is_none_or(|b| b.shape() == [w.shape()[0]])
            });
        if !fits {
            let shapes: Vec<_> = (parts.iter())
                .map(|(w, b)| (w.shape().to_vec(), b.as_ref().map(|b| b.shape().to_vec())))
                .collect();
            return Err(Error::InvalidConfig {
                what: "Linear::in_parts",
                message: format!(
                    "parts {shapes:?} must be [rows, in] weights of one in, each with a [rows] \
                     bias or none with one"
                ),
            });
        }
        let mut parts = parts.into_iter();
        let Some((weight, bias)) = parts.next() else {
            return Err(Error::InvalidConfig {
                what: "Linear::in_parts",
                message: "no part".to_string(),
            });
        };
        Ok(Linear {
            weight,
            bias,
            rest: parts.collect(),
            training: true,
        })
    }

    /// The parts in order (one, the whole layer, unless made [`Linear::in_parts`]).
    pub fn parts(&self) -> Vec<(&Tensor, Option<&Tensor>)> {
        std::iter::once((&self.weight, self.bias.as_ref()))
            .chain(self.rest.iter().map(|(w, b)| (w, b.as_ref())))
            .collect()
    }

    /// A layer with the given weight `[out, in]` and bias `[out]` (taken as they are: pass
    /// parameter leaves to train them). Errors: shapes that do not fit.
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        let ok = weight.rank() == 2
            && bias
                .as_ref()
                .is_none_or(|b| b.shape() == [weight.shape()[0]]);
        if !ok {
            return Err(Error::InvalidConfig {
                what: "Linear::from_tensors",
                message: format!(
                    "weight {:?} must be [out, in] and bias {:?} [out]",
                    weight.shape(),
                    bias.as_ref().map(|b| b.shape().to_vec())
                ),
            });
        }
        Ok(Linear {
            weight,
            bias,
            rest: Vec::new(),
            training: true,
        })
    }

    /// The weight, `[out, in]`; for a layer in parts, its first part ([`Linear::parts`]).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias, `[out]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Output width (of every part together).
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0] + self.rest.iter().map(|(w, _)| w.shape()[0]).sum::<usize>()
    }
}

impl Module for Linear {
    /// `x · Wᵀ + b` for `x` of shape `[.., in]`, giving `[.., out]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() == 0 || x.shape()[x.rank() - 1] != self.in_features() {
            return Err(Error::InputShape {
                module: "Linear",
                expected: format!("[.., {}]", self.in_features()),
                found: x.shape().to_vec(),
            });
        }
        // (.., in) · (out, in)ᵀ, the rows of x folded into one matrix; the bias in the
        // matmul's epilogue. A layer in parts: each part's outputs, joined.
        let part = |w: &Tensor, b: Option<&Tensor>| -> Result<Tensor> {
            match b {
                Some(b) => Ok(x.linear(w, b, false)?),
                None => Ok(x.matmul_transposed(w)?),
            }
        };
        if self.rest.is_empty() {
            return part(&self.weight, self.bias.as_ref());
        }
        let outputs = (self.parts().into_iter())
            .map(|(w, b)| part(w, b))
            .collect::<Result<Vec<_>>>()?;
        let outputs: Vec<&Tensor> = outputs.iter().collect();
        Ok(Tensor::concat(&outputs, x.rank() - 1)?)
    }

    fn forward_relu(&self, x: &Tensor) -> Option<Result<Tensor>> {
        if !self.rest.is_empty() {
            return None;
        }
        let b = self.bias.as_ref()?;
        if x.rank() == 0 || x.shape()[x.rank() - 1] != self.in_features() {
            return Some(self.forward(x)); // the same error as forward's
        }
        Some(x.linear(&self.weight, b, true).map_err(Into::into))
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        if self.rest.is_empty() {
            let mut p = vec![("weight".to_string(), self.weight.clone())];
            if let Some(b) = &self.bias {
                p.push(("bias".to_string(), b.clone()));
            }
            return p;
        }
        let parts = self.parts();
        let mut p: Vec<(String, Tensor)> = (parts.iter().enumerate())
            .map(|(i, (w, _))| (format!("weight.part{i}"), (*w).clone()))
            .collect();
        p.extend(
            (parts.iter().enumerate())
                .filter_map(|(i, (_, b))| b.map(|b| (format!("bias.part{i}"), b.clone()))),
        );
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
