//! The train suite's GPT workload: `plimsoll train shakespeare`'s default model (nanoGPT's CPU
//! configuration: 4 layers, 4 heads, width 128, context 64, batch 12, AdamW) on the bundled
//! plays through the trainer's real step.
//!
//! - Median step time and tokens per second over 10 steps after 3 warm-up steps; peak
//!   allocated and reserved bytes against the analytic minimum.
//! - Peak activation bytes and step time with every block checkpointed against none.
//! - Part `precision`: `--precision f32` against `f16` on each f16 path the adapter has (native `SHADER_F16`,
//!   packed words): peak activation, allocated and reserved bytes, and step time, side by
//!   side (f16's activation peak must be at most 0.55 of f32's).
//!
//! - Part `attention`: the same model at context 64 (the default), 256 and 1024, batch 1, and
//!   at context 256 with GPT-2's 50,257-token vocabulary, with the memory-efficient attention
//!   and loss (fused attention: no `T x T` tensor kept; the head and loss in chunks: no whole
//!   logits) against the reference path (scores, softmax, product, the probabilities kept; the
//!   whole logits kept): peak activation bytes and median step time.
//!
//! - Part `host` (in `train`'s parts): mlp-bench, the default GPT and, on a GPU, nanoGPT's GPU
//!   configuration in f32 and f16: the step, the device's busy time and the host's time
//!   outside its waits, each the median of 5 profiled steps.
//!
//! - Part `ahead` (in `train`'s parts): the `host` part's workloads stepped one by one
//!   (`Trainer::step`) against `Trainer::run`, which records step k+1 while the device runs
//!   step k: the median step of each, and their ratio.
//!
//! - Part `data`: the default model from a token folder `prepare` made of the plays
//!   (characters, memory-mapped), with the loader thread 2 batches ahead and without: the
//!   median time a step waits for its data, and the median step; then with a host whose every
//!   gather sleeps half a step (simulated: a slow file system), which the loader should hide.
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
use plimsoll_kernels_wgsl::kernels::convert::F16Path;
use plimsoll_nn::{AdamWConfig, GptConfig, LrSchedule};
use plimsoll_trainer::{
    CharCorpus, CheckpointPolicy, GptSpec, LeakPolicy, OptimizerSpec, Precision, Recipe, RunLength,
    TokenData, TrainConfig, Trainer,
};

use super::Report;
use super::train::{mb, median, steps};

pub(crate) const BATCH: usize = 12;
pub(crate) const CONTEXT: usize = 64;
const WARMUP_STEPS: usize = 3;
const TIMED_STEPS: usize = 10;
/// Timed steps of each precision in the `precision` part, taken in turn.
const PRECISION_ROUNDS: usize = 9;

