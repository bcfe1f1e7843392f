//! [`Gpt`]: a decoder-only transformer in the shape of nanoGPT (Karpathy): token and position
//! embeddings, pre-norm [`TransformerBlock`]s of causal self-attention and a 4x GELU MLP, a final
//! layer norm, and an output head tied to the token embedding (`logits = h · wteᵀ`).
//!
//! Parameters carry nanoGPT's names and PyTorch's layouts (`transformer.wte.weight`,
//! `transformer.h.0.attn.c_attn.weight` `[3C, C]`, ...), and are initialised as nanoGPT does:
//! `N(0, 0.02)` for linear weights and embeddings, `N(0, 0.02 / sqrt(2 n_layer))` for the
//! residual projections (`attn.c_proj`, `mlp.c_proj`), zero biases, unit layer-norm scales.
//! Its [`CausalLm::state_dict`] adds the tied `lm_head.weight`, so a saved file loads into nanoGPT's
//! `GPT(GPTConfig(bias=True, ...))` with `load_state_dict(..., strict=True)`.

use plimsoll_autograd::{Gpu, Tensor, TensorOptions};

use crate::attention::CausalSelfAttention;
use crate::blocks::{Stream, TransformerBlock};
use crate::embedding::Embedding;
use crate::error::{Error, Result};
use crate::linear::{Linear, derive_seed};
use crate::module::{CausalLm, Module, prefixed};
use crate::norm::LayerNorm;
use crate::sequential::{built, run_blocks, streams_any, token_time};

/// The layer-norm epsilon (PyTorch's default, as nanoGPT).
const LAYER_NORM_EPS: f32 = 1e-5;
/// nanoGPT's initialisation scale.
const INIT_STD: f32 = 0.02;

/// The shape of a [`Gpt`], nanoGPT's `GPTConfig` (with `bias=True`, no dropout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The longest context (positions of `wpe`).
    pub block_size: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block (dividing `n_embd`).
    pub n_head: usize,
    /// Width.
    pub n_embd: usize,
}

impl GptConfig {
    /// Checks the figures: all positive, `n_head` dividing `n_embd`.
    pub fn validate(&self) -> Result<()> {
        let figures = [
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
        ];
        let invalid = |message: String| Error::InvalidConfig {
            what: "GptConfig",
            message,
        };
        if let Some((name, _)) = figures.iter().find(|(_, v)| *v == 0) {
            return Err(invalid(format!("{name} is 0; it must be at least 1")));
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(invalid(format!(
                "n_head {} does not divide n_embd {}; pick a head count that divides the width",
                self.n_head, self.n_embd
            )));
        }
        Ok(())
    }

    /// Parameter elements (the tied head counted once), as nanoGPT's `get_num_params` with
    /// the position embedding included.
    /// Saturates at `usize::MAX` for absurd shapes instead of overflowing.
    pub fn parameter_count(&self) -> usize {
        let c = self.n_embd as u128;
        let block =
            4 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c);
        let total = (self.vocab_size as u128 + self.block_size as u128) * c
            + self.n_layer as u128 * block
            + 2 * c;
        usize::try_from(total).unwrap_or(usize::MAX)
    }
}

/// nanoGPT's character-level GPT. See the module docs.
#[derive(Debug, Clone)]
pub struct Gpt {
    config: GptConfig,
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<TransformerBlock>,
    ln_f: LayerNorm,
    training: bool,
    /// Dropout in training (nanoGPT's `dropout`): of the embeddings' sum and in every block.
    dropout: f32,
}

/// A parameter leaf `[shape]` drawn from `N(0, std)` with `seed`, labelled `label`.
pub(crate) fn normal(
    gpu: &Gpu,
    shape: &[usize],
    std: f32,
    seed: u64,
    label: &str,
) -> Result<Tensor> {
    let options = TensorOptions::parameter(label);
    Ok(Tensor::normal(gpu, shape, 0.0, std, seed, options)?)
}

