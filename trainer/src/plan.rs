//! The memory plan: before step one, a dry run on a throwaway copy of the model measures the
//! peak bytes of real steps (forward, backward and optimizer, through the same
//! [`crate::step::run_step`] the trainer uses) at two micro-batch sizes, per category, and fits
//! `peak(m) = fixed + per_sample * m`. From that the plan picks the checkpointing and the largest
//! micro-batch whose predicted peak fits the budget with [`HEADROOM`] to spare (segments and
//! fragmentation make reserved bytes exceed allocated ones). A third dry run then measures the
//! choice itself, which becomes the prediction (halving the choice if it does not fit).
//! Out-of-memory recovery remains the backstop when the prediction is wrong.

use std::fmt;

use plimsoll_allocator::format_bytes;
use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::Category;

use crate::config::{CheckpointPolicy, TrainConfig};
use crate::error::{Error, Result};
use crate::step::{StepInputs, run_step};
use crate::task::{Data, Recipe};

/// Fraction of the budget a planned step's allocated peak may use.
pub const HEADROOM: f64 = 0.85;

/// One measured dry-run step.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Probe {
    /// Children per checkpointed segment (0: none).
    pub segment_len: usize,
    /// Samples per forward/backward.
    pub micro_batch: usize,
    /// Peak allocated bytes of the whole step.
    pub peak_allocated_bytes: u64,
    /// Peak allocated bytes per category ([`Category::ALL`] order).
    pub category_peaks: [u64; 7],
    /// Peak allocated bytes of evaluating a chunk of `micro_batch` samples right after the step
    /// (the trainer evaluates in chunks of the micro-batch, with the optimizer state alive);
    /// `None` when that evaluation ran out of memory.
    pub eval_peak_allocated_bytes: Option<u64>,
}

/// A linear model of one checkpointing choice's peak.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PeakModel {
    /// Children per checkpointed segment (0: none).
    pub segment_len: usize,
    /// Bytes that do not grow with the micro-batch.
    pub fixed_bytes: f64,
    /// Bytes per sample of the micro-batch.
    pub per_sample_bytes: f64,
}

impl PeakModel {
    /// Predicted peak allocated bytes at `micro_batch`.
    pub fn predict(&self, micro_batch: usize) -> u64 {
        (self.fixed_bytes + self.per_sample_bytes * micro_batch as f64).max(0.0) as u64
    }

    /// The largest micro-batch in `1..=limit` whose prediction fits `usable` bytes, if any.
    pub fn largest_fitting(&self, usable: u64, limit: usize) -> Option<usize> {
        if self.predict(1) > usable {
            return None;
        }
        if self.per_sample_bytes <= 0.0 {
            return Some(limit);
        }
        let m = ((usable as f64 - self.fixed_bytes) / self.per_sample_bytes).floor();
        Some((m.max(1.0) as usize).min(limit))
    }
}

