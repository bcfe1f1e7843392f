//! [`Llama`]: a decoder-only transformer in the shape of Llama, Mistral, Qwen and SmolLM: no
//! biases, [`RmsNorm`] before each half-block, rotary position embeddings on queries and keys
//! ([`crate::rotary_embedding`]), grouped-query attention ([`LlamaAttention`]: fewer key/value
//! heads than query heads, read in place by the fused kernels), a SwiGLU MLP ([`SwiGlu`]) and an
//! output head that is its own table unless tied to the token embedding.
//!
//! Parameters carry Hugging Face's `LlamaForCausalLM` names and PyTorch's `[out, in]` layouts
//! (`model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj.weight`, ...,
//! `model.norm.weight`, `lm_head.weight`), so a saved file is what `from_pretrained` reads.
//! Initialisation: `N(0, 0.02)` for every weight (Hugging Face's `initializer_range`), the two
//! residual projections (`o_proj`, `down_proj`) at `0.02 / sqrt(2 n_layer)` as nanoGPT's, unit
//! norm scales.

use plimsoll_autograd::{Gpu, Tensor};

use crate::attention::causal_attention_dropout;
use crate::embedding::Embedding;
use crate::error::{Error, Result};
use crate::gpt::{linear_with, normal_table};
use crate::linear::{Linear, derive_seed};
use crate::module::{CausalLm, Module, prefixed};
use crate::norm::RmsNorm;
use crate::rotary::rotary_embedding;
use crate::sequential::{built, run_blocks, token_time};

/// Hugging Face's `initializer_range`.
const INIT_STD: f32 = 0.02;

/// The shape of a [`Llama`], Hugging Face's `LlamaConfig` under its names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The longest context (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    /// Decoder layers (`num_hidden_layers`).
    pub num_hidden_layers: usize,
    /// Query heads (`num_attention_heads`), dividing the width.
    pub num_attention_heads: usize,
    /// Key/value heads (`num_key_value_heads`), dividing the query heads.
    pub num_key_value_heads: usize,
    /// Width (`hidden_size`).
    pub hidden_size: usize,
    /// The SwiGLU MLP's width (`intermediate_size`).
    pub intermediate_size: usize,
    /// The rotary embeddings' base (`rope_theta`).
    pub rope_theta: f32,
    /// RMSNorm's epsilon (`rms_norm_eps`).
    pub rms_norm_eps: f32,
    /// Whether the output head is the token embedding (`tie_word_embeddings`).
    pub tie_word_embeddings: bool,
}

impl LlamaConfig {
    /// The SwiGLU width that gives the MLP about the parameters of a `4 x width` GELU MLP
    /// (three matrices of `8 width / 3`), rounded up to a multiple of 32.
    pub fn default_intermediate(hidden_size: usize) -> usize {
        (8 * hidden_size).div_ceil(3).div_ceil(32) * 32
    }

