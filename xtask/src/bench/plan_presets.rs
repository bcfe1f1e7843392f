//! The plan suite's `presets` part: the memory plan of each GPT-2 preset (`plimsoll plan
//! shakespeare --model gpt2|gpt2-medium|gpt2-large|gpt2-xl`: context 1024, batch 12, GPT-2's
//! 50,257-token vocabulary over the plays' characters, automatic checkpointing, f32, AdamW;
//! on lavapipe the token table passes one binding and is kept in parts) under budgets of
//! 8, 24 and 80 GiB: the choice (micro-batch, checkpoint segment length, whether the fused
//! attention was taken, the loss chunk), the predicted peak, the plan's wall time, and an
//! analytic count of the same step to check the peak against:
//!
//! - 16 bytes per parameter: the parameter, its gradient and AdamW's two moments;
//! - the activations autograd keeps, counted from the shapes (B micro-batch, T context, C width,
//!   H heads, L layers), 4 bytes each: per block `16 BTC + B H T T + 4 BT` with the reference
//!   attention (the residual into `ln_1` and its output, q, k and v, the attention output after
//!   its permute, the residual into `ln_2` and its output, the MLP's 4C pre- and post-GELU
//!   activations, the probabilities, both layer norms' statistics) or `17 BTC + B H T + 4 BT`
//!   with the fused one (its output before the permute and one log-sum-exp per row instead of
//!   the probabilities); around the blocks `2 BTC + 4 BT` (`ln_f`'s input and output, its
//!   statistics, ids and targets; the chunked loss keeps no logits);
//! - with checkpoint segments of `s` blocks, the `ceil(L / s)` segment inputs (`BTC` each) and
//!   one segment's blocks recomputed during backward, in place of every block's.
//!
//! The analytic count leaves out what lives only for a moment (a gradient being made, a chunk's
//! logits, the allocator's rounding), which pushes the ratio predicted / analytic above 1, and
//! assumes every gradient and every kept activation alive at once, which the peak need not
//! see (a large micro-batch peaks early in backward, before most gradients exist): below 1.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use plimsoll_kernels_wgsl::Gpu;
use plimsoll_nn::{AdamWConfig, GptConfig};
use plimsoll_trainer::{
    CharCorpus, CheckpointPolicy, GptSpec, OptimizerSpec, Recipe, TokenData, TrainConfig,
};

use super::Report;
use super::train::mb;

/// Each preset: name, layers, heads, width (context 1024).
const PRESETS: [(&str, usize, usize, usize); 4] = [
    ("gpt2", 12, 12, 768),
    ("gpt2-medium", 24, 16, 1024),
    ("gpt2-large", 36, 20, 1280),
    ("gpt2-xl", 48, 25, 1600),
];
/// GPT-2's vocabulary (the plays' characters are its first 80 tokens here).
const GPT2_VOCAB: usize = 50_257;
/// The budgets, GiB.
const BUDGETS_GIB: [u64; 3] = [8, 24, 80];
const CONTEXT: usize = 1024;
const BATCH: usize = 12;

