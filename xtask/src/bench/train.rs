//! The train suite: the peer workload (MLP 784-1024-1024-1024-10, ReLU, cross-entropy, Adam,
//! batch 128, synthetic data) through `plimsoll-trainer`'s real step (micro-batch 128, leak
//! check on, no checkpointing): median step time and GFLOP/s over 20 steps after 5 warm-up
//! steps, peak allocated and reserved bytes against the analytic minimum; the time from process
//! start to the end of the first step, measured by spawning `plimsoll train mlp-bench --steps 1`
//! (cold process: adapter, device, pipelines, plus the process's own exit); and a 12-layer,
//! 1024-wide MLP with and without activation checkpointing (peak activation bytes, step time);
//! and the Shakespeare GPT (see `train_gpt.rs`).
//!
//! Analytic minimum: parameters + gradients + two Adam moments (16 bytes per parameter) plus the
//! activations that must be live at the start of backward: the input batch, one `(B, 1024)`
//! tensor per hidden layer (the ReLU output, which both ReLU's and the next matmul's backward
//! need) and the logits.
//!
//! Floors (reference: Burn 0.22.1 on the same lavapipe, 491 ms per step, 70-73 MB reserved,
//! 166 s to its first steps from a cold start): faster per step than 491 ms, reserved <= 1.05 x
//! the analytic minimum, first step in under 3 s. Printed as met or not; never asserted.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use plimsoll_kernels_wgsl::{Category, Gpu};
use plimsoll_nn::{Activation, AdamWConfig, LrSchedule};
use plimsoll_trainer::{
    CheckpointPolicy, Dataset, LeakPolicy, ModelSpec, OptimizerSpec, RunLength, TrainConfig,
    Trainer,
};

use super::Report;

/// FLOP per step of the peer workload (forward + backward of its matmuls), as quoted.
const PEER_GFLOP_PER_STEP: f64 = 2.235;
const PEER_WIDTHS: [usize; 5] = [784, 1024, 1024, 1024, 10];
const BATCH: usize = 128;
const WARMUP_STEPS: usize = 5;
const TIMED_STEPS: usize = 20;
/// Burn 0.22.1 on the same lavapipe.
const BURN_STEP_MS: f64 = 491.0;

/// Runs the train suite.
pub fn run() -> Result<Report> {
    let mut report = Report::new("train");
    peer_workload(&mut report)?;
    first_step_cold(&mut report)?;
    deep_checkpointing(&mut report)?;
    super::train_gpt::run(&mut report)?;
    Ok(report)
}

fn spec(widths: Vec<usize>) -> ModelSpec {
    ModelSpec {
        widths,
        activation: Activation::Relu,
        seed: 1,
        optimizer: OptimizerSpec::AdamW(AdamWConfig {
            weight_decay: 0.0,
            ..AdamWConfig::default()
        }),
    }
}

fn config(steps: u64, checkpointing: CheckpointPolicy) -> TrainConfig {
    TrainConfig {
        effective_batch: BATCH,
        micro_batch: Some(BATCH),
        length: RunLength::Steps(steps),
        schedule: LrSchedule::Constant { lr: 1e-3 },
        checkpointing,
        fence_deadline: Duration::from_secs(300),
        leak_policy: LeakPolicy::Warn,
        ..TrainConfig::default()
    }
}

/// Parameters + gradients + Adam moments + the live activations at the start of backward.
fn analytic_minimum_bytes(widths: &[usize], batch: usize) -> u64 {
    let params: usize = widths.windows(2).map(|w| w[0] * w[1] + w[1]).sum();
    let activations: usize = widths.iter().map(|w| batch * w).sum();
    4 * (4 * params + activations) as u64
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(super) fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn floor(met: bool) -> &'static str {
    if met { "met" } else { "NOT met" }
}

/// Runs `warmup + timed` steps; returns the timed steps' milliseconds and the peaks over all
/// steps: (allocated, reserved, activation).
pub(super) fn steps(
    trainer: &mut Trainer,
    warmup: usize,
    timed: usize,
) -> Result<(Vec<f64>, [u64; 3])> {
    let mut times = Vec::new();
    let mut peaks = [0u64; 3];
    for i in 0..warmup + timed {
        let r = trainer.step()?;
        if i >= warmup {
            times.push(r.step_ms);
        }
        let activation = trainer.gpu().with_allocator(|a| {
            a.stats()
                .category(Category::Activation)
                .peak_allocated_bytes
        });
        peaks[0] = peaks[0].max(r.peak_allocated_bytes);
        peaks[1] = peaks[1].max(r.peak_reserved_bytes);
        peaks[2] = peaks[2].max(activation);
    }
    Ok((times, peaks))
}