    /// Features per head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// Checks the figures: all positive, the heads dividing the width, the key/value heads
    /// dividing the heads, an even head dimension (rotary pairs), positive theta and epsilon.
    pub fn validate(&self) -> Result<()> {
        let invalid = |message: String| {
            Err(Error::InvalidConfig {
                what: "LlamaConfig",
                message,
            })
        };
        let figures = [
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
        ];
        if let Some((name, _)) = figures.iter().find(|(_, v)| *v == 0) {
            return invalid(format!("{name} is 0; it must be at least 1"));
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return invalid(format!(
                "{} heads do not divide the width {}; pick a head count that divides it",
                self.num_attention_heads, self.hidden_size
            ));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return invalid(format!(
                "{} key/value heads do not divide the {} query heads (each key/value head \
                 serves a whole group of query heads; pick --kv-heads dividing --heads)",
                self.num_key_value_heads, self.num_attention_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return invalid(format!(
                "the head dimension {} (width {} / {} heads) is odd; rotary embeddings turn \
                 pairs of features",
                self.head_dim(),
                self.hidden_size,
                self.num_attention_heads
            ));
        }
        let positive = |v: f32| v.is_finite() && v > 0.0;
        if !positive(self.rope_theta) || !positive(self.rms_norm_eps) {
            return invalid(format!(
                "rope_theta {} and rms_norm_eps {} must be positive",
                self.rope_theta, self.rms_norm_eps
            ));
        }
        Ok(())
    }

    /// Parameter elements (a tied head counted once). Saturates at `usize::MAX`.
    pub fn parameter_count(&self) -> usize {
        let c = self.hidden_size as u128;
        let kv = (self.num_key_value_heads * self.head_dim()) as u128;
        let attention = 2 * c * c + 2 * c * kv;
        let mlp = 3 * c * self.intermediate_size as u128;
        let block = attention + mlp + 2 * c;
        let tables = if self.tie_word_embeddings { 1 } else { 2 };
        let total =
            tables * self.vocab_size as u128 * c + self.num_hidden_layers as u128 * block + c;
        usize::try_from(total).unwrap_or(usize::MAX)
    }
}

/// Causal self-attention with rotary embeddings and grouped-query heads, no biases:
/// `q_proj` `[H D, C]`, `k_proj` and `v_proj` `[H_kv D, C]`, `o_proj` `[C, H D]`.
#[derive(Debug, Clone)]
pub struct LlamaAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    heads: usize,
    kv_heads: usize,
    rope_theta: f32,
    /// The fused kernels (no `T x T` tensor kept) or the reference path.
    memory_efficient: bool,
    /// Dropout on the attention probabilities in training (`attention_dropout`).
    dropout: f32,
    training: bool,
}

impl LlamaAttention {
    /// Uses the fused attention (the key/value heads read in place by each group of query
    /// heads) or, with `false`, the reference path, which repeats each key/value head for its
    /// group and keeps the `T x T` probabilities.
    pub fn set_memory_efficient(&mut self, on: bool) {
        self.memory_efficient = on;
    }
}

impl Module for LlamaAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let width = self.q_proj.in_features();
        let &[batch, time, channels] = x.shape() else {
            return Err(Error::InputShape {
                module: "LlamaAttention",
                expected: format!("[batch, time, {width}]"),
                found: x.shape().to_vec(),
            });
        };
        if channels != width {
            return Err(Error::InputShape {
                module: "LlamaAttention",
                expected: format!("[batch, time, {width}]"),
                found: x.shape().to_vec(),
            });
        }
        let (heads, kv_heads) = (self.heads, self.kv_heads);
        let head_dim = self.q_proj.out_features() / heads;
        // (B, T, H D) -> (B, H, T, D), then the rotation by position.
        let split = |y: Tensor, h: usize| -> Result<Tensor> {
            Ok(y.reshape(&[batch, time, h, head_dim])?
                .permute(&[0, 2, 1, 3])?)
        };
        let q = split(self.q_proj.forward(x)?, heads)?;
        let k = split(self.k_proj.forward(x)?, kv_heads)?;
        let v = split(self.v_proj.forward(x)?, kv_heads)?;
        let q = rotary_embedding(&q, self.rope_theta, 0)?;
        let k = rotary_embedding(&k, self.rope_theta, 0)?;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let p = if self.training { self.dropout } else { 0.0 };
        let seed = if p > 0.0 {
            plimsoll_autograd::grad_mode::next_seed()
        } else {
            0
        };
        let attended = if self.memory_efficient {
            causal_attention_dropout(&q, &k, &v, scale, p, seed)?
        } else {
            let group = heads / kv_heads;
            let repeat = |t: &Tensor| -> Result<Tensor> {
                if group == 1 {
                    return Ok(t.clone());
                }
                let one = t.reshape(&[batch, kv_heads, 1, time, head_dim])?;
                let copies: Vec<&Tensor> = (0..group).map(|_| &one).collect();
                Ok(Tensor::concat(&copies, 2)?.reshape(&[batch, heads, time, head_dim])?)
            };
            let (k, v) = (repeat(&k)?, repeat(&v)?);
            let scores = q.matmul_transposed_scaled(&k, scale)?;
            let probs = scores.softmax_causal()?;
            let probs = match p > 0.0 {
                true => probs.dropout_with_seed(p, seed)?,
                false => probs,
            };
            probs.matmul(&v)?
        };
        let y = attended
            .permute(&[0, 2, 1, 3])?
            .reshape(&[batch, time, heads * head_dim])?;
        self.o_proj.forward(&y)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("q_proj", self.q_proj.parameters());
        p.extend(prefixed("k_proj", self.k_proj.parameters()));
        p.extend(prefixed("v_proj", self.v_proj.parameters()));
        p.extend(prefixed("o_proj", self.o_proj.parameters()));
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// The SwiGLU MLP: `down_proj(silu(gate_proj(x)) * up_proj(x))`, no biases.
#[derive(Debug, Clone)]
pub struct SwiGlu {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    training: bool,
}

impl SwiGlu {
    /// The MLP from its three projections (`gate_proj`, `up_proj`: width to hidden;
    /// `down_proj`: hidden to width). Errors: projections that do not fit.
    pub fn from_parts(gate_proj: Linear, up_proj: Linear, down_proj: Linear) -> Result<SwiGlu> {
        let (width, hidden) = (gate_proj.in_features(), gate_proj.out_features());
        let fits = up_proj.in_features() == width
            && up_proj.out_features() == hidden
            && down_proj.in_features() == hidden
            && down_proj.out_features() == width;
        if !fits {
            return Err(Error::InvalidConfig {
                what: "SwiGlu::from_parts",
                message: format!(
                    "gate {width} -> {hidden}, up {} -> {}, down {} -> {}: need gate and up \
                     width -> hidden, down hidden -> width",
                    up_proj.in_features(),
                    up_proj.out_features(),
                    down_proj.in_features(),
                    down_proj.out_features()
                ),
            });
        }
        Ok(SwiGlu {
            gate_proj,
            up_proj,
            down_proj,
            training: true,
        })
    }
}

impl Module for SwiGlu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = self.gate_proj.forward(x)?.silu()?;
        let h = gate.mul(&self.up_proj.forward(x)?)?;
        self.down_proj.forward(&h)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("gate_proj", self.gate_proj.parameters());
        p.extend(prefixed("up_proj", self.up_proj.parameters()));
        p.extend(prefixed("down_proj", self.down_proj.parameters()));
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// A Llama decoder layer: `x = x + self_attn(input_layernorm(x))`, then
/// `x = x + mlp(post_attention_layernorm(x))`.
#[derive(Debug, Clone)]
pub struct LlamaBlock {
    input_layernorm: RmsNorm,
    self_attn: LlamaAttention,
    post_attention_layernorm: RmsNorm,
    mlp: SwiGlu,
    training: bool,
}

impl Module for LlamaBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.self_attn.forward(&self.input_layernorm.forward(x)?)?)?;
        let h = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x)?)?;
        Ok(x.add(&h)?)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("input_layernorm", self.input_layernorm.parameters());
        p.extend(prefixed("self_attn", self.self_attn.parameters()));
        p.extend(prefixed(
            "post_attention_layernorm",
            self.post_attention_layernorm.parameters(),
        ));
        p.extend(prefixed("mlp", self.mlp.parameters()));
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
        self.self_attn.set_training(training);
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// A Llama-family causal language model. See the module docs.
#[derive(Debug, Clone)]
pub struct Llama {
    config: LlamaConfig,
    embed_tokens: Embedding,
    layers: Vec<LlamaBlock>,
    norm: RmsNorm,
    /// The output head's table, `[vocab, width]`; `None` when tied to `embed_tokens`.
    lm_head: Option<Embedding>,
    training: bool,
}

