//! Residual blocks: [`ResidualMlpBlock`] (`x + fc2(act(fc1(ln(x))))`) and the pre-norm
//! [`TransformerBlock`] (`x + attn(ln1(x))`, then `x + mlp(ln2(x))`).

use plimsoll_autograd::{Gpu, Tensor};

use crate::activation::Activation;
use crate::attention::CausalSelfAttention;
use crate::error::Result;
use crate::linear::{Linear, derive_seed};
use crate::module::{Module, prefixed};
use crate::norm::LayerNorm;

/// The layer-norm epsilon of the blocks (PyTorch's default).
const LAYER_NORM_EPS: f32 = 1e-5;

/// `x + fc2(act(fc1(ln(x))))` over `[.., dim]`. Parameters: `ln.weight`, `ln.bias`,
/// `fc1.weight` `[hidden, dim]`, `fc1.bias`, `fc2.weight` `[dim, hidden]`, `fc2.bias`.
#[derive(Debug, Clone)]
pub struct ResidualMlpBlock {
    ln: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    activation: Activation,
    training: bool,
}

impl ResidualMlpBlock {
    /// A block of width `dim` with a `hidden`-wide middle layer, initialised from `seed`.
    pub fn new(
        gpu: &Gpu,
        dim: usize,
        hidden: usize,
        activation: Activation,
        seed: u64,
    ) -> Result<ResidualMlpBlock> {
        Ok(ResidualMlpBlock {
            ln: LayerNorm::new(gpu, dim, LAYER_NORM_EPS)?,
            fc1: Linear::new(
                gpu,
                dim,
                hidden,
                true,
                activation.init(),
                derive_seed(seed, 1),
            )?,
            fc2: Linear::new(
                gpu,
                hidden,
                dim,
                true,
                activation.init(),
                derive_seed(seed, 2),
            )?,
            activation,
            training: true,
        })
    }
}

impl Module for ResidualMlpBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.fc1.forward(&self.ln.forward(x)?)?;
        let h = self.fc2.forward(&self.activation.apply(&h)?)?;
        Ok(x.add(&h)?)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("ln", self.ln.parameters());
        p.extend(prefixed("fc1", self.fc1.parameters()));
        p.extend(prefixed("fc2", self.fc2.parameters()));
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// A pre-norm transformer block over `[batch, time, dim]`: `x = x + attn(ln_1(x))`, then
/// `x = x + c_proj(gelu(c_fc(ln_2(x))))`. Parameters under nanoGPT's names: `ln_1.*`,
/// `attn.c_attn.*`, `attn.c_proj.*`, `ln_2.*`, `mlp.c_fc.*`, `mlp.c_proj.*`.
#[derive(Debug, Clone)]
pub struct TransformerBlock {
    ln1: LayerNorm,
    attn: CausalSelfAttention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    training: bool,
    /// Dropout of the attention probabilities and of each residual branch's output, in
    /// training (nanoGPT's `attn_dropout` and `resid_dropout`, one `p`).
    dropout: f32,
}

impl TransformerBlock {
    /// Drops with probability `p` in training, as nanoGPT's block does: the attention
    /// probabilities, the attention's output projection and the MLP's output (before each is
    /// added to the residual stream). Masks come from the thread's random state. Errors: `p`
    /// outside `[0, 1)`.
    pub fn set_dropout(&mut self, p: f32) -> Result<()> {
        self.attn.set_dropout(p)?;
        self.dropout = p;
        Ok(())
    }

    /// `x` with this block's dropout, in training.
    fn dropped(&self, x: Tensor) -> Result<Tensor> {
        match self.training && self.dropout > 0.0 {
            true => Ok(x.dropout(self.dropout)?),
            false => Ok(x),
        }
    }

    /// Uses the fused attention or the reference path (the default)
    /// ([`CausalSelfAttention::set_memory_efficient`]).
    pub fn set_memory_efficient_attention(&mut self, on: bool) {
        self.attn.set_memory_efficient(on);
    }