/// `plimsoll train shakespeare`'s default model on `vocab` characters (also `cargo xtask
/// soak`'s GPT).
pub(crate) fn spec(vocab: usize) -> GptSpec {
    GptSpec::new(
        GptConfig {
            vocab_size: vocab,
            block_size: CONTEXT,
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
        },
        0,
        OptimizerSpec::AdamW(AdamWConfig {
            beta2: 0.99,
            weight_decay: 0.1,
            decay_matrices_only: true,
            ..AdamWConfig::default()
        }),
    )
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

/// Builds one of the `host` part's trainers.
type MakeTrainer = Box<dyn Fn() -> Result<Trainer>>;

/// Steps of each workload the `host` part profiles, after its warm-up steps.
const HOST_STEPS: usize = 5;

/// The `host` part's workloads, each a trainer of `steps` steps on `gpu`: mlp-bench (the peer
/// workload), the default GPT, and on a GPU nanoGPT's GPU configuration (6 layers, 6 heads,
/// width 384, context 256, batch 64) in f32 and f16, which takes minutes a step on a CPU
/// adapter.
fn host_cases(gpu: &Gpu, steps: u64) -> Result<Vec<(&'static str, MakeTrainer)>> {
    let corpus = CharCorpus::shakespeare()?;
    let vocab = corpus.vocab_size();
    let tokens = Arc::new(corpus.train().to_vec());
    let mut gpu_spec = spec(vocab);
    gpu_spec.config = GptConfig {
        vocab_size: vocab,
        block_size: 256,
        n_layer: 6,
        n_head: 6,
        n_embd: 384,
    };
    let mut cases: Vec<(&str, MakeTrainer)> = Vec::new();
    let g = gpu.clone();
    cases.push((
        "mlp_bench",
        Box::new(move || super::train::peer_trainer(&g, steps)),
    ));
    let (g, t) = (gpu.clone(), Arc::clone(&tokens));
    cases.push((
        "gpt",
        Box::new(move || {
            let data = TokenData::windows(Arc::clone(&t), CONTEXT, vocab)?;
            let cfg = config(BATCH, Some(BATCH), steps, CheckpointPolicy::None);
            Ok(Trainer::new(&g, cfg, &spec(vocab), data, None)?)
        }),
    ));
    for precision in [Precision::F32, Precision::F16] {
        if gpu.is_cpu() {
            println!("train: gpt_gpu_config skipped on a CPU adapter (minutes a step)");
            break;
        }
        let (g, t, s) = (gpu.clone(), Arc::clone(&tokens), gpu_spec);
        let name = match precision {
            Precision::F32 => "gpt_gpu_config_f32",
            Precision::F16 => "gpt_gpu_config_f16",
        };
        cases.push((
            name,
            Box::new(move || {
                let data = TokenData::windows(Arc::clone(&t), 256, vocab)?;
                let cfg = TrainConfig {
                    precision,
                    ..config(64, Some(64), steps, CheckpointPolicy::None)
                };
                Ok(Trainer::new(&g, cfg, &s, data, None)?)
            }),
        ));
    }
    Ok(cases)
}

/// The `host` part (see the module docs): per workload, the median over [`HOST_STEPS`]
/// profiled steps of the step's wall time, the device's busy time (the union of its kernels'
/// intervals) and the host's time outside its waits on the device
/// (`plimsoll_trainer::profiling::{busy_ns, waits_ns}`).
pub fn run_host(report: &mut Report) -> Result<()> {
    let gpu = Gpu::new()?;
    println!("train: host part on {}", gpu.adapter());
    let cases = host_cases(&gpu, (WARMUP_STEPS + HOST_STEPS) as u64)?;
    for (name, make) in cases {
        let mut trainer = make()?;
        for _ in 0..WARMUP_STEPS {
            trainer.step()?;
        }
        let (mut step, mut busy, mut host) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..HOST_STEPS {
            gpu.begin_profile(None)?;
            let r = trainer.step();
            let profile = gpu.end_profile(Duration::from_secs(300))?;
            let r = r?;
            let until = (r.step_ms * 1e6) as u64;
            let waits = plimsoll_trainer::profiling::waits_ns(&profile, until) as f64 / 1e6;
            step.push(r.step_ms);
            busy.push(plimsoll_trainer::profiling::busy_ns(&profile) as f64 / 1e6);
            host.push((r.step_ms - waits).max(0.0));
        }
        let (step, busy, host) = (median(step), median(busy), median(host));
        report.push(format!("host/{name}/step"), step, "ms");
        report.push(format!("host/{name}/device_busy"), busy, "ms");
        report.push(format!("host/{name}/host_outside_waits"), host, "ms");
        report.push(format!("host/{name}/host_share"), host / step, "ratio");
    }
    Ok(())
}

/// Rounds of the `ahead` part, each running both modes in turn on fresh trainers.
const AHEAD_ROUNDS: usize = 3;
/// Steps the `ahead` part times per trainer, after [`WARMUP_STEPS`].
const AHEAD_STEPS: usize = 10;

/// Collects [`plimsoll_trainer::Trainer::run`]'s step times.
struct StepTimes(Vec<f64>);

impl plimsoll_trainer::Observer for StepTimes {
    fn on_step(&mut self, report: &plimsoll_trainer::StepReport) {
        self.0.push(report.step_ms);
    }
    fn on_eval(&mut self, _: u64, _: u64, _: &plimsoll_trainer::Evaluation) {}
    fn on_log(&mut self, _: &str) {}
}

/// The `ahead` part (see the module docs): per workload of the `host` part, the median step of
/// [`AHEAD_STEPS`] steps one by one (`Trainer::step`: each waits for its read-back before the
/// next is recorded) against the same steps in `Trainer::run`, which records step k+1 while
/// the device runs step k; [`AHEAD_ROUNDS`] rounds, the two in turn, medians over the rounds.
pub fn run_ahead(report: &mut Report) -> Result<()> {
    let gpu = Gpu::new()?;
    println!("train: ahead part on {}", gpu.adapter());
    let steps = WARMUP_STEPS + AHEAD_STEPS;
    for (name, make) in host_cases(&gpu, steps as u64)? {
        let (mut one_by_one, mut ahead) = (Vec::new(), Vec::new());
        for round in 0..AHEAD_ROUNDS {
            let mut trainer = make()?;
            let mut times = Vec::new();
            for _ in 0..steps {
                times.push(trainer.step()?.step_ms);
            }
            let one = median(times.split_off(WARMUP_STEPS));
            let mut trainer = make()?;
            let mut times = StepTimes(Vec::new());
            trainer.run(&mut times)?;
            let begun = trainer.steps_begun_ahead();
            let overlapped = median(times.0.split_off(WARMUP_STEPS));
            println!(
                "train: {name} round {}: one by one {one:.2} ms, ahead {overlapped:.2} ms \
                 ({begun} of {steps} steps begun ahead)",
                round + 1
            );
            one_by_one.push(one);
            ahead.push(overlapped);
        }
        let (one, overlapped) = (median(one_by_one), median(ahead));
        report.push(format!("ahead/{name}/step_one_by_one"), one, "ms");
        report.push(format!("ahead/{name}/step_ahead"), overlapped, "ms");
        report.push(
            format!("ahead/{name}/ahead_over_one_by_one"),
            overlapped / one,
            "ratio",
        );
    }
    Ok(())
}

/// The `attention` part (see the module docs).
pub fn run_attention(report: &mut Report) -> Result<()> {
    let corpus = CharCorpus::shakespeare()?;
    let characters = corpus.vocab_size();
    // (context, the model's vocabulary): the characters, and GPT-2's BPE size at 256 (its
    // logits at 1024 would pass lavapipe's 128 MiB binding on the reference path).
    let cases = [
        (64usize, characters),
        (256, characters),
        (1024, characters),
        (256, GPT2_VOCAB),
    ];
    for (context, vocab) in cases {
        let data = TokenData::windows(Arc::new(corpus.train().to_vec()), context, characters)?;
        let mut rows = Vec::new();
        for (name, attention, loss) in [
            (
                "efficient",
                plimsoll_trainer::Attention::Fused,
                plimsoll_trainer::LossHead::Chunked(0),
            ),
            (
                "reference",
                plimsoll_trainer::Attention::Reference,
                plimsoll_trainer::LossHead::Reference,
            ),
        ] {
            let mut spec = spec(vocab);
            spec.config.block_size = context;
            spec.attention = attention;
            spec.loss = loss;
            let gpu = Gpu::new()?;
            let cfg = config(1, Some(1), 7, CheckpointPolicy::None);
            let mut trainer = Trainer::new(&gpu, cfg, &spec, data.clone(), None)?;
            let (times, [allocated, _, activation]) = steps(&mut trainer, 2, 5)?;
            let key = attention_key(context, vocab, characters);
            let key = format!("{key}/{name}");
            let step = median(times);
            report.push(format!("{key}/step_median"), step, "ms");
            report.push(format!("{key}/peak_activation"), mb(activation), "MB");
            report.push(format!("{key}/peak_allocated"), mb(allocated), "MB");
            rows.push((step, activation));
        }
        let key = attention_key(context, vocab, characters);
        report.push(
            format!("{key}/efficient_over_reference_activation"),
            rows[0].1 as f64 / rows[1].1 as f64,
            "ratio",
        );
        report.push(
            format!("{key}/efficient_over_reference_step"),
            rows[0].0 / rows[1].0,
            "ratio",
        );
    }
    Ok(())
}

/// GPT-2's vocabulary.
const GPT2_VOCAB: usize = 50_257;

/// The `data` part: the default model trained from a token folder that `plimsoll prepare`
/// made of the bundled plays (characters, memory-mapped), with the loader thread building
/// batches ahead (`--prefetch 2`, the default) and without (each step gathers its own): the
/// median time a step waits for its data, and the median step. Then the same with a host
/// that is slow to build a batch (each gather sleeps half the step: a network file system, a
/// slow decoder), which the loader should hide.
pub fn run_data(report: &mut Report) -> Result<()> {
    use plimsoll_trainer::data::Tokens;
    use plimsoll_trainer::prepare::{PrepareOptions, TextSource, prepare};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench/data-char");
    let _ = std::fs::remove_dir_all(&dir);
    let options = PrepareOptions {
        tokenizer: "char".into(),
        val_fraction: 0.1,
        threads: 2,
        memory_limit_bytes: 64 << 20,
        overwrite: true,
    };
    let started = std::time::Instant::now();
    let meta = prepare(
        &[TextSource::BundledShakespeare],
        &dir,
        &options,
        &mut |_| std::ops::ControlFlow::Continue(()),
    )?;
    report.push(
        "data/prepare_bundled_plays_char",
        started.elapsed().as_secs_f64() * 1e3,
        "ms",
    );
    let folder = plimsoll_trainer::TokenFolder::open(&dir)?;
    let vocab = meta.vocab_size;
    let data = TokenData::windows_of(Tokens::File(folder.train.clone()), CONTEXT, vocab)?;
    let mut fast_step = f64::NAN;
    for host in ["fast", "slow"] {
        let delay = match host {
            "fast" => Duration::ZERO,
            _ => Duration::from_secs_f64(fast_step / 2e3),
        };
        let mut waits = Vec::new();
        for prefetch in [0usize, 2] {
            let gpu = Gpu::new()?;
            let mut cfg = config(BATCH, Some(BATCH), 12, CheckpointPolicy::None);
            cfg.prefetch = prefetch;
            let slow = SlowGather {
                inner: data.clone(),
                delay,
            };
            let mut trainer = Trainer::new(&gpu, cfg, &spec(vocab), slow, None)?;
            let (mut wait, mut step) = (Vec::new(), Vec::new());
            for i in 0..WARMUP_STEPS + 8 {
                let r = trainer.step()?;
                if i >= WARMUP_STEPS {
                    wait.push(r.data_wait_ms);
                    step.push(r.step_ms);
                }
            }
            let key = format!("data/{host}_host/prefetch_{prefetch}");
            let (wait, step) = (median(wait), median(step));
            if host == "fast" && prefetch == 0 {
                fast_step = step;
            }
            report.push(format!("{key}/data_wait_median"), wait, "ms");
            report.push(format!("{key}/step_median"), step, "ms");
            report.push(
                format!("{key}/loader_host"),
                trainer.loader().host_bytes() as f64 / 1e3,
                "KB",
            );
            waits.push(wait);
        }
        if host == "slow" {
            report.push(
                "data/slow_host/gather_sleep",
                delay.as_secs_f64() * 1e3,
                "ms",
            );
        }
        report.push(
            format!("data/{host}_host/prefetch_2_minus_0_data_wait"),
            waits[1] - waits[0],
            "ms",
        );
    }
    Ok(())
}

/// Token windows whose host gather sleeps `delay` first (a slow host, for the `data` part).
struct SlowGather {
    inner: TokenData,
    delay: Duration,
}

impl plimsoll_trainer::Data for SlowGather {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn upload(
        &self,
        gpu: &Gpu,
        indices: &[usize],
    ) -> plimsoll_trainer::Result<plimsoll_trainer::Batch> {
        std::thread::sleep(self.delay);
        self.inner.upload(gpu, indices)
    }

    fn gather(
        &self,
        indices: &[usize],
    ) -> plimsoll_trainer::Result<Option<plimsoll_trainer::task::HostBatch>> {
        std::thread::sleep(self.delay);
        self.inner.gather(indices)
    }

    fn input_width(&self) -> usize {
        self.inner.input_width()
    }

    fn classes(&self) -> usize {
        self.inner.classes()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// The report's name of an `attention` case.
fn attention_key(context: usize, vocab: usize, characters: usize) -> String {
    match vocab == characters {
        true => format!("gpt_context_{context}"),
        false => format!("gpt_context_{context}_vocab_{vocab}"),
    }
}

/// The `precision` part: the GPT in f32 against f16 on each conversion path (see the module
/// docs).
pub fn run_precisions(report: &mut Report) -> Result<()> {
    let corpus = CharCorpus::shakespeare()?;
    let vocab = corpus.vocab_size();
    let data = TokenData::windows(Arc::new(corpus.train().to_vec()), CONTEXT, vocab)?;
    let spec = spec(vocab);
    // Interleaved: a step of each run in turn, so the machine's drift between minutes falls on
    // every run alike.
    let mut runs = Vec::new();
    for (name, precision, path) in [
        ("f32", Precision::F32, None),
        ("f16_native", Precision::F16, Some(F16Path::Native)),
        ("f16_packed", Precision::F16, Some(F16Path::Packed)),
    ] {
        let gpu = Gpu::new()?;
        if let Some(path) = path
            && gpu.set_f16_path(path).is_err()
        {
            println!("train: gpt/precision_{name}: skipped (the adapter has no SHADER_F16)");
            continue;
        }
        let mut cfg = config(
            BATCH,
            Some(BATCH),
            (2 + PRECISION_ROUNDS) as u64,
            CheckpointPolicy::None,
        );
        cfg.precision = precision;
        let mut trainer = Trainer::new(&gpu, cfg, &spec, data.clone(), None)?;
        let (_, peaks) = steps(&mut trainer, 2, 0)?;
        runs.push((name, trainer, Vec::new(), peaks));
    }
    for _ in 0..PRECISION_ROUNDS {
        for (_, trainer, times, peaks) in &mut runs {
            let (t, p) = steps(trainer, 0, 1)?;
            times.extend(t);
            for (peak, new) in peaks.iter_mut().zip(p) {
                *peak = (*peak).max(new);
            }
        }
    }
    let mut f32_run: Option<(f64, u64)> = None;
    for (name, _, times, [allocated, reserved, activation]) in runs {
        let key = format!("gpt/precision_{name}");
        let step_ms = median(times);
        report.push(format!("{key}/step_median"), step_ms, "ms");
        report.push(format!("{key}/peak_activation"), mb(activation), "MB");
        report.push(format!("{key}/peak_allocated"), mb(allocated), "MB");
        report.push(format!("{key}/peak_reserved"), mb(reserved), "MB");
        let Some((f32_ms, f32_activation)) = f32_run else {
            f32_run = Some((step_ms, activation));
            continue;
        };
        let ratio = activation as f64 / f32_activation as f64;
        report.push(format!("{key}/activation_over_f32"), ratio, "ratio");
        report.push(format!("{key}/step_over_f32"), step_ms / f32_ms, "ratio");
        println!(
            "train: floor gpt {name} peak activation <= 0.55 of f32: {}",
            if ratio <= 0.55 { "met" } else { "NOT met" }
        );
    }
    Ok(())
}
