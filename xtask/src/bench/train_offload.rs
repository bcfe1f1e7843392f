//! The train suite's part `offload`: what each `--offload` level buys a GPT, and what it costs.
//!
//! The model is a larger relative of the default GPT (8 layers, 4 heads, width 256, context
//! 256, batch 8: 6.4 million parameters), on the bundled plays. For each level (`none`,
//! `optimizer`, `activations`, `parameters`) the plan's least budget: the one its refusal of a
//! budget too small names (6 bytes per parameter; 1 MiB streaming the parameters), the smallest
//! that fits at that level (micro-batch and checkpointing planned). Then 6 steps under the
//! least budget of each of the last two levels, and 6 steps of the same run with no budget and
//! nothing offloaded. Reported: each least budget, the ratio of the on-device least budget to
//! each level's, each run's median step (the last 5), the bytes each offloaded run moves
//! between host and device per step (the plan's figure), its peak reserved bytes against the
//! budget, and how far its parameters are from the unconstrained run's after the 6 steps (relative Euclidean difference over the model and the
//! largest per tensor, in parts per million; the runs sum their micro-batches in another
//! order, and AdamW normalises the rounding noise of near-zero gradients into steps).

use std::sync::Arc;

use anyhow::{Result, bail};
use plimsoll_kernels_wgsl::Gpu;
use plimsoll_nn::{AdamWConfig, GptConfig};
use plimsoll_trainer::{
    CharCorpus, CheckpointPolicy, Error, GptSpec, Offload, OptimizerSpec, Recipe, TokenData,
    TrainConfig, Trainer,
};

use super::Report;
use super::train::median;
use super::train_gpt::config;

const BATCH: usize = 8;
const CONTEXT: usize = 256;
const STEPS: u64 = 6;

fn spec(vocab: usize) -> GptSpec {
    GptSpec::new(
        GptConfig {
            vocab_size: vocab,
            block_size: CONTEXT,
            n_layer: 8,
            n_head: 4,
            n_embd: 256,
        },
        0,
        OptimizerSpec::AdamW(AdamWConfig::default()),
    )
}

/// The run's configuration at `offload` with `budget` (none: the device's).
fn planned(offload: Offload, budget: Option<u64>) -> TrainConfig {
    TrainConfig {
        offload,
        memory_budget_bytes: budget,
        ..config(BATCH, None, STEPS, CheckpointPolicy::Automatic)
    }
}

/// Runs the part.
pub fn run(report: &mut Report) -> Result<()> {
    let corpus = CharCorpus::shakespeare()?;
    let vocab = corpus.vocab_size();
    let data = TokenData::windows(Arc::new(corpus.train().to_vec()), CONTEXT, vocab)?;
    let spec = spec(vocab);
    let gpu = Gpu::new()?;
    let mut least = Vec::new();
    // A budget that holds the parameters but not their gradients: every level that keeps the
    // parameters on the device refuses it, naming its least budget. Streaming them, 1 MiB
    // (less than one block's parameters) is refused.
    let too_small = 6 * spec.parameter_count() as u64;
    for offload in LEVELS {
        let budget = match offload {
            Offload::Parameters => 1 << 20,
            _ => too_small,
        };
        let config = planned(offload, Some(budget));
        let refused = Trainer::new(&gpu, config, &spec, data.clone(), None);
        let need = match refused {
            Err(Error::BudgetTooSmall {
                predicted_bytes, ..
            }) => predicted_bytes,
            Err(e) => return Err(e.into()),
            Ok(_) => bail!("{budget} bytes fitted --offload {offload}"),
        };
        report.push(
            format!("offload/{offload}/least_budget"),
            need as f64,
            "bytes",
        );
        least.push(need);
    }
    let on_device = least[0];
    for (offload, need) in LEVELS.iter().zip(&least).skip(1) {
        report.push(
            format!("offload/{offload}/on_device_over_least"),
            on_device as f64 / (*need).max(1) as f64,
            "x",
        );
    }

    let train = |config: TrainConfig| -> Result<(Vec<f64>, Trainer)> {
        let gpu = Gpu::new()?;
        let mut trainer = Trainer::new(&gpu, config, &spec, data.clone(), None)?;
        let mut times = Vec::new();
        for _ in 0..STEPS {
            times.push(trainer.step()?.step_ms);
        }
        Ok((times.split_off(1), trainer))
    };
    let (free_times, free) = train(planned(Offload::None, None))?;
    report.push(
        "offload/unconstrained/step_median",
        median(free_times),
        "ms",
    );
    for (offload, &budget) in LEVELS.iter().zip(&least).skip(2) {
        let (times, tight) = train(planned(*offload, Some(budget)))?;
        tight_run(report, *offload, budget, times, &tight, &free)?;
    }
    Ok(())
}

/// The levels, from everything on the device to the parameters streamed.
const LEVELS: [Offload; 4] = [
    Offload::None,
    Offload::OptimizerState,
    Offload::Activations,
    Offload::Parameters,
];

/// Reports a run at `offload` under its least `budget`: its median step, transfer bytes, plan,
/// peak reserved bytes, and how far its parameters are from the unconstrained run's.
fn tight_run(
    report: &mut Report,
    offload: Offload,
    budget: u64,
    times: Vec<f64>,
    tight: &Trainer,
    free: &Trainer,
) -> Result<()> {
    let plan = tight.plan().cloned().unwrap_or_default();
    let key = |what: &str| format!("offload/{offload}/{what}");
    report.push(key("step_median"), median(times), "ms");
    report.push(
        key("transfer_bytes_per_step"),
        plan.offload_transfer_bytes as f64,
        "bytes",
    );
    report.push(key("micro_batch"), plan.micro_batch as f64, "samples");
    report.push(key("segment_len"), plan.segment_len as f64, "blocks");
    let peak = tight
        .gpu()
        .with_allocator(|a| a.stats().peak_reserved_bytes);
    report.push(key("peak_reserved"), peak as f64, "bytes");
    report.push(key("budget"), budget as f64, "bytes");
    let (mut worst, mut diff_all, mut norm_all) = (0.0f64, 0.0f64, 0.0f64);
    for ((_, a), (_, b)) in free.parameters().iter().zip(tight.parameters()) {
        let (a, b) = (a.to_vec()?, b.to_vec()?);
        let diff: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(x - y).powi(2))
            .sum();
        let norm: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum();
        worst = worst.max((diff / norm.max(1e-30)).sqrt());
        (diff_all, norm_all) = (diff_all + diff, norm_all + norm);
    }
    report.push(
        key("parameters_relative_difference"),
        (diff_all / norm_all.max(1e-30)).sqrt() * 1e6,
        "ppm",
    );
    report.push(
        key("parameters_max_relative_difference"),
        worst * 1e6,
        "ppm",
    );
    Ok(())
}
