//! The plan suite: the memory plan's predictions against what the run then measures, and the
//! plan's own time, for digits' MLP (64-128-10, batch 64), mlp-bench (784-1024-1024-1024-10,
//! batch 128) and the shakespeare GPT (batch 12) without checkpointing and with every block
//! checkpointed, and in f16 (`--precision f16`). The run is 50 steps with an evaluation every
//! 10; measured peaks are the largest over all of its steps and evaluations. MLP data are synthetic with the real shapes (a plan depends
//! on shapes only).
//!
//! Then the same workloads under each allocator (`--allocator caching` and `planned`) for
//! [`ARENA_STEPS`] steps: the last step's peak reserved bytes over its peak allocated bytes (the
//! most bytes live at once, which no placement can go below), the planned run's arena and how
//! many of its steps replayed the plan, and the median time of the steps after the plan.

use std::sync::Arc;

use anyhow::Result;
use plimsoll_kernels_wgsl::Gpu;
use plimsoll_nn::{Activation, AdamWConfig};
use plimsoll_trainer::{
    AllocatorMode, CharCorpus, CheckpointPolicy, CnnSpec, Data, Dataset, ModelSpec, OptimizerSpec,
    Precision, Recipe, ResNetSpec, SyntheticImages, TokenData, TrainConfig, Trainer,
};

use super::Report;
use super::train::mb;
use super::train_gpt::{BATCH, CONTEXT, config, spec};

fn mlp(widths: &[usize]) -> ModelSpec {
    ModelSpec {
        widths: widths.to_vec(),
        activation: Activation::Relu,
        seed: 1,
        optimizer: OptimizerSpec::AdamW(AdamWConfig {
            weight_decay: 0.0,
            ..AdamWConfig::default()
        }),
    }
}

/// Steps of each allocator run: the plan is built at the end of step 3 (step 2 is the first
/// steady step, step 3 repeats it), so steps 4 on replay it.
const ARENA_STEPS: u64 = 6;

/// The data of one case, made afresh for each run.
type MakeData<'a> = &'a dyn Fn() -> Result<(Box<dyn Data>, Box<dyn Data>)>;

/// Plans, runs and reports one case, then compares the allocators on it.
fn case(
    report: &mut Report,
    name: &str,
    recipe: &dyn Recipe,
    data: MakeData<'_>,
    batch: usize,
    (checkpointing, precision): (CheckpointPolicy, Precision),
) -> Result<()> {
    let settings = (checkpointing, precision);
    predicted_against_measured(report, name, recipe, data()?, batch, settings)?;
    let mut ratios = Vec::new();
    for mode in [AllocatorMode::Caching, AllocatorMode::Planned] {
        let gpu = Gpu::new()?;
        let cfg = TrainConfig {
            allocator: mode,
            precision,
            ..config(batch, None, ARENA_STEPS, checkpointing)
        };
        let (train, test) = data()?;
        let mut trainer = Trainer::new(&gpu, cfg, recipe, train, Some(test))?;
        let mut last = None;
        let mut step_ms = Vec::new();
        for step in 1..=ARENA_STEPS {
            let report = trainer.step()?;
            if step > 3 {
                step_ms.push(report.step_ms);
            }
            last = Some(report);
        }
        step_ms.sort_by(f64::total_cmp);
        let last = last.ok_or_else(|| anyhow::anyhow!("{name}: no step ran"))?;
        let ratio = last.peak_reserved_bytes as f64 / last.peak_allocated_bytes.max(1) as f64;
        let mode_name = match mode {
            AllocatorMode::Caching => "caching",
            AllocatorMode::Planned => "planned",
        };
        let key = format!("plan/{name}/{mode_name}");
        report.push(
            format!("{key}/peak_reserved"),
            mb(last.peak_reserved_bytes),
            "MB",
        );
        report.push(
            format!("{key}/peak_live"),
            mb(last.peak_allocated_bytes),
            "MB",
        );
        report.push(format!("{key}/reserved_over_live"), ratio, "ratio");
        let median = step_ms.get(step_ms.len() / 2).copied().unwrap_or(f64::NAN);
        report.push(format!("{key}/step_median_steps_4_on"), median, "ms");
        ratios.push(ratio);
        if mode == AllocatorMode::Planned {
            let plan = gpu.with_allocator(|a| a.step_plan_stats());
            report.push(format!("{key}/arena"), mb(plan.arena_bytes), "MB");
            report.push(
                format!("{key}/arena_over_step_live"),
                plan.arena_bytes as f64 / plan.planned_max_live_bytes.max(1) as f64,
                "ratio",
            );
            report.push(
                format!("{key}/steps_replayed"),
                plan.steps_replayed as f64,
                "steps",
            );
            report.push(
                format!("{key}/fell_back"),
                plan.fell_back as f64,
                "requests",
            );
        }
    }
    if let [caching, planned] = ratios[..] {
        report.push(
            format!("plan/{name}/planned_over_caching_reserved_ratio"),
            planned / caching,
            "ratio",
        );
    }
    Ok(())
}

