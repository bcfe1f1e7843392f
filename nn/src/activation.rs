//! Activation modules ([`Relu`], [`Gelu`], [`Tanh`], [`Sigmoid`]), the [`Activation`] choice,
//! and [`Dropout`]. None has parameters; only dropout depends on the train/eval mode.

use plimsoll_autograd::Tensor;

use crate::error::Result;
use crate::module::Module;

macro_rules! activation {
    ($name:ident, $method:ident, $doc:literal, $relu:literal) => {
        #[doc = $doc]
        ///
        /// Stateless: no parameters and no mode (it reports training mode, and ignores
        /// [`Module::set_training`]).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name;

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                Ok(x.$method()?)
            }

            fn parameters(&self) -> Vec<(String, Tensor)> {
                Vec::new()
            }

            fn set_training(&mut self, _training: bool) {}

            fn is_training(&self) -> bool {
                true
            }

            fn is_relu(&self) -> bool {
                $relu
            }
        }
    };
}

activation!(Relu, relu, "`max(x, 0)`.", true);
activation!(Gelu, gelu, "GELU, tanh approximation.", false);
activation!(Tanh, tanh, "`tanh(x)`.", false);
activation!(Sigmoid, sigmoid, "`1 / (1 + exp(-x))`.", false);

/// Which activation a builder ([`crate::mlp`], the blocks) puts between layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// [`Relu`].
    Relu,
    /// [`Gelu`].
    Gelu,
    /// [`Tanh`].
    Tanh,
    /// [`Sigmoid`].
    Sigmoid,
}

impl Activation {
    /// Applies the activation to `x`.
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::Relu => x.relu()?,
            Activation::Gelu => x.gelu()?,
            Activation::Tanh => x.tanh()?,
            Activation::Sigmoid => x.sigmoid()?,
        })
    }

    /// The activation as a module.
    pub fn module(self) -> Box<dyn Module> {
        match self {
            Activation::Relu => Box::new(Relu),
            Activation::Gelu => Box::new(Gelu),
            Activation::Tanh => Box::new(Tanh),
            Activation::Sigmoid => Box::new(Sigmoid),
        }
    }

    /// The initialisation that suits a layer followed by this activation (Kaiming for ReLU and
    /// GELU, Xavier for tanh and sigmoid).
    pub fn init(self) -> crate::Init {
        match self {
            Activation::Relu | Activation::Gelu => crate::Init::KaimingUniform,
            Activation::Tanh | Activation::Sigmoid => crate::Init::XavierUniform,
        }
    }
}

/// Inverted dropout: in training mode each element is zeroed with probability `p` and the rest
/// scaled by `1 / (1 - p)`; the identity in evaluation mode. Masks come from the thread's random
/// state ([`plimsoll_autograd::manual_seed`]), which checkpoints save and restore.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    p: f32,
    training: bool,
}

impl Dropout {
    /// Dropout with probability `p` (in `[0, 1)`; checked by forward), in training mode.
    pub fn new(p: f32) -> Dropout {
        Dropout { p, training: true }
    }

    /// The drop probability.
    pub fn p(&self) -> f32 {
        self.p
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.training && self.p != 0.0 {
            Ok(x.dropout(self.p)?)
        } else {
            Ok(x.clone())
        }
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
