//! Plimsoll's layer library: the [`Module`] trait (forward, dotted parameter names, train/eval
//! mode) and the layers of a small language model — [`Linear`] (seeded [`Init`]),
//! [`Embedding`], [`LayerNorm`], [`Dropout`], the activations, [`Sequential`] (with
//! checkpointed segments) and [`mlp`], [`ResidualMlpBlock`], [`CausalSelfAttention`] and the
//! pre-norm [`TransformerBlock`]; the losses ([`loss`]); the optimizers [`Sgd`] and [`AdamW`]
//! on `kernels-wgsl`'s fused kernels, with [`zero_grad`], [`clip_grad_norm`] and
//! [`LrSchedule`] ([`optim`]); and parameter/optimizer state as plain safetensors files
//! ([`state`]). It is not the training loop (micro-batching, checkpoint policy, mixed
//! precision, out-of-memory recovery): that is `plimsoll-trainer`. Every fallible function
//! returns this crate's [`Error`].
//!
//! Map: [`module`], [`linear`], [`conv`], [`pool`], [`norm2d`], [`resnet`], [`activation`], [`norm`], [`embedding`], [`attention`],
//! [`blocks`], [`sequential`], [`loss`], [`optim`], [`state`], [`error`].

pub mod activation;
pub mod attention;
pub mod blocks;
pub mod conv;
pub mod embedding;
pub mod error;
pub mod gpt;
pub mod linear;
pub mod llama;
pub mod loss;
pub mod module;
pub mod norm;
pub mod norm2d;
pub mod optim;
pub mod pool;
pub mod resnet;
pub mod rotary;
pub mod sequential;
pub mod state;

pub use activation::{Activation, Dropout, Gelu, Relu, Sigmoid, Tanh};
pub use attention::{CausalSelfAttention, causal_attention, causal_attention_dropout};
pub use blocks::{ResidualMlpBlock, TransformerBlock};
pub use conv::{Conv2d, Conv2dOptions, cnn, conv2d};
pub use embedding::Embedding;
pub use error::{Error, Result};
pub use gpt::{Gpt, GptConfig};
pub use linear::{Init, Linear};
pub use llama::{Llama, LlamaAttention, LlamaBlock, LlamaConfig, SwiGlu};
pub use module::{CausalLm, Module, parameter_count};
pub use norm::{LayerNorm, RmsNorm, rms_norm};
pub use norm2d::{BatchNorm2d, GroupNorm};
pub use optim::{
    AdamW, AdamWConfig, HostAdamW, LrSchedule, Optimizer, RowShard, Sgd, SgdConfig, ShardedAdamW,
    clip_grad_norm, grad_norm, row_view, zero_grad,
};
pub use pool::{AdaptiveAvgPool2d, AvgPool2d, Flatten, MaxPool2d, Unflatten, pool2d};
pub use resnet::{BlockKind, ResNet, ResNetConfig};
pub use rotary::rotary_embedding;
pub use sequential::{EvictBlocksGuard, Sequential, evict_blocks_as_built, mlp};
pub use state::{HostTensor, LoadedState, Stored};