    /// A block of width `dim` with `heads` attention heads and an `mlp_hidden`-wide MLP
    /// (`4 * dim` is usual), initialised from `seed`. Errors: `heads` not dividing `dim`.
    pub fn new(
        gpu: &Gpu,
        dim: usize,
        heads: usize,
        mlp_hidden: usize,
        seed: u64,
    ) -> Result<TransformerBlock> {
        let init = Activation::Gelu.init();
        Ok(TransformerBlock {
            ln1: LayerNorm::new(gpu, dim, LAYER_NORM_EPS)?,
            attn: CausalSelfAttention::new(gpu, dim, heads, derive_seed(seed, 1))?,
            ln2: LayerNorm::new(gpu, dim, LAYER_NORM_EPS)?,
            fc1: Linear::new(gpu, dim, mlp_hidden, true, init, derive_seed(seed, 2))?,
            fc2: Linear::new(gpu, mlp_hidden, dim, true, init, derive_seed(seed, 3))?,
            training: true,
            dropout: 0.0,
        })
    }
}

impl TransformerBlock {
    /// A block from its parts (e.g. initialised as nanoGPT does). Errors: widths that do not fit
    /// `ln1`'s.
    pub fn from_parts(
        ln1: LayerNorm,
        attn: CausalSelfAttention,
        ln2: LayerNorm,
        fc1: Linear,
        fc2: Linear,
    ) -> Result<TransformerBlock> {
        let dim = ln1.weight().numel();
        let fits = ln2.weight().numel() == dim
            && attn.proj().out_features() == dim
            && fc1.in_features() == dim
            && fc2.in_features() == fc1.out_features()
            && fc2.out_features() == dim;
        if !fits {
            return Err(crate::error::Error::InvalidConfig {
                what: "TransformerBlock::from_parts",
                message: format!(
                    "width {dim}: the norms, attention and MLP ({} -> {} -> {}) must agree",
                    fc1.in_features(),
                    fc1.out_features(),
                    fc2.out_features()
                ),
            });
        }
        Ok(TransformerBlock {
            ln1,
            attn,
            ln2,
            fc1,
            fc2,
            training: true,
            dropout: 0.0,
        })
    }
}

/// A residual stream whose last addition may still be open: the stream and the branch to add
/// to it, which the next layer norm adds in its own kernel ([`LayerNorm::add_forward`]).
pub(crate) enum Stream {
    /// The stream, every addition made.
    Whole(Tensor),
    /// The stream and a branch not yet added to it.
    Open(Tensor, Tensor),
}

impl Stream {
    /// The stream (its open addition made) and `norm` of it, the addition in the norm's kernel.
    pub(crate) fn normed(self, norm: &LayerNorm) -> Result<(Tensor, Tensor)> {
        match self {
            Stream::Whole(x) => {
                let y = norm.forward(&x)?;
                Ok((x, y))
            }
            Stream::Open(x, branch) => norm.add_forward(&x, branch),
        }
    }
}

impl TransformerBlock {
    /// [`Module::forward`] from a stream whose last addition may be open, leaving the MLP's
    /// addition open: each residual addition then runs in the kernel of the layer norm after it
    /// (this block's `ln_2`, the next block's `ln_1` or the model's final norm).
    pub(crate) fn forward_open(&self, x: Stream) -> Result<Stream> {
        let (x, normed) = x.normed(&self.ln1)?;
        let attended = self.dropped(self.attn.forward(&normed)?)?;
        drop(normed);
        let (x, normed) = self.ln2.add_forward(&x, attended)?;
        let h = self.fc1.forward(&normed)?.gelu()?;
        drop(normed);
        Ok(Stream::Open(x, self.dropped(self.fc2.forward(&h)?)?))
    }
}

impl Module for TransformerBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.forward_open(Stream::Whole(x.clone()))? {
            Stream::Whole(x) => Ok(x),
            Stream::Open(x, branch) => Ok(x.add(&branch)?),
        }
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("ln_1", self.ln1.parameters());
        p.extend(prefixed("attn", self.attn.parameters()));
        p.extend(prefixed("ln_2", self.ln2.parameters()));
        p.extend(prefixed("mlp.c_fc", self.fc1.parameters()));
        p.extend(prefixed("mlp.c_proj", self.fc2.parameters()));
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
        self.attn.set_training(training);
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
