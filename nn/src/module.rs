//! The [`Module`] trait: a forward function, named parameters and a train/eval switch.
//!
//! Parameter names are dotted paths (`blocks.3.attn.qkv.weight`): a container prefixes each
//! child's names with the child's name and a dot ([`prefixed`]). The order is stable (the order
//! in which the module declares them), so two models built the same way list the same names in
//! the same order.

use plimsoll_autograd::Tensor;

use crate::error::Result;
use crate::sequential::{chunked_head_loss, head_logits};

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

    /// State that is not trained but belongs to the model (PyTorch's buffers: BatchNorm's
    /// running statistics), with dotted names as [`Module::parameters`]. None by default.
    fn buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
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
/// A model gives its final hidden states and its output head's table; the logits and the
/// chunked loss are the same for every model and provided here.
pub trait CausalLm: Module {
    /// The final hidden states `[batch, time, width]` (after the last norm, before the head),
    /// each run of `segment_len` blocks checkpointed (0: none).
    fn hidden_checkpointed(&self, ids: &Tensor, segment_len: usize) -> Result<Tensor>;

    /// The parameters of the stack of blocks, named as in [`Module::parameters`]: what
    /// parameter streaming keeps in host memory between their uses ([`Tensor::evict`]), since
    /// the blocks run in checkpointed segments that bring them to the device
    /// ([`plimsoll_autograd::checkpoint_with`]). The embeddings, the last norm and the head,
    /// used outside the blocks, are not among them.
    fn block_parameters(&self) -> Vec<(String, Tensor)>;

    /// The output head's `[vocab, width]` table, in parts where it is past one binding (a
    /// tied head: the token embedding's).
    fn head_parts(&self) -> Vec<&Tensor>;

    /// Logits `[batch, time, vocab]`, each run of `segment_len` blocks checkpointed (0: none).
    fn forward_checkpointed(&self, ids: &Tensor, segment_len: usize) -> Result<Tensor> {
        let h = self.hidden_checkpointed(ids, segment_len)?;
        head_logits(&h, &self.head_parts())
    }

    /// The mean next-token cross-entropy of token ids `[batch, time]` against `targets` (the
    /// same shape), with label smoothing, through the chunked output head
    /// ([`crate::loss::linear_cross_entropy`], `chunk_rows` rows a chunk, 0: automatic): the
    /// `[batch, time, vocab]` logits never exist. The same loss and gradients as
    /// [`CausalLm::forward_checkpointed`] followed by [`crate::loss::cross_entropy`], within f32
    /// rounding.
    fn loss_checkpointed(
        &self,
        ids: &Tensor,
        targets: &Tensor,
        segment_len: usize,
        label_smoothing: f32,
        chunk_rows: usize,
    ) -> Result<Tensor> {
        let h = self.hidden_checkpointed(ids, segment_len)?;
        chunked_head_loss(&h, &self.head_parts(), targets, label_smoothing, chunk_rows)
    }

    /// What a saved file holds: the parameters, plus a tied head under its own name where the
    /// model's usual layout has one.
    fn state_dict(&self) -> Vec<(String, Tensor)>;

    /// Tokens in the vocabulary.
    fn vocab_size(&self) -> usize;

    /// The longest context.
    fn context(&self) -> usize;
}
