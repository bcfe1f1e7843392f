//! The two models the trainer ships with, as [`Recipe`]s: [`ModelSpec`], an MLP classifier over a
//! table, and [`GptSpec`], nanoGPT's character-level GPT over token windows. Each builds its
//! model and optimizer identically every time, so the memory plan can dry-run a throwaway copy.

use plimsoll_autograd::{Gpu, Tensor};
use plimsoll_nn::{
    Activation, AdamW, AdamWConfig, CausalLm, Gpt, GptConfig, Llama, LlamaConfig, Module,
    Optimizer, Sequential, Sgd, SgdConfig, loss, mlp,
};

use crate::error::{Error, Result};
use crate::task::{Batch, Data, EvalSums, Model, Recipe};
use plimsoll_nn::{HostTensor, LoadedState};

/// Which optimizer, with its hyper-parameters (the learning rate is set by the schedule).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerSpec {
    /// AdamW (weight decay 0 gives Adam).
    AdamW(AdamWConfig),
    /// SGD with optional momentum.
    Sgd(SgdConfig),
}

impl OptimizerSpec {
    /// A fresh optimizer.
    pub fn build(&self) -> Box<dyn Optimizer> {
        match *self {
            OptimizerSpec::AdamW(c) => Box::new(AdamW::new(c)),
            OptimizerSpec::Sgd(c) => Box::new(Sgd::new(c)),
        }
    }

    /// The optimizer's name and settings as a JSON object (`run.json`'s `optimizer`):
    /// `{"name": "AdamW", "lr": 0.002, "beta1": 0.9, ...}`, numbers as written (`0.002`, not
    /// the f32's `0.0020000000949949026`).
    pub fn to_json(&self) -> serde_json::Value {
        match *self {
            OptimizerSpec::AdamW(c) => serde_json::json!({
                "name": "AdamW",
                "lr": plain_number(c.lr),
                "beta1": plain_number(c.beta1),
                "beta2": plain_number(c.beta2),
                "eps": plain_number(c.eps),
                "weight_decay": plain_number(c.weight_decay),
                "weight_decay_on": if c.decay_matrices_only { "matrices only" } else { "all parameters" },
            }),
            OptimizerSpec::Sgd(c) => serde_json::json!({
                "name": "SGD",
                "lr": plain_number(c.lr),
                "momentum": plain_number(c.momentum),
                "dampening": plain_number(c.dampening),
                "weight_decay": plain_number(c.weight_decay),
                "nesterov": c.nesterov,
            }),
        }
    }
}

/// `v` as the JSON number its shortest decimal form names (f32 `0.002` is `0.002`, not
/// `0.0020000000949949026`).
pub fn plain_number(v: f32) -> serde_json::Value {
    v.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}

impl std::fmt::Display for OptimizerSpec {
    /// `AdamW lr 0.002, betas 0.9 and 0.999, eps 1e-8, weight decay 0.1 on matrices only`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            OptimizerSpec::AdamW(c) => write!(
                f,
                "AdamW lr {}, betas {} and {}, eps {:e}, weight decay {}{}",
                c.lr,
                c.beta1,
                c.beta2,
                c.eps,
                c.weight_decay,
                match (c.weight_decay == 0.0, c.decay_matrices_only) {
                    (true, _) => "",
                    (false, true) => " on matrices only",
                    (false, false) => " on all parameters",
                }
            ),
            OptimizerSpec::Sgd(c) => write!(
                f,
                "SGD lr {}, momentum {}{}, weight decay {}",
                c.lr,
                c.momentum,
                if c.nesterov { " (Nesterov)" } else { "" },
                c.weight_decay
            ),
        }
    }
}

/// An activation's usual name: `ReLU`, `GELU`, `tanh`, `sigmoid`.
fn activation_name(activation: Activation) -> &'static str {
    match activation {
        Activation::Relu => "ReLU",
        Activation::Gelu => "GELU",
        Activation::Tanh => "tanh",
        Activation::Sigmoid => "sigmoid",
    }
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
    /// Builds the network alone.
    pub fn network(&self, gpu: &Gpu) -> Result<Sequential> {
        Ok(mlp(gpu, &self.widths, self.activation, self.seed)?)
    }

    /// Number of children of the built `Sequential` (Linear and activation modules).
    pub fn children(&self) -> usize {
        (2 * self.widths.len()).saturating_sub(3)
    }
}

