//! `plimsoll`: train the digits MLP or the peer benchmark workload, or print the memory plan.
//!
//! `plimsoll train digits` trains a 64-128-10 ReLU MLP on the bundled digits data (1,797 8x8
//! images; 20% held out) and prints test accuracy each epoch and the memory summary at the end.
//! `plimsoll train mlp-bench` is the peer workload (MLP 784-1024-1024-1024-10, ReLU,
//! cross-entropy, Adam, batch 128, synthetic data). `plimsoll plan <workload>` prints the
//! memory plan without training. Errors are one message with the numbers and a hint, and a
//! non-zero exit code.

mod out;
mod progress;
mod sampling;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::GpuOptions;
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::{
    CheckpointPolicy, Error, JsonLines, LeakPolicy, Result, TrainConfig, Trainer,
};

use progress::Progress;
use workloads::job;

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
    /// Generate text from a trained `shakespeare` model (its latest checkpoint).
    Sample(sampling::SampleArgs),
}

#[derive(Subcommand)]
enum Workload {
    /// An MLP on the bundled digits data (8x8 images, 10 classes).
    Digits(DigitsArgs),
    /// The peer benchmark: MLP 784-1024-1024-1024-10, ReLU, Adam, batch 128, synthetic data.
    MlpBench(BenchArgs),
    /// A character-level GPT (nanoGPT's CPU configuration) on the bundled Shakespeare plays.
    Shakespeare(ShakespeareArgs),
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
    /// Linear warm-up steps of the learning rate, then cosine decay to --min-lr over the run
    /// (default: the workload's; 0 with no --min-lr: a constant rate).
    #[arg(long)]
    warmup_steps: Option<u64>,
    /// The learning rate the cosine decay ends at (default: the workload's).
    #[arg(long)]
    min_lr: Option<f32>,
    /// Clip the global gradient norm to this (default: the workload's; 0: no clipping).
    #[arg(long)]
    clip_grad_norm: Option<f32>,
    /// AdamW weight decay, on weights and embeddings only (default: the workload's).
    #[arg(long)]
    weight_decay: Option<f32>,
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

/// The shape of a character-level GPT: `train shakespeare` builds it (these defaults when a flag
/// is absent) and records it in `run.json`; `sample` reads it from there.
#[derive(Args)]
struct GptShape {
    /// Tokens per window, the model's block size [default: 64].
    #[arg(long)]
    context: Option<usize>,
    /// Transformer blocks [default: 4].
    #[arg(long)]
    layers: Option<usize>,
    /// Attention heads, dividing --width [default: 4].
    #[arg(long)]
    heads: Option<usize>,
    /// Model width [default: 128].
    #[arg(long)]
    width: Option<usize>,
}

impl GptShape {
    /// The defaults: nanoGPT's CPU configuration.
    const DEFAULT: [usize; 4] = [64, 4, 4, 128];
    /// The names in `run.json` (and of the flags).
    const NAMES: [&str; 4] = ["context", "layers", "heads", "width"];

    fn given(&self) -> [Option<usize>; 4] {
        [self.context, self.layers, self.heads, self.width]
    }

    /// Context, layers, heads and width: the flags, else `recorded`, else the defaults. A flag
    /// that contradicts `recorded` (the shape a run was trained with) is an error naming both.
    fn resolve(&self, recorded: Option<[usize; 4]>) -> Result<[usize; 4]> {
        let mut shape = recorded.unwrap_or(Self::DEFAULT);
        for (i, given) in self.given().into_iter().enumerate() {
            match (given, recorded) {
                (Some(g), Some(r)) if g != r[i] => {
                    return Err(Error::invalid(
                        format!("--{}", Self::NAMES[i]),
                        format!(
                            "{g}, but the run was trained with {}; leave the flag out to use \
                             the run's",
                            r[i]
                        ),
                    ));
                }
                (Some(g), _) => shape[i] = g,
                (None, _) => {}
            }
        }
        for (value, name) in shape.iter().zip(Self::NAMES) {
            if *value == 0 {
                return Err(Error::invalid(
                    format!("--{name}"),
                    "0; it must be at least 1",
                ));
            }
        }
        let [_, _, heads, width] = shape;
        if !width.is_multiple_of(heads) {
            return Err(Error::invalid(
                "--heads",
                format!(
                    "{heads} does not divide --width {width}; pick a head count that divides the width"
                ),
            ));
        }
        Ok(shape)
    }