/// The plan: what the trainer will use, and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemoryPlan {
    /// The budget planned against.
    pub budget_bytes: u64,
    /// The effective batch.
    pub effective_batch: usize,
    /// The chosen micro-batch.
    pub micro_batch: usize,
    /// The chosen checkpoint segment length (0: none).
    pub segment_len: usize,
    /// Predicted peak allocated bytes of a step with the choice.
    pub predicted_peak_bytes: u64,
    /// Measured peak allocated bytes of evaluating a chunk of the chosen micro-batch (the
    /// trainer's evaluation chunk) after a step; `None` if even that ran out of memory, in which
    /// case evaluation splits its chunks as it goes.
    pub predicted_eval_peak_bytes: Option<u64>,
    /// The fitted model of each checkpointing choice measured.
    pub models: Vec<PeakModel>,
    /// The dry-run measurements.
    pub probes: Vec<Probe>,
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "memory plan (budget {})",
            format_bytes(self.budget_bytes)
        )?;
        writeln!(
            f,
            "  {:<14} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            "checkpointing",
            "micro",
            "peak",
            "parameter",
            "gradient",
            "optimizer",
            "activation",
            "eval peak"
        )?;
        for p in &self.probes {
            let c = |cat: Category| format_bytes(p.category_peaks[cat.index()]);
            writeln!(
                f,
                "  {:<14} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
                segment_name(p.segment_len),
                p.micro_batch,
                format_bytes(p.peak_allocated_bytes),
                c(Category::Parameter),
                c(Category::Gradient),
                c(Category::OptimizerState),
                c(Category::Activation),
                p.eval_peak_allocated_bytes
                    .map_or("out of memory".to_string(), format_bytes),
            )?;
        }
        for m in &self.models {
            writeln!(
                f,
                "  {:<14} fixed {} + {} per sample",
                segment_name(m.segment_len),
                format_bytes(m.fixed_bytes as u64),
                format_bytes(m.per_sample_bytes as u64)
            )?;
        }
        write!(
            f,
            "  choice: effective batch {} = {} micro-batch(es) of {}, checkpointing {}; \
             predicted peak {} ({:.0}% of the budget); evaluation in chunks of {}: {}",
            self.effective_batch,
            self.effective_batch.div_ceil(self.micro_batch),
            self.micro_batch,
            segment_name(self.segment_len),
            format_bytes(self.predicted_peak_bytes),
            100.0 * self.predicted_peak_bytes as f64 / self.budget_bytes.max(1) as f64,
            self.micro_batch,
            self.predicted_eval_peak_bytes.map_or(
                "out of memory (it will split its chunks)".to_string(),
                |b| format!("peak {}", format_bytes(b))
            )
        )
    }
}

/// The micro-batch at most `largest` that splits `effective` into equal parts (as nearly as
/// possible) with as few micro-batches as `largest` allows: 64 with at most 21 gives 16 (4 x 16),
/// not 21 (21 + 21 + 21 + 1).
pub fn balanced(effective: usize, largest: usize) -> usize {
    let parts = effective.div_ceil(largest.max(1));
    effective.div_ceil(parts.max(1))
}

/// `none` or `every N`.
pub fn segment_name(segment_len: usize) -> String {
    if segment_len == 0 {
        "none".to_string()
    } else {
        format!("every {segment_len}")
    }
}

/// Runs one dry step at `micro_batch` and returns its peaks (the micro-batch it really used, if
/// out-of-memory recovery had to lower it, and whether it did).
fn probe(
    gpu: &Gpu,
    spec: &dyn Recipe,
    data: &dyn Data,
    config: &TrainConfig,
    segment_len: usize,
    micro_batch: usize,
) -> Result<(Probe, bool)> {
    let (mut model, mut optimizer) = crate::task::build_within_budget(spec, gpu)?;
    let params = model.parameters();
    let indices: Vec<usize> = (0..config.effective_batch.min(data.len())).collect();
    let indices = &indices[..micro_batch.min(indices.len())];
    let lr = config.schedule.lr_at(0);
    let mut measured = None;
    // The first step creates the optimizer state; the second is the steady state we measure.
    for warm in [true, false] {
        gpu.flush("plan")?;
        gpu.with_allocator(|a| a.reset_peaks());
        let inputs = StepInputs {
            gpu,
            model: model.as_ref(),
            params: &params,
            data,
            segment_len,
            label_smoothing: config.label_smoothing,
            clip_grad_norm: config.clip_grad_norm,
            step: 0,
        };
        let result = run_step(&inputs, optimizer.as_mut(), indices, micro_batch, lr)?;
        gpu.flush("plan")?;
        if !warm {
            let stats = gpu.with_allocator(|a| a.stats().clone());
            let mut category_peaks = [0; 7];
            for c in Category::ALL {
                category_peaks[c.index()] = stats.category(c).peak_allocated_bytes;
            }
            let eval_peak_allocated_bytes =
                eval_probe(gpu, model.as_mut(), data, &indices[..result.micro_batch])?;
            let p = Probe {
                segment_len,
                micro_batch: result.micro_batch,
                peak_allocated_bytes: stats.peak_allocated_bytes,
                category_peaks,
                eval_peak_allocated_bytes,
            };
            measured = Some((p, !result.recoveries.is_empty()));
        }
    }
    drop((params, model, optimizer));
    gpu.flush("plan")?;
    measured.ok_or_else(|| Error::invalid("plan", "no probe ran"))
}