impl Recipe for ModelSpec {
    fn build(&self, gpu: &Gpu) -> Result<(Box<dyn Model>, Box<dyn Optimizer>)> {
        let model = Classifier {
            net: self.network(gpu)?,
        };
        Ok((Box::new(model), self.optimizer.build()))
    }

    fn blocks(&self) -> usize {
        self.children()
    }

    fn parameter_count(&self) -> usize {
        self.widths.windows(2).fold(0usize, |n, w| {
            n.saturating_add(w[0].saturating_mul(w[1]).saturating_add(w[1]))
        })
    }

    fn check(&self, data: &dyn Data) -> Result<()> {
        let (features, classes) = (data.input_width(), data.classes());
        match (self.widths.first(), self.widths.last()) {
            (Some(&i), Some(&o)) if i == features && o >= classes => Ok(()),
            _ => Err(Error::invalid(
                "model",
                format!(
                    "widths {:?} do not fit data with {features} features and {classes} classes",
                    self.widths
                ),
            )),
        }
    }

    fn describe(&self) -> String {
        let widths: Vec<String> = self.widths.iter().map(usize::to_string).collect();
        format!(
            "MLP {}, {}, seed {}; {}",
            widths.join("-"),
            activation_name(self.activation),
            self.seed,
            self.optimizer
        )
    }
}

/// A built classifier (an MLP, or a CNN over flat pixels): cross-entropy of its logits.
pub struct Classifier {
    pub(crate) net: Sequential,
}

/// [`classifier_sums`] of `logits` (`[rows, classes]`, read back and dropped) against the u32
/// `targets`: what a classifier's [`Model::evaluate`] returns.
pub(crate) fn logits_sums(logits: Tensor, targets: &Tensor) -> Result<EvalSums> {
    let classes = *logits.shape().last().unwrap_or(&1);
    let values = logits.to_vec()?;
    drop(logits);
    Ok(classifier_sums(&values, &targets.to_vec_u32()?, classes))
}

/// Sums of one chunk's per-row cross-entropy and arg-max hits, from `[rows, classes]` logits.
fn classifier_sums(logits: &[f32], targets: &[u32], classes: usize) -> EvalSums {
    let mut sums = EvalSums {
        correct: Some(0),
        ..EvalSums::default()
    };
    for (row, &t) in logits.chunks(classes.max(1)).zip(targets) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = f64::from(max)
            + row
                .iter()
                .map(|&v| (f64::from(v) - f64::from(max)).exp())
                .sum::<f64>()
                .ln();
        let target = row.get(t as usize).map_or(f64::NAN, |&v| f64::from(v));
        let best =
            row.iter().enumerate().fold(
                (0, f32::NEG_INFINITY),
                |b, (j, &v)| if v > b.1 { (j, v) } else { b },
            );
        sums.count += 1;
        sums.loss_sum += lse - target;
        sums.correct = sums.correct.map(|c| c + u64::from(best.0 as u32 == t));
    }
    sums
}

impl Model for Classifier {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.net.parameters()
    }

    fn loss(&self, batch: &Batch, segment_len: usize, label_smoothing: f32) -> Result<Tensor> {
        let logits = self.net.forward_checkpointed(&batch.inputs, segment_len)?;
        Ok(loss::cross_entropy(
            &logits,
            &batch.targets,
            label_smoothing,
        )?)
    }

    fn evaluate(&self, batch: &Batch) -> Result<EvalSums> {
        logits_sums(self.net.forward(&batch.inputs)?, &batch.targets)
    }

    fn set_training(&mut self, training: bool) {
        self.net.set_training(training);
    }

    fn buffers(&self) -> Vec<(String, Tensor)> {
        self.net.buffers()
    }
}