/// A `inputs -> outputs` linear layer initialised as nanoGPT does (`N(0, std)` weight, zero
/// bias). A weight past one binding is kept in parts of whole rows ([`Linear::in_parts`]; the
/// first part drawn from `seed`, each further one from its own).
pub(crate) fn linear(
    gpu: &Gpu,
    inputs: usize,
    outputs: usize,
    std: f32,
    seed: u64,
) -> Result<Linear> {
    linear_with(gpu, inputs, outputs, std, seed, true)
}

/// [`linear`], with or without a bias.
pub(crate) fn linear_with(
    gpu: &Gpu,
    inputs: usize,
    outputs: usize,
    std: f32,
    seed: u64,
    bias: bool,
) -> Result<Linear> {
    let per_part = crate::embedding::rows_per_part(inputs, gpu.max_buffer_bytes());
    let parts = (0..outputs)
        .step_by(per_part.max(1))
        .enumerate()
        .map(|(k, first)| {
            let rows = per_part.min(outputs - first);
            let part_seed = if k == 0 {
                seed
            } else {
                derive_seed(seed, k as u64)
            };
            let weight = normal(gpu, &[rows, inputs], std, part_seed, "linear.weight")?;
            let bias = match bias {
                true => Some(Tensor::zeros(
                    gpu,
                    &[rows],
                    TensorOptions::parameter("linear.bias"),
                )?),
                false => None,
            };
            Ok((weight, bias))
        })
        .collect::<Result<Vec<_>>>()?;
    Linear::in_parts(parts)
}

/// A `[rows, dim]` table drawn from `N(0, std)` with `seed`; past one binding it is kept in
/// parts of whole rows (the first drawn from `seed`, each further part from its own).
pub(crate) fn normal_table(
    gpu: &Gpu,
    [rows, dim]: [usize; 2],
    std: f32,
    seed: u64,
    label: &str,
) -> Result<Embedding> {
    let per_part = crate::embedding::rows_per_part(dim, gpu.max_buffer_bytes());
    if rows <= per_part {
        return Embedding::from_weight(normal(gpu, &[rows, dim], std, seed, label)?);
    }
    let parts = (0..rows)
        .step_by(per_part)
        .enumerate()
        .map(|(k, first)| {
            let part_seed = if k == 0 {
                seed
            } else {
                derive_seed(seed, k as u64)
            };
            let shape = [per_part.min(rows - first), dim];
            normal(gpu, &shape, std, part_seed, label)
        })
        .collect::<Result<Vec<_>>>()?;
    Embedding::in_parts(parts)
}

impl Gpt {
    /// Drops with probability `p` in training where nanoGPT's `dropout` does: the sum of the
    /// token and position embeddings, and in every block the attention probabilities (inside
    /// the fused kernels, or on the reference path's probabilities, the same mask for a seed)
    /// and each residual branch's output. 0 (the default) drops nothing. Errors: `p` outside
    /// `[0, 1)`.
    pub fn set_dropout(&mut self, p: f32) -> Result<()> {
        for block in &mut self.blocks {
            block.set_dropout(p)?;
        }
        self.dropout = p;
        Ok(())
    }

    /// Uses the fused attention in every block or, with `false` (the default), the reference
    /// path that keeps each layer's `T x T` probabilities for backward.
    pub fn set_memory_efficient_attention(&mut self, on: bool) {
        for block in &mut self.blocks {
            block.set_memory_efficient_attention(on);
        }
    }

