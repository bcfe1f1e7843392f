//! `cargo xtask soak`: long runs hold still. 10,000 steps of the digits MLP and 1,000 steps of
//! the shakespeare GPT (its default configuration), through the trainer's real step, in release.
//!
//! After a warm-up (the first tenth of the steps), allocated bytes, reserved bytes and the
//! process's resident memory (`VmRSS`) are sampled every step; what must show is that none of
//! them grows: the growth is the last sample minus the warm-up's, and the task fails if
//! allocated or reserved bytes grew at all or resident memory grew by more than 1 MiB (the C
//! allocator's own bookkeeping moves by pages). The step-time drift (median of the last tenth
//! over the median of the tenth after warm-up) is reported, not judged. No leak warning may
//! appear: the leak policy is `error`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use plimsoll_kernels_wgsl::{Gpu, GpuOptions};
use plimsoll_nn::{Activation, AdamWConfig, LrSchedule};
use plimsoll_trainer::{
    CharCorpus, CheckpointPolicy, Data, Dataset, LeakPolicy, ModelSpec, OptimizerSpec, Recipe,
    RunLength, TokenData, TrainConfig, Trainer,
};

/// The bundled digits table, as `plimsoll train digits` reads it.
const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");

/// Resident memory of this process in bytes (Linux's `/proc/self/status`), if known.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One soak: `steps` steps; returns whether it held still.
fn soak(
    name: &str,
    recipe: &dyn Recipe,
    data: Box<dyn Data>,
    batch: usize,
    steps: u64,
) -> Result<bool> {
    let gpu = Gpu::with_options(GpuOptions::from_env()).context("opening a device")?;
    let config = TrainConfig {
        effective_batch: batch,
        micro_batch: Some(batch),
        length: RunLength::Steps(steps),
        schedule: LrSchedule::Constant { lr: 1e-3 },
        checkpointing: CheckpointPolicy::None,
        fence_deadline: Duration::from_secs(60),
        leak_policy: LeakPolicy::Error,
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::new(&gpu, config, recipe, data, None)?;
    let warmup = (steps / 10).max(1);
    let start = Instant::now();
    // Every step's time, in memory made resident before the first step (written now), so the
    // soak's own bookkeeping does not show as growth; of the memory samples only the first
    // after warm-up, the last and the maxima are kept.
    let mut times = vec![f64::NAN; steps as usize];
    let mut first = None;
    let mut last = (0, 0, 0);
    let (mut max_allocated, mut max_reserved) = (0, 0);
    for step in 1..=steps {
        let report = trainer
            .step()
            .with_context(|| format!("{name}: step {step}"))?;
        if let Some(t) = times.get_mut(step as usize - 1) {
            *t = report.step_ms;
        }
        if step >= warmup {
            last = (
                report.allocated_bytes,
                report.reserved_bytes,
                resident_bytes().unwrap_or(0),
            );
            first.get_or_insert(last);
            max_allocated = max_allocated.max(last.0);
            max_reserved = max_reserved.max(last.1);
        }
    }
    let Some(first) = first else {
        bail!("{name}: no samples");
    };
    let growth = |a: u64, b: u64| i128::from(b) - i128::from(a);
    let allocated = growth(first.0, last.0);
    let reserved = growth(first.1, last.1);
    let resident = growth(first.2, last.2);
    let tenth = (steps as usize / 10).max(1);
    let early = median(times[warmup as usize..(warmup as usize + tenth).min(times.len())].to_vec());
    let late = median(times[times.len().saturating_sub(tenth)..].to_vec());
    println!(
        "{name}: {steps} steps in {:.0} s; after step {warmup}: allocated {} -> {} bytes \
         (growth {allocated}, max {max_allocated}), reserved {} -> {} (growth {reserved}, max \
         {max_reserved}), resident {} -> {} (growth {resident}); step time median {early:.2} ms \
         -> {late:.2} ms (drift {:.3})",
        start.elapsed().as_secs_f64(),
        first.0,
        last.0,
        first.1,
        last.1,
        first.2,
        last.2,
        late / early
    );
    let still = allocated <= 0
        && reserved <= 0
        && max_allocated <= first.0.max(last.0)
        && max_reserved <= first.1.max(last.1)
        && resident <= 1 << 20;
    if !trainer.log().iter().all(|l| !l.contains("leak")) {
        println!("{name}: leak warnings: {:?}", trainer.log());
        return Ok(false);
    }
    Ok(still)
}

/// `cargo xtask soak [digits-steps [gpt-steps]]` (defaults 10,000 and 1,000). In a debug build
/// it re-runs itself in release.
pub fn run(args: &[String]) -> Result<()> {
    if cfg!(debug_assertions) {
        let mut cargo_args = vec!["run", "--quiet", "--release", "--package", "plimsoll-xtask"];
        cargo_args.extend(["--", "soak"]);
        cargo_args.extend(args.iter().map(String::as_str));
        return crate::cargo(&cargo_args);
    }
    let count = |i: usize, default: u64| -> Result<u64> {
        args.get(i).map_or(Ok(default), |a| {
            a.parse()
                .with_context(|| format!("`{a}` is not a step count"))
        })
    };
    let (digits_steps, gpt_steps) = (count(0, 10_000)?, count(1, 1_000)?);
    let mut digits = Dataset::from_csv_gz_bytes("data/digits.csv.gz", DIGITS_CSV_GZ)?;
    digits.scale(1.0 / 16.0);
    let mlp = ModelSpec {
        widths: vec![64, 128, 10],
        activation: Activation::Relu,
        seed: 0,
        optimizer: OptimizerSpec::AdamW(AdamWConfig {
            weight_decay: 0.0,
            ..AdamWConfig::default()
        }),
    };
    let mut still = soak("digits", &mlp, Box::new(digits), 64, digits_steps)?;
    let corpus = CharCorpus::shakespeare()?;
    let vocab = corpus.vocab_size();
    let tokens = TokenData::windows(Arc::new(corpus.train().to_vec()), 64, vocab)?;
    let gpt = crate::bench::train_gpt::spec(vocab);
    still &= soak("shakespeare gpt", &gpt, Box::new(tokens), 12, gpt_steps)?;
    if !still {
        bail!("memory grew after warm-up (see above)");
    }
    Ok(())
}