/// A decoder-only language model and its optimizer: nanoGPT's GPT ([`plimsoll_nn::Gpt`]) or,
/// with [`Arch::Llama`], a Llama of the same layers, heads, width, context and vocabulary
/// ([`plimsoll_nn::Llama`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptSpec {
    /// The model's shape (for a Llama: its layers, query heads, width, context, vocabulary).
    pub config: GptConfig,
    /// Which family: nanoGPT's GPT or a Llama.
    pub arch: Arch,
    /// The names and layouts of the exported `model.safetensors`.
    pub export: ExportLayout,
    /// Initialisation seed.
    pub seed: u64,
    /// The optimizer.
    pub optimizer: OptimizerSpec,
    /// How attention runs.
    pub attention: Attention,
    /// How the output head and loss run.
    pub loss: LossHead,
    /// Dropout in training where nanoGPT's `dropout` applies ([`plimsoll_nn::Gpt::set_dropout`];
    /// 0: none).
    pub dropout: f32,
}

/// Whose names and layouts the exported `model.safetensors` has (`--export`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportLayout {
    /// nanoGPT's for a GPT, Hugging Face's for a Llama.
    #[default]
    Auto,
    /// nanoGPT's `GPT` (`Linear` weights `[out, in]`, `lm_head.weight` tied); a GPT only.
    NanoGpt,
    /// Hugging Face's: `GPT2LMHeadModel` (its `Conv1D` weights `[in, out]`) or
    /// `LlamaForCausalLM`, with a `config.json` beside the file.
    HuggingFace,
}

/// The GPT's weights that Hugging Face's `GPT2LMHeadModel` keeps as `Conv1D`, `[in, out]`:
/// the transposes of nanoGPT's `Linear` weights of the same names.
const CONV1D: [&str; 4] = [
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
];

/// A matrix transposed in place (`[rows, cols]` to `[cols, rows]`); anything else unchanged.
fn transpose(t: &mut HostTensor) {
    let [rows, cols] = t.shape[..] else {
        return;
    };
    let mut data = vec![0.0f32; t.data.len()];
    for r in 0..rows {
        for k in 0..cols {
            data[k * rows + r] = t.data[r * cols + k];
        }
    }
    t.shape = vec![cols, rows];
    t.data = data;
}

/// Whether `name` is a block weight that [`CONV1D`] lists.
fn is_conv1d(name: &str) -> bool {
    name.starts_with("transformer.h.") && CONV1D.iter().any(|w| name.ends_with(w))
}

/// The model family of a [`GptSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Arch {
    /// nanoGPT's GPT: learned positions, layer norms, a 4x GELU MLP, biases, a tied head.
    #[default]
    Gpt,
    /// A Llama: rotary positions, RMSNorm, a SwiGLU MLP, grouped-query heads, no biases.
    Llama(LlamaShape),
}

/// What a Llama has beyond the GPT's figures (Hugging Face's `LlamaConfig` names in the docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaShape {
    /// Key/value heads (`num_key_value_heads`), dividing the query heads.
    pub kv_heads: usize,
    /// The SwiGLU MLP's width (`intermediate_size`).
    pub mlp_width: usize,
    /// The rotary embeddings' base (`rope_theta`).
    pub rope_theta: f32,
    /// Whether the head is the token embedding (`tie_word_embeddings`).
    pub tie_embeddings: bool,
}

impl GptSpec {
    /// nanoGPT's GPT of shape `config`, initialised from `seed`, trained with `optimizer`;
    /// everything else as the command's defaults: nanoGPT's export names, attention and loss
    /// as the plan picks them ([`Attention::default`], [`LossHead::default`]), no dropout.
    pub fn new(config: GptConfig, seed: u64, optimizer: OptimizerSpec) -> GptSpec {
        GptSpec {
            config,
            arch: Arch::default(),
            export: ExportLayout::default(),
            seed,
            optimizer,
            attention: Attention::default(),
            loss: LossHead::default(),
            dropout: 0.0,
        }
    }

    /// The Llama this spec builds, if it is one.
    pub fn llama_config(&self) -> Option<LlamaConfig> {
        let Arch::Llama(shape) = self.arch else {
            return None;
        };
        let c = self.config;
        Some(LlamaConfig {
            vocab_size: c.vocab_size,
            max_position_embeddings: c.block_size,
            num_hidden_layers: c.n_layer,
            num_attention_heads: c.n_head,
            num_key_value_heads: shape.kv_heads,
            hidden_size: c.n_embd,
            intermediate_size: shape.mlp_width,
            rope_theta: shape.rope_theta,
            rms_norm_eps: 1e-5,
            tie_word_embeddings: shape.tie_embeddings,
        })
    }

