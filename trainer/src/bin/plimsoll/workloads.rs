//! The workloads of `plimsoll train` and `plimsoll plan`: each decides the model, the data and
//! the configuration of its run ([`Job`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use plimsoll_nn::{Activation, AdamWConfig, LrSchedule, ResNetConfig};
use plimsoll_trainer::config::describe_schedule;
use plimsoll_trainer::data::DIGITS_CSV_GZ;
use plimsoll_trainer::data::Tokens;
use plimsoll_trainer::model::plain_number;
use plimsoll_trainer::text::{SHAKESPEARE_GZ, read_text};
use plimsoll_trainer::{
    Arch, Attention, CharCorpus, CheckpointPolicy, CnnSpec, Data, Dataset, Error, ExportLayout,
    GptSpec, ImageSet, ImageTransform, LlamaShape, ModelSpec, OptimizerSpec, Recipe, ResNetSpec,
    Result, RunLength, SyntheticImages, TokenData, TokenFolder, Tokenizer, TrainConfig,
};

use crate::{
    ArchArg, AttentionArg, CommonArgs, DigitsModel, ExportArg, GptShape, Preset, ResNetArgs,
    ShakespeareArgs, TokenizerArg, Workload,
};

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
    /// A language model's family and vocabulary (recorded in `run.json` for `sample`).
    pub lm: Option<(Arch, usize)>,
    /// Where the training data came from and its SHA-256 (`run.json`'s `data`; a resumed run
    /// checks it).
    pub data: DataSource,
    /// The optimizer the model trains with (its `lr` is the schedule's peak).
    pub optimizer: OptimizerSpec,
    /// What the job changed of what it was given, in words (a default shortened to fit the
    /// run), for the command to print before it runs.
    pub notes: Vec<String>,
    /// A GPT's tokenizer (`sample` decodes with it).
    pub tokenizer: Option<Tokenizer>,
}