    /// A model of `config`, initialised from `seed` (see the module docs). Errors: a config
    /// [`GptConfig::validate`] refuses.
    pub fn new(gpu: &Gpu, config: GptConfig, seed: u64) -> Result<Gpt> {
        config.validate()?;
        let c = config.n_embd;
        let residual_std = INIT_STD / (2.0 * config.n_layer as f32).sqrt();
        let table = |rows: usize, index: u64, label: &str| -> Result<Embedding> {
            normal_table(gpu, [rows, c], INIT_STD, derive_seed(seed, index), label)
        };
        let wte = table(config.vocab_size, 0, "transformer.wte.weight")?;
        let wpe = table(config.block_size, 1, "transformer.wpe.weight")?;
        let blocks = (0..config.n_layer)
            .map(|i| {
                let s = |k: u64| derive_seed(seed, 16 + 8 * i as u64 + k);
                let attn = CausalSelfAttention::from_parts(
                    linear(gpu, c, 3 * c, INIT_STD, s(0))?,
                    linear(gpu, c, c, residual_std, s(1))?,
                    config.n_head,
                )?;
                built(TransformerBlock::from_parts(
                    LayerNorm::new(gpu, c, LAYER_NORM_EPS)?,
                    attn,
                    LayerNorm::new(gpu, c, LAYER_NORM_EPS)?,
                    linear(gpu, c, 4 * c, INIT_STD, s(2))?,
                    linear(gpu, 4 * c, c, residual_std, s(3))?,
                )?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Gpt {
            config,
            wte,
            wpe,
            blocks,
            ln_f: LayerNorm::new(gpu, c, LAYER_NORM_EPS)?,
            training: true,
            dropout: 0.0,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> GptConfig {
        self.config
    }
}

impl Module for Gpt {
    /// Logits of token ids without checkpointing ([`CausalLm::forward_checkpointed`]).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_checkpointed(ids, 0)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("transformer.wte", self.wte.parameters());
        p.extend(prefixed("transformer.wpe", self.wpe.parameters()));
        p.extend(self.block_parameters());
        p.extend(prefixed("transformer.ln_f", self.ln_f.parameters()));
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
        for block in &mut self.blocks {
            block.set_training(training);
        }
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

impl CausalLm for Gpt {
    /// Token and position embeddings, the blocks, then `ln_f`: `[batch, time, n_embd]`.
    fn hidden_checkpointed(&self, ids: &Tensor, segment_len: usize) -> Result<Tensor> {
        let time = token_time(ids, self.config.block_size, "Gpt")?;
        let positions: Vec<u32> = (0..time as u32).collect();
        let positions = Tensor::from_indices(ids.gpu(), &positions, &[time])?;
        let mut x = self.wte.forward(ids)?.add(&self.wpe.forward(&positions)?)?;
        if self.training && self.dropout > 0.0 {
            x = x.dropout(self.dropout)?;
        }
        if segment_len == 0 && !streams_any(&self.blocks) {
            // Every block's activations kept: each residual addition runs in the kernel of the
            // layer norm after it.
            let mut stream = Stream::Whole(x);
            for block in &self.blocks {
                stream = block.forward_open(stream)?;
            }
            return Ok(stream.normed(&self.ln_f)?.1);
        }
        let x = run_blocks(
            self.blocks.as_slice(),
            x,
            segment_len,
            "Gpt::forward_checkpointed",
        )?;
        self.ln_f.forward(&x)
    }

    fn block_parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = Vec::new();
        for (i, block) in self.blocks.iter().enumerate() {
            p.extend(prefixed(&format!("transformer.h.{i}"), block.parameters()));
        }
        p
    }

    fn head_parts(&self) -> Vec<&Tensor> {
        self.wte.parts()
    }

    /// The parameters under nanoGPT's names plus `lm_head.weight`, the head tied to
    /// `transformer.wte.weight` (the same tensor twice): what a file must hold for nanoGPT's
    /// `load_state_dict(..., strict=True)`. A token table past one binding is kept in parts
    /// (`transformer.wte.weight.part0`, ..., and `lm_head.weight.part0`, ...), which nanoGPT
    /// does not read.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut p = self.parameters();
        let parts = self.wte.parts();
        match parts[..] {
            [weight] => p.push(("lm_head.weight".to_string(), weight.clone())),
            _ => p.extend(
                (parts.iter().enumerate())
                    .map(|(i, w)| (format!("lm_head.weight.part{i}"), (*w).clone())),
            ),
        }
        p
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn context(&self) -> usize {
        self.config.block_size
    }
}