/// Steps of the run the plan's prediction is compared with, evaluating every [`EVAL_EVERY`].
const RUN_STEPS: u64 = 50;
/// Steps between the compared run's evaluations.
const EVAL_EVERY: u64 = 10;

/// The largest peaks over every step and evaluation of a run, and its out-of-memory lines.
#[derive(Default)]
struct RunPeaks {
    allocated: u64,
    reserved: u64,
    recovered: usize,
}

impl plimsoll_trainer::Observer for RunPeaks {
    fn on_step(&mut self, r: &plimsoll_trainer::StepReport) {
        self.allocated = self.allocated.max(r.peak_allocated_bytes);
        self.reserved = self.reserved.max(r.peak_reserved_bytes);
    }
    fn on_eval(&mut self, _: u64, _: u64, e: &plimsoll_trainer::Evaluation) {
        self.reserved = self.reserved.max(e.peak_reserved_bytes);
    }
    fn on_log(&mut self, line: &str) {
        // A recovery's line ("step 3: out of memory at micro-batch ..."), not the plan's table,
        // whose dry runs that did not fit say "out of memory" too.
        let recovery = line.contains(": out of memory at") && !line.starts_with("memory plan");
        self.recovered += usize::from(recovery);
    }
}

/// The memory plan's prediction against the run's peaks over all of its [`RUN_STEPS`] steps
/// and its evaluations (the steps' peak allocated; the steps' and evaluations' peak reserved).
fn predicted_against_measured(
    report: &mut Report,
    name: &str,
    recipe: &dyn Recipe,
    data: (Box<dyn Data>, Box<dyn Data>),
    batch: usize,
    (checkpointing, precision): (CheckpointPolicy, Precision),
) -> Result<()> {
    let cfg = TrainConfig {
        precision,
        eval_interval_steps: Some(EVAL_EVERY),
        ..config(batch, None, RUN_STEPS, checkpointing)
    };
    predicted_against_run(report, name, recipe, data, cfg, &Gpu::new()?)
}

/// [`predicted_against_measured`] of a run of `cfg` on `gpu`.
pub(super) fn predicted_against_run(
    report: &mut Report,
    name: &str,
    recipe: &dyn Recipe,
    (train, test): (Box<dyn Data>, Box<dyn Data>),
    cfg: TrainConfig,
    gpu: &Gpu,
) -> Result<()> {
    let gpu = gpu.clone();
    let mut trainer = Trainer::new(&gpu, cfg, recipe, train, Some(test))?;
    let plan = trainer
        .plan()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("{name}: no plan was made"))?;
    let mut peaks = RunPeaks::default();
    trainer.run(&mut peaks)?;
    let (allocated, reserved) = (peaks.allocated, peaks.reserved);
    report.push(
        format!("plan/{name}/run_out_of_memory_lines"),
        peaks.recovered as f64,
        "lines",
    );
    let key = format!("plan/{name}");
    report.push(format!("{key}/plan_time"), plan.plan_ms, "ms");
    report.push(format!("{key}/dry_runs"), plan.probes.len() as f64, "runs");
    report.push(
        format!("{key}/micro_batch_chosen"),
        plan.micro_batch as f64,
        "samples",
    );
    report.push(
        format!("{key}/segment_len_chosen"),
        plan.segment_len as f64,
        "blocks",
    );
    report.push(
        format!("{key}/predicted_peak_reserved"),
        mb(plan.predicted_peak_reserved_bytes),
        "MB",
    );
    report.push(format!("{key}/measured_peak_reserved"), mb(reserved), "MB");
    report.push(
        format!("{key}/reserved_predicted_over_measured"),
        plan.predicted_peak_reserved_bytes as f64 / reserved.max(1) as f64,
        "ratio",
    );
    report.push(
        format!("{key}/allocated_predicted_over_measured"),
        plan.predicted_peak_bytes as f64 / allocated.max(1) as f64,
        "ratio",
    );
    Ok(())
}

/// The parts `cargo xtask bench plan [PART...]` runs (all of them when none is named):
/// `measured` (the predictions against real runs, above), `presets` (the GPT-2 presets
/// under three budgets, [`super::plan_presets`]), `scale` (real steps of GPT-2 small's
/// shape against the plan, [`super::plan_presets::run_scale`]) and `images` (the digits CNN and
/// a ResNet-18 under budgets that make the plan split the batch and checkpoint, [`images`]).
pub const PARTS: [&str; 4] = ["measured", "presets", "scale", "images"];