/// Runs the part (see the module docs).
pub fn run(report: &mut Report) -> Result<()> {
    let corpus = CharCorpus::shakespeare()?;
    let vocab = corpus.vocab_size();
    let train = TokenData::windows(Arc::new(corpus.train().to_vec()), CONTEXT, vocab)?;
    let val = TokenData::evenly_spaced(Arc::new(corpus.val().to_vec()), CONTEXT, vocab, 240)?;
    let config = TrainConfig {
        effective_batch: BATCH,
        micro_batch: None,
        checkpointing: CheckpointPolicy::Automatic,
        eval_interval_steps: Some(250),
        length: plimsoll_trainer::RunLength::Steps(2000),
        ..TrainConfig::default()
    };
    println!(
        "  {:<12} {:>6} {:>6} {:>7} {:>7} {:>9} {:>12} {:>12} {:>9} {:>9}",
        "preset",
        "budget",
        "micro",
        "ckpt",
        "fused",
        "loss rows",
        "predicted",
        "analytic",
        "ratio",
        "plan"
    );
    for (name, layers, heads, width) in PRESETS {
        let spec = GptSpec {
            export: Default::default(),
            arch: Default::default(),
            dropout: 0.0,
            attention: plimsoll_trainer::Attention::Auto,
            loss: plimsoll_trainer::LossHead::default(),
            config: GptConfig {
                vocab_size: GPT2_VOCAB,
                block_size: CONTEXT,
                n_layer: layers,
                n_head: heads,
                n_embd: width,
            },
            seed: 1,
            optimizer: OptimizerSpec::AdamW(AdamWConfig::default()),
        };
        for budget in BUDGETS_GIB {
            let gpu = Gpu::new()?;
            gpu.set_memory_budget(budget << 30);
            let started = Instant::now();
            let plan = plimsoll_trainer::plan::plan(&gpu, &spec, &train, Some(&val), &config);
            let ms = started.elapsed().as_secs_f64() * 1e3;
            let key = format!("plan/presets/{name}/{budget}GiB");
            report.push(format!("{key}/plan_time"), ms, "ms");
            let plan = match plan {
                Ok(plan) => plan,
                Err(e) => {
                    let first = e.to_string();
                    let first = first.lines().next().unwrap_or("");
                    println!("  {name:<12} {budget:>4}GiB refused in {ms:.0} ms: {first}");
                    report.push(format!("{key}/fits"), 0.0, "bool");
                    continue;
                }
            };
            let fused = plan.variant.is_some();
            let analytic = analytic_bytes(&spec, plan.micro_batch, plan.segment_len, fused);
            let ratio = plan.predicted_peak_bytes as f64 / analytic as f64;
            let loss_rows = plan.loss_chunk_rows.unwrap_or(0);
            println!(
                "  {name:<12} {budget:>4}GiB {:>6} {:>7} {:>7} {:>9} {:>9.0} MB {:>9.0} MB {:>9.3} {:>6.0} ms",
                plan.micro_batch,
                plimsoll_trainer::plan::segment_name(plan.segment_len),
                if fused { "yes" } else { "no" },
                loss_rows,
                mb(plan.predicted_peak_bytes),
                mb(analytic),
                ratio,
                ms
            );
            report.push(format!("{key}/fits"), 1.0, "bool");
            report.push(format!("{key}/dry_runs"), plan.probes.len() as f64, "runs");
            report.push(
                format!("{key}/micro_batch"),
                plan.micro_batch as f64,
                "samples",
            );
            report.push(
                format!("{key}/segment_len"),
                plan.segment_len as f64,
                "blocks",
            );
            report.push(
                format!("{key}/fused_attention"),
                f64::from(u8::from(fused)),
                "bool",
            );
            report.push(format!("{key}/loss_chunk_rows"), loss_rows as f64, "rows");
            report.push(
                format!("{key}/predicted_peak"),
                mb(plan.predicted_peak_bytes),
                "MB",
            );
            report.push(format!("{key}/analytic_peak"), mb(analytic), "MB");
            report.push(format!("{key}/predicted_over_analytic"), ratio, "ratio");
        }
    }
    Ok(())
}

/// The analytic step of the module docs at `micro` samples, checkpoint segments of `segment`
/// blocks (0: none), with the fused attention or the reference one.
fn analytic_bytes(spec: &GptSpec, micro: usize, segment: usize, fused: bool) -> u64 {
    let c = spec.config;
    let (b, t, w, h, l) = (micro, c.block_size, c.n_embd, c.n_head, c.n_layer);
    let btc = b * t * w;
    let block = match fused {
        true => 17 * btc + b * h * t + 4 * b * t,
        false => 16 * btc + b * h * t * t + 4 * b * t,
    };
    let around = 2 * btc + 4 * b * t;
    let kept = match segment {
        0 => l * block,
        s => l.div_ceil(s) * btc + s.min(l) * block,
    };
    16 * spec.parameter_count() as u64 + 4 * (around + kept) as u64
}

