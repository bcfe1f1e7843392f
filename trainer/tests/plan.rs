//! Budget first: the plan's dry runs on a planning twin predict the run's peaks exactly
//! (allocated, reserved, evaluation), a small budget makes it choose a smaller micro-batch that
//! the run then trains under without running out of memory, and (`budget_sweep`) over 40 budgets
//! for an MLP and a GPT it never says "fits" for a run that fails nor "does not fit" for one that
//! fits with 2% to spare.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::Recipe;
use plimsoll_trainer::{CheckpointPolicy, Trainer};

/// Bytes of the model's fixed state under AdamW: each weight and bias, rounded up to the
/// allocator's block alignment, held four times (parameter, gradient, first and second moment).
fn fixed_state_bytes(widths: &[usize], alignment: u64) -> u64 {
    let block = |elements: usize| (elements as u64 * 4).div_ceil(alignment) * alignment;
    let parameters: u64 = widths
        .windows(2)
        .map(|w| block(w[0] * w[1]) + block(w[1]))
        .sum();
    4 * parameters
}

/// The plan's prediction against the measured peak, judged on the part that depends on the
/// micro-batch: a deep thin MLP with a big batch, so saved activations are most of the peak.
///
/// Widths 32 -> 64 x5 -> 10, effective batch 1024 (one micro-batch). Fixed state: 19 402
/// parameters, about 76 KiB each for the parameters, their gradients and Adam's two moments,
/// so about 300 KiB. Activations: every hidden layer keeps a (1024, 64) f32 tensor of 256 KiB
/// (its ReLU's output, the next matmul's input: the linear layer and its ReLU are one op), so
/// with the backward's temporaries about 2.4 MiB: the fixed state is under a fifth of the
/// peak. The activation part of the peak is `peak - fixed`, and the prediction must hit it
/// within 4%: a per-sample figure off by 10%, or one that ignored activations, fails.
#[test]
fn the_predicted_peak_is_the_measured_one() {
    let gpu = fresh_gpu();
    let widths = [32, 64, 64, 64, 64, 64, 10];
    let spec = adam_spec(&widths);
    let mut config = config(1024, 1, 3, 1e-3);
    config.micro_batch = None;
    let mut trainer = Trainer::new(&gpu, config, &spec, data(1024, 32, 10), None).unwrap();
    let plan = trainer.plan().unwrap().clone();
    assert_eq!(plan.micro_batch, 1024, "{plan}");
    assert_eq!(plan.segment_len, 0, "{plan}");
    let mut measured = 0;
    let mut reserved = 0;
    for _ in 0..3 {
        let report = trainer.step().unwrap();
        measured = measured.max(report.peak_allocated_bytes);
        reserved = reserved.max(report.peak_reserved_bytes);
    }
    assert_eq!(plan.predicted_peak_reserved_bytes, reserved, "{plan}");

    let fixed = fixed_state_bytes(&widths, gpu.block_alignment());
    // The shapes above, checked against what the allocator holds after a step: the parameters
    // and Adam's two moments (gradients are cleared by then). Requested bytes, since a block may
    // keep a remainder too small to split off.
    let (parameter, optimizer) = gpu.with_allocator(|a| {
        let stats = a.stats();
        (
            stats.category(Category::Parameter).requested_bytes,
            stats.category(Category::OptimizerState).requested_bytes,
        )
    });
    let parameter_bytes = 4 * spec.parameter_count() as u64;
    assert_eq!(
        (parameter, optimizer),
        (parameter_bytes, 2 * parameter_bytes)
    );
    assert!(
        measured > 5 * fixed,
        "activations dominate: peak {measured}, fixed {fixed}"
    );

    // The dry runs replay the run's allocations: the prediction is the measured peak.
    assert_eq!(plan.predicted_peak_bytes, measured, "{plan}");
    assert!(
        plan.probes.iter().any(|p| p.micro_batch == 1024),
        "the choice was probed\n{plan}"
    );
}

/// The plan's allocated peak at a fixed micro-batch of the deep thin MLP (activations
/// dominate), for the runs below: 2 steps of batch 1024 over 2048 samples. (Allocated, not
/// reserved: under a budget the allocator reserves in smaller segments than without one, so a
/// reserved figure measured without a budget overstates what a micro-batch needs under one.)
fn peak_at(micro: usize) -> u64 {
    let gpu = fresh_gpu();
    let mut config = config(1024, micro, 2, 1e-3);
    config.checkpointing = CheckpointPolicy::None;
    let spec = adam_spec(&[32, 64, 64, 64, 64, 64, 10]);
    plimsoll_trainer::plan::plan(&gpu, &spec, &data(2048, 32, 10), &config)
        .unwrap()
        .predicted_peak_bytes
}

/// A budget between the allocated peaks of micro-batches 512 and 1024: the plan picks 512, and
/// the run trains under the budget without running out of memory.
#[test]
fn small_budget_gives_a_smaller_micro_batch() {
    let (half, full) = (peak_at(512), peak_at(1024));
    assert!(half < full, "{half} vs {full}");
    let budget = (half + full) / 2;
    let spec = adam_spec(&[32, 64, 64, 64, 64, 64, 10]);
    let mut config = config(1024, 1, 2, 1e-3);
    config.micro_batch = None;
    config.checkpointing = CheckpointPolicy::None;
    config.memory_budget_bytes = Some(budget);
    let gpu = fresh_gpu();
    let mut trainer = Trainer::new(&gpu, config, &spec, data(2048, 32, 10), None).unwrap();
    let plan = trainer.plan().unwrap().clone();
    assert_eq!(plan.micro_batch, 512, "{plan}");
    assert!(plan.predicted_peak_reserved_bytes <= budget, "{plan}");
    for _ in 0..2 {
        let report = trainer.step().unwrap();
        assert_eq!(report.micro_batch, 512, "no out-of-memory recovery");
        assert!(report.peak_reserved_bytes <= budget);
    }
}

/// Evaluation is inside the plan: the plan measures an evaluation of a chunk of the chosen
/// micro-batch after a step, and the run's evaluations (in chunks of the micro-batch) peak at
/// what it measured, so a budget the plan fits never runs out of memory evaluating.
#[test]
fn a_planned_run_evaluates_within_the_predicted_evaluation_peak() {
    let spec = adam_spec(&[32, 64, 64, 64, 64, 64, 10]);
    let mut config = config(1024, 1, 2, 1e-3);
    config.micro_batch = None;
    config.checkpointing = CheckpointPolicy::None;
    // About half the batch fits.
    config.memory_budget_bytes = Some((peak_at(512) + peak_at(1024)) / 2);
    let gpu = fresh_gpu();
    let test = data(700, 32, 10);
    let mut trainer = Trainer::new(
        &gpu,
        config,
        &spec,
        data(2048, 32, 10),
        Some(Box::new(test)),
    )
    .unwrap();
    let plan = trainer.plan().unwrap().clone();
    assert!(plan.micro_batch < 1024, "{plan}");
    let predicted = plan.predicted_eval_peak_bytes.unwrap();
    assert!(predicted <= plan.budget_bytes, "{plan}");
    trainer.step().unwrap();
    gpu.flush("test").unwrap();
    gpu.with_allocator(|a| a.reset_peaks());
    trainer.evaluate().unwrap().unwrap();
    let measured = gpu.with_allocator(|a| a.stats().peak_allocated_bytes);
    assert!(
        trainer
            .log()
            .iter()
            .all(|l| !l.starts_with("evaluation: out of memory")),
        "{:?}",
        trainer.log()
    );
    assert_eq!(measured, predicted, "evaluation peak\n{plan}");
}