impl Llama {
    /// A model of `config`, initialised from `seed` (see the module docs). Errors: a config
    /// [`LlamaConfig::validate`] refuses.
    pub fn new(gpu: &Gpu, config: LlamaConfig, seed: u64) -> Result<Llama> {
        config.validate()?;
        let c = config.hidden_size;
        let (heads, kv_heads) = (config.num_attention_heads, config.num_key_value_heads);
        let kv = kv_heads * config.head_dim();
        let hidden = config.intermediate_size;
        let residual_std = INIT_STD / (2.0 * config.num_hidden_layers as f32).sqrt();
        let embed_tokens = normal_table(
            gpu,
            [config.vocab_size, c],
            INIT_STD,
            derive_seed(seed, 0),
            "model.embed_tokens.weight",
        )?;
        let lm_head = match config.tie_word_embeddings {
            true => None,
            false => Some(normal_table(
                gpu,
                [config.vocab_size, c],
                INIT_STD,
                derive_seed(seed, 1),
                "lm_head.weight",
            )?),
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let s = |k: u64| derive_seed(seed, 16 + 8 * i as u64 + k);
                let proj =
                    |inputs, outputs, std, k| linear_with(gpu, inputs, outputs, std, s(k), false);
                Ok(LlamaBlock {
                    input_layernorm: RmsNorm::new(gpu, c, config.rms_norm_eps)?,
                    self_attn: LlamaAttention {
                        q_proj: proj(c, c, INIT_STD, 0)?,
                        k_proj: proj(c, kv, INIT_STD, 1)?,
                        v_proj: proj(c, kv, INIT_STD, 2)?,
                        o_proj: proj(c, c, residual_std, 3)?,
                        heads,
                        kv_heads,
                        rope_theta: config.rope_theta,
                        memory_efficient: false,
                        dropout: 0.0,
                        training: true,
                    },
                    post_attention_layernorm: RmsNorm::new(gpu, c, config.rms_norm_eps)?,
                    mlp: SwiGlu::from_parts(
                        proj(c, hidden, INIT_STD, 4)?,
                        proj(c, hidden, INIT_STD, 5)?,
                        proj(hidden, c, residual_std, 6)?,
                    )?,
                    training: true,
                })
                .and_then(built)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Llama {
            config,
            embed_tokens,
            layers,
            norm: RmsNorm::new(gpu, c, config.rms_norm_eps)?,
            lm_head,
            training: true,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> LlamaConfig {
        self.config
    }

    /// Uses the fused attention in every layer or, with `false` (the default), the reference
    /// path ([`LlamaAttention::set_memory_efficient`]).
    pub fn set_memory_efficient_attention(&mut self, on: bool) {
        for layer in &mut self.layers {
            layer.self_attn.set_memory_efficient(on);
        }
    }

    /// Drops each attention probability with probability `p` in training (Hugging Face's
    /// `attention_dropout`; 0, the default, none). Errors: `p` outside `[0, 1)`.
    pub fn set_dropout(&mut self, p: f32) -> Result<()> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::InvalidConfig {
                what: "Llama::set_dropout",
                message: format!("dropout {p} outside [0, 1)"),
            });
        }
        for layer in &mut self.layers {
            layer.self_attn.dropout = p;
        }
        Ok(())
    }
}

