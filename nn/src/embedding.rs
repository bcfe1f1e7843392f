//! [`Embedding`]: a `[vocab, dim]` table of learned rows picked by u32 ids.

use plimsoll_autograd::{DType, Gpu, Tensor, TensorOptions};

use crate::error::{Error, Result};
use crate::module::Module;

/// A lookup table. Parameter: `weight` `[vocab, dim]`, drawn from `N(0, 1)` (PyTorch's
/// default). Forward takes a u32 tensor of ids of any shape and gives `[ids.., dim]`.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// `[vocab, dim]`.
    weight: Tensor,
    training: bool,
}

impl Embedding {
    /// A table of `vocab` rows of `dim` values, from `seed`. Errors: a zero extent.
    pub fn new(gpu: &Gpu, vocab: usize, dim: usize, seed: u64) -> Result<Embedding> {
        if vocab == 0 || dim == 0 {
            return Err(Error::InvalidConfig {
                what: "Embedding::new",
                message: format!("vocab {vocab} and dim {dim} must both be at least 1"),
            });
        }
        let weight = Tensor::normal(
            gpu,
            &[vocab, dim],
            0.0,
            1.0,
            seed,
            TensorOptions::parameter("embedding.weight"),
        )?;
        Ok(Embedding {
            weight,
            training: true,
        })
    }

    /// A table with the given `[vocab, dim]` weight (taken as it is: pass a parameter leaf to
    /// train it). Errors: a weight that is not a non-empty matrix.
    pub fn from_weight(weight: Tensor) -> Result<Embedding> {
        if weight.rank() != 2 || weight.numel() == 0 {
            return Err(Error::InvalidConfig {
                what: "Embedding::from_weight",
                message: format!(
                    "weight {:?} must be a non-empty [vocab, dim]",
                    weight.shape()
                ),
            });
        }
        Ok(Embedding {
            weight,
            training: true,
        })
    }

    /// The table, `[vocab, dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Module for Embedding {
    /// Rows of the table for u32 `ids` (an id `>= vocab` gives a row of NaN, see
    /// [`Tensor::embedding`]).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.dtype() != DType::U32 {
            return Err(Error::InputShape {
                module: "Embedding",
                expected: "u32 token ids (Tensor::from_indices)".to_string(),
                found: ids.shape().to_vec(),
            });
        }
        Ok(self.weight.embedding(ids)?)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
