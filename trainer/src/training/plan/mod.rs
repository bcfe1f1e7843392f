//! The memory plan: before step one, the run's own steps are replayed on a planning twin of the
//! device (`Gpu::planning_twin`: the same allocator over stand-in segments, no kernel run), so
//! every allocation happens as it will in the run, at its size and offset, in milliseconds. Each
//! dry run builds the model and replays the run's events in the trainer's order
//! (`schedule.rs`: steps over the whole effective batch in micro-batches, through the same
//! [`crate::step::run_step`] the trainer uses, an epoch's last partial batch, and evaluations in
//! chunks) until the allocator's state stops changing: the same event from the same allocator
//! layout does the same again, so each is replayed once per layout it meets and looked up after
//! that, and once every kind of event leaves the layout unchanged the rest of the run, however
//! long, repeats what was replayed. (The caching
//! allocator keeps reshaping its segments for several steps: three steps were not enough.) It
//! fits when nothing in it runs out of memory under the budget, and then its peaks are the
//! run's, for every step: allocated and reserved, per category, of the steps and of the
//! evaluations.
//!
//! The plan tries every checkpointing choice that matters (none, and every `k` blocks for each
//! `k` from 1 to the number of blocks) and, for each, finds by bisection the fewest equal
//! micro-batches that fit; it picks the largest micro-batch, then no checkpointing, then the
//! lowest reserved peak. [`MemoryPlan::margin_bytes`] is what the dry run cannot see: 0, since
//! it replays the run's allocation sequence itself. A run resumed from a checkpoint starts its
//! allocator afresh at another point of the same sequence, which out-of-memory recovery covers.

use std::time::Instant;

use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::Category;

use crate::config::{CheckpointPolicy, Offload, Precision, TrainConfig};
use crate::error::{Error, Result};
use crate::task::{Data, Recipe};

mod dry_run;
mod memory_plan;
use dry_run::probe;
pub use memory_plan::MemoryPlan;

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
    /// state alive, as the trainer evaluates); 0 without an evaluation set; `None` when it ran
    /// out of memory or the dry run ended before one.
    pub eval_peak_allocated_bytes: Option<u64>,
    /// Peak reserved bytes of the evaluation.
    pub eval_peak_reserved_bytes: Option<u64>,
    /// Whether an evaluation chunk ran out of memory (then it does not fit).
    pub eval_out_of_memory: bool,
    /// A buffer of the step or the evaluation larger than a kernel can bind (its label, bytes
    /// and the limit): then it does not fit, whatever the budget.
    pub too_large: Option<(String, u64, u64)>,
    /// A kernel loop past the adapter's limit (lavapipe's 65,535 passes) at this micro-batch,
    /// above 1: then it does not fit here, and a smaller micro-batch may.
    pub past_loop_limit: Option<String>,
    /// Steps and evaluation chunks the dry run replayed before the allocator's state repeated
    /// (the rest of the run's events repeat one of these).
    pub events_replayed: usize,
    /// Whether the allocator's state repeated within the replayed events; when not, later steps
    /// of a long run may reserve more than predicted (out-of-memory recovery covers them).
    pub converged: bool,
    /// Whether the dry run was of the recipe's memory-efficient variant
    /// ([`crate::Recipe::memory_efficient_variant`]).
    pub variant: bool,
    /// Parameters kept in host memory between their uses ([`Offload::Parameters`]).
    pub streamed_parameters: u64,
    /// Host bytes the step's offloaded activations took at most ([`Offload::Activations`]).
    pub host_activation_bytes: u64,
}

/// The checkpoint segment lengths worth a dry run for a model of `blocks` blocks: none (0), and
/// for each count of segments `s` the shortest length that makes `s` of them, `ceil(blocks /
/// s)`. A longer length with the same count keeps the same segment inputs and more of one
/// segment's activations, so it never needs less memory: 13 lengths for 48 blocks, not 48.
pub fn automatic_segments(blocks: usize) -> Vec<usize> {
    let mut lengths: Vec<usize> = (1..=blocks).map(|s| blocks.div_ceil(s)).collect();
    lengths.push(0);
    lengths.sort_unstable();
    lengths.dedup();
    lengths
}

