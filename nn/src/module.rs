//! The [`Module`] trait: a forward function, named parameters and a train/eval switch.
//!
//! Parameter names are dotted paths (`blocks.3.attn.qkv.weight`): a container prefixes each
//! child's names with the child's name and a dot ([`prefixed`]). The order is stable (the order
//! in which the module declares them), so two models built the same way list the same names in
//! the same order.

use plimsoll_autograd::Tensor;

use crate::error::Result;

/// A layer or a network: forward, parameters, and the train/eval mode.
///
/// `Send + Sync` so that a module can be shared with a checkpointed segment
/// ([`crate::Sequential::forward_checkpointed`]), which backward runs again.
pub trait Module: Send + Sync {
    /// Runs the module on `x` (recording a graph when grad mode is on).
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Every trainable parameter with its dotted name, in a stable order. The tensors are
    /// handles: they share storage and gradient slot with the module's own.
    fn parameters(&self) -> Vec<(String, Tensor)>;

    /// Switches training mode (`true`, dropout active) or evaluation mode (`false`).
    fn set_training(&mut self, training: bool);

    /// Whether the module is in training mode.
    fn is_training(&self) -> bool;

    /// Whether the module is a ReLU, which a preceding [`Module::forward_relu`] can take over
    /// ([`crate::Sequential`] asks). False unless overridden.
    fn is_relu(&self) -> bool {
        false
    }

    /// This module's forward followed by a ReLU, fused where the module can do it in one
    /// kernel (a [`crate::Linear`] with a bias: the ReLU in its matmul's epilogue), the same
    /// values as the two apart; `None` where it cannot (the caller then runs the two).
    fn forward_relu(&self, _x: &Tensor) -> Option<Result<Tensor>> {
        None
    }
}

/// `params` with every name prefixed by `prefix` and a dot.
pub fn prefixed(prefix: &str, params: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    params
        .into_iter()
        .map(|(name, t)| (format!("{prefix}.{name}"), t))
        .collect()
}

/// Total number of parameter elements of `module`.
pub fn parameter_count(module: &dyn Module) -> usize {
    module.parameters().iter().map(|(_, t)| t.numel()).sum()
}

/// A causal language model ([`crate::Gpt`], [`crate::Llama`]): u32 token ids `[batch, time]` in,
/// next-token logits or the mean cross-entropy out. What a trainer and a sampler need of either.
pub trait CausalLm: Module {
    /// Logits `[batch, time, vocab]`, each run of `segment_len` blocks checkpointed (0: none).
    fn forward_checkpointed(&self, ids: &Tensor, segment_len: usize) -> Result<Tensor>;

    /// The mean next-token cross-entropy against `targets` through the chunked output head
    /// (`chunk_rows` rows a chunk, 0: automatic), the logits never whole.
    fn loss_checkpointed(
        &self,
        ids: &Tensor,
        targets: &Tensor,
        segment_len: usize,
        label_smoothing: f32,
        chunk_rows: usize,
    ) -> Result<Tensor>;

    /// What a saved file holds: the parameters, plus a tied head under its own name where the
    /// model's usual layout has one.
    fn state_dict(&self) -> Vec<(String, Tensor)>;

    /// Tokens in the vocabulary.
    fn vocab_size(&self) -> usize;

    /// The longest context.
    fn context(&self) -> usize;
}