/// Runs the suite, or the parts named.
pub fn run(parts: &[String]) -> Result<Report> {
    if let Some(bad) = parts.iter().find(|p| !PARTS.contains(&p.as_str())) {
        anyhow::bail!("unknown plan part `{bad}`; parts: {}", PARTS.join(", "));
    }
    let wanted = |part: &str| parts.is_empty() || parts.iter().any(|p| p == part);
    let mut report = Report::new("plan");
    if wanted("presets") {
        super::plan_presets::run(&mut report)?;
    }
    if wanted("measured") {
        measured(&mut report)?;
    }
    if wanted("scale") {
        super::plan_presets::run_scale(&mut report)?;
    }
    if wanted("images") {
        images(&mut report)?;
    }
    Ok(report)
}

/// The `measured` part: predictions against real runs (see the module docs).
fn measured(report: &mut Report) -> Result<()> {
    let tables = |rows: usize, dim: usize| -> Result<(Box<dyn Data>, Box<dyn Data>)> {
        Ok((
            Box::new(Dataset::synthetic(rows, dim, 10, 5)?),
            Box::new(Dataset::synthetic(rows / 4, dim, 10, 6)?),
        ))
    };
    case(
        report,
        "digits",
        &mlp(&[64, 128, 10]),
        &|| tables(1437, 64),
        64,
        (CheckpointPolicy::None, Precision::F32),
    )?;
    case(
        report,
        "mlp_bench",
        &mlp(&[784, 1024, 1024, 1024, 10]),
        &|| tables(512, 784),
        128,
        (CheckpointPolicy::None, Precision::F32),
    )?;
    let corpus = CharCorpus::shakespeare()?;
    let vocab = corpus.vocab_size();
    let train = TokenData::windows(Arc::new(corpus.train().to_vec()), CONTEXT, vocab)?;
    let val = TokenData::evenly_spaced(Arc::new(corpus.val().to_vec()), CONTEXT, vocab, 240)?;
    for (name, settings) in [
        (
            "gpt_no_checkpointing",
            (CheckpointPolicy::None, Precision::F32),
        ),
        (
            "gpt_every_block",
            (CheckpointPolicy::EveryBlocks(1), Precision::F32),
        ),
        ("gpt_f16", (CheckpointPolicy::None, Precision::F16)),
    ] {
        let data = || -> Result<(Box<dyn Data>, Box<dyn Data>)> {
            Ok((Box::new(train.clone()), Box::new(val.clone())))
        };
        case(report, name, &spec(vocab), &data, BATCH, settings)?;
    }
    Ok(())
}

/// The `images` part: the digits CNN (32 and 64 channels, batch 64) under 1 MiB and a
/// ResNet-18 (10 classes, 64x64 synthetic images, batch 8) under 185 MiB, budgets under which
/// the plan splits the batch and checkpoints: its prediction against a few real steps.
fn images(report: &mut Report) -> Result<()> {
    let optimizer = OptimizerSpec::AdamW(AdamWConfig {
        weight_decay: 0.0,
        ..AdamWConfig::default()
    });
    let under = |batch: usize, budget: u64, steps: u64| TrainConfig {
        memory_budget_bytes: Some(budget),
        eval_interval_steps: Some(steps),
        ..config(batch, None, steps, CheckpointPolicy::Automatic)
    };
    let budgeted = |budget: u64| -> Result<Gpu> {
        let gpu = Gpu::new()?;
        gpu.set_memory_budget(budget);
        Ok(gpu)
    };
    let cnn = CnnSpec {
        image: [1, 8, 8],
        widths: vec![32, 64],
        classes: 10,
        seed: 1,
        optimizer,
    };
    let digits: (Box<dyn Data>, Box<dyn Data>) = (
        Box::new(Dataset::synthetic(1437, 64, 10, 5)?),
        Box::new(Dataset::synthetic(359, 64, 10, 6)?),
    );
    let budget = 1 << 20;
    let cfg = under(64, budget, 20);
    predicted_against_run(report, "digits_cnn", &cnn, digits, cfg, &budgeted(budget)?)?;
    let resnet = ResNetSpec {
        config: plimsoll_nn::ResNetConfig::depth(18, 10)?,
        depth: 18,
        image: [3, 64, 64],
        seed: 1,
        optimizer,
    };
    let images = |len, seed| SyntheticImages {
        len,
        image: [3, 64, 64],
        classes: 10,
        seed,
    };
    let data: (Box<dyn Data>, Box<dyn Data>) = (Box::new(images(32, 5)), Box::new(images(8, 6)));
    let budget = 185 << 20;
    let cfg = under(8, budget, 4);
    predicted_against_run(
        report,
        "resnet18_64px",
        &resnet,
        data,
        cfg,
        &budgeted(budget)?,
    )
}