fn peer_workload(report: &mut Report) -> Result<()> {
    let gpu = Gpu::new()?;
    println!("train: adapter {}", gpu.adapter());
    let data = Dataset::synthetic(BATCH * 4, PEER_WIDTHS[0], 10, 5)?;
    let steps_total = (WARMUP_STEPS + TIMED_STEPS) as u64;
    let mut trainer = Trainer::new(
        &gpu,
        config(steps_total, CheckpointPolicy::None),
        &spec(PEER_WIDTHS.to_vec()),
        data,
        None,
    )?;
    let (times, [allocated, reserved, _]) = steps(&mut trainer, WARMUP_STEPS, TIMED_STEPS)?;
    let step_ms = median(times);
    let minimum = analytic_minimum_bytes(&PEER_WIDTHS, BATCH);
    report.push("mlp_bench/step_median", step_ms, "ms");
    report.push(
        "mlp_bench/throughput",
        PEER_GFLOP_PER_STEP / (step_ms / 1e3),
        "GFLOP/s",
    );
    report.push("mlp_bench/peak_allocated", mb(allocated), "MB");
    report.push("mlp_bench/peak_reserved", mb(reserved), "MB");
    report.push("mlp_bench/analytic_minimum", mb(minimum), "MB");
    report.push(
        "mlp_bench/reserved_over_minimum",
        reserved as f64 / minimum as f64,
        "ratio",
    );
    report.push(
        "mlp_bench/allocated_over_minimum",
        allocated as f64 / minimum as f64,
        "ratio",
    );
    println!(
        "train: floor step < {BURN_STEP_MS} ms (Burn): {}; reserved <= 1.05 x minimum: {}",
        floor(step_ms < BURN_STEP_MS),
        floor(reserved as f64 <= 1.05 * minimum as f64)
    );
    Ok(())
}

/// Spawns `plimsoll train mlp-bench --steps 1` (built first, in release) and times it from
/// spawn to exit; also reports the process's own figure (main's start to the end of step 1).
fn first_step_cold(report: &mut Report) -> Result<()> {
    crate::cargo(&[
        "build",
        "--quiet",
        "--release",
        "-p",
        "plimsoll-trainer",
        "--bin",
        "plimsoll",
    ])?;
    // Where cargo put it: CARGO_TARGET_DIR when set (relative to the workspace), else target/.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "target".into());
    let exe = crate::workspace_root()
        .join(target)
        .join("release")
        .join("plimsoll");
    let start = Instant::now();
    let output = std::process::Command::new(&exe)
        .args(["train", "mlp-bench", "--steps", "1", "--leak-check", "warn"])
        .output()
        .with_context(|| format!("could not start {}", exe.display()))?;
    let wall = start.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        anyhow::bail!(
            "plimsoll train mlp-bench failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let in_process = stdout
        .lines()
        .find_map(|l| l.split("first step done ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    report.push("mlp_bench/first_step_cold_process_spawn_to_exit", wall, "s");
    report.push(
        "mlp_bench/first_step_cold_process_start_to_step_end",
        in_process,
        "s",
    );
    println!("train: floor first step < 3 s: {}", floor(wall < 3.0));
    Ok(())
}

fn deep_checkpointing(report: &mut Report) -> Result<()> {
    let mut widths = vec![1024; 12];
    widths.push(10);
    for (name, policy) in [
        ("none", CheckpointPolicy::None),
        ("every_6_modules", CheckpointPolicy::EveryBlocks(6)),
    ] {
        let gpu = Gpu::new()?;
        let data = Dataset::synthetic(BATCH * 2, 1024, 10, 9)?;
        let mut trainer = Trainer::new(&gpu, config(8, policy), &spec(widths.clone()), data, None)?;
        let (times, [allocated, _, activation]) = steps(&mut trainer, 2, 5)?;
        report.push(
            format!("mlp12x1024/checkpointing_{name}/step_median"),
            median(times),
            "ms",
        );
        report.push(
            format!("mlp12x1024/checkpointing_{name}/peak_activation"),
            mb(activation),
            "MB",
        );
        report.push(
            format!("mlp12x1024/checkpointing_{name}/peak_allocated"),
            mb(allocated),
            "MB",
        );
    }
    Ok(())
}
