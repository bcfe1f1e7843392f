//! The train suite's GPT workload: `plimsoll train shakespeare`'s default model (nanoGPT's CPU
//! configuration: 4 layers, 4 heads, width 128, context 64, batch 12, AdamW) on the bundled
//! plays through the trainer's real step.
//!
//! - Median step time and tokens per second over 10 steps after 3 warm-up steps; peak
//!   allocated and reserved bytes against the analytic minimum.
//! - Peak activation bytes and step time with every block checkpointed against none.
//!
//! (The memory plan's predictions are `cargo xtask bench plan`.)
//!
//! Analytic minimum: parameters, gradients and two AdamW moments (16 bytes per parameter), plus
//! the activations a plain autograd must keep for backward, counted from the shapes (B batch,
//! T context, C width, H heads, V vocabulary, L layers), 4 bytes each:
//! - per block `16 BTC + B H T T + 4 BT`: the residual into `ln_1` and its output, q, k and v
//!   (3), the attention output before `c_proj`, the residual into `ln_2` and its output, the
//!   MLP's pre-GELU and post-GELU activations (4 + 4), the attention probabilities, and both
//!   layer norms' mean and reciprocal deviation;
//! - around the blocks `2 BTC + 2 BT + BTV + 2 BT`: `ln_f`'s input and output and statistics,
//!   the log-probabilities the cross-entropy backward needs, the token ids and the targets.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use plimsoll_kernels_wgsl::Gpu;
use plimsoll_nn::{AdamWConfig, GptConfig, LrSchedule};
use plimsoll_trainer::{
    CharCorpus, CheckpointPolicy, GptSpec, LeakPolicy, OptimizerSpec, Recipe, RunLength, TokenData,
    TrainConfig, Trainer,
};

use super::Report;
use super::train::{mb, median, steps};

pub(crate) const BATCH: usize = 12;
pub(crate) const CONTEXT: usize = 64;
const WARMUP_STEPS: usize = 3;
const TIMED_STEPS: usize = 10;

/// `plimsoll train shakespeare`'s default model on `vocab` characters (also `cargo xtask
/// soak`'s GPT).
pub(crate) fn spec(vocab: usize) -> GptSpec {
    GptSpec {
        config: GptConfig {
            vocab_size: vocab,
            block_size: CONTEXT,
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
        },
        seed: 0,
        optimizer: OptimizerSpec::AdamW(AdamWConfig {
            beta2: 0.99,
            weight_decay: 0.1,
            decay_matrices_only: true,
            ..AdamWConfig::default()
        }),
    }
}

pub(crate) fn config(
    batch: usize,
    micro: Option<usize>,
    steps: u64,
    ckpt: CheckpointPolicy,
) -> TrainConfig {
    TrainConfig {
        effective_batch: batch,
        micro_batch: micro,
        length: RunLength::Steps(steps),
        schedule: LrSchedule::Constant { lr: 1e-3 },
        checkpointing: ckpt,
        fence_deadline: Duration::from_secs(300),
        leak_policy: LeakPolicy::Warn,
        clip_grad_norm: Some(1.0),
        ..TrainConfig::default()
    }
}

/// See the module docs.
fn analytic_minimum_bytes(c: &GptConfig, parameters: usize, batch: usize) -> u64 {
    let (b, t, w, h, v, l) = (
        batch,
        c.block_size,
        c.n_embd,
        c.n_head,
        c.vocab_size,
        c.n_layer,
    );
    let per_block = 16 * b * t * w + b * h * t * t + 4 * b * t;
    let around = 2 * b * t * w + 2 * b * t + b * t * v + 2 * b * t;
    4 * (4 * parameters + l * per_block + around) as u64
}

/// Runs the GPT workload.
pub fn run(report: &mut Report) -> Result<()> {
    let corpus = CharCorpus::shakespeare()?;
    let vocab = corpus.vocab_size();
    let data = TokenData::windows(Arc::new(corpus.train().to_vec()), CONTEXT, vocab)?;
    let spec = spec(vocab);
    let parameters = spec.parameter_count();

    // Speed and memory of the default run.
    let gpu = Gpu::new()?;
    let total = (WARMUP_STEPS + TIMED_STEPS + super::train::EFFICIENCY_STEPS) as u64;
    let cfg = config(BATCH, Some(BATCH), total, CheckpointPolicy::None);
    let mut trainer = Trainer::new(&gpu, cfg, &spec, data.clone(), None)?;
    let (times, [allocated, reserved, _]) = steps(&mut trainer, WARMUP_STEPS, TIMED_STEPS)?;
    let step_ms = median(times);
    let (matmul_ms, efficiency, products) = super::train::step_efficiency(&mut trainer, "gpt")?;
    drop(trainer);
    report.push(
        format!("gpt/step_matmuls_alone ({products} products)"),
        matmul_ms,
        "ms",
    );
    report.push("gpt/step_efficiency", efficiency, "ratio");
    println!(
        "train: floor gpt step efficiency >= 0.70: {}",
        if efficiency >= 0.70 { "met" } else { "NOT met" }
    );
    let minimum = analytic_minimum_bytes(&spec.config, parameters, BATCH);
    report.push("gpt/step_median", step_ms, "ms");
    report.push(
        "gpt/tokens_per_s",
        (BATCH * CONTEXT) as f64 / (step_ms / 1e3),
        "tokens/s",
    );
    report.push("gpt/peak_allocated", mb(allocated), "MB");
    report.push("gpt/peak_reserved", mb(reserved), "MB");
    report.push("gpt/analytic_minimum", mb(minimum), "MB");
    report.push(
        "gpt/allocated_over_minimum",
        allocated as f64 / minimum as f64,
        "ratio",
    );
    report.push(
        "gpt/reserved_over_minimum",
        reserved as f64 / minimum as f64,
        "ratio",
    );

    // Every block checkpointed against none.
    for (name, policy) in [
        ("none", CheckpointPolicy::None),
        ("every_block", CheckpointPolicy::EveryBlocks(1)),
    ] {
        let gpu = Gpu::new()?;
        let cfg = config(BATCH, Some(BATCH), 7, policy);
        let mut trainer = Trainer::new(&gpu, cfg, &spec, data.clone(), None)?;
        let (times, [allocated, _, activation]) = steps(&mut trainer, 2, 5)?;
        let key = format!("gpt/checkpointing_{name}");
        report.push(format!("{key}/step_median"), median(times), "ms");
        report.push(format!("{key}/peak_activation"), mb(activation), "MB");
        report.push(format!("{key}/peak_allocated"), mb(allocated), "MB");
    }

    Ok(())
}
