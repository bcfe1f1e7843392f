//! [`ModelSpec`]: what to build (an MLP classifier and its optimizer), so the memory plan can
//! build a throwaway copy for its dry run and the trainer the real one, identically.

use plimsoll_autograd::Gpu;
use plimsoll_nn::{Activation, AdamW, AdamWConfig, Optimizer, Sequential, Sgd, SgdConfig, mlp};

use crate::error::{Error, Result};

/// Which optimizer, with its hyper-parameters (the learning rate is set by the schedule).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerSpec {
    /// AdamW (weight decay 0 gives Adam).
    AdamW(AdamWConfig),
    /// SGD with optional momentum.
    Sgd(SgdConfig),
}

/// An MLP classifier `widths[0] -> ... -> widths[last]` and its optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// Layer widths, input first, classes last.
    pub widths: Vec<usize>,
    /// Activation between layers.
    pub activation: Activation,
    /// Initialisation seed.
    pub seed: u64,
    /// The optimizer.
    pub optimizer: OptimizerSpec,
}

impl ModelSpec {
    /// Builds the model and a fresh optimizer on `gpu`.
    pub fn build(&self, gpu: &Gpu) -> Result<(Sequential, Box<dyn Optimizer>)> {
        let net = mlp(gpu, &self.widths, self.activation, self.seed)?;
        let optimizer: Box<dyn Optimizer> = match self.optimizer {
            OptimizerSpec::AdamW(c) => Box::new(AdamW::new(c)),
            OptimizerSpec::Sgd(c) => Box::new(Sgd::new(c)),
        };
        Ok((net, optimizer))
    }

    /// Number of children of the built `Sequential` (Linear and activation modules).
    pub fn children(&self) -> usize {
        (2 * self.widths.len()).saturating_sub(3)
    }

    /// Parameter elements (weights and biases).
    pub fn parameter_count(&self) -> usize {
        self.widths.windows(2).map(|w| w[0] * w[1] + w[1]).sum()
    }

    /// Checks the widths against a dataset's features and classes.
    pub fn check_fits(&self, feature_dim: usize, num_classes: usize) -> Result<()> {
        match (self.widths.first(), self.widths.last()) {
            (Some(&i), Some(&o)) if i == feature_dim && o >= num_classes => Ok(()),
            _ => Err(Error::invalid(
                "model",
                format!(
                    "widths {:?} do not fit data with {feature_dim} features and \
                     {num_classes} classes",
                    self.widths
                ),
            )),
        }
    }
}
