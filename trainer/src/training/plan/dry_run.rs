//! One dry run on the planning twin: the run's own events replayed once per allocator layout
//! they start from, until the layout stops changing (see the parent module's docs).

use std::collections::HashMap;

use plimsoll_allocator::Layout;
use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::Category;

use super::{Inputs, Probe};
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::step::{StepInputs, run_step};
use crate::task::Data;
use crate::training::schedule::{Event, RunEvents};

/// The number of `layout` in `layouts`, numbering it if new.
fn intern(layouts: &mut HashMap<Layout, usize>, layout: Layout) -> usize {
    let next = layouts.len();
    *layouts.entry(layout).or_insert(next)
}

/// Events a dry run replays at most before it gives up waiting for the allocator's state to
/// repeat (each is a step or an evaluation chunk on the twin: milliseconds for the models here).
pub(super) const MAX_REPLAYED_EVENTS: usize = 256;

/// The dry run of `micro_batch` with checkpoint segments of `segment_len` on the twin: the run's
/// own events ([`RunEvents`]: its steps, partial steps and evaluation chunks, in order), each
/// replayed once per allocator [`Layout`] it starts from. The allocator is deterministic, so an
/// event from a layout it was replayed from before (with the same last step, which a planned
/// allocator remembers) would do exactly what it did then, peaks included: it is looked up, not
/// run. A run whose steps settle into one layout, or cycle through a few, costs a few replays;
/// once every kind of event leaves the current layout unchanged the dry run stops. Its peaks
/// are then those of every step of the run, however long.
pub(super) fn probe(
    twin: &Gpu,
    (spec, data, test, config): Inputs<'_>,
    segment_len: usize,
    micro_batch: usize,
) -> Result<Probe> {
    // The twin allocates as the run will: planned steps when the run has them, afresh.
    let planned = config.allocator == crate::config::AllocatorMode::Planned;
    twin.with_allocator(|a| a.set_step_planning(planned));
    twin.empty_cache();
    twin.with_allocator(|a| a.reset_peaks());
    let mut p = Probe::unrun(segment_len, micro_batch);
    // Without an evaluation set the run never evaluates: nothing to run out of memory.
    if test.is_none() {
        p.eval_peak_allocated_bytes = Some(0);
        p.eval_peak_reserved_bytes = Some(0);
    }
    // A model that cannot be built within the budget is `ModelTooLarge`, whatever the batch.
    let (mut model, mut optimizer) = match crate::task::build_for_run(spec, twin, config) {
        // Streamed, the model's blocks leave the device as they are made: what is left may
        // still not fit this budget, as a step may not.
        Err(e) if e.is_out_of_memory() && config.offload.parameters_on_host() => {
            fold_peaks(twin, &mut p);
            p.out_of_memory = true;
            return Ok(p);
        }
        built => built?,
    };
    let params = model.parameters();
    p.streamed_parameters = params
        .iter()
        .filter(|(_, t)| !t.is_resident())
        .map(|(_, t)| t.numel() as u64)
        .sum();
    if config.resumed_at.is_some() {
        // A resume loads the state before step 1 (each entry uploaded, then copied into the
        // optimizer's own buffer): its peak is the run's too.
        let loaded = crate::checkpoint_io::planned_resume(twin, &params, optimizer.as_mut());
        fold_peaks(twin, &mut p);
        match loaded {
            Ok(()) => {}
            Err(e) if e.is_out_of_memory() => {
                p.out_of_memory = true;
                return Ok(p);
            }
            Err(e) => return Err(e),
        }
    }
    let eval_len = test.map_or(0, |t| t.len());
    let mut events = RunEvents::new(config, data.len(), eval_len, micro_batch);
    if let Some(at) = config.resumed_at {
        events.start_at(at);
    }
    // Every layout seen, numbered; and per (layout, the last step's kind, event) replayed, the
    // layout it left. The allocator is deterministic: the same event from the same layout (the
    // last step's kind too, which a planned allocator's recording holds) does the same again,
    // peaks included, so it is not run twice. A run whose steps repeat, or cycle through a
    // few layouts, costs a few replays and then a table lookup per event, however long.
    let mut layouts: HashMap<Layout, usize> = HashMap::new();
    let mut memo: HashMap<(usize, Option<Event>, Event), usize> = HashMap::new();
    let mut current = intern(&mut layouts, twin.with_allocator(|a| a.layout()));
    let mut last_step: Option<Event> = None;
    let kinds = events.kinds();
    let lr = config.schedule.lr_at(0);
    for event in events {
        let key = (current, last_step, event);
        if matches!(event, Event::Step(_)) {
            last_step = Some(event);
        }
        if let Some(&next) = memo.get(&key) {
            // Every event the run can still do leaves this layout as it is: the rest repeats.
            let still = |ls: Option<Event>| {
                kinds
                    .iter()
                    .all(|&k| memo.get(&(current, ls, k)) == Some(&current))
            };
            if next == current
                && still(last_step)
                && kinds
                    .iter()
                    .filter(|k| matches!(k, Event::Step(_)))
                    .all(|&k| still(Some(k)))
            {
                break;
            }
            current = next;
            continue;
        }
        if p.events_replayed == MAX_REPLAYED_EVENTS {
            p.converged = false;
            break;
        }
        p.events_replayed += 1;
        let fits = match event {
            Event::Step(samples) => replay_step(
                twin,
                (model.as_mut(), optimizer.as_mut()),
                &params,
                (data, config),
                segment_len,
                (samples, micro_batch),
                lr,
                &mut p,
            )?,
            Event::EvalChunk(samples) => {
                let Some(test) = test else { continue };
                replay_eval_chunk(twin, model.as_mut(), test, samples, &mut p)?
            }
        };
        if !fits {
            return Ok(p);
        }
        current = intern(&mut layouts, twin.with_allocator(|a| a.layout()));
        memo.insert(key, current);
    }
    Ok(p)
}