impl Probe {
    /// A probe of `micro_batch` with `segment_len` that has not run yet: nothing seen.
    fn unrun(segment_len: usize, micro_batch: usize) -> Probe {
        Probe {
            segment_len,
            micro_batch,
            out_of_memory: false,
            peak_allocated_bytes: 0,
            peak_reserved_bytes: 0,
            category_peaks: [0; 7],
            eval_peak_allocated_bytes: None,
            eval_peak_reserved_bytes: None,
            eval_out_of_memory: false,
            too_large: None,
            past_loop_limit: None,
            events_replayed: 0,
            converged: true,
            variant: false,
            host_activation_bytes: 0,
            streamed_parameters: 0,
        }
    }

    /// Whether it ran without running out of memory.
    pub fn fits(&self) -> bool {
        !self.out_of_memory
            && !self.eval_out_of_memory
            && self.too_large.is_none()
            && self.past_loop_limit.is_none()
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

/// How a batch of `effective` samples splits into micro-batches of at most `micro`, in words:
/// "1 micro-batch of 256", "4 micro-batches of 64", "19 micro-batches of 13 and one of 9" (the
/// last takes what is left).
pub fn micro_batches_in_words(effective: usize, micro: usize) -> String {
    let micro = micro.clamp(1, effective.max(1));
    let (full, rest) = (effective / micro, effective % micro);
    let of = |n: usize| match n {
        1 => "1 micro-batch".to_string(),
        n => format!("{n} micro-batches"),
    };
    match rest {
        0 => format!("{} of {micro}", of(full)),
        _ => format!("{} of {micro} and one of {rest}", of(full)),
    }
}

/// What a dry run replays: the recipe, the training data, the evaluation data (if the run
/// evaluates) and the run's configuration.
pub(super) type Inputs<'a> = (
    &'a dyn Recipe,
    &'a dyn Data,
    Option<&'a dyn Data>,
    &'a TrainConfig,
);

/// Of two refusals, the one that asks for less: a budget that is too small over a tensor past
/// one binding (a budget can fix the first), else the smaller least budget.
fn smaller_need(a: Error, b: Error) -> Error {
    match (&a, &b) {
        (
            Error::BudgetTooSmall {
                predicted_bytes: x, ..
            },
            Error::BudgetTooSmall {
                predicted_bytes: y, ..
            },
        ) => match x <= y {
            true => a,
            false => b,
        },
        (Error::BudgetTooSmall { .. }, _) => a,
        _ => b,
    }
}

/// Whether the fixed state of a step (parameters, gradients, optimizer state: what no
/// micro-batch or checkpointing changes) alone passes `twin`'s budget, from one dry run of
/// micro-batch 1 with checkpoint segments of `segment_len` without a budget.
fn fixed_state_passes(
    gpu: &Gpu,
    twin: &Gpu,
    inputs: Inputs<'_>,
    segment_len: usize,
) -> Result<bool> {
    let unbounded = gpu.planning_twin(u64::MAX);
    let p = probe(&unbounded, inputs, segment_len, 1)?;
    Ok(fixed_bytes(&p) > twin.memory_budget_bytes())
}

/// The fixed state a dry run held: its peaks of parameters, gradients and optimizer state.
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

/// The least budget (within 1%) in which the leanest step (the configured micro-batch, else 1
/// or the whole batch) fits with some checkpointing choice, and its fixed state. One unbudgeted dry run of the
/// choice that keeps the least (every block checkpointed, where that is a choice) bounds it
/// from above (without a budget the allocator sizes segments more freely) and gives the fixed
/// state, below which nothing fits; then bisection on twins, each budget tried with every
/// choice until one fits (a dry run that runs out of memory stops there, so the ones that do
/// not fit cost little; an unbudgeted dry run of a deep model runs whole, and one of each of a
/// dozen choices made a refusal of GPT-2 XL take seconds).
fn least_budget(
    gpu: &Gpu,
    inputs: Inputs<'_>,
    candidates: &[usize],
    refused: u64,
) -> Result<(u64, u64)> {
    // Micro-batch 1 keeps the fewest activations, but the whole batch in one micro-batch
    // accumulates no gradients: either may be the leaner (a small batch of a model whose
    // gradients are large), so both are tried unless a micro-batch is given.
    let whole = inputs.3.effective_batch.min(inputs.1.len()).max(1);
    let micros: Vec<usize> = match inputs.3.micro_batch {
        Some(m) => vec![m],
        None if whole > 1 => vec![1, whole],
        None => vec![1],
    };
    let unbounded = gpu.planning_twin(u64::MAX);
    let leanest = candidates
        .iter()
        .copied()
        .find(|&c| c == 1)
        .or_else(|| candidates.iter().copied().filter(|&c| c > 0).min())
        .unwrap_or(0);
    // The leanest choice first: it is the likeliest to fit.
    let mut order: Vec<usize> = vec![leanest];
    order.extend(candidates.iter().copied().filter(|&c| c != leanest));
    let mut fits = u64::MAX;
    // The fixed state of the choices that fit, the least of them (streamed parameters' share
    // grows with the segment), and the most any choice showed.
    let (mut fixed_fitting, mut fixed_seen) = (u64::MAX, 0);
    let mut largest_unfit = 0;
    for &micro in &micros {
        // Only a dry run that fits bounds the need from above: one stopped by a tensor past
        // one binding or the loop limit peaked early, below what the step needs.
        for &segment_len in &order {
            let p = probe(&unbounded, inputs, segment_len, micro)?;
            fixed_seen = fixed_seen.max(fixed_bytes(&p));
            let peak = p
                .peak_reserved_bytes
                .max(p.eval_peak_reserved_bytes.unwrap_or(0));
            if p.fits() {
                fixed_fitting = fixed_fitting.min(fixed_bytes(&p));
                fits = fits.min(peak);
                break;
            }
            largest_unfit = largest_unfit.max(peak);
        }
    }
    let fixed = match fixed_fitting {
        u64::MAX => fixed_seen,
        least => least,
    };
    if fits == u64::MAX {
        // Nothing fits at any budget (a limit no budget lifts): at least what was seen.
        fits = largest_unfit.max(fixed);
    }
    // Every step holds the fixed state (parameters, gradients, optimizer state) at once: no
    // smaller budget can fit, so the search starts there.
    let mut fails = refused.max(fixed).min(fits);
    while fits - fails > (fits / 100).max(1) {
        let mid = fails + (fits - fails) / 2;
        let twin = gpu.planning_twin(mid);
        let mut ok = false;
        'search: for &micro in &micros {
            for &segment_len in &order {
                if probe(&twin, inputs, segment_len, micro)?.fits() {
                    ok = true;
                    break 'search;
                }
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

/// One dry run of a run whose micro-batch and checkpointing are given (it needs no plan:
/// [`TrainConfig::needs_plan`]), on a planning twin of `gpu` under its budget, each of `ranks`
/// ranks taking its shard of a batch: the kernels it launches are noted for
/// `Gpu::compile_wanted`, so the run compiles what it uses rather than every kernel, and
/// [`Probe::fits`] says whether the run will meet out-of-memory recovery. `None` when the run
/// makes a plan (whose dry runs note the kernels).
///
/// # Errors
/// Errors of the dry run other than out-of-memory (a model that cannot be built within the
/// budget is [`Error::ModelTooLarge`]).
pub fn rehearse(
    gpu: &Gpu,
    (spec, data, test): (&dyn Recipe, &dyn Data, Option<&dyn Data>),
    config: &TrainConfig,
    ranks: usize,
) -> Result<Option<Probe>> {
    if config.needs_plan() {
        return Ok(None);
    }
    let mut per_rank = config.clone();
    per_rank.effective_batch = crate::collective::largest_shard(config.effective_batch, ranks);
    let micro_batch = config.micro_batch.unwrap_or(per_rank.effective_batch);
    let segment_len = match config.checkpointing {
        CheckpointPolicy::EveryBlocks(k) => k,
        _ => 0,
    };
    let twin = gpu.planning_twin(gpu.memory_budget_bytes());
    let p = probe(
        &twin,
        (spec, data, test, &per_rank),
        segment_len,
        micro_batch,
    )?;
    if let Some(message) = &p.past_loop_limit {
        return Err(Error::invalid(
            "--micro-batch",
            format!(
                "{micro_batch}: {message}; leave --micro-batch out and the plan picks one whose \
                 loops fit"
            ),
        ));
    }
    match too_large_error(&p, config.micro_batch.is_some()) {
        Some(e) => Err(e),
        None => Ok(Some(p)),
    }
}

/// [`Error::TensorTooLarge`] for a dry run that made a buffer larger than one binding, with the
/// advice for a micro-batch the user gave (`given`) or one the plan reached.
fn too_large_error(p: &Probe, given: bool) -> Option<Error> {
    let (label, bytes, max_bytes) = p.too_large.clone()?;
    let hint = if given && p.micro_batch > 1 {
        "leave --micro-batch out: the plan then picks a micro-batch whose tensors fit one \
         binding"
            .to_string()
    } else {
        "one sample's step makes it already: use a smaller model (for the GPT a shorter \
         --context or a smaller --width); tensors split across bindings are not supported yet"
            .to_string()
    };
    Some(Error::TensorTooLarge {
        label,
        bytes,
        max_bytes,
        made_by: format!("the step at micro-batch {}", p.micro_batch),
        hint,
    })
}

/// Plans the run of `spec` on `data` under `config` and the budget of `gpu` (dry runs on a
/// planning twin of `gpu`; `gpu` itself allocates nothing). With [`Offload::Auto`], the
/// optimizer's state goes to host memory when no choice fits with it on the device and one
/// fits without (the plan's `offload` says which).
///
/// # Errors
/// [`Error::BudgetTooSmall`] when no choice fits (with `Auto`, the device's refusal); errors of
/// the dry runs other than out-of-memory.
pub fn plan(
    gpu: &Gpu,
    spec: &dyn Recipe,
    data: &dyn Data,
    test: Option<&dyn Data>,
    config: &TrainConfig,
) -> Result<MemoryPlan> {
    with_offload(config, |c| plan_on_device_or_not(gpu, spec, data, test, c))
}

/// `plan(config)` with [`Offload::Auto`] resolved, each level only when nothing fits at the one
/// before: on the device; the optimizer's state in host memory; that and the activations
/// checkpointed segments keep; that and the blocks' parameters streamed. When none fits, the last level's refusal (it names the smallest
/// budget that would do), or the one before's when a level cannot be planned (an optimizer
/// without a host form) or passes the host budget (nor does `auto` offload past it).
fn with_offload(
    config: &TrainConfig,
    plan: impl Fn(&TrainConfig) -> Result<MemoryPlan>,
) -> Result<MemoryPlan> {
    if config.offload != Offload::Auto {
        return plan(config);
    }
    let at = |offload: Offload| TrainConfig {
        offload,
        ..config.clone()
    };
    // Parameters that do not fit the device at all are a refusal too: streamed, they need not.
    let mut refused = match plan(&at(Offload::None)) {
        Err(refused @ (Error::BudgetTooSmall { .. } | Error::ModelTooLarge { .. })) => refused,
        other => return other,
    };
    for level in [
        Offload::OptimizerState,
        Offload::Activations,
        Offload::Parameters,
    ] {
        match plan(&at(level)) {
            Ok(p) => {
                let host = p
                    .offload_host_bytes
                    .saturating_add(p.offload_activation_bytes)
                    .saturating_add(p.loader_host_bytes);
                return match crate::host::budget(config.host_memory_budget) {
                    Some(budget) if host > budget => Err(refused),
                    _ => Ok(p),
                };
            }
            Err(e @ (Error::BudgetTooSmall { .. } | Error::ModelTooLarge { .. })) => refused = e,
            Err(_) => return Err(refused),
        }
    }
    Err(refused)
}

/// [`plan`] for a `config` whose offload is decided.
fn plan_on_device_or_not(
    gpu: &Gpu,
    spec: &dyn Recipe,
    data: &dyn Data,
    test: Option<&dyn Data>,
    config: &TrainConfig,
) -> Result<MemoryPlan> {
    let Some((why, variant)) = spec.memory_efficient_variant() else {
        return plan_explained(gpu, (spec, data, test, config), true);
    };
    // The variant needs less memory for the same choice at the sizes it is for (a tiny model's
    // may need more): plan the variant, then one dry run of the recipe at that choice keeps
    // the (faster) recipe when it fits there too. When the variant fits nothing, the recipe
    // is planned in full, and when neither fits, the refusal names the smaller need.
    let mut lean = match plan_explained(gpu, (variant.as_ref(), data, test, config), true) {
        Ok(lean) => lean,
        Err(lean_err @ (Error::BudgetTooSmall { .. } | Error::TensorTooLarge { .. })) => {
            // The parameters, gradients and optimizer state alone pass the budget: the recipe
            // holds the same ones, so planning it too (as many dry runs again) cannot fit.
            if let Error::BudgetTooSmall {
                budget_bytes,
                fixed_bytes,
                ..
            } = lean_err
                && fixed_bytes > budget_bytes
            {
                return Err(lean_err);
            }
            return match plan_explained(gpu, (spec, data, test, config), true) {
                Ok(own) => Ok(own),
                Err(own_err @ (Error::BudgetTooSmall { .. } | Error::TensorTooLarge { .. })) => {
                    Err(smaller_need(lean_err, own_err))
                }
                Err(e) => Err(e),
            };
        }
        Err(e) => return Err(e),
    };
    for p in &mut lean.probes {
        p.variant = true;
    }
    let at_choice = TrainConfig {
        micro_batch: Some(lean.micro_batch),
        checkpointing: match lean.segment_len {
            0 => CheckpointPolicy::None,
            k => CheckpointPolicy::EveryBlocks(k),
        },
        ..config.clone()
    };
    match plan_explained(gpu, (spec, data, test, &at_choice), false) {
        Ok(mut own) => {
            own.plan_ms += lean.plan_ms;
            lean.probes.append(&mut own.probes);
            own.probes = lean.probes;
            Ok(own)
        }
        Err(Error::BudgetTooSmall { .. } | Error::TensorTooLarge { .. }) => {
            lean.variant = Some(why);
            Ok(lean)
        }
        Err(e) => Err(e),
    }
}

/// Plans `recipe` itself again (its memory-efficient variant is not considered: the model is
/// built) under the current budget of `gpu`: what a run does when the budget changes mid-run.
/// No least budget is searched for a refusal.
///
/// # Errors
/// As [`plan`]'s.
pub fn replan(
    gpu: &Gpu,
    recipe: &dyn Recipe,
    data: &dyn Data,
    test: Option<&dyn Data>,
    config: &TrainConfig,
) -> Result<MemoryPlan> {
    with_offload(config, |c| {
        plan_explained(gpu, (recipe, data, test, c), false)
    })
}

/// Host bytes of the batches the loader thread keeps ready ([`crate::loader`]): `prefetch`
/// batches (one without prefetching) of `effective_batch` samples, each as large as sample 0
/// built in host memory (0 for data that builds its batches only on the device).
pub(crate) fn loader_host_bytes(data: &dyn Data, config: &TrainConfig) -> Result<u64> {
    let per_sample = match data.is_empty() {
        true => None,
        false => data.gather(&[0])?,
    };
    let batches = config.prefetch.max(1) as u64;
    Ok(per_sample.map_or(0, |b| b.bytes()) * config.effective_batch as u64 * batches)
}

/// [`plan`]; when nothing fits and `explain`, the refusal's least budget and whether f16 fits
/// are found too (more dry runs), else [`Error::BudgetTooSmall`] carries zeros for them.
fn plan_explained(
    gpu: &Gpu,
    (spec, data, test, config): Inputs<'_>,
    explain: bool,
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
        CheckpointPolicy::Automatic => automatic_segments(spec.blocks()),
    };
    // Streamed blocks run in segments of at least one block (`plimsoll_nn`'s `run_blocks`).
    let mut candidates = candidates;
    if config.offload.parameters_on_host() {
        candidates.iter_mut().for_each(|k| *k = (*k).max(1));
        candidates.dedup();
    }
    let mut probes: Vec<Probe> = Vec::new();
    let mut best: Option<Probe> = None;
    // The largest micro-batch whose tensors each fit one binding, as far as known: a tensor
    // past the limit at micro-batch m is past it at every larger one, checkpointed or not
    // (checkpointing changes what is kept, not how big each tensor is made).
    let mut cap = effective;
    let mut cap_by_loops = false;
    // Whether the fixed state alone passes the budget, once asked.
    let mut fixed_checked: Option<bool> = None;
    for &segment_len in &candidates {
        // The largest micro-batch the search can reach under the cap: `ceil(effective / parts)`.
        let reachable = (1..=effective)
            .map(|parts| effective.div_ceil(parts))
            .find(|&m| m <= cap)
            .unwrap_or(1);
        if best
            .as_ref()
            .is_some_and(|b| b.micro_batch >= reachable && b.segment_len == 0)
        {
            break; // the largest possible micro-batch without checkpointing: nothing can beat it
        }
        let mut run = |micro: usize, probes: &mut Vec<Probe>| -> Result<Probe> {
            if let Some(p) = probes
                .iter()
                .find(|p| p.segment_len == segment_len && p.micro_batch == micro)
            {
                return Ok(p.clone());
            }
            if micro > cap {
                // Not run: a smaller micro-batch already made a tensor past one binding, or a
                // kernel loop past the adapter's limit.
                let mut p = Probe::unrun(segment_len, micro);
                match cap_by_loops {
                    true => p.past_loop_limit = Some("(a smaller micro-batch's)".into()),
                    false => p.too_large = Some(("(a smaller micro-batch's)".into(), 0, 0)),
                }
                return Ok(p);
            }
            let p = probe(&twin, (spec, data, test, config), segment_len, micro)?;
            if (p.too_large.is_some() || p.past_loop_limit.is_some()) && micro <= cap {
                cap = micro.saturating_sub(1);
                cap_by_loops = p.too_large.is_none();
            }
            probes.push(p.clone());
            Ok(p)
        };
        let found = match config.micro_batch {
            Some(m) => Some(run(m.min(effective), &mut probes)?).filter(Probe::fits),
            // The best so far already has the largest micro-batch the search can reach: this
            // checkpointing can only tie it (and win with a lower peak), so try just that.
            None if best.as_ref().is_some_and(|b| b.micro_batch >= reachable) => {
                Some(run(reachable, &mut probes)?).filter(Probe::fits)
            }
            None => {
                // The fewest equal parts that fit: double the parts until one fits (small
                // micro-batches are the slow dry runs), then bisect between the last two.
                let mut fails = 0usize;
                let mut parts = 1usize;
                let mut fitting: Option<(usize, Probe)> = None;
                if let Some(b) = &best {
                    // Only a micro-batch at least the best's can win: try the best's first,
                    // and drop this checkpointing when it does not fit (one dry run, not a
                    // search from the whole batch down).
                    let parts_b = effective.div_ceil(b.micro_batch.max(1));
                    let p = run(effective.div_ceil(parts_b), &mut probes)?;
                    match p.fits() {
                        true => fitting = Some((parts_b, p)),
                        false => parts = effective + 1,
                    }
                }
                while fitting.is_none() && parts <= effective {
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
        // Asked once, after the first checkpointing that fits nothing.
        if found.is_none() && best.is_none() && fixed_checked.is_none() {
            let passes = fixed_state_passes(gpu, &twin, (spec, data, test, config), segment_len)?;
            fixed_checked = Some(passes);
        }
        if fixed_checked == Some(true) {
            // The parameters, gradients and optimizer state alone pass the budget: no
            // micro-batch or checkpointing can fit, so the search stops here.
            break;
        }
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
    }
    let Some(choice) = best else {
        // A buffer past one binding at the smallest micro-batch tried: no budget helps.
        let smallest = probes.iter().map(|p| p.micro_batch).min();
        if let Some(e) = probes
            .iter()
            .filter(|p| Some(p.micro_batch) == smallest)
            .find_map(|p| too_large_error(p, config.micro_batch.is_some()))
        {
            return Err(e);
        }
        if !explain {
            return Err(Error::BudgetTooSmall {
                budget_bytes: budget,
                predicted_bytes: 0,
                fixed_bytes: 0,
                f16_fits: None,
            });
        }
        let (need, fixed) = least_budget(gpu, (spec, data, test, config), &candidates, budget)?;
        // Would storing activations in f16 make it fit? Not when the fixed state alone (the
        // parameters, gradients and optimizer state, all f32) passes the budget.
        let f16_fits = match config.precision {
            Precision::F32 if fixed < budget => {
                let half = TrainConfig {
                    precision: Precision::F16,
                    ..config.clone()
                };
                match plan_explained(gpu, (spec, data, test, &half), false) {
                    Ok(p) => Some((p.micro_batch, p.predicted_peak_reserved_bytes)),
                    Err(Error::BudgetTooSmall { .. }) => None,
                    Err(e) => return Err(e),
                }
            }
            Precision::F32 | Precision::F16 => None,
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
        precision: config.precision.to_string(),
        predicted_peak_bytes: choice.peak_allocated_bytes,
        predicted_peak_reserved_bytes: choice
            .peak_reserved_bytes
            .max(choice.eval_peak_reserved_bytes.unwrap_or(0)),
        predicted_eval_peak_bytes: choice.eval_peak_allocated_bytes,
        loss_chunk_rows: spec.loss_chunk_rows(
            choice.micro_batch,
            data.input_width(),
            gpu.max_buffer_bytes(),
        ),
        variant: None,
        offload: config.offload.to_string(),
        offload_host_bytes: match config.offload.optimizer_on_host() {
            true => crate::host::product(spec.parameter_count(), 8),
            false => 0,
        },
        offload_activation_bytes: choice.host_activation_bytes,
        offload_streamed_parameters: choice.streamed_parameters,
        offload_transfer_bytes: transfer_bytes(spec, config, &choice),
        prefetch: config.prefetch,
        loader_host_bytes: loader_host_bytes(data, config)?,
        micro_batch_note: (choice.micro_batch < config.effective_batch
            && !spec.micro_batch_invariant())
        .then(|| {
            format!(
                "the model's BatchNorm normalises each micro-batch of {} by its own statistics, \
                 not the batch of {}'s (GroupNorm does not depend on the batch; \
                 --micro-batch-invariant refuses the split)",
                choice.micro_batch, config.effective_batch
            )
        }),
        probes,
        plan_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// Bytes a step of `choice` moves between host and device for its offloading. The optimizer's
/// update: each gradient and value on the device read back, each value written (a streamed
/// parameter's are in host memory already). The activations: each read back once and written
/// back once. Each streamed parameter: written for its segment's forward and for its
/// recomputation, its gradient read back after each micro-batch's backward and written for
/// every one after the first.
fn transfer_bytes(spec: &dyn Recipe, config: &TrainConfig, choice: &Probe) -> u64 {
    let streamed = choice.streamed_parameters;
    let optimizer = match config.offload.optimizer_on_host() {
        true => (spec.parameter_count() as u64).saturating_sub(streamed),
        false => 0,
    };
    let micro_batches = config
        .effective_batch
        .div_ceil(choice.micro_batch.max(1))
        .max(1) as u64;
    optimizer
        .saturating_mul(12)
        .saturating_add(choice.host_activation_bytes.saturating_mul(2))
        .saturating_add(
            streamed
                .saturating_mul(4)
                .saturating_mul(4 * micro_batches - 1),
        )
}

/// The share of what the driver lets the process use ([`plimsoll_autograd::Gpu::device_memory`])
/// that the allocator's budget may take: the rest is for what it does not count (pipelines,
/// uniform chunks, read-back staging) and for the driver's own rounding.
pub const DRIVER_SHARE: f64 = 0.9;

/// The budget a run follows when the driver reports `driver_bytes` for the process: its own
/// `run_budget`, or [`DRIVER_SHARE`] of the driver's figure when that is less.
pub fn driver_budget(run_budget: u64, driver_bytes: u64) -> u64 {
    run_budget.min((driver_bytes as f64 * DRIVER_SHARE) as u64)
}

#[cfg(test)]
mod tests;