/// Peak allocated bytes of evaluating `indices` of `data` as the trainer does (no graph,
/// evaluation mode), after a step: the optimizer state is alive as it is in a run. `None` when
/// it ran out of memory.
fn eval_probe(
    gpu: &Gpu,
    model: &mut dyn crate::task::Model,
    data: &dyn Data,
    indices: &[usize],
) -> Result<Option<u64>> {
    gpu.with_allocator(|a| a.reset_peaks());
    let _no_grad = plimsoll_autograd::no_grad();
    model.set_training(false);
    let result = data
        .upload(gpu, indices)
        .and_then(|batch| model.evaluate(&batch));
    model.set_training(true);
    gpu.flush("plan")?;
    match result {
        Ok(_) => Ok(Some(gpu.with_allocator(|a| a.stats().peak_allocated_bytes))),
        Err(e) if e.is_out_of_memory() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Fits a [`PeakModel`] for `segment_len` from two probes (or one, at micro-batch 1).
fn fit(
    gpu: &Gpu,
    spec: &dyn Recipe,
    data: &dyn Data,
    config: &TrainConfig,
    segment_len: usize,
    probes: &mut Vec<Probe>,
) -> Result<PeakModel> {
    let effective = config.effective_batch.min(data.len()).max(1);
    let mut small = (effective / 4).max(1);
    let (mut a, mut recovered) = probe(gpu, spec, data, config, segment_len, small)?;
    while recovered {
        // Its peak includes the failed attempt: measure again at the size that fitted.
        small = a.micro_batch;
        (a, recovered) = probe(gpu, spec, data, config, segment_len, small)?;
    }
    let large = (2 * small).min(effective);
    probes.push(a.clone());
    let single_point = |a: &Probe| {
        let fixed = fixed_bytes(a);
        PeakModel {
            segment_len,
            fixed_bytes: fixed as f64,
            per_sample_bytes: a.peak_allocated_bytes.saturating_sub(fixed) as f64
                / a.micro_batch.max(1) as f64,
        }
    };
    if large <= a.micro_batch {
        return Ok(single_point(&a));
    }
    let (b, recovered) = probe(gpu, spec, data, config, segment_len, large)?;
    probes.push(b.clone());
    if recovered || b.micro_batch <= a.micro_batch {
        // The larger probe ran out of memory: its peak includes the failed attempt.
        return Ok(single_point(&a));
    }
    let per_sample = (b.peak_allocated_bytes as f64 - a.peak_allocated_bytes as f64)
        / (b.micro_batch - a.micro_batch) as f64;
    Ok(PeakModel {
        segment_len,
        fixed_bytes: a.peak_allocated_bytes as f64 - per_sample * a.micro_batch as f64,
        per_sample_bytes: per_sample,
    })
}

/// Parameters + gradients + optimizer state of a probe (what does not grow with the batch).
fn fixed_bytes(p: &Probe) -> u64 {
    [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
    ]
    .iter()
    .map(|c| p.category_peaks[c.index()])
    .sum()
}

/// Checks the chosen micro-batch with a dry run of its own when no probe measured it: the fit
/// is a line through two small probes, and small tensors' rounding bends the real curve (the
/// GPT at batch 6, fitted at 1 and 2, was 7% over the line). The measured peak becomes the
/// prediction; a choice over `usable` (or one that ran out of memory, in its step or in the
/// evaluation of a chunk that size) is halved and checked again. A user's own micro-batch is
/// checked but never changed. Returns the micro-batch, its step's peak and its evaluation's.
fn confirm(
    gpu: &Gpu,
    (spec, data, config): (&dyn Recipe, &dyn Data, &TrainConfig),
    (segment_len, mut micro, mut predicted): (usize, usize, u64),
    usable: u64,
    probes: &mut Vec<Probe>,
) -> Result<(usize, u64, Option<u64>)> {
    loop {
        if let Some(p) = probes
            .iter()
            .find(|p| p.segment_len == segment_len && p.micro_batch == micro)
            && p.eval_peak_allocated_bytes.is_some_and(|e| e <= usable)
        {
            return Ok((micro, p.peak_allocated_bytes, p.eval_peak_allocated_bytes));
        }
        let (p, recovered) = probe(gpu, spec, data, config, segment_len, micro)?;
        probes.push(p.clone());
        let eval_fits = p.eval_peak_allocated_bytes.is_some_and(|e| e <= usable);
        let fits = !recovered && p.peak_allocated_bytes <= usable && eval_fits;
        if fits || micro == 1 || config.micro_batch.is_some() {
            if !recovered {
                predicted = p.peak_allocated_bytes;
            }
            return Ok((micro, predicted, p.eval_peak_allocated_bytes));
        }
        micro = balanced(config.effective_batch, micro / 2);
    }
}

/// Plans the run of `spec` on `data` under `config` (dry runs on `gpu` under its budget).
pub fn plan(
    gpu: &Gpu,
    spec: &dyn Recipe,
    data: &dyn Data,
    config: &TrainConfig,
) -> Result<MemoryPlan> {
    config.validate()?;
    let budget = gpu.memory_budget_bytes();
    let usable = (budget as f64 * HEADROOM) as u64;
    let effective = config.effective_batch;
    let candidates: Vec<usize> = match config.checkpointing {
        CheckpointPolicy::None => vec![0],
        CheckpointPolicy::EveryBlocks(k) => vec![k],
        CheckpointPolicy::Automatic => {
            let sqrt = (spec.blocks() as f64).sqrt().ceil() as usize;
            vec![0, sqrt.max(1)]
        }
    };
    let mut probes = Vec::new();
    let mut models = Vec::new();
    let mut best: Option<(usize, usize)> = None; // (micro, segment_len)
    for &segment_len in &candidates {
        let model = fit(gpu, spec, data, config, segment_len, &mut probes)?;
        let fits = match config.micro_batch {
            Some(m) => (model.predict(m) <= usable).then_some(m),
            None => model
                .largest_fitting(usable, effective)
                .map(|m| balanced(effective, m)),
        };
        models.push(model);
        if let Some(m) = fits
            && best.is_none_or(|(b, _)| m > b)
        {
            best = Some((m, segment_len));
        }
        if best.is_some_and(|(m, _)| m >= effective) {
            break; // the whole batch fits: no need to try more checkpointing
        }
    }
    gpu.empty_cache();
    let Some((micro_batch, segment_len)) = best else {
        let last = models
            .last()
            .ok_or_else(|| Error::invalid("plan", "no candidate"))?;
        return Err(Error::BudgetTooSmall {
            budget_bytes: budget,
            predicted_bytes: last.predict(config.micro_batch.unwrap_or(1)),
            fixed_bytes: last.fixed_bytes.max(0.0) as u64,
        });
    };
    let predicted_peak_bytes = models
        .iter()
        .find(|m| m.segment_len == segment_len)
        .map_or(0, |m| m.predict(micro_batch));
    let (micro_batch, predicted_peak_bytes, predicted_eval_peak_bytes) = confirm(
        gpu,
        (spec, data, config),
        (segment_len, micro_batch, predicted_peak_bytes),
        usable,
        &mut probes,
    )?;
    gpu.empty_cache();
    Ok(MemoryPlan {
        budget_bytes: budget,
        effective_batch: effective,
        micro_batch,
        segment_len,
        predicted_peak_bytes,
        predicted_eval_peak_bytes,
        models,
        probes,
    })
}