/// Replays one optimizer step of `samples` samples in micro-batches of at most `micro_batch`
/// on the twin, folding its peaks into `p`; false (and `p` marked) when it ran out of memory.
#[allow(clippy::too_many_arguments)]
fn replay_step(
    twin: &Gpu,
    (model, optimizer): (&mut dyn crate::task::Model, &mut dyn plimsoll_nn::Optimizer),
    params: &[(String, plimsoll_autograd::Tensor)],
    (data, config): (&dyn Data, &TrainConfig),
    segment_len: usize,
    (samples, micro_batch): (usize, usize),
    lr: f32,
    p: &mut Probe,
) -> Result<bool> {
    twin.with_allocator(|a| {
        // As the trainer's step: with a plan installed, what an evaluation left empty goes first.
        if a.step_plan_stats().planned_requests > 0 {
            a.empty_cache();
        }
        a.reset_peaks();
    });
    crate::host::check("the step's sample indices", samples as u64, 8)?;
    let indices: Vec<usize> = (0..samples).collect();
    // With several ranks, the collective calls as the run makes them (nothing is sent), and
    // this rank's loss weighted by its share of the whole batch, as in the run.
    let (rank, ranks) = config.rank;
    let planning = crate::collective::Planning { rank, ranks };
    let inputs = StepInputs {
        gpu: twin,
        model: &*model,
        params,
        data,
        host: None,
        segment_len,
        label_smoothing: config.label_smoothing,
        clip_grad_norm: config.clip_grad_norm,
        step: 0,
        batch_len: samples * ranks.max(1),
        collective: (ranks > 1).then_some(&planning as &dyn crate::collective::Collective),
        stop: false,
        precision: config.precision,
        // The first step's scale: the same arguments as the run's first step (the warm-up
        // compiles what the dry run launched).
        loss_scale: crate::scaler::first_scale(config.precision),
        shard: config.shard,
        offload_activations: config.offload.activations_on_host(),
    };
    // In chunks of `micro_batch`, as the trainer's step: an epoch's partial batch of 128 at
    // micro-batch 37 runs 37, 37, 37 and 17 (not four of 32, which would predict too little).
    plimsoll_autograd::reset_offloaded_peak();
    let result = run_step(&inputs, optimizer, &indices, micro_batch, lr);
    fold_peaks(twin, p);
    let host = plimsoll_autograd::offloaded_host_bytes().1;
    p.host_activation_bytes = p.host_activation_bytes.max(host);
    match result {
        Ok(r) if r.recoveries.is_empty() => Ok(true),
        Ok(_) => {
            p.out_of_memory = true;
            Ok(false)
        }
        Err(e) if e.is_out_of_memory() => {
            p.out_of_memory = true;
            Ok(false)
        }
        Err(e) => beyond_a_limit(e, p),
    }
}

