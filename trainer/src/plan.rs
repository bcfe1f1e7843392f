//! The memory plan: before step one, the run's own steps are replayed on a planning twin of the
//! device (`Gpu::planning_twin`: the same allocator over stand-in segments, no kernel run), so
//! every allocation happens as it will in the run, at its size and offset, in milliseconds. Each
//! dry run builds the model, runs three steps over the whole effective batch (in micro-batches,
//! through the same [`crate::step::run_step`] the trainer uses) with an evaluation of two chunks
//! between the second and the third, and the last partial batch of an epoch when there is one.
//! It fits when nothing in it runs out of memory under the budget, and then its peaks are the
//! run's: allocated and reserved, per category, of the steps and of the evaluation.
//!
//! The plan tries every checkpointing choice that matters (none, and every `k` blocks for each
//! `k` from 1 to the number of blocks) and, for each, finds by bisection the fewest equal
//! micro-batches that fit; it picks the largest micro-batch, then no checkpointing, then the
//! lowest reserved peak. [`MemoryPlan::margin_bytes`] is what the dry run cannot see: 0, since
//! it replays the run's allocation sequence itself (steps, an evaluation between steps, the last
//! partial batch); a run that evaluates more often, or resumes from a checkpoint, allocates in
//! the same sizes in another order, which out-of-memory recovery covers.

use std::fmt;
use std::time::Instant;

use plimsoll_allocator::format_bytes;
use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::Category;

use crate::config::{CheckpointPolicy, Precision, TrainConfig};
use crate::error::{Error, Result};
use crate::step::{StepInputs, run_step};
use crate::task::{Data, Recipe};

/// One dry run on the planning twin.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Probe {
    /// Children per checkpointed segment (0: none).
    pub segment_len: usize,
    /// Samples per forward/backward.
    pub micro_batch: usize,
    /// Whether anything in it ran out of memory under the budget (then it does not fit, and
    /// its peaks are those of the part that ran).
    pub out_of_memory: bool,
    /// Peak allocated bytes of the steps.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes of the steps.
    pub peak_reserved_bytes: u64,
    /// Peak allocated bytes per category ([`Category::ALL`] order) of the steps.
    pub category_peaks: [u64; 7],
    /// Peak allocated bytes of the evaluation (chunks of `micro_batch` samples, the optimizer
    /// state alive, as the trainer evaluates); `None` when it ran out of memory.
    pub eval_peak_allocated_bytes: Option<u64>,
    /// Peak reserved bytes of the evaluation.
    pub eval_peak_reserved_bytes: Option<u64>,
}

impl Probe {
    /// Whether it ran without running out of memory.
    pub fn fits(&self) -> bool {
        !self.out_of_memory && self.eval_peak_allocated_bytes.is_some()
    }
}