    /// Checks the shape: [`GptConfig::validate`] or [`LlamaConfig::validate`]; and that a
    /// Llama is not exported in nanoGPT's layout.
    pub fn validate(&self) -> Result<()> {
        if self.arch != Arch::Gpt && self.export == ExportLayout::NanoGpt {
            return Err(Error::invalid(
                "--export",
                "nanogpt, but nanoGPT has no Llama; a Llama exports in Hugging Face's layout \
                 (--export hf, the default for it)",
            ));
        }
        match self.llama_config() {
            Some(llama) => Ok(llama.validate()?),
            None => Ok(self.config.validate()?),
        }
    }

    /// The network, initialised from the spec's seed, with its attention path and dropout.
    pub fn build_lm(&self, gpu: &Gpu) -> Result<Box<dyn CausalLm>> {
        let fused = self.attention == Attention::Fused;
        Ok(match self.llama_config() {
            Some(config) => {
                let mut llama = Llama::new(gpu, config, self.seed)?;
                llama.set_memory_efficient_attention(fused);
                llama.set_dropout(self.dropout)?;
                Box::new(llama)
            }
            None => {
                let mut gpt = Gpt::new(gpu, self.config, self.seed)?;
                gpt.set_memory_efficient_attention(fused);
                gpt.set_dropout(self.dropout)?;
                Box::new(gpt)
            }
        })
    }
}

/// How a GPT's output head and cross-entropy run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossHead {
    /// The memory plan decides, as for [`Attention::Auto`]: the whole logits when the step fits
    /// with them (faster: the chunked loss took 2.4x the step at GPT-2's vocabulary on an H200,
    /// `cargo xtask bench train attention`), else the automatic chunk. Without a plan, the
    /// whole logits.
    #[default]
    Auto,
    /// [`plimsoll_nn::loss::linear_cross_entropy`]: the head and loss in chunks of this many
    /// rows (0: the automatic chunk, [`plimsoll_nn::loss::loss_chunk_rows`]), so the
    /// `[batch, time, vocab]` logits never exist.
    Chunked(usize),
    /// The whole logits, then cross-entropy (the reference the chunked loss is checked
    /// against); the logits are kept for backward.
    Reference,
}

impl LossHead {
    /// Rows per chunk of the head for `rows` rows of `width` over `vocab` tokens with bindings
    /// of `max_binding_bytes`: `None` for the whole logits.
    pub fn chunk_rows(
        self,
        rows: usize,
        width: usize,
        vocab: usize,
        max_binding_bytes: u64,
    ) -> Option<usize> {
        match self {
            LossHead::Chunked(0) => {
                Some(loss::loss_chunk_rows(rows, width, vocab, max_binding_bytes))
            }
            LossHead::Chunked(n) => Some(n.min(rows.max(1))),
            LossHead::Auto | LossHead::Reference => None,
        }
    }
}

/// How a GPT's attention runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Attention {
    /// The memory plan decides: the reference path when the step fits with it at the largest
    /// micro-batch and no checkpointing (it is the faster: the fused kernels took 1.1x its step
    /// on an H200 and 1.3x to 2.6x on lavapipe, `cargo xtask bench train attention`), else the
    /// fused op when that fits a larger micro-batch or less checkpointing. Without a plan, the
    /// reference path.
    #[default]
    Auto,
    /// One fused op that keeps no `T x T` tensor (`plimsoll_nn::causal_attention`).
    Fused,
    /// Scores, causal softmax and a product, the probabilities kept for backward (the
    /// reference the fused op is checked against).
    Reference,
}

impl Recipe for GptSpec {
    fn build(&self, gpu: &Gpu) -> Result<(Box<dyn Model>, Box<dyn Optimizer>)> {
        let model = GptModel {
            lm: self.build_lm(gpu)?,
            loss: self.loss,
            spec: *self,
        };
        Ok((Box::new(model), self.optimizer.build()))
    }

    fn blocks(&self) -> usize {
        self.config.n_layer
    }

    fn parameter_count(&self) -> usize {
        match self.llama_config() {
            Some(llama) => llama.parameter_count(),
            None => self.config.parameter_count(),
        }
    }

