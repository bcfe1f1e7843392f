//! The plan over 40 budgets, from far below what one step needs to above the unconstrained peak,
//! for an MLP and a tiny GPT (checkpointing automatic): wherever the plan says "fits", the real
//! run (three steps, the last a partial batch, an evaluation after the second) trains without
//! running out of memory and within the budget. Where it says "does not fit": bisecting on its
//! verdict gives the least budget it accepts, a refusal's message names that budget, and 2%
//! under it the real run fails with every checkpointing choice at micro-batch 1 (no plan, so
//! nothing else could have fit).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use plimsoll_kernels_wgsl::Gpu;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::{
    CheckpointPolicy, Data, Error, MemoryPlan, Recipe, RunLength, Silent, TokenData, TrainConfig,
    Trainer,
};

struct Workload {
    name: &'static str,
    recipe: Box<dyn Recipe>,
    batch: usize,
    train: Box<dyn Fn() -> Box<dyn Data>>,
    /// The evaluation set (small: every run evaluates it after its second and last steps).
    test: Box<dyn Fn() -> Box<dyn Data>>,
}

fn run_config(batch: usize, budget: u64) -> TrainConfig {
    let mut c = config(batch, 1, 3, 1e-3);
    c.micro_batch = None;
    c.checkpointing = CheckpointPolicy::Automatic;
    c.memory_budget_bytes = Some(budget);
    c.eval_interval_steps = Some(2);
    c.length = RunLength::Steps(3);
    c
}

/// The real run under `budget`: `Ok(true)` trained cleanly, `Ok(false)` the plan refused.
fn real_run(w: &Workload, budget: u64) -> Result<bool, String> {
    let gpu = fresh_gpu();
    let trainer = Trainer::new(
        &gpu,
        run_config(w.batch, budget),
        w.recipe.as_ref(),
        (w.train)(),
        Some((w.test)()),
    );
    let mut trainer = match trainer {
        Ok(t) => t,
        Err(Error::BudgetTooSmall { .. } | Error::ModelTooLarge { .. }) => return Ok(false),
        Err(e) => return Err(format!("{e}")),
    };
    trainer.run(&mut Silent).map_err(|e| format!("{e}"))?;
    let recovered: Vec<&String> = trainer
        .log()
        .iter()
        .filter(|l| l.contains("out of memory at"))
        .collect();
    if !recovered.is_empty() {
        return Err(format!("recovered from out-of-memory: {recovered:?}"));
    }
    let reserved = gpu.with_allocator(|a| a.stats().peak_reserved_bytes);
    if reserved > budget {
        return Err(format!("reserved {reserved} over the budget {budget}"));
    }
    Ok(true)
}

/// The least budget the plan's refusal of `budget` names, if it refuses it.
fn need(w: &Workload, budget: u64) -> Option<u64> {
    let gpu = fresh_gpu();
    gpu.set_memory_budget(budget);
    let (data, test) = ((w.train)(), (w.test)());
    match plimsoll_trainer::plan::plan(
        &gpu,
        w.recipe.as_ref(),
        &data,
        Some(test.as_ref()),
        &run_config(w.batch, budget),
    ) {
        Err(Error::BudgetTooSmall {
            predicted_bytes, ..
        }) => Some(predicted_bytes),
        _ => None,
    }
}

/// Whether the plan accepts `budget`.
fn accepts(w: &Workload, budget: u64) -> bool {
    let gpu = fresh_gpu();
    gpu.set_memory_budget(budget);
    plan(&gpu, w, budget).is_ok()
}

/// The plan of `w`'s run under `budget` on `gpu`.
fn plan(gpu: &Gpu, w: &Workload, budget: u64) -> plimsoll_trainer::Result<MemoryPlan> {
    let (data, test) = ((w.train)(), (w.test)());
    plimsoll_trainer::plan::plan(
        gpu,
        w.recipe.as_ref(),
        &data,
        Some(test.as_ref()),
        &run_config(w.batch, budget),
    )
}