/// The twin's peaks since they were last reset, folded into `p`'s.
fn fold_peaks(twin: &Gpu, p: &mut Probe) {
    let stats = twin.with_allocator(|a| a.stats().clone());
    p.peak_allocated_bytes = p.peak_allocated_bytes.max(stats.peak_allocated_bytes);
    p.peak_reserved_bytes = p.peak_reserved_bytes.max(stats.peak_reserved_bytes);
    for c in Category::ALL {
        let peak = &mut p.category_peaks[c.index()];
        *peak = (*peak).max(stats.category(c).peak_allocated_bytes);
    }
}

/// A dry run's error that is a buffer larger than one binding marks `p` (`Ok(false)`: it does
/// not fit), as does a kernel loop past the adapter's limit above micro-batch 1 (a smaller
/// micro-batch has shorter loops); any other error is returned.
fn beyond_a_limit(e: Error, p: &mut Probe) -> Result<bool> {
    if let Some((label, bytes, max)) = e.too_large_for_binding() {
        p.too_large = Some((label.to_string(), bytes, max));
        return Ok(false);
    }
    let loop_limit = matches!(
        e.kernel_error(),
        Some(plimsoll_kernels_wgsl::Error::LoopLimit { .. })
    );
    if loop_limit && p.micro_batch > 1 {
        p.past_loop_limit = Some(e.to_string());
        return Ok(false);
    }
    Err(e)
}

/// Replays one evaluation chunk of `samples` samples (forward without a graph, evaluation
/// mode, as the trainer evaluates), folding its peaks into `p`'s evaluation peaks; false (and
/// those peaks `None`) when it ran out of memory.
fn replay_eval_chunk(
    twin: &Gpu,
    model: &mut dyn crate::task::Model,
    test: &dyn Data,
    samples: usize,
    p: &mut Probe,
) -> Result<bool> {
    twin.with_allocator(|a| a.reset_peaks());
    let samples = samples.min(test.len());
    crate::host::check("an evaluation chunk's sample indices", samples as u64, 8)?;
    let indices: Vec<usize> = (0..samples).collect();
    let result = {
        let _no_grad = plimsoll_autograd::no_grad();
        model.set_training(false);
        let result = test
            .upload(twin, &indices)
            .and_then(|batch| model.evaluate(&batch))
            .map(drop);
        model.set_training(true);
        result
    };
    match result {
        Ok(()) => {
            let stats = twin.with_allocator(|a| a.stats().clone());
            let peak = |old: Option<u64>, new: u64| Some(old.unwrap_or(0).max(new));
            p.eval_peak_allocated_bytes =
                peak(p.eval_peak_allocated_bytes, stats.peak_allocated_bytes);
            p.eval_peak_reserved_bytes =
                peak(p.eval_peak_reserved_bytes, stats.peak_reserved_bytes);
            Ok(true)
        }
        Err(e) if e.is_out_of_memory() => {
            p.eval_peak_allocated_bytes = None;
            p.eval_peak_reserved_bytes = None;
            p.eval_out_of_memory = true;
            Ok(false)
        }
        Err(e) => beyond_a_limit(e, p),
    }
}