    fn check(&self, data: &dyn Data) -> Result<()> {
        let (context, vocab) = (data.input_width(), data.classes());
        if context > self.config.block_size || vocab > self.config.vocab_size {
            return Err(Error::invalid(
                "model",
                format!(
                    "a model of context {} and vocabulary {} cannot read windows of {context} \
                     tokens over {vocab} symbols",
                    self.config.block_size, self.config.vocab_size
                ),
            ));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let c = self.config;
        let family = match self.arch {
            Arch::Gpt => "GPT".to_string(),
            Arch::Llama(l) => format!(
                "Llama ({} key/value heads, SwiGLU {} wide, rope theta {}{})",
                l.kv_heads,
                l.mlp_width,
                l.rope_theta,
                if l.tie_embeddings { ", tied head" } else { "" }
            ),
        };
        format!(
            "{family} {} layers x {} heads x {} wide, context {}, vocabulary {}, seed {}; {}",
            c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size, self.seed, self.optimizer
        )
    }

    fn memory_efficient_variant(&self) -> Option<(String, Box<dyn Recipe>)> {
        let (attention, loss) = (
            self.attention == Attention::Auto,
            self.loss == LossHead::Auto,
        );
        if !attention && !loss {
            return None;
        }
        let lean = GptSpec {
            attention: if attention {
                Attention::Fused
            } else {
                self.attention
            },
            loss: if loss {
                LossHead::Chunked(0)
            } else {
                self.loss
            },
            ..*self
        };
        let what = match (attention, loss) {
            (true, true) => "fused attention and the chunked loss",
            (true, false) => "fused attention",
            _ => "the chunked loss",
        };
        let why = format!(
            "{what} (the reference path, which keeps the T x T probabilities and the whole \
             logits, does not fit this choice)"
        );
        Some((why, Box::new(lean)))
    }

    fn loss_chunk_rows(
        &self,
        micro_batch: usize,
        input_width: usize,
        max_binding_bytes: u64,
    ) -> Option<usize> {
        let c = self.config;
        let rows = micro_batch.saturating_mul(input_width);
        self.loss
            .chunk_rows(rows, c.n_embd, c.vocab_size, max_binding_bytes)
    }
}

/// A built language model: the mean next-token cross-entropy over every position of every
/// window.
pub struct GptModel {
    lm: Box<dyn CausalLm>,
    loss: LossHead,
    /// What it was built from (the export's layout and `config.json`).
    spec: GptSpec,
}

impl GptModel {
    /// The network.
    pub fn lm(&self) -> &dyn CausalLm {
        self.lm.as_ref()
    }

    /// `[n·t, vocab]` logits and `[n·t]` targets of `batch`.
    fn flat(&self, batch: &Batch, segment_len: usize) -> Result<(Tensor, Tensor)> {
        let logits = self.lm.forward_checkpointed(&batch.inputs, segment_len)?;
        let tokens = batch.targets.numel();
        let vocab = self.lm.vocab_size();
        Ok((
            logits.reshape(&[tokens, vocab])?,
            batch.targets.reshape(&[tokens])?,
        ))
    }
}

impl Model for GptModel {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.lm.parameters()
    }

    fn streamed_parameters(&self) -> Vec<(String, Tensor)> {
        self.lm.block_parameters()
    }

    fn loss(&self, batch: &Batch, segment_len: usize, label_smoothing: f32) -> Result<Tensor> {
        if let LossHead::Chunked(rows) = self.loss {
            let (ids, targets) = (&batch.inputs, &batch.targets);
            return Ok(self.lm.loss_checkpointed(
                ids,
                targets,
                segment_len,
                label_smoothing,
                rows,
            )?);
        }
        let (logits, targets) = self.flat(batch, segment_len)?;
        Ok(loss::cross_entropy(&logits, &targets, label_smoothing)?)
    }

    fn evaluate(&self, batch: &Batch) -> Result<EvalSums> {
        let mean = self.loss(batch, 0, 0.0)?.item()?;
        let count = batch.targets.numel() as u64;
        Ok(EvalSums {
            count,
            loss_sum: f64::from(mean) * count as f64,
            correct: None,
        })
    }