    /// The model's configuration over a vocabulary of `vocab_size` characters.
    fn config(shape: [usize; 4], vocab_size: usize) -> plimsoll_nn::GptConfig {
        let [block_size, n_layer, n_head, n_embd] = shape;
        plimsoll_nn::GptConfig {
            vocab_size,
            block_size,
            n_layer,
            n_head,
            n_embd,
        }
    }

    /// The shape as `run.json` records it.
    fn record(shape: [usize; 4]) -> serde_json::Value {
        Self::NAMES
            .iter()
            .zip(shape)
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

#[derive(Args)]
struct ShakespeareArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Optimizer steps.
    #[arg(long, default_value_t = 2000)]
    steps: u64,
    /// Windows per optimizer step.
    #[arg(long, default_value_t = 12)]
    batch: usize,
    #[command(flatten)]
    shape: GptShape,
    /// Evaluate the validation loss every N steps (and at the end).
    #[arg(long, default_value_t = 250)]
    eval_every: u64,
    /// Validation windows, evenly spaced over the last 10% of the text.
    #[arg(long, default_value_t = 240)]
    eval_windows: usize,
    /// Train on this text file (UTF-8, optionally .gz) instead of the bundled plays.
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
    let plan = plimsoll_trainer::plan::plan(&gpu, job.spec.as_ref(), &job.train, &config)?;
    out::say(format_args!("{} on {}", job.name, gpu.adapter()));
    out::say(&plan);
    Ok(())
}

fn train(workload: Workload, started: Instant) -> Result<()> {
    let (job, common) = job(workload)?;
    let gpu = open_gpu(&common)?;
    out::say(format_args!(
        "training {} ({} parameters) on {}",
        job.name,
        job.spec.parameter_count(),
        gpu.adapter()
    ));
    let checkpoint_dir = job.config.checkpoint_dir.clone();
    if let Some(dir) = &checkpoint_dir {
        record_run(dir, &job, &gpu, common.resume)?;
    }
    let mut trainer = Trainer::new(&gpu, job.config, job.spec.as_ref(), job.train, job.test)?;
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
    out::stop_on_close(trainer.stop_flag());
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
        let saved = match &summary.checkpoint {
            Some(p) => format!("saved {}; continue with --resume", p.display()),
            None => "nothing saved (no --checkpoint-dir)".to_string(),
        };
        let why = if out::closed() {
            "standard output closed"
        } else {
            "interrupted"
        };
        // Said on standard error too: standard output may be the pipe that closed.
        eprintln!("{why} at step {}; {saved}", summary.steps);
    }
    out::say(format_args!(
        "{} steps in {seconds:.1} s{}{}; first step done {:.2} s after start",
        summary.steps,
        summary
            .last_loss
            .map(|l| format!(", training loss {l:.4} (mean of the last steps)"))
            .unwrap_or_default(),
        summary
            .last_evaluation
            .map(|e| format!(", {}", progress::describe(&e)))
            .unwrap_or_default(),
        progress.first_step_done.unwrap_or_default().as_secs_f64()
    ));
    out::say(gpu.memory_summary());
    if let Some(e) = progress.metrics_error.take() {
        return Err(e);
    }
    Ok(())
}

/// Writes what this run was told into its checkpoint folder: `run.json`, or for a resumed run
/// `run-resumed.json` (the first record stays as it was).
fn record_run(dir: &std::path::Path, job: &workloads::Job, gpu: &Gpu, resume: bool) -> Result<()> {
    let record = serde_json::json!({
        "plimsoll": env!("CARGO_PKG_VERSION"),
        "command": std::env::args().collect::<Vec<_>>(),
        "workload": job.name,
        "model": job.spec.describe(),
        "parameters": job.spec.parameter_count(),
        "train_data": job.train.describe(),
        "eval_data": job.test.as_ref().map(|t| t.describe()),
        "config": job.config.to_json(),
        "adapter": gpu.adapter().to_string(),
        "gpt": job.gpt_shape.map(GptShape::record),
    });
    let name = if resume {
        "run-resumed.json"
    } else {
        "run.json"
    };
    plimsoll_trainer::checkpoint_io::save_record(dir, name, &record)?;
    Ok(())
}

fn main() -> ExitCode {
    let started = Instant::now();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train { workload } => train(workload, started),
        Command::Plan { workload } => plan_only(workload),
        Command::Sample(args) => sampling::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