/// The plan: what the trainer will use, and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemoryPlan {
    /// The budget planned against.
    pub budget_bytes: u64,
    /// Bytes kept free for what the dry run cannot see (see the module docs).
    pub margin_bytes: u64,
    /// The effective batch.
    pub effective_batch: usize,
    /// The chosen micro-batch.
    pub micro_batch: usize,
    /// The chosen checkpoint segment length (0: none).
    pub segment_len: usize,
    /// Predicted peak allocated bytes of a step with the choice.
    pub predicted_peak_bytes: u64,
    /// Predicted peak reserved bytes of the run (steps and evaluation).
    pub predicted_peak_reserved_bytes: u64,
    /// Predicted peak allocated bytes of evaluating in chunks of the chosen micro-batch.
    pub predicted_eval_peak_bytes: Option<u64>,
    /// Every dry run, in the order made.
    pub probes: Vec<Probe>,
    /// Wall time of the plan, ms.
    pub plan_ms: f64,
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "memory plan (budget {}; {} dry runs on a planning device, no kernel run, in {:.0} ms)",
            format_bytes(self.budget_bytes),
            self.probes.len(),
            self.plan_ms
        )?;
        writeln!(
            f,
            "  {:<14} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            "checkpointing",
            "micro",
            "peak",
            "reserved",
            "parameter",
            "optimizer",
            "activation",
            "eval peak",
            "fits"
        )?;
        for p in &self.probes {
            let c = |cat: Category| format_bytes(p.category_peaks[cat.index()]);
            writeln!(
                f,
                "  {:<14} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
                segment_name(p.segment_len),
                p.micro_batch,
                format_bytes(p.peak_allocated_bytes),
                format_bytes(p.peak_reserved_bytes),
                c(Category::Parameter),
                c(Category::OptimizerState),
                c(Category::Activation),
                p.eval_peak_allocated_bytes
                    .map_or("-".to_string(), format_bytes),
                if p.fits() { "yes" } else { "out of memory" },
            )?;
        }
        writeln!(
            f,
            "  margin: {} (the dry run replays the run's own allocations: steps, an evaluation \
             between steps, the last partial batch)",
            format_bytes(self.margin_bytes)
        )?;
        write!(
            f,
            "  choice: effective batch {} = {} micro-batch(es) of {}, checkpointing {}; \
             predicted peak {} allocated, {} reserved ({:.0}% of the budget); evaluation in \
             chunks of {}: {}",
            self.effective_batch,
            self.effective_batch.div_ceil(self.micro_batch),
            self.micro_batch,
            segment_name(self.segment_len),
            format_bytes(self.predicted_peak_bytes),
            format_bytes(self.predicted_peak_reserved_bytes),
            100.0 * self.predicted_peak_reserved_bytes as f64 / self.budget_bytes.max(1) as f64,
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

/// The dry run of `micro_batch` with checkpoint segments of `segment_len` on the twin (see the
/// module docs).
fn probe(
    twin: &Gpu,
    (spec, data, config): (&dyn Recipe, &dyn Data, &TrainConfig),
    segment_len: usize,
    micro_batch: usize,
) -> Result<Probe> {
    // The twin allocates as the run will: planned steps when the run has them, afresh.
    let planned = config.allocator == crate::config::AllocatorMode::Planned;
    twin.with_allocator(|a| a.set_step_planning(planned));
    twin.empty_cache();
    twin.with_allocator(|a| a.reset_peaks());
    let mut p = Probe {
        segment_len,
        micro_batch,
        out_of_memory: false,
        peak_allocated_bytes: 0,
        peak_reserved_bytes: 0,
        category_peaks: [0; 7],
        eval_peak_allocated_bytes: None,
        eval_peak_reserved_bytes: None,
    };
    // A model that cannot be built within the budget is `ModelTooLarge`, whatever the batch.
    let (mut model, mut optimizer) = crate::task::build_within_budget(spec, twin)?;
    let params = model.parameters();
    let len = data.len();
    let effective = config.effective_batch.min(len).max(1);
    let full: Vec<usize> = (0..effective).collect();
    let partial: Vec<usize> = (0..len % config.effective_batch).collect();
    let lr = config.schedule.lr_at(0);
    let keep_step_peaks = |p: &mut Probe| {
        let stats = twin.with_allocator(|a| a.stats().clone());
        p.peak_allocated_bytes = p.peak_allocated_bytes.max(stats.peak_allocated_bytes);
        p.peak_reserved_bytes = p.peak_reserved_bytes.max(stats.peak_reserved_bytes);
        for c in Category::ALL {
            let peak = &mut p.category_peaks[c.index()];
            *peak = (*peak).max(stats.category(c).peak_allocated_bytes);
        }
    };
    // Steps 1 and 2, an evaluation, step 3, and the last partial batch.
    let steps: [&[usize]; 4] = [&full, &full, &full, &partial];
    for (i, indices) in steps.into_iter().enumerate() {
        if i == 2 {
            twin.with_allocator(|a| a.reset_peaks());
            let chunk = micro_batch.min(len);
            let eval: Vec<usize> = (0..(2 * chunk).min(len)).collect();
            let _no_grad = plimsoll_autograd::no_grad();
            model.set_training(false);
            let mut result = Ok(());
            for part in eval.chunks(chunk.max(1)) {
                result = data
                    .upload(twin, part)
                    .and_then(|batch| model.evaluate(&batch))
                    .map(drop);
                if result.is_err() {
                    break;
                }
            }
            model.set_training(true);
            match result {
                Ok(()) => {
                    let stats = twin.with_allocator(|a| a.stats().clone());
                    p.eval_peak_allocated_bytes = Some(stats.peak_allocated_bytes);
                    p.eval_peak_reserved_bytes = Some(stats.peak_reserved_bytes);
                }
                Err(e) if e.is_out_of_memory() => return Ok(p),
                Err(e) => return Err(e),
            }
        }
        if indices.is_empty() {
            continue;
        }
        twin.with_allocator(|a| a.reset_peaks());
        let inputs = StepInputs {
            gpu: twin,
            model: model.as_ref(),
            params: &params,
            data,
            segment_len,
            label_smoothing: config.label_smoothing,
            clip_grad_norm: config.clip_grad_norm,
            step: 0,
            batch_len: indices.len(),
            collective: None,
            stop: false,
            precision: config.precision,
            // The first step's scale: the same arguments as the run's first step (the warm-up
            // compiles what the dry run launched).
            loss_scale: crate::scaler::first_scale(config.precision),
        };
        let micro = balanced(indices.len(), micro_batch);
        let result = run_step(&inputs, optimizer.as_mut(), indices, micro, lr);
        keep_step_peaks(&mut p);
        match result {
            Ok(r) if r.recoveries.is_empty() => {}
            Ok(_) => {
                p.out_of_memory = true;
                return Ok(p);
            }
            Err(e) if e.is_out_of_memory() => {
                p.out_of_memory = true;
                return Ok(p);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(p)
}

/// The least budget (within 1%) in which the smallest step (the configured micro-batch, else 1)
/// fits with some checkpointing choice, and its fixed state: an unbudgeted dry run bounds it from
/// above (without a budget the allocator sizes segments more freely), then bisection on twins.
fn least_budget(
    gpu: &Gpu,
    (spec, data, config): (&dyn Recipe, &dyn Data, &TrainConfig),
    candidates: &[usize],
    refused: u64,
) -> Result<(u64, u64)> {
    let micro = config.micro_batch.unwrap_or(1);
    let unbounded = gpu.planning_twin(u64::MAX);
    let (mut fits, mut fixed) = (u64::MAX, u64::MAX);
    for &segment_len in candidates {
        let p = probe(&unbounded, (spec, data, config), segment_len, micro)?;
        fits = fits.min(
            p.peak_reserved_bytes
                .max(p.eval_peak_reserved_bytes.unwrap_or(0)),
        );
        fixed = fixed.min(
            [
                Category::Parameter,
                Category::Gradient,
                Category::OptimizerState,
            ]
            .iter()
            .map(|c| p.category_peaks[c.index()])
            .sum(),
        );
    }
    let mut fails = refused.min(fits);
    while fits - fails > (fits / 100).max(1) {
        let mid = fails + (fits - fails) / 2;
        let twin = gpu.planning_twin(mid);
        let mut ok = false;
        for &segment_len in candidates {
            if probe(&twin, (spec, data, config), segment_len, micro)?.fits() {
                ok = true;
                break;
            }
        }
        if ok {
            fits = mid;
        } else {
            fails = mid;
        }
    }
    Ok((fits, fixed))
}

/// Plans the run of `spec` on `data` under `config` and the budget of `gpu` (dry runs on a
/// planning twin of `gpu`; `gpu` itself allocates nothing).
///
/// # Errors
/// [`Error::BudgetTooSmall`] when no choice fits; errors of the dry runs other than
/// out-of-memory.
pub fn plan(
    gpu: &Gpu,
    spec: &dyn Recipe,
    data: &dyn Data,
    config: &TrainConfig,
) -> Result<MemoryPlan> {
    config.validate()?;
    let started = Instant::now();
    let budget = gpu.memory_budget_bytes();
    let margin = 0;
    let twin = gpu.planning_twin(budget.saturating_sub(margin));
    let effective = config.effective_batch.min(data.len()).max(1);
    let candidates: Vec<usize> = match config.checkpointing {
        CheckpointPolicy::None => vec![0],
        CheckpointPolicy::EveryBlocks(k) => vec![k],
        CheckpointPolicy::Automatic => (0..=spec.blocks()).collect(),
    };
    let mut probes: Vec<Probe> = Vec::new();
    let mut best: Option<Probe> = None;
    for &segment_len in &candidates {
        let run = |micro: usize, probes: &mut Vec<Probe>| -> Result<Probe> {
            if let Some(p) = probes
                .iter()
                .find(|p| p.segment_len == segment_len && p.micro_batch == micro)
            {
                return Ok(p.clone());
            }
            let p = probe(&twin, (spec, data, config), segment_len, micro)?;
            probes.push(p.clone());
            Ok(p)
        };
        let found = match config.micro_batch {
            Some(m) => Some(run(m.min(effective), &mut probes)?).filter(Probe::fits),
            None => {
                // The fewest equal parts that fit: double the parts until one fits (small
                // micro-batches are the slow dry runs), then bisect between the last two.
                let mut fails = 0usize;
                let mut parts = 1usize;
                let mut fitting: Option<(usize, Probe)> = None;
                loop {
                    let p = run(effective.div_ceil(parts), &mut probes)?;
                    if p.fits() {
                        fitting = Some((parts, p));
                        break;
                    }
                    fails = parts;
                    if parts >= effective {
                        break;
                    }
                    parts = (parts * 2).min(effective);
                }
                if let Some((mut hi, mut best_here)) = fitting {
                    while hi - fails > 1 {
                        let mid = fails + (hi - fails) / 2;
                        let p = run(effective.div_ceil(mid), &mut probes)?;
                        if p.fits() {
                            (hi, best_here) = (mid, p);
                        } else {
                            fails = mid;
                        }
                    }
                    Some(best_here)
                } else {
                    None
                }
            }
        };
        if let Some(p) = found {
            let better = match &best {
                None => true,
                Some(b) => {
                    p.micro_batch > b.micro_batch
                        || (p.micro_batch == b.micro_batch
                            && b.segment_len != 0
                            && p.peak_reserved_bytes < b.peak_reserved_bytes)
                }
            };
            if better {
                best = Some(p);
            }
        }
        if best
            .as_ref()
            .is_some_and(|b| b.micro_batch >= effective && b.segment_len == 0)
        {
            break; // the whole batch fits without checkpointing: nothing can beat it
        }
    }
    let Some(choice) = best else {
        let (need, fixed) = least_budget(gpu, (spec, data, config), &candidates, budget)?;
        // Would storing activations in f16 make it fit?
        let f16_fits = match config.precision {
            Precision::F32 => {
                let half = TrainConfig {
                    precision: Precision::F16,
                    ..config.clone()
                };
                match plan(gpu, spec, data, &half) {
                    Ok(p) => Some((p.micro_batch, p.predicted_peak_reserved_bytes)),
                    Err(Error::BudgetTooSmall { .. }) => None,
                    Err(e) => return Err(e),
                }
            }
            Precision::F16 => None,
        };
        return Err(Error::BudgetTooSmall {
            budget_bytes: budget,
            predicted_bytes: need,
            fixed_bytes: fixed,
            f16_fits,
        });
    };
    Ok(MemoryPlan {
        budget_bytes: budget,
        margin_bytes: margin,
        effective_batch: config.effective_batch,
        micro_batch: choice.micro_batch,
        segment_len: choice.segment_len,
        predicted_peak_bytes: choice.peak_allocated_bytes,
        predicted_peak_reserved_bytes: choice
            .peak_reserved_bytes
            .max(choice.eval_peak_reserved_bytes.unwrap_or(0)),
        predicted_eval_peak_bytes: choice.eval_peak_allocated_bytes,
        probes,
        plan_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}