/// The `scale` part: exactness at scale. Real steps of GPT-2 small's shape (12 layers x 768,
/// context 256, batch 1, GPT-2's vocabulary over the plays' characters, the loss in chunks of
/// [`SCALE_LOSS_CHUNK`] rows) under a budget halfway between the least any choice needs and its
/// peak without checkpointing, so the plan must checkpoint: the predicted peaks against the run's ([`SCALE_STEPS`] steps, an
/// evaluation every [`SCALE_EVAL_EVERY`]).
pub fn run_scale(report: &mut Report) -> Result<()> {
    let corpus = CharCorpus::shakespeare()?;
    let vocab = corpus.vocab_size();
    let context = 256;
    let spec = GptSpec {
        export: Default::default(),
        arch: Default::default(),
        dropout: 0.0,
        attention: plimsoll_trainer::Attention::Auto,
        loss: plimsoll_trainer::LossHead::Chunked(SCALE_LOSS_CHUNK),
        config: GptConfig {
            vocab_size: GPT2_VOCAB,
            block_size: context,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
        },
        seed: 1,
        optimizer: OptimizerSpec::AdamW(AdamWConfig::default()),
    };
    let data = || -> Result<(Box<dyn plimsoll_trainer::Data>, Box<dyn plimsoll_trainer::Data>)> {
        let train = TokenData::windows(Arc::new(corpus.train().to_vec()), context, vocab)?;
        let val = TokenData::evenly_spaced(Arc::new(corpus.val().to_vec()), context, vocab, 2)?;
        Ok((Box::new(train), Box::new(val)))
    };
    let config = TrainConfig {
        effective_batch: 1,
        micro_batch: None,
        checkpointing: CheckpointPolicy::Automatic,
        eval_interval_steps: Some(SCALE_EVAL_EVERY),
        length: plimsoll_trainer::RunLength::Steps(SCALE_STEPS),
        fence_deadline: std::time::Duration::from_secs(600),
        ..TrainConfig::default()
    };
    // The budget: halfway between the least any choice needs (the plan's refusal of a budget
    // too small says it) and the peak without checkpointing.
    let plan_at = |budget: u64| -> Result<plimsoll_trainer::MemoryPlan, plimsoll_trainer::Error> {
        let gpu = Gpu::new()?;
        gpu.set_memory_budget(budget);
        let (train, test) =
            data().map_err(|e| plimsoll_trainer::Error::invalid("data", e.to_string()))?;
        plimsoll_trainer::plan::plan(&gpu, &spec, train.as_ref(), Some(test.as_ref()), &config)
    };
    let free = plan_at(64 << 30)?;
    let least = match plan_at(1 << 30) {
        Err(plimsoll_trainer::Error::BudgetTooSmall {
            predicted_bytes, ..
        }) => predicted_bytes,
        other => anyhow::bail!("a 1 GiB budget should be refused: {other:?}"),
    };
    let budget = (least + free.predicted_peak_reserved_bytes) / 2;
    let key = "plan/gpt2_small_context_256";
    report.push(format!("{key}/least_budget"), mb(least), "MB");
    let peak = free.predicted_peak_reserved_bytes;
    report.push(format!("{key}/peak_without_a_budget"), mb(peak), "MB");
    report.push(format!("{key}/budget"), mb(budget), "MB");
    let gpu = Gpu::new()?;
    gpu.set_memory_budget(budget);
    let cfg = TrainConfig {
        memory_budget_bytes: Some(budget),
        ..config
    };
    super::plan::predicted_against_run(report, "gpt2_small_context_256", &spec, data()?, cfg, &gpu)
}

/// Rows per chunk of the loss in the `scale` part: 4 chunks of the 256 rows.
const SCALE_LOSS_CHUNK: usize = 64;
/// Steps of the `scale` part's run.
const SCALE_STEPS: u64 = 4;
/// Steps between its evaluations.
const SCALE_EVAL_EVERY: u64 = 2;