impl Job {
    /// The optimizer as it trains, as `run.json` records it: its name and settings, the peak
    /// learning rate, the schedule (warm-up, floor, decay length) and the gradient clipping.
    pub fn optimizer_record(&self) -> serde_json::Value {
        let mut record = self.optimizer.to_json();
        let config = &self.config;
        let (warmup_steps, min_lr, decay_ends) = match config.schedule {
            LrSchedule::Constant { .. } => (0, None, None),
            LrSchedule::WarmupCosine {
                warmup_steps,
                total_steps,
                min_lr,
                ..
            } => (warmup_steps, Some(min_lr), Some(total_steps)),
        };
        record["schedule"] = describe_schedule(&config.schedule).into();
        record["warmup_steps"] = warmup_steps.into();
        record["min_lr"] = min_lr.map_or(serde_json::Value::Null, plain_number);
        record["decay_ends_at_step"] = decay_ends.into();
        record["clip_grad_norm"] = config
            .clip_grad_norm
            .map_or(serde_json::Value::Null, plain_number);
        record
    }
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

/// Refuses an effective batch larger than the `samples` there are to train on (`what`: the
/// samples' name): one step would see each sample at most once and the rest of the batch
/// would never be filled.
fn check_batch(batch: usize, samples: usize, what: &str) -> Result<()> {
    if batch > samples {
        return Err(Error::invalid(
            "--batch",
            format!(
                "{batch}, but the training set has only {samples} {what}; give a --batch of at \
                 most {samples}"
            ),
        ));
    }
    Ok(())
}

/// The learning rate, the warm-up and the floor, from the flags over the workload's defaults.
/// A flag that contradicts another (a floor above the peak, a warm-up longer than the run's
/// `steps`) is an error; a workload default that does not fit the run is shortened to fit,
/// and `notes` says so.
fn schedule_values(
    common: &CommonArgs,
    steps: u64,
    defaults: &Defaults,
    notes: &mut Vec<String>,
) -> Result<(f32, u64, Option<f32>)> {
    let lr = common.lr.unwrap_or(defaults.lr);
    for (flag, value) in [("--lr", Some(lr)), ("--min-lr", common.min_lr)] {
        if let Some(v) = value
            && !(v.is_finite() && v >= 0.0)
        {
            return Err(Error::invalid(flag, format!("{v} must be finite and >= 0")));
        }
    }
    let lr_source = match common.lr {
        Some(_) => "--lr",
        None => "the workload's default --lr",
    };
    let min_lr = match (common.min_lr, defaults.min_lr) {
        (Some(min), _) if min > lr => {
            return Err(Error::invalid(
                "--min-lr",
                format!(
                    "{min} is above the peak learning rate {lr} ({lr_source}): the rate would \
                     rise as it decays; give a --min-lr of at most {lr}, or a --lr of at least \
                     {min}"
                ),
            ));
        }
        (Some(min), _) => Some(min),
        (None, Some(min)) if min > lr => {
            notes.push(format!(
                "note: the workload's --min-lr {min} is above --lr {lr}; the rate decays to \
                 {lr} instead (no decay), give --min-lr to choose the floor"
            ));
            Some(lr)
        }
        (None, min) => min,
    };
    let warmup_steps = match common.warmup_steps {
        Some(w) if w > steps => {
            return Err(Error::invalid(
                "--warmup-steps",
                format!(
                    "{w}, but the run has only {steps} steps; give --warmup-steps of at most \
                     {steps} (or a longer run)"
                ),
            ));
        }
        Some(w) => w,
        None if defaults.warmup_steps > steps => {
            notes.push(format!(
                "note: the workload's {} warm-up steps are more than the run's {steps}; the \
                 warm-up takes {steps} steps instead (give --warmup-steps to choose)",
                defaults.warmup_steps
            ));
            steps
        }
        None => defaults.warmup_steps,
    };
    Ok((lr, warmup_steps, min_lr))
}

/// The shared options over a workload's `defaults`; `steps`: the run's length in steps, for
/// the schedule's decay (see [`schedule_values`]; `notes` gets what was shortened). The
/// checkpoint directory is the run's, set by the caller.
fn base_config(
    common: &CommonArgs,
    batch: usize,
    steps: u64,
    defaults: &Defaults,
    notes: &mut Vec<String>,
) -> Result<TrainConfig> {
    let (lr, warmup_steps, min_lr) = schedule_values(common, steps, defaults, notes)?;
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
        offload: common.offload,
        host_memory_budget: common.host_memory_budget,
        shard: common.shard,
        prefetch: common.prefetch,
        snapshot_every: common.snapshot_every,
        max_device_losses: common.max_device_losses,
        ..TrainConfig::default()
    })
}

