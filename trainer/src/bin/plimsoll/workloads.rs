//! The workloads of `plimsoll train` and `plimsoll plan`: each decides the model, the data and
//! the configuration of its run ([`Job`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use plimsoll_nn::{Activation, AdamWConfig, LrSchedule};
use plimsoll_trainer::data::DIGITS_CSV_GZ;
use plimsoll_trainer::text::SHAKESPEARE_GZ;
use plimsoll_trainer::{
    CharCorpus, CheckpointPolicy, Data, Dataset, Error, GptSpec, ModelSpec, OptimizerSpec, Recipe,
    Result, RunLength, TokenData, TrainConfig,
};

use crate::{CommonArgs, GptShape, Workload};

/// Everything a workload decides: the model, the data, the configuration.
pub struct Job {
    /// The workload's name.
    pub name: &'static str,
    /// What to build.
    pub spec: Box<dyn Recipe>,
    /// Training samples.
    pub train: Box<dyn Data>,
    /// Evaluation samples.
    pub test: Option<Box<dyn Data>>,
    /// The run.
    pub config: TrainConfig,
    /// A GPT's context, layers, heads and width (recorded in `run.json` for `sample`).
    pub gpt_shape: Option<[usize; 4]>,
    /// Where the training data came from and its SHA-256 (`run.json`'s `data`; a resumed run
    /// checks it).
    pub data: DataSource,
}

/// The origin of a run's data: a file (absolute path) or the bundled copy, and a checksum of
/// its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct DataSource {
    /// `bundled data/digits.csv.gz`, an absolute path, or `synthetic ...`.
    pub source: String,
    /// SHA-256 of the bytes, hex.
    pub sha256: String,
}

impl DataSource {
    /// The bundled `bytes` (named `name`), or the file at `path`.
    fn of(path: Option<&Path>, name: &str, bundled: &[u8]) -> Result<DataSource> {
        use sha2::Digest;
        let (source, bytes) = match path {
            None => (
                format!("bundled {name}"),
                std::borrow::Cow::Borrowed(bundled),
            ),
            Some(p) => {
                let bytes = std::fs::read(p).map_err(|source| Error::Io {
                    path: p.to_path_buf(),
                    source,
                })?;
                let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
                (abs.display().to_string(), std::borrow::Cow::Owned(bytes))
            }
        };
        let digest = sha2::Sha256::digest(&bytes);
        let sha256 = digest.iter().map(|b| format!("{b:02x}")).collect();
        Ok(DataSource { source, sha256 })
    }

    /// As `run.json` records it.
    pub fn record(&self) -> serde_json::Value {
        serde_json::json!({ "source": self.source, "sha256": self.sha256 })
    }
}

/// A workload's defaults for the optimisation flags.
struct Defaults {
    lr: f32,
    warmup_steps: u64,
    min_lr: Option<f32>,
    clip_grad_norm: Option<f32>,
    weight_decay: f32,
}

fn digits_data(path: Option<PathBuf>) -> Result<Dataset> {
    let mut data = match path {
        Some(path) => Dataset::from_csv_gz(&path)?,
        None => Dataset::from_csv_gz_bytes("data/digits.csv.gz", DIGITS_CSV_GZ)?,
    };
    data.scale(1.0 / 16.0);
    Ok(data)
}

/// The shared options over a workload's `defaults`; `steps`: the run's length in steps, for
/// the schedule's decay. The checkpoint directory is the run's, set by the caller.
fn base_config(
    common: &CommonArgs,
    batch: usize,
    steps: u64,
    defaults: &Defaults,
) -> Result<TrainConfig> {
    let lr = common.lr.unwrap_or(defaults.lr);
    let warmup_steps = common.warmup_steps.unwrap_or(defaults.warmup_steps);
    let min_lr = common.min_lr.or(defaults.min_lr);
    for (flag, value) in [("--lr", Some(lr)), ("--min-lr", min_lr)] {
        if let Some(v) = value
            && !(v.is_finite() && v >= 0.0)
        {
            return Err(Error::invalid(flag, format!("{v} must be finite and >= 0")));
        }
    }
    let schedule = match (warmup_steps, min_lr) {
        (0, None) => LrSchedule::Constant { lr },
        (warmup_steps, min_lr) => LrSchedule::WarmupCosine {
            peak_lr: lr,
            warmup_steps,
            total_steps: steps,
            min_lr: min_lr.unwrap_or(lr),
        },
    };
    let clip_grad_norm = common
        .clip_grad_norm
        .or(defaults.clip_grad_norm)
        .filter(|&c| c != 0.0);
    Ok(TrainConfig {
        effective_batch: batch,
        micro_batch: common.micro_batch,
        schedule,
        seed: common.seed,
        memory_budget_bytes: common.device.memory_budget,
        checkpointing: common.checkpointing,
        fence_deadline: common.device.deadline(),
        checkpoint_dir: None,
        checkpoint_interval_steps: common.checkpoint_every,
        leak_policy: common.leak_check,
        clip_grad_norm,
        memory_timeline: common.memory_timeline.0,
        profile_steps: common.profile_steps.0,
        allocator: common.allocator,
        precision: common.precision,
        ..TrainConfig::default()
    })
}