    /// nanoGPT's names and layouts for a GPT ([`plimsoll_nn::CausalLm::state_dict`]), Hugging Face's for a
    /// Llama.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        self.lm.state_dict()
    }

    /// [`Model::state_dict`] on the host with tables joined; with [`ExportLayout::HuggingFace`]
    /// a GPT's block weights of `CONV1D` transposed to `[in, out]`.
    fn export_entries(&self) -> Result<Vec<(String, HostTensor)>> {
        let mut entries = crate::task::host_state(self.lm.state_dict())?;
        if self.spec.arch == Arch::Gpt && self.spec.export == ExportLayout::HuggingFace {
            for (name, t) in &mut entries {
                if is_conv1d(name) {
                    transpose(t);
                }
            }
        }
        Ok(entries)
    }

    fn export_config(&self) -> Option<serde_json::Value> {
        let c = self.spec.config;
        if let Some(l) = self.spec.llama_config() {
            return Some(serde_json::json!({
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": l.vocab_size,
                "hidden_size": l.hidden_size,
                "intermediate_size": l.intermediate_size,
                "num_hidden_layers": l.num_hidden_layers,
                "num_attention_heads": l.num_attention_heads,
                "num_key_value_heads": l.num_key_value_heads,
                "head_dim": l.head_dim(),
                "max_position_embeddings": l.max_position_embeddings,
                "rms_norm_eps": l.rms_norm_eps,
                "rope_theta": l.rope_theta,
                "hidden_act": "silu",
                "attention_bias": false,
                "mlp_bias": false,
                "tie_word_embeddings": l.tie_word_embeddings,
                "torch_dtype": "float32",
            }));
        }
        (self.spec.export == ExportLayout::HuggingFace).then(|| {
            serde_json::json!({
                "architectures": ["GPT2LMHeadModel"],
                "model_type": "gpt2",
                "vocab_size": c.vocab_size,
                "n_positions": c.block_size,
                "n_embd": c.n_embd,
                "n_layer": c.n_layer,
                "n_head": c.n_head,
                "n_inner": null,
                "activation_function": "gelu_new",
                "layer_norm_epsilon": 1e-5,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attn_pdrop": 0.0,
                "tie_word_embeddings": true,
                "torch_dtype": "float32",
            })
        })
    }

    /// A file in either export layout (or a checkpoint's parameters) as this model's
    /// parameters: a GPT's `[in, out]` block weights (Hugging Face's, recognised by
    /// `c_attn.weight`'s shape) transposed back, a tied `lm_head.weight` and Hugging Face's
    /// attention-mask buffers (`attn.bias`, `attn.masked_bias`) left out when the model has no
    /// such parameter.
    fn import_state(&self, mut loaded: LoadedState) -> Result<LoadedState> {
        let names: std::collections::BTreeSet<String> =
            self.parameters().into_iter().map(|(n, _)| n).collect();
        let embedding = match self.spec.arch {
            Arch::Gpt => "transformer.wte.weight",
            Arch::Llama(_) => "model.embed_tokens.weight",
        };
        // A head the file keeps beside the embedding: dropped when the model ties its head and
        // the file's is the same table, refused when it is a table of its own.
        let heads: Vec<String> = (loaded.tensors.keys())
            .filter(|n| n.starts_with("lm_head.weight") && !names.contains(n.as_str()))
            .cloned()
            .collect();
        for head in heads {
            let table = head.replacen("lm_head.weight", embedding, 1);
            let same = loaded.tensors.get(&table) == loaded.tensors.get(&head);
            if !same {
                return Err(Error::invalid(
                    "--init-from",
                    format!(
                        "the file's {head} is a table of its own, but this model ties its head \
                         to {table}; train an untied model (a Llama without --tie-embeddings) \
                         to start from it"
                    ),
                ));
            }
            loaded.tensors.remove(&head);
        }
        loaded.tensors.retain(|name, _| {
            let buffer = name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
            names.contains(name) || !buffer
        });
        let c = self.spec.config.n_embd;
        let conv1d = self.spec.arch == Arch::Gpt
            && loaded
                .tensors
                .get("transformer.h.0.attn.c_attn.weight")
                .is_some_and(|t| t.shape == [c, 3 * c]);
        if conv1d {
            for (name, t) in loaded.tensors.iter_mut() {
                if is_conv1d(name) {
                    transpose(t);
                }
            }
        }
        Ok(loaded)
    }

    fn set_training(&mut self, training: bool) {
        self.lm.set_training(training);
    }
}