/// AdamW with `betas`, the workload's (or the flag's) peak learning rate and weight decay on
/// matrices only.
fn adamw(common: &CommonArgs, defaults: &Defaults, beta2: f32) -> Result<OptimizerSpec> {
    let lr = common.lr.unwrap_or(defaults.lr);
    let weight_decay = common.weight_decay.unwrap_or(defaults.weight_decay);
    if !(weight_decay.is_finite() && weight_decay >= 0.0) {
        return Err(Error::invalid(
            "--weight-decay",
            format!("{weight_decay} must be finite and >= 0"),
        ));
    }
    Ok(OptimizerSpec::AdamW(AdamWConfig {
        lr,
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
        lm: None,
        data: DataSource {
            source: String::new(),
            sha256: String::new(),
        },
        optimizer,
        notes: Vec::new(),
        tokenizer: None,
    }
}

/// The one-channel square image of `features` pixels (the digits' 64: 8x8), for `--model cnn`.
fn square_image(features: usize) -> Result<[usize; 3]> {
    let side = (features as f64).sqrt().round() as usize;
    if side == 0 || side * side != features {
        return Err(Error::invalid(
            "--model",
            format!(
                "cnn reads each row as a square one-channel image, and {features} pixels are \
                 not a square; use --model mlp for this data"
            ),
        ));
    }
    Ok([1, side, side])
}

/// Refuses a `--context` the text cannot hold (a window is `context + 1` tokens, of the
/// `train_tokens` and of the `val_tokens`: the last 10%) and more `--eval-windows` than the
/// validation text has distinct windows.
fn check_text(
    context: usize,
    eval_windows: usize,
    (train_tokens, val_tokens): (usize, usize),
    val_name: &str,
) -> Result<()> {
    let (part, tokens) = match train_tokens <= val_tokens {
        true => ("training text", train_tokens),
        false => (val_name, val_tokens),
    };
    if context >= tokens {
        return Err(Error::invalid(
            "--context",
            format!(
                "{context}, but the {part} has {tokens} tokens and a window needs context + 1; \
                 give a --context of at most {}, or more text",
                tokens.saturating_sub(1)
            ),
        ));
    }
    let windows = val_tokens - context;
    if eval_windows > windows {
        return Err(Error::invalid(
            "--eval-windows",
            format!(
                "{eval_windows}, but the {val_name} ({val_tokens} tokens) has only {windows} \
                 windows of {context} tokens; give --eval-windows of at most {windows}"
            ),
        ));
    }
    Ok(())
}

/// The job of `workload`, and its shared options; with `--micro-batch-invariant`, a model that
/// is not micro-batch invariant takes its whole batch a forward (a smaller `--micro-batch` is
/// refused).
pub fn job(workload: Workload) -> Result<(Job, CommonArgs)> {
    let (mut job, common) = job_of(workload)?;
    if common.micro_batch_invariant && !job.spec.micro_batch_invariant() {
        let whole = job.config.effective_batch;
        if let Some(m) = common.micro_batch.filter(|&m| m < whole) {
            return Err(Error::invalid(
                "--micro-batch",
                format!(
                    "{m} splits the batch of {whole}, and --micro-batch-invariant refuses that \
                     for this model (its BatchNorm normalises each micro-batch by its own \
                     statistics); leave one of the two out"
                ),
            ));
        }
        job.config.micro_batch = Some(whole);
    }
    Ok((job, common))
}

/// [`job`] before `--micro-batch-invariant`.
fn job_of(workload: Workload) -> Result<(Job, CommonArgs)> {
    Ok(match workload {
        Workload::Digits(a) => {
            let source = DataSource::of(a.data.as_deref(), "data/digits.csv.gz", DIGITS_CSV_GZ)?;
            let data = digits_data(a.data)?;
            let (train, test) = data.split(0.2, 1234);
            let mut widths = vec![train.feature_dim()];
            if a.model == DigitsModel::Cnn && a.hidden.is_some() {
                return Err(Error::invalid(
                    "--hidden",
                    "is the MLP's; the CNN's convolutions are --channels",
                ));
            }
            let hidden = a.hidden.clone().unwrap_or_else(|| vec![128]);
            widths.extend(hidden.iter().copied().filter(|&w| w > 0));
            widths.push(train.num_classes());
            check_batch(a.batch, train.len(), "samples")?;
            let steps = a
                .epochs
                .saturating_mul(train.len().div_ceil(a.batch.max(1)) as u64);
            let defaults = match a.model {
                DigitsModel::Mlp => mlp_defaults(2e-3),
                // The CNN decays its rate: a constant 2e-3 left it no better than the MLP.
                DigitsModel::Cnn => Defaults {
                    min_lr: Some(1e-4),
                    ..mlp_defaults(2e-3)
                },
            };
            let mut notes = Vec::new();
            let mut config = base_config(&a.common, a.batch, steps, &defaults, &mut notes)?;
            config.length = RunLength::Epochs(a.epochs);
            let optimizer = adamw(&a.common, &defaults, 0.999)?;
            let job = match (a.model, a.channels) {
                (DigitsModel::Mlp, None) => {
                    mlp_job("digits", widths, a.common.seed, optimizer, config, train)
                }
                (DigitsModel::Mlp, Some(_)) => {
                    return Err(Error::invalid(
                        "--channels",
                        "is the CNN's (--model cnn); the MLP's widths are --hidden",
                    ));
                }
                (DigitsModel::Cnn, channels) => {
                    let image = square_image(train.feature_dim())?;
                    if a.crop_padding > image[1] {
                        return Err(Error::invalid(
                            "--crop-padding",
                            format!(
                                "{}: more than the {}x{} image, so a crop could hold no pixel; \
                                 give at most {} (0 crops nothing)",
                                a.crop_padding, image[1], image[2], image[1]
                            ),
                        ));
                    }
                    let spec = CnnSpec {
                        image,
                        widths: channels.unwrap_or_else(|| vec![32, 64]),
                        classes: train.num_classes(),
                        seed: a.common.seed,
                        optimizer,
                    };
                    // The images as u8 (the pixels' 17 levels kept apart), made f32 on the
                    // device: the training set's with the random crops and flips asked for.
                    let images = |d: &Dataset| {
                        ImageSet::from_features(d.features(), d.labels(), d.num_classes(), image)
                    };
                    let augmented = ImageTransform {
                        crop_padding: a.crop_padding,
                        flips: a.flip,
                        ..ImageTransform::plain(image)
                    };
                    let train_images = images(&train)?.with_transform(augmented)?;
                    Job {
                        spec: Box::new(spec),
                        train: Box::new(train_images),
                        test: Some(Box::new(images(&test)?)),
                        ..mlp_job("digits", widths, a.common.seed, optimizer, config, train)
                    }
                }
            };
            if a.model != DigitsModel::Cnn && (a.crop_padding > 0 || a.flip) {
                return Err(Error::invalid(
                    "--crop-padding and --flip",
                    "augment the CNN's images (--model cnn); the MLP reads its rows as they are",
                ));
            }
            let job = Job {
                test: job.test.or(Some(Box::new(test))),
                data: source,
                notes,
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
            let mut notes = Vec::new();
            let mut config = base_config(&a.common, a.batch, a.steps, &defaults, &mut notes)?;
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
            job.notes = notes;
            job.data = DataSource {
                source: format!(
                    "synthetic: {samples} samples of 784 features, seed {}",
                    a.common.seed
                ),
                sha256: String::new(),
            };
            (job, a.common)
        }
        Workload::Resnet18(a) => resnet_job("resnet18", 18, a)?,
        Workload::Resnet34(a) => resnet_job("resnet34", 34, a)?,
        Workload::Resnet50(a) => resnet_job("resnet50", 50, a)?,
        Workload::Resnet101(a) => resnet_job("resnet101", 101, a)?,
        Workload::Resnet152(a) => resnet_job("resnet152", 152, a)?,
        Workload::Shakespeare(a) => gpt_job("shakespeare", a)?,
        Workload::Gpt(a) => gpt_job("gpt", a)?,
    })
}

/// torchvision's ResNet of `depth` on synthetic `--image` squares (made on demand: a plan
/// makes none), AdamW 1e-3, for `--steps` steps of `--batch` images.
fn resnet_job(name: &'static str, depth: usize, a: ResNetArgs) -> Result<(Job, CommonArgs)> {
    let config = ResNetConfig::depth(depth, a.classes)?;
    let image = [3, a.image, a.image];
    // The stem's 7x7 convolution of stride 2 and the 3x3 pooling of stride 2 need 7 pixels.
    if a.image < 7 {
        return Err(Error::invalid(
            "--image",
            format!("{}: a ResNet's stem needs images of at least 7x7", a.image),
        ));
    }
    let samples = a
        .batch
        .checked_mul(4)
        .ok_or_else(|| Error::invalid("--batch", format!("{} is too large to count", a.batch)))?;
    let train = SyntheticImages {
        len: samples,
        image,
        classes: a.classes,
        seed: a.common.seed,
    };
    // The held-out images: the same recipe under another seed (docs/torchvision_check.py
    // makes them again to check an export's evaluation loss).
    let test = (a.eval_images > 0).then_some(SyntheticImages {
        len: a.eval_images,
        image,
        classes: a.classes,
        seed: a.common.seed ^ SyntheticImages::HELD_OUT,
    });
    let defaults = mlp_defaults(1e-3);
    let mut notes = Vec::new();
    let mut config_run = base_config(&a.common, a.batch, a.steps, &defaults, &mut notes)?;
    config_run.length = RunLength::Steps(a.steps);
    let optimizer = adamw(&a.common, &defaults, 0.999)?;
    let spec = ResNetSpec {
        config,
        depth,
        image,
        seed: a.common.seed,
        optimizer,
    };
    let job = Job {
        name,
        spec: Box::new(spec),
        train: Box::new(train),
        test: test.map(|t| Box::new(t) as Box<dyn Data>),
        config: config_run,
        gpt_shape: None,
        lm: None,
        data: DataSource {
            source: format!(
                "synthetic: {samples} images of 3x{0}x{0}, {1} classes, seed {2}",
                a.image, a.classes, a.common.seed
            ),
            sha256: String::new(),
        },
        optimizer,
        notes,
        tokenizer: None,
    };
    Ok((job, a.common))
}

/// A GPT's tokens: the training and validation sequences, the tokenizer, where they came from.
struct GptText {
    tokenizer: Tokenizer,
    train: Tokens,
    val: Tokens,
    source: DataSource,
    /// What the validation tokens are, for messages.
    val_name: String,
    /// A line for the log saying what the data is.
    note: Option<String>,
}

/// The tokens `a` names: a token folder, or a text (the bundled plays without `--data`)
/// tokenized by `--tokenizer`.
fn gpt_text(a: &ShakespeareArgs) -> Result<GptText> {
    if let Some(dir) = a.data.as_deref().filter(|p| p.is_dir()) {
        let folder = TokenFolder::open(dir)?;
        if let Some(asked) = a.tokenizer {
            let asked = tokenizer_name(asked);
            if asked != folder.tokenizer.name() {
                return Err(Error::invalid(
                    "--tokenizer",
                    format!(
                        "{asked}, but {} holds {} tokens ({}); leave --tokenizer out for a \
                         token folder, or prepare the text again with --tokenizer {asked}",
                        dir.display(),
                        folder.tokenizer.name(),
                        folder.tokenizer_source
                    ),
                ));
            }
        }
        let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let note = format!(
            "data: {} holds {} training and {} validation tokens, {} tokens from {} \
             (vocabulary {}), read through a memory map",
            dir.display(),
            folder.train.len(),
            folder.val.len(),
            folder.tokenizer.name(),
            folder.tokenizer_source,
            folder.tokenizer.vocab_size()
        );
        return Ok(GptText {
            note: Some(note),
            source: DataSource {
                source: abs.display().to_string(),
                sha256: folder.fingerprint(),
            },
            val_name: format!("{}", folder.val.path().display()),
            train: Tokens::File(Arc::clone(&folder.train)),
            val: Tokens::File(Arc::clone(&folder.val)),
            tokenizer: folder.tokenizer,
        });
    }
    if let Some(path) = &a.data {
        check_whole_text(path, a.tokenizer.unwrap_or(TokenizerArg::Char))?;
    }
    let source = DataSource::of(a.data.as_deref(), "data/shakespeare.txt.gz", SHAKESPEARE_GZ)?;
    let val_name = "validation text (the last 10%)".to_string();
    match a.tokenizer.unwrap_or(TokenizerArg::Char) {
        TokenizerArg::Char => {
            let corpus = match &a.data {
                None => CharCorpus::shakespeare()?,
                Some(path) => CharCorpus::from_file(path, 0.1)?,
            };
            Ok(GptText {
                note: None,
                tokenizer: Tokenizer::Char(corpus.vocab().to_vec()),
                train: Tokens::Host(Arc::new(corpus.train().to_vec())),
                val: Tokens::Host(Arc::new(corpus.val().to_vec())),
                source,
                val_name,
            })
        }
        TokenizerArg::Gpt2 => {
            let (what, text) = match &a.data {
                None => (
                    "data/shakespeare.txt.gz".to_string(),
                    read_text("data/shakespeare.txt.gz", SHAKESPEARE_GZ)?,
                ),
                Some(path) => {
                    let bytes = std::fs::read(path).map_err(|source| Error::Io {
                        path: path.clone(),
                        source,
                    })?;
                    let what = path.display().to_string();
                    let text = read_text(&what, &bytes)?;
                    (what, text)
                }
            };
            // nanoGPT's `shakespeare/prepare.py`: the first 90% of the characters train, the
            // rest validates, each part tokenized on its own.
            let chars = text.chars().count();
            let split = text
                .char_indices()
                .nth(chars * 9 / 10)
                .map_or(text.len(), |(i, _)| i);
            let tokenizer = Tokenizer::Gpt2;
            let (train, val) = text.split_at(split);
            Ok(GptText {
                note: None,
                train: Tokens::Host(Arc::new(tokenizer.encode(&what, train)?)),
                val: Tokens::Host(Arc::new(tokenizer.encode(&what, val)?)),
                tokenizer,
                source,
                val_name,
            })
        }
    }
}

/// Texts larger than this are refused by `--data FILE`, which reads a text whole, with the way
/// to train on them: `plimsoll prepare` streams it into a token folder once.
pub const WHOLE_TEXT_LIMIT: u64 = 1 << 30;

/// Refuses a text file `--data` would read whole when it is past [`WHOLE_TEXT_LIMIT`] on disk,
/// before anything reads it.
fn check_whole_text(path: &Path, tokenizer: TokenizerArg) -> Result<()> {
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if bytes > WHOLE_TEXT_LIMIT {
        return Err(Error::invalid(
            "--data",
            format!(
                "{} is {:.2} GiB: --data FILE reads a text whole (at most {} GiB); prepare it \
                 once with `plimsoll prepare {} --tokenizer {} --out DIR` (it streams, in bounded \
                 memory) and train with --data DIR, which is read through a memory map",
                path.display(),
                bytes as f64 / f64::from(1u32 << 30),
                WHOLE_TEXT_LIMIT >> 30,
                path.display(),
                tokenizer_name(tokenizer)
            ),
        ));
    }
    Ok(())
}

/// `--tokenizer`'s value as `meta.json` names it.
pub fn tokenizer_name(t: TokenizerArg) -> &'static str {
    match t {
        TokenizerArg::Char => "char",
        TokenizerArg::Gpt2 => "gpt2",
    }
}

/// The job of `train shakespeare` and `train gpt` (named `name`).
/// The family `--arch` and `--model` name, with a Llama's figures from the flags, else the
/// preset's, else the defaults. Errors: a Llama's flag without `--arch llama`, a Llama preset
/// with `--arch gpt`.
fn model_arch(a: &ShakespeareArgs, shape: [usize; 4]) -> Result<Arch> {
    let args = &a.arch;
    let preset = a.shape.model.and_then(Preset::llama);
    let llama = match (args.arch, preset) {
        (Some(ArchArg::Gpt), Some(_)) => {
            return Err(Error::invalid(
                "--arch",
                "gpt, but the --model preset is a Llama; leave --arch out or say llama",
            ));
        }
        (Some(ArchArg::Llama), _) | (None, Some(_)) => true,
        _ => false,
    };
    if !llama {
        let given = [
            ("--kv-heads", args.kv_heads.is_some()),
            ("--mlp-width", args.mlp_width.is_some()),
            ("--rope-theta", args.rope_theta.is_some()),
            ("--tie-embeddings", args.tie_embeddings.is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
            return Err(Error::invalid(
                *flag,
                "shapes a Llama; add --arch llama (the GPT has no such setting)",
            ));
        }
        return Ok(Arch::Gpt);
    }
    let [_, _, heads, width] = shape;
    let from_preset = |f: fn(&LlamaShape) -> usize| preset.as_ref().map(f);
    Ok(Arch::Llama(LlamaShape {
        kv_heads: args
            .kv_heads
            .or(from_preset(|p| p.kv_heads))
            .unwrap_or(heads),
        mlp_width: args
            .mlp_width
            .or(from_preset(|p| p.mlp_width))
            .unwrap_or_else(|| plimsoll_nn::LlamaConfig::default_intermediate(width)),
        rope_theta: args
            .rope_theta
            .or(preset.map(|p| p.rope_theta))
            .unwrap_or(10_000.0),
        tie_embeddings: args
            .tie_embeddings
            .or(preset.map(|p| p.tie_embeddings))
            .unwrap_or(false),
    }))
}

fn gpt_job(name: &'static str, a: ShakespeareArgs) -> Result<(Job, CommonArgs)> {
    let text = gpt_text(&a)?;
    let data_vocab = text.tokenizer.vocab_size();
    let shape = a.shape.resolve(None)?;
    let arch = model_arch(&a, shape)?;
    let vocab = match a.arch.vocab_size {
        Some(v) if v < data_vocab => {
            return Err(Error::invalid(
                "--vocab-size",
                format!(
                    "{v} is below the data's vocabulary of {data_vocab} tokens; give at least \
                     {data_vocab}, or leave it out"
                ),
            ));
        }
        Some(v) => v,
        None => data_vocab,
    };
    let context = shape[0];
    check_text(
        context,
        a.eval_windows,
        (text.train.len(), text.val.len()),
        &text.val_name,
    )?;
    let train = TokenData::windows_of(text.train, context, data_vocab)?;
    check_batch(a.batch, train.len(), "windows")?;
    let val = TokenData::evenly_spaced_of(text.val, context, data_vocab, a.eval_windows)?;
    // nanoGPT's CPU configuration (its README): lr 1e-3, 100 warm-up steps, cosine to
    // 1e-4 over the run, clipping at 1.0, AdamW betas (0.9, 0.99), weight decay 0.1.
    let defaults = Defaults {
        lr: 1e-3,
        warmup_steps: 100,
        min_lr: Some(1e-4),
        clip_grad_norm: Some(1.0),
        weight_decay: 0.1,
    };
    let mut notes: Vec<String> = text.note.into_iter().collect();
    let mut config = base_config(&a.common, a.batch, a.steps, &defaults, &mut notes)?;
    config.length = RunLength::Steps(a.steps);
    config.eval_interval_steps = Some(a.eval_every.max(1));
    let optimizer = adamw(&a.common, &defaults, 0.99)?;
    notes.extend(a.shape.preset_note(shape, vocab));
    if let Arch::Llama(l) = arch {
        notes.push(format!(
            "--arch llama: {} key/value heads for {} query heads, SwiGLU {} wide, rope theta {}, \
             {}",
            l.kv_heads,
            shape[2],
            l.mlp_width,
            l.rope_theta,
            if l.tie_embeddings {
                "the head tied to the token embedding"
            } else {
                "its own head"
            }
        ));
    }
    let spec = GptSpec {
        export: match a.arch.export {
            None => ExportLayout::Auto,
            Some(ExportArg::Nanogpt) => ExportLayout::NanoGpt,
            Some(ExportArg::Hf) => ExportLayout::HuggingFace,
        },
        arch,
        dropout: a.dropout,
        attention: match a.attention {
            AttentionArg::Auto => Attention::Auto,
            AttentionArg::Fused => Attention::Fused,
            AttentionArg::Reference => Attention::Reference,
        },
        loss: a.loss_chunk,
        config: GptShape::config(shape, vocab),
        seed: a.common.seed,
        optimizer,
    };
    spec.validate()?;
    let job = Job {
        name,
        spec: Box::new(spec),
        train: Box::new(train),
        test: Some(Box::new(val)),
        config,
        gpt_shape: Some(shape),
        lm: Some((arch, vocab)),
        data: text.source,
        optimizer,
        notes,
        tokenizer: Some(text.tokenizer),
    };
    Ok((job, a.common))
}