/// AdamW with `betas`, the workload's (or the flag's) weight decay on matrices only.
fn adamw(common: &CommonArgs, defaults: &Defaults, beta2: f32) -> Result<OptimizerSpec> {
    let weight_decay = common.weight_decay.unwrap_or(defaults.weight_decay);
    if !(weight_decay.is_finite() && weight_decay >= 0.0) {
        return Err(Error::invalid(
            "--weight-decay",
            format!("{weight_decay} must be finite and >= 0"),
        ));
    }
    Ok(OptimizerSpec::AdamW(AdamWConfig {
        beta2,
        weight_decay,
        decay_matrices_only: true,
        ..AdamWConfig::default()
    }))
}

/// The MLP workloads' defaults: Adam, a constant rate.
fn mlp_defaults(lr: f32) -> Defaults {
    Defaults {
        lr,
        warmup_steps: 0,
        min_lr: None,
        clip_grad_norm: None,
        weight_decay: 0.0,
    }
}

/// A ReLU MLP classifier of `widths` trained on `train`, with no evaluation set yet.
fn mlp_job(
    name: &'static str,
    widths: Vec<usize>,
    seed: u64,
    optimizer: OptimizerSpec,
    config: TrainConfig,
    train: Dataset,
) -> Job {
    let spec = ModelSpec {
        widths,
        activation: Activation::Relu,
        seed,
        optimizer,
    };
    Job {
        name,
        spec: Box::new(spec),
        train: Box::new(train),
        test: None,
        config,
        gpt_shape: None,
        data: DataSource {
            source: String::new(),
            sha256: String::new(),
        },
    }
}

/// The job of `workload`, and its shared options.
pub fn job(workload: Workload) -> Result<(Job, CommonArgs)> {
    Ok(match workload {
        Workload::Digits(a) => {
            let source = DataSource::of(a.data.as_deref(), "data/digits.csv.gz", DIGITS_CSV_GZ)?;
            let data = digits_data(a.data)?;
            let (train, test) = data.split(0.2, 1234);
            let mut widths = vec![train.feature_dim()];
            widths.extend(a.hidden.iter().copied().filter(|&w| w > 0));
            widths.push(train.num_classes());
            let steps = a
                .epochs
                .saturating_mul(train.len().div_ceil(a.batch.max(1)) as u64);
            let defaults = mlp_defaults(2e-3);
            let mut config = base_config(&a.common, a.batch, steps, &defaults)?;
            config.length = RunLength::Epochs(a.epochs);
            let optimizer = adamw(&a.common, &defaults, 0.999)?;
            let job = mlp_job("digits", widths, a.common.seed, optimizer, config, train);
            let job = Job {
                test: Some(Box::new(test)),
                data: source,
                ..job
            };
            (job, a.common)
        }
        Workload::MlpBench(a) => {
            let samples = a.batch.checked_mul(4).ok_or_else(|| {
                Error::invalid("--batch", format!("{} is too large to count", a.batch))
            })?;
            let train = Dataset::synthetic(samples, 784, 10, a.common.seed)?;
            let mut widths = vec![784];
            widths.extend(std::iter::repeat_n(1024, a.layers));
            widths.push(10);
            let defaults = mlp_defaults(1e-3);
            let mut config = base_config(&a.common, a.batch, a.steps, &defaults)?;
            config.length = RunLength::Steps(a.steps);
            if a.common.device.memory_budget.is_none() {
                // The peer workload runs plain batches of 128; plan only under a budget.
                config.micro_batch = Some(a.common.micro_batch.unwrap_or(a.batch));
                if config.checkpointing == CheckpointPolicy::Automatic {
                    config.checkpointing = CheckpointPolicy::None;
                }
            }
            let optimizer = adamw(&a.common, &defaults, 0.999)?;
            let mut job = mlp_job("mlp-bench", widths, a.common.seed, optimizer, config, train);
            job.data = DataSource {
                source: format!(
                    "synthetic: {samples} samples of 784 features, seed {}",
                    a.common.seed
                ),
                sha256: String::new(),
            };
            (job, a.common)
        }
        Workload::Shakespeare(a) => {
            let source =
                DataSource::of(a.data.as_deref(), "data/shakespeare.txt.gz", SHAKESPEARE_GZ)?;
            let corpus = match &a.data {
                None => CharCorpus::shakespeare()?,
                Some(path) => CharCorpus::from_file(path, 0.1)?,
            };
            let vocab = corpus.vocab_size();
            let shape = a.shape.resolve(None)?;
            let context = shape[0];
            let train = TokenData::windows(Arc::new(corpus.train().to_vec()), context, vocab)?;
            let val = TokenData::evenly_spaced(
                Arc::new(corpus.val().to_vec()),
                context,
                vocab,
                a.eval_windows,
            )?;
            // nanoGPT's CPU configuration (its README): lr 1e-3, 100 warm-up steps, cosine to
            // 1e-4 over the run, clipping at 1.0, AdamW betas (0.9, 0.99), weight decay 0.1.
            let defaults = Defaults {
                lr: 1e-3,
                warmup_steps: 100,
                min_lr: Some(1e-4),
                clip_grad_norm: Some(1.0),
                weight_decay: 0.1,
            };
            let mut config = base_config(&a.common, a.batch, a.steps, &defaults)?;
            config.length = RunLength::Steps(a.steps);
            config.eval_interval_steps = Some(a.eval_every.max(1));
            let spec = GptSpec {
                config: GptShape::config(shape, vocab),
                seed: a.common.seed,
                optimizer: adamw(&a.common, &defaults, 0.99)?,
            };
            spec.config.validate()?;
            let job = Job {
                name: "shakespeare",
                spec: Box::new(spec),
                train: Box::new(train),
                test: Some(Box::new(val)),
                config,
                gpt_shape: Some(shape),
                data: source,
            };
            (job, a.common)
        }
    })
}