impl Module for Llama {
    /// Logits of token ids without checkpointing ([`CausalLm::forward_checkpointed`]).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_checkpointed(ids, 0)
    }

    /// Hugging Face's names (`lm_head.weight` only when the head is its own table).
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("model.embed_tokens", self.embed_tokens.parameters());
        p.extend(self.block_parameters());
        p.extend(prefixed("model.norm", self.norm.parameters()));
        if let Some(head) = &self.lm_head {
            p.extend(prefixed("lm_head", head.parameters()));
        }
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
        for layer in &mut self.layers {
            layer.set_training(training);
        }
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

impl CausalLm for Llama {
    /// The token embedding, the layers, then `model.norm`: `[batch, time, width]`.
    fn hidden_checkpointed(&self, ids: &Tensor, segment_len: usize) -> Result<Tensor> {
        token_time(ids, self.config.max_position_embeddings, "Llama")?;
        let x = self.embed_tokens.forward(ids)?;
        let x = run_blocks(
            self.layers.as_slice(),
            x,
            segment_len,
            "Llama::forward_checkpointed",
        )?;
        self.norm.forward(&x)
    }

    fn block_parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            p.extend(prefixed(&format!("model.layers.{i}"), layer.parameters()));
        }
        p
    }

    /// The output head's table parts (the token embedding's when tied).
    fn head_parts(&self) -> Vec<&Tensor> {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens).parts()
    }

    /// The parameters: Hugging Face leaves a tied head out of the file.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        self.parameters()
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn context(&self) -> usize {
        self.config.max_position_embeddings
    }
}