/// The real run at micro-batch 1 with checkpoint segments of `segment` (0: none) under `budget`,
/// without a plan: whether it trains three steps and evaluates without running out of memory.
fn fits_without_plan(w: &Workload, budget: u64, segment: usize) -> bool {
    let gpu = fresh_gpu();
    let mut config = run_config(w.batch, budget);
    config.micro_batch = Some(1);
    config.checkpointing = match segment {
        0 => CheckpointPolicy::None,
        k => CheckpointPolicy::EveryBlocks(k),
    };
    let trainer = Trainer::new(
        &gpu,
        config,
        w.recipe.as_ref(),
        (w.train)(),
        Some((w.test)()),
    );
    match trainer {
        Ok(mut t) => match t.run(&mut Silent) {
            Ok(_) => true,
            Err(e) if e.is_out_of_memory() => false,
            Err(e) => panic!("{}: {e}", w.name),
        },
        Err(e) if e.is_out_of_memory() || matches!(e, Error::ModelTooLarge { .. }) => false,
        Err(e) => panic!("{}: {e}", w.name),
    }
}

fn sweep(w: &Workload) {
    let unconstrained = {
        plan(&fresh_gpu(), w, u64::MAX / 4)
            .unwrap()
            .predicted_peak_reserved_bytes
    };
    let (low, high) = (unconstrained as f64 * 0.02, unconstrained as f64 * 1.1);
    let mut fits = 0;
    let mut refused = Vec::new();
    for i in 0..40 {
        let budget = (low * (high / low).powf(i as f64 / 39.0)) as u64;
        match real_run(w, budget) {
            Ok(true) => fits += 1,
            Ok(false) => refused.push(budget),
            Err(e) => panic!("{}: the plan said budget {budget} fits, but {e}", w.name),
        }
    }
    assert!(
        fits >= 5 && refused.len() >= 5,
        "{}: {fits} fit, {} refused",
        w.name,
        refused.len()
    );
    // The least budget the plan accepts, by bisection between the sweep's neighbours.
    let mut no = *refused.iter().max().unwrap();
    let mut yes = (no as f64 * 1.2) as u64;
    assert!(accepts(w, yes), "{}: {yes} refused", w.name);
    while yes - no > (no / 1000).max(1) {
        let mid = no + (yes - no) / 2;
        if accepts(w, mid) {
            yes = mid;
        } else {
            no = mid;
        }
    }
    assert_eq!(
        real_run(w, yes),
        Ok(true),
        "{}: at the least accepted budget",
        w.name
    );
    // A refusal's message names that budget (within its 1% search and this bisection's 0.1%).
    let named = need(w, no).unwrap();
    assert!(
        named >= no && named as f64 <= yes as f64 * 1.02,
        "{}: the refusal names {named} B, the least accepted budget is {yes} B",
        w.name
    );
    // 2% under it, nothing fits: every checkpointing choice at micro-batch 1 runs out of memory.
    let below = (yes as f64 / 1.02) as u64;
    for segment in 0..=w.recipe.blocks() {
        assert!(
            !fits_without_plan(w, below, segment),
            "{}: the plan refuses {below} B, but micro-batch 1 with checkpointing {segment} fits",
            w.name
        );
    }
    eprintln!(
        "{}: {fits} of 40 budgets fit, {} refused; least accepted budget {yes} B",
        w.name,
        refused.len()
    );
}

// The two workloads are two tests: each sweep runs on one core, so the harness's two test
// threads run them side by side.

#[test]
fn over_forty_budgets_the_plan_is_never_wrong_about_fitting_an_mlp() {
    let mlp = Workload {
        name: "mlp",
        recipe: Box::new(adam_spec(&[32, 64, 64, 64, 64, 10])),
        batch: 256,
        train: Box::new(|| Box::new(data(640, 32, 10))),
        test: Box::new(|| Box::new(data(96, 32, 10))),
    };
    sweep(&mlp);
}

#[test]
fn over_forty_budgets_the_plan_is_never_wrong_about_fitting_a_gpt() {
    let (gpt_spec, tokens) = tiny_gpt(3000);
    let gpt = Workload {
        name: "gpt",
        recipe: Box::new(gpt_spec),
        batch: 16,
        train: Box::new({
            let tokens = Arc::clone(&tokens);
            move || Box::new(TokenData::evenly_spaced(Arc::clone(&tokens), 8, 13, 40).unwrap())
        }),
        test: Box::new(move || {
            Box::new(TokenData::evenly_spaced(Arc::clone(&tokens), 8, 13, 24).unwrap())
        }),
    };
    sweep(&gpt);
}
