//! `plimsoll`: train the digits MLP or the peer benchmark workload, or print the memory plan.
//!
//! `plimsoll train digits` trains a 64-128-10 ReLU MLP on the bundled digits data (1,797 8x8
//! images; 20% held out) and prints test accuracy each epoch and the memory summary at the end.
//! `plimsoll train mlp-bench` is the peer workload (MLP 784-1024-1024-1024-10, ReLU,
//! cross-entropy, Adam, batch 128, synthetic data). `plimsoll plan <workload>` prints the
//! memory plan without training. Errors are one message with the numbers and a hint, and a
//! non-zero exit code.

mod progress;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::GpuOptions;
use plimsoll_nn::{Activation, AdamWConfig, LrSchedule};
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::{
    CheckpointPolicy, Data, Dataset, Error, JsonLines, LeakPolicy, ModelSpec, OptimizerSpec,
    Recipe, Result, RunLength, TrainConfig, Trainer,
};

use progress::Progress;

#[derive(Parser)]
#[command(
    name = "plimsoll",
    version,
    about = "Train neural networks on wgpu with memory and deadlines first"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a workload.
    Train {
        #[command(subcommand)]
        workload: Workload,
    },
    /// Print the memory plan (dry run of one micro-batch) without training.
    Plan {
        #[command(subcommand)]
        workload: Workload,
    },
}

#[derive(Subcommand)]
enum Workload {
    /// An MLP on the bundled digits data (8x8 images, 10 classes).
    Digits(DigitsArgs),
    /// The peer benchmark: MLP 784-1024-1024-1024-10, ReLU, Adam, batch 128, synthetic data.
    MlpBench(BenchArgs),
}

#[derive(Args)]
struct CommonArgs {
    /// Memory budget, e.g. `64MiB`, `1.5GB`, `100000000` (default: the adapter's).
    #[arg(long, value_parser = parse_bytes)]
    memory_budget: Option<u64>,
    /// Samples per forward/backward (default: the largest the memory plan allows).
    #[arg(long)]
    micro_batch: Option<usize>,
    /// Activation checkpointing: `none`, `auto`, or N (checkpoint every N modules).
    #[arg(long, default_value = "auto", value_parser = parse_checkpointing)]
    checkpointing: CheckpointPolicy,
    /// Learning rate (Adam).
    #[arg(long)]
    lr: Option<f32>,
    /// Seed of the data order and the model's initialisation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Adapter: backend (`vulkan`), type (`cpu`, `discrete`) or name substring (default:
    /// `PLIMSOLL_ADAPTER`, else the best one).
    #[arg(long)]
    adapter: Option<String>,
    /// Deadline of every GPU wait, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    deadline_ms: u64,
    /// Write one JSON line per step to this file.
    #[arg(long)]
    metrics_out: Option<PathBuf>,
    /// Directory of training checkpoints (default: target/plimsoll/digits for digits; none for
    /// mlp-bench).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every N steps (always at the end, on Ctrl-C and on timeout).
    #[arg(long)]
    checkpoint_every: Option<u64>,
    /// Continue from the latest checkpoint in the checkpoint directory.
    #[arg(long)]
    resume: bool,
    /// What the after-step leak check does: `off`, `warn` or `error`.
    #[arg(long, default_value = "warn", value_parser = parse_leak)]
    leak_check: LeakPolicy,
}

#[derive(Args)]
struct DigitsArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Passes over the training set.
    #[arg(long, default_value_t = 30)]
    epochs: u64,
    /// Effective batch (samples per optimizer step).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Hidden widths, comma-separated.
    #[arg(long, default_value = "128", value_delimiter = ',')]
    hidden: Vec<usize>,
    /// The data (gzip CSV: 64 pixels then the label per line).
    #[arg(long)]
    data: Option<PathBuf>,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Optimizer steps.
    #[arg(long, default_value_t = 25)]
    steps: u64,
    /// Effective batch.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Hidden layers of width 1024.
    #[arg(long, default_value_t = 3)]
    layers: usize,
}

fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} (use B, KB, KiB, MB, MiB, GB, GiB)"
            ));
        }
    };
    Ok((value * scale) as u64)
}

fn parse_checkpointing(s: &str) -> std::result::Result<CheckpointPolicy, String> {
    match s {
        "none" | "off" => Ok(CheckpointPolicy::None),
        "auto" => Ok(CheckpointPolicy::Automatic),
        n => match n.parse::<usize>() {
            Ok(k) if k > 0 => Ok(CheckpointPolicy::EveryBlocks(k)),
            _ => Err(format!(
                "{s:?}: use none, auto, or a positive number of modules"
            )),
        },
    }
}

fn parse_leak(s: &str) -> std::result::Result<LeakPolicy, String> {
    match s {
        "off" => Ok(LeakPolicy::Off),
        "warn" => Ok(LeakPolicy::Warn),
        "error" => Ok(LeakPolicy::Error),
        _ => Err(format!("{s:?}: use off, warn or error")),
    }
}

/// Everything a workload decides: the model, the data, the configuration.
struct Job {
    name: &'static str,
    spec: ModelSpec,
    train: Dataset,
    test: Option<Dataset>,
    config: TrainConfig,
}

fn digits_data(path: Option<PathBuf>) -> Result<Dataset> {
    let path = path.unwrap_or_else(|| {
        let local = PathBuf::from("data/digits.csv.gz");
        if local.exists() {
            local
        } else {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../data/digits.csv.gz"
            ))
        }
    });
    let mut data = Dataset::from_csv_gz(&path)?;
    data.scale(1.0 / 16.0);
    Ok(data)
}

/// The shared options; `default_dir`: the checkpoint directory when none is given.
fn base_config(
    common: &CommonArgs,
    default_dir: Option<&str>,
    batch: usize,
    lr: f32,
) -> TrainConfig {
    TrainConfig {
        effective_batch: batch,
        micro_batch: common.micro_batch,
        schedule: LrSchedule::Constant {
            lr: common.lr.unwrap_or(lr),
        },
        seed: common.seed,
        memory_budget_bytes: common.memory_budget,
        checkpointing: common.checkpointing,
        fence_deadline: Duration::from_millis(common.deadline_ms.max(1)),
        checkpoint_dir: common
            .checkpoint_dir
            .clone()
            .or_else(|| default_dir.map(PathBuf::from)),
        checkpoint_interval_steps: common.checkpoint_every,
        leak_policy: common.leak_check,
        ..TrainConfig::default()
    }
}

fn adam() -> OptimizerSpec {
    OptimizerSpec::AdamW(AdamWConfig {
        weight_decay: 0.0,
        ..AdamWConfig::default()
    })
}

fn job(workload: Workload) -> Result<(Job, CommonArgs)> {
    Ok(match workload {
        Workload::Digits(a) => {
            let data = digits_data(a.data)?;
            let (train, test) = data.split(0.2, 1234);
            let mut widths = vec![train.feature_dim()];
            widths.extend(a.hidden.iter().copied().filter(|&w| w > 0));
            widths.push(train.num_classes());
            let mut config = base_config(&a.common, Some("target/plimsoll/digits"), a.batch, 2e-3);
            config.length = RunLength::Epochs(a.epochs);
            let spec = ModelSpec {
                widths,
                activation: Activation::Relu,
                seed: a.common.seed,
                optimizer: adam(),
            };
            let job = Job {
                name: "digits",
                spec,
                train,
                test: Some(test),
                config,
            };
            (job, a.common)
        }
        Workload::MlpBench(a) => {
            let train = Dataset::synthetic(a.batch * 4, 784, 10, a.common.seed)?;
            let mut widths = vec![784];
            widths.extend(std::iter::repeat_n(1024, a.layers));
            widths.push(10);
            let mut config = base_config(&a.common, None, a.batch, 1e-3);
            config.length = RunLength::Steps(a.steps);
            if a.common.memory_budget.is_none() {
                // The peer workload runs plain batches of 128; plan only under a budget.
                config.micro_batch = Some(a.common.micro_batch.unwrap_or(a.batch));
                if config.checkpointing == CheckpointPolicy::Automatic {
                    config.checkpointing = CheckpointPolicy::None;
                }
            }
            let spec = ModelSpec {
                widths,
                activation: Activation::Relu,
                seed: a.common.seed,
                optimizer: adam(),
            };
            let job = Job {
                name: "mlp-bench",
                spec,
                train,
                test: None,
                config,
            };
            (job, a.common)
        }
    })
}

fn open_gpu(common: &CommonArgs) -> Result<Gpu> {
    let from_env = GpuOptions::from_env();
    let options = GpuOptions {
        adapter: common
            .adapter
            .clone()
            .filter(|s| !s.trim().is_empty())
            .or(from_env.adapter),
        memory_budget_bytes: common.memory_budget,
        default_deadline: Some(Duration::from_millis(common.deadline_ms.max(1))),
        ..GpuOptions::default()
    };
    Ok(Gpu::with_options(options)?)
}

fn plan_only(workload: Workload) -> Result<()> {
    let (job, common) = job(workload)?;
    let gpu = open_gpu(&common)?;
    let config = TrainConfig {
        micro_batch: common.micro_batch,
        ..job.config
    };
    let plan = plimsoll_trainer::plan::plan(&gpu, &job.spec, &job.train, &config)?;
    println!("{} on {}", job.name, gpu.adapter());
    println!("{plan}");
    Ok(())
}

fn train(workload: Workload, started: Instant) -> Result<()> {
    let (job, common) = job(workload)?;
    let gpu = open_gpu(&common)?;
    println!(
        "training {} ({} parameters) on {}",
        job.name,
        Recipe::parameter_count(&job.spec),
        gpu.adapter()
    );
    let checkpoint_dir = job.config.checkpoint_dir.clone();
    let test = job.test.map(|t| Box::new(t) as Box<dyn Data>);
    let mut trainer = Trainer::new(&gpu, job.config, &job.spec, job.train, test)?;
    if common.resume {
        let Some(dir) = checkpoint_dir else {
            return Err(Error::invalid("--resume", "needs --checkpoint-dir"));
        };
        let path = latest_path(&dir);
        if !path.exists() {
            return Err(Error::invalid(
                "--resume",
                format!(
                    "no checkpoint at {}; train without --resume first",
                    path.display()
                ),
            ));
        }
        trainer.resume(&path)?;
    }
    let stop = trainer.stop_flag();
    ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
        .map_err(|e| Error::invalid("Ctrl-C handler", e.to_string()))?;
    let metrics = match &common.metrics_out {
        Some(p) => Some(JsonLines::create(p, common.resume)?),
        None => None,
    };
    let mut progress = Progress::new(
        trainer.total_steps(),
        trainer.position().step,
        metrics,
        started,
    );
    let run_start = Instant::now();
    let summary = trainer.run(&mut progress);
    progress.finish();
    let summary = summary?;
    let seconds = run_start.elapsed().as_secs_f64();
    if summary.interrupted {
        println!(
            "interrupted at step {}; saved {}; continue with --resume",
            summary.steps,
            summary
                .checkpoint
                .as_ref()
                .map_or("nothing".to_string(), |p| p.display().to_string())
        );
    }
    println!(
        "{} steps in {seconds:.1} s{}{}; first step done {:.2} s after start",
        summary.steps,
        summary
            .last_loss
            .map(|l| format!(", final loss {l:.4}"))
            .unwrap_or_default(),
        summary
            .last_evaluation
            .map(|e| format!(", {}", progress::describe(&e)))
            .unwrap_or_default(),
        progress.first_step_done.unwrap_or_default().as_secs_f64()
    );
    println!("{}", gpu.memory_summary());
    if let Some(e) = progress.metrics_error.take() {
        return Err(e);
    }
    Ok(())
}

fn main() -> ExitCode {
    let started = Instant::now();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train { workload } => train(workload, started),
        Command::Plan { workload } => plan_only(workload),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
