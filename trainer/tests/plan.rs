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
    // Adam's two moments, and the vector its updates read the device's decision from.
    let control = 4 * plimsoll_kernels_wgsl::kernels::optimizer::CONTROL_WORDS;
    assert_eq!(
        (parameter, optimizer),
        (parameter_bytes, 2 * parameter_bytes + control)
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
    plimsoll_trainer::plan::plan(&gpu, &spec, &data(2048, 32, 10), None, &config)
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

/// Keeps the largest peaks over every step and evaluation of a run, and whether any step ran
/// out of memory and recovered.
#[derive(Default)]
struct Peaks {
    allocated: u64,
    reserved: u64,
    steps: u64,
    recovered: Vec<String>,
}

impl plimsoll_trainer::Observer for Peaks {
    fn on_step(&mut self, r: &plimsoll_trainer::StepReport) {
        self.allocated = self.allocated.max(r.peak_allocated_bytes);
        self.reserved = self.reserved.max(r.peak_reserved_bytes);
        self.steps += 1;
    }
    fn on_eval(&mut self, _: u64, _: u64, e: &plimsoll_trainer::Evaluation) {
        self.reserved = self.reserved.max(e.peak_reserved_bytes);
    }
    fn on_log(&mut self, line: &str) {
        if line.contains("out of memory") {
            self.recovered.push(line.to_string());
        }
    }
}

/// A run of 50 steps (evaluating every 10, and, for the MLP, the last partial batch of each
/// epoch) under a budget of exactly the reserved peak the plan predicts for it: no step runs
/// out of memory, and the run's peaks over all 50 steps are the prediction. Under a budget the
/// caching allocator reshapes its segments for several steps (the Shakespeare GPT reserved
/// 41.0, 41.5 and 42.0 MiB after steps 2, 3 and 4 under 42 MiB), so a dry run of three steps
/// predicted too little; these two models keep reshaping into their fourth and fifth steps.
fn fifty_steps_under_the_predicted_peak(
    name: &str,
    recipe: &dyn plimsoll_trainer::Recipe,
    make: &dyn Fn() -> (
        Box<dyn plimsoll_trainer::Data>,
        Box<dyn plimsoll_trainer::Data>,
    ),
    batch: usize,
    first_budget: u64,
) {
    let mut config = config(batch, 1, 50, 1e-3);
    config.micro_batch = None;
    config.checkpointing = CheckpointPolicy::Automatic;
    config.eval_interval_steps = Some(10);
    // The plan under a first budget, then the run under exactly the reserved peak it predicts.
    let predicted = {
        let (train, test) = make();
        let gpu = fresh_gpu();
        gpu.set_memory_budget(first_budget);
        plimsoll_trainer::plan::plan(&gpu, recipe, train.as_ref(), Some(test.as_ref()), &config)
            .unwrap()
    };
    let budget = predicted.predicted_peak_reserved_bytes;
    config.memory_budget_bytes = Some(budget);
    let gpu = fresh_gpu();
    let (train, test) = make();
    let mut trainer = Trainer::new(&gpu, config, recipe, train, Some(test)).unwrap();
    let plan = trainer.plan().unwrap().clone();
    assert_eq!(
        (plan.micro_batch, plan.segment_len),
        (predicted.micro_batch, predicted.segment_len),
        "{name}: {plan}"
    );
    let mut peaks = Peaks::default();
    trainer.run(&mut peaks).unwrap();
    assert_eq!(peaks.steps, 50, "{name}");
    assert!(
        peaks.recovered.is_empty(),
        "{name}: out of memory under the predicted peak {budget} B:\n{}\n{plan}",
        peaks.recovered.join("\n")
    );
    assert_eq!(
        (peaks.allocated, peaks.reserved),
        (
            plan.predicted_peak_bytes,
            plan.predicted_peak_reserved_bytes
        ),
        "{name}: the peaks over 50 steps (allocated, reserved)\n{plan}"
    );
}

#[test]
fn the_plan_holds_for_fifty_steps_of_an_mlp_and_a_gpt() {
    // Digits' shapes: 1,437 samples in batches of 64 (22 whole steps and one of 29 per epoch).
    let mlp = adam_spec(&[64, 128, 10]);
    let tables = || -> (Box<dyn plimsoll_trainer::Data>, Box<dyn plimsoll_trainer::Data>) {
        (Box::new(data(1437, 64, 10)), Box::new(data(360, 64, 10)))
    };
    fifty_steps_under_the_predicted_peak("mlp", &mlp, &tables, 64, 300_000);
    // A GPT of 2 layers, width 32, context 16.
    let (mut gpt, tokens) = tiny_gpt(4000);
    gpt.config.block_size = 16;
    let windows = || -> (Box<dyn plimsoll_trainer::Data>, Box<dyn plimsoll_trainer::Data>) {
        let context = 16;
        (
            Box::new(plimsoll_trainer::TokenData::windows(tokens.clone(), context, 13).unwrap()),
            Box::new(
                plimsoll_trainer::TokenData::evenly_spaced(tokens.clone(), context, 13, 24)
                    .unwrap(),
            ),
        )
    };
    fifty_steps_under_the_predicted_peak("gpt", &gpt, &windows, 12, 1_500_000);
}

/// The plan's prediction for the Shakespeare GPT (nanoGPT's CPU shape: 4 layers, width 128,
/// context 64, 65 characters, batch 12) under 42 MiB, against the oracle of the trainer's own
/// loop run for 60 steps, evaluating every 20, on a planning twin of the device (every
/// allocation as on the device, no kernel run). Under 42 MiB the caching allocator reserved
/// 41.0, 41.5 and 42.0 MiB after steps 2, 3 and 4 and ran out of memory at step 5, where a
/// plan that replayed three steps had predicted 41.5 MiB: the plan must see the whole run.
#[test]
fn the_plan_predicts_every_step_of_the_shakespeare_gpt_under_42_mib() {
    let budget = 42 << 20;
    let spec = plimsoll_trainer::GptSpec::new(
        plimsoll_nn::GptConfig {
            vocab_size: 65,
            block_size: 64,
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
        },
        1,
        adam_spec(&[1]).optimizer,
    );
    let tokens: std::sync::Arc<Vec<u32>> =
        std::sync::Arc::new((0..20_000u32).map(|i| (i * 31 + i / 7) % 65).collect());
    let train = plimsoll_trainer::TokenData::windows(tokens.clone(), 64, 65).unwrap();
    let val = plimsoll_trainer::TokenData::evenly_spaced(tokens, 64, 65, 240).unwrap();
    let mut cfg = config(12, 1, 60, 1e-3);
    cfg.micro_batch = None;
    cfg.checkpointing = CheckpointPolicy::Automatic;
    cfg.eval_interval_steps = Some(20);
    let gpu = fresh_gpu();
    gpu.set_memory_budget(budget);
    let plan = plimsoll_trainer::plan::plan(&gpu, &spec, &train, Some(&val), &cfg).unwrap();
    // The oracle: the trainer's loop at the plan's choice, on a twin under the same budget:
    // its micro-batch, checkpointing and, where it chose it, the memory-efficient variant.
    let twin = gpu.planning_twin(budget);
    cfg.micro_batch = Some(plan.micro_batch);
    cfg.checkpointing = match plan.segment_len {
        0 => CheckpointPolicy::None,
        k => CheckpointPolicy::EveryBlocks(k),
    };
    cfg.memory_budget_bytes = Some(budget);
    let variant = (plan.variant.as_ref())
        .and_then(|_| plimsoll_trainer::Recipe::memory_efficient_variant(&spec))
        .map(|(_, recipe)| recipe);
    let recipe: &dyn plimsoll_trainer::Recipe = variant.as_deref().unwrap_or(&spec);
    let mut trainer = Trainer::new(&twin, cfg, recipe, train, Some(Box::new(val))).unwrap();
    let mut peaks = Peaks::default();
    trainer.run(&mut peaks).unwrap();
    assert_eq!(peaks.steps, 60);
    assert!(
        peaks.recovered.is_empty(),
        "{}\n{plan}",
        peaks.recovered.join("\n")
    );
    assert_eq!(
        (peaks.allocated, peaks.reserved),
        (
            plan.predicted_peak_bytes,
            plan.predicted_peak_reserved_bytes
        ),
        "the peaks over 60 steps (allocated, reserved)\n{plan}"
    );
}

/// A run whose micro-batch and checkpointing are given needs no plan, but it is rehearsed on
/// a planning twin (`plan::rehearse`, as `plimsoll train` does): the kernels it compiles before
/// step 1 are those its steps and evaluations then use (no pipeline is built later), not every
/// kernel the crate has (`compile_wanted` builds all of them when no twin noted any: 260 on
/// lavapipe).
#[test]
fn a_run_with_a_fixed_micro_batch_compiles_only_its_kernels() {
    let gpu = fresh_gpu();
    let spec = adam_spec(&[32, 64, 10]);
    let mut cfg = config(64, 64, 3, 1e-3);
    cfg.eval_interval_steps = Some(2);
    let (train, test) = (data(256, 32, 10), data(100, 32, 10));
    let rehearsal =
        plimsoll_trainer::plan::rehearse(&gpu, (&spec, &train, Some(&test)), &cfg, 1).unwrap();
    assert!(rehearsal.is_some_and(|p| p.fits()));
    let mut trainer = Trainer::new(&gpu, cfg, &spec, train, Some(Box::new(test))).unwrap();
    assert!(trainer.plan().is_none());
    let compiled = gpu
        .compile_wanted(std::time::Duration::from_secs(120))
        .unwrap();
    let before = gpu.compiled_pipelines();
    assert!(
        compiled.built > 0 && compiled.built < 40,
        "{} pipelines compiled",
        compiled.built
    );
    let mut peaks = Peaks::default();
    trainer.run(&mut peaks).unwrap();
    assert_eq!(
        gpu.compiled_pipelines(),
        before,
        "a kernel was built after step 1"
    );
}

/// Counts evaluations.
#[derive(Default)]
struct Evaluations(Vec<u64>);

impl plimsoll_trainer::Observer for Evaluations {
    fn on_step(&mut self, _: &plimsoll_trainer::StepReport) {}
    fn on_eval(&mut self, _: u64, step: u64, _: &plimsoll_trainer::Evaluation) {
        self.0.push(step);
    }
    fn on_log(&mut self, _: &str) {}
}

/// A run of 5 steps evaluating every 2 ends evaluated: after steps 2, 4 and 5 (`train
/// shakespeare --steps 20` with evaluations every 250 never evaluated, and kept no best
/// checkpoint).
#[test]
fn a_run_of_steps_evaluates_at_its_end() {
    let gpu = fresh_gpu();
    let spec = adam_spec(&[32, 16, 10]);
    let mut cfg = config(32, 32, 5, 1e-3);
    cfg.eval_interval_steps = Some(2);
    let mut trainer = Trainer::new(
        &gpu,
        cfg,
        &spec,
        data(256, 32, 10),
        Some(Box::new(data(40, 32, 10))),
    )
    .unwrap();
    let mut evaluations = Evaluations::default();
    trainer.run(&mut evaluations).unwrap();
    assert_eq!(evaluations.0, [2, 4, 5]);
}

/// A tensor past one binding is avoided as out of memory is. Under a fake binding limit of
/// 20 KiB, the tiny GPT (width 32, context 8: its MLP's hidden activation takes 4 KiB a sample,
/// its largest parameter 16 KiB) with batch 12: the plan picks a micro-batch below 12 whose
/// run trains, and the device itself refuses the next larger candidate (the oracle: a real
/// step fails with the binding error). Given that micro-batch, the plan says so and advises
/// leaving it out; weights past the limit are kept in parts, and under a limit below one row of
/// a weight the parameters are named.
#[test]
fn the_plan_picks_a_micro_batch_whose_tensors_fit_one_binding() {
    use plimsoll_kernels_wgsl::GpuOptions;
    use plimsoll_kernels_wgsl::testing::gpu_with;
    use plimsoll_trainer::Error;
    let limited = |bytes: u64| {
        gpu_with(GpuOptions {
            max_binding_bytes: Some(bytes),
            ..GpuOptions::from_env()
        })
    };
    let (mut gpt, tokens) = tiny_gpt(4000);
    gpt.config.block_size = 8;
    let windows = || plimsoll_trainer::TokenData::windows(tokens.clone(), 8, 13).unwrap();
    let mut cfg = config(12, 1, 3, 1e-3);
    cfg.micro_batch = None;
    cfg.checkpointing = CheckpointPolicy::Automatic;

    let gpu = limited(20 << 10);
    assert_eq!(gpu.max_buffer_bytes(), 20 << 10);
    let mut trainer = Trainer::new(&gpu, cfg.clone(), &gpt, windows(), None).unwrap();
    let plan = trainer.plan().unwrap().clone();
    let chosen = plan.micro_batch;
    assert!(chosen < 12, "{plan}");
    // The smallest micro-batch larger than the choice that the plan tried was refused for a
    // tensor past one binding.
    let refused = plan
        .probes
        .iter()
        .filter(|p| p.micro_batch > chosen)
        .min_by_key(|p| p.micro_batch)
        .unwrap();
    let (label, bytes, max) = refused.too_large.clone().expect("refused for the binding");
    assert!(
        bytes > max && max == 20 << 10,
        "{label} {bytes} {max}\n{plan}"
    );
    for _ in 0..3 {
        let report = trainer.step().unwrap();
        assert_eq!(report.micro_batch, chosen);
    }

    // The oracle: a real run at the refused micro-batch, without a plan, fails on the device.
    let mut forced = cfg.clone();
    forced.micro_batch = Some(refused.micro_batch);
    forced.checkpointing = CheckpointPolicy::None;
    let gpu = limited(20 << 10);
    let mut real = Trainer::new(&gpu, forced.clone(), &gpt, windows(), None).unwrap();
    let err = real.step().unwrap_err();
    assert!(err.too_large_for_binding().is_some(), "{err}");

    // Given it, the plan (or the rehearsal of a run that makes none) refuses it and says what
    // to do.
    let gpu = limited(20 << 10);
    let data = windows();
    for result in [
        plimsoll_trainer::plan::plan(&gpu, &gpt, &data, None, &forced).map(drop),
        plimsoll_trainer::plan::rehearse(&gpu, (&gpt, &data, None), &forced, 1).map(drop),
    ] {
        match result {
            Err(Error::TensorTooLarge { made_by, hint, .. }) => {
                assert!(
                    made_by.contains(&format!("micro-batch {}", refused.micro_batch))
                        && hint.contains("leave --micro-batch out"),
                    "{made_by} / {hint}"
                );
            }
            other => panic!("want TensorTooLarge, got {other:?}"),
        }
    }

    // Weights past the limit are kept in parts of whole rows; below one row of the widest
    // weight (the MLP's c_proj, 128 inputs: 512 bytes a row), no micro-batch or part helps.
    let gpu = limited(8 << 10);
    assert!(Trainer::new(&gpu, cfg.clone(), &gpt, windows(), None).is_ok());
    let gpu = limited(256);
    match Trainer::new(&gpu, cfg, &gpt, windows(), None) {
        Err(Error::TensorTooLarge { made_by, bytes, .. }) => {
            assert_eq!(made_by, "the model's parameters");
            assert!(bytes > 256);
        }
        other => panic!("want TensorTooLarge, got {:?}", other.map(|_| ())),
    }
}

/// Scale, shapes only: the GPT-2 small shape (12 layers, 12 heads, width 768, context 1024) on
/// the Shakespeare characters, batch 12, under 8 GiB with a binding limit of 128 MiB (lavapipe's;
/// set, so the test means the same on any adapter). No kernel runs and no parameter value is
/// drawn. With the reference attention a layer's probabilities take `m * 12 * 1024^2 * 4` bytes
/// at micro-batch `m`: 151 MB at 3 is past one binding, 101 MB at 2 is not, so the plan picks 2
/// (the largest `ceil(12 / parts)` under the limit). The fused attention keeps no `1024 x 1024`
/// tensor, so the largest tensor is the MLP's hidden activation, `m * 1024 * 3072 * 4` bytes:
/// 151 MB at 12, 75.5 MB at 6, and the plan picks 6. The fixed state is the analytic one: 4
/// bytes a parameter, twice that for AdamW's moments.
#[test]
fn the_gpt2_small_shape_is_planned_at_the_largest_micro_batch_under_the_binding_limit() {
    use plimsoll_kernels_wgsl::GpuOptions;
    use plimsoll_kernels_wgsl::testing::gpu_with;
    let gpu = gpu_with(GpuOptions {
        max_binding_bytes: Some(128 << 20),
        ..GpuOptions::from_env()
    });
    if gpu.max_buffer_bytes() < 128 << 20 {
        plimsoll_kernels_wgsl::testing::skip(
            "the_gpt2_small_shape_is_planned_at_the_largest_micro_batch_under_the_binding_limit",
            "the adapter binds less than 128 MiB",
        );
        return;
    }
    gpu.set_memory_budget(8 << 30);
    let spec = plimsoll_trainer::GptSpec {
        export: Default::default(),
        arch: Default::default(),
        dropout: 0.0,
        attention: plimsoll_trainer::Attention::Reference,
        loss: Default::default(),
        config: plimsoll_nn::GptConfig {
            vocab_size: 65,
            block_size: 1024,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
        },
        seed: 1,
        optimizer: adam_spec(&[1]).optimizer,
    };
    let tokens: std::sync::Arc<Vec<u32>> =
        std::sync::Arc::new((0..4096u32).map(|i| (i * 31 + i / 7) % 65).collect());
    let train = plimsoll_trainer::TokenData::windows(tokens.clone(), 1024, 65).unwrap();
    let val = plimsoll_trainer::TokenData::evenly_spaced(tokens, 1024, 65, 24).unwrap();
    let mut cfg = config(12, 1, 100, 1e-3);
    cfg.micro_batch = None;
    cfg.checkpointing = CheckpointPolicy::Automatic;
    cfg.eval_interval_steps = Some(50);
    let reference = plimsoll_trainer::plan::plan(&gpu, &spec, &train, Some(&val), &cfg).unwrap();
    assert_eq!(reference.micro_batch, 2, "{reference}");
    let at = |m: usize| {
        reference
            .probes
            .iter()
            .find(|p| p.micro_batch == m)
            .unwrap()
    };
    let (_, bytes, _) = at(3).too_large.clone().expect("past one binding at 3");
    assert_eq!(bytes, 3 * 12 * 1024 * 1024 * 4, "{reference}");
    let spec = plimsoll_trainer::GptSpec {
        attention: plimsoll_trainer::Attention::Fused,
        loss: Default::default(),
        ..spec
    };
    let plan = plimsoll_trainer::plan::plan(&gpu, &spec, &train, Some(&val), &cfg).unwrap();
    assert_eq!(plan.micro_batch, 6, "{plan}");
    assert!(plan.predicted_peak_reserved_bytes <= 8 << 30, "{plan}");
    let at = |m: usize| plan.probes.iter().find(|p| p.micro_batch == m).unwrap();
    let (_, bytes, max) = at(12).too_large.clone().expect("past one binding at 12");
    assert_eq!((bytes, max), (12 * 1024 * 3072 * 4, 128 << 20), "{plan}");
    assert!(at(6).fits(), "{plan}");
    let parameters = 4 * spec.parameter_count() as u64;
    let chosen = at(6);
    let parameter_peak = chosen.category_peaks[Category::Parameter.index()];
    // Each of the model's 150 parameter tensors is rounded up to the block alignment.
    assert!(
        parameter_peak >= parameters && parameter_peak < parameters + 150 * gpu.block_alignment(),
        "parameters {parameter_peak} vs {parameters}\n{plan}"
    );
    // The two moments, and the control vector (one block).
    assert_eq!(
        chosen.category_peaks[Category::OptimizerState.index()],
        2 * parameter_peak + gpu.block_alignment(),
        "{plan}"
    );
    // The default leaves it to the plan: the reference path reaches micro-batch 2 only, so the
    // plan takes the fused attention, and says so.
    let auto = plimsoll_trainer::GptSpec {
        attention: plimsoll_trainer::Attention::Auto,
        ..spec
    };
    let plan = plimsoll_trainer::plan::plan(&gpu, &auto, &train, Some(&val), &cfg).unwrap();
    assert_eq!(plan.micro_batch, 6, "{plan}");
    assert!(
        plan.variant
            .as_deref()
            .is_some_and(|v| v.contains("fused attention and the chunked loss")),
        "{plan}"
    );
    assert!(plan.loss_chunk_rows.is_some(), "{plan}");
    // A small shape fits with the reference path at the whole batch: the plan keeps it.
    let small = plimsoll_trainer::GptSpec {
        config: plimsoll_nn::GptConfig {
            block_size: 64,
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            ..auto.config
        },
        ..auto
    };
    let windows = |n| {
        let tokens: std::sync::Arc<Vec<u32>> =
            std::sync::Arc::new((0..4096u32).map(|i| (i * 31 + i / 7) % 65).collect());
        plimsoll_trainer::TokenData::evenly_spaced(tokens, 64, 65, n).unwrap()
    };
    let plan =
        plimsoll_trainer::plan::plan(&gpu, &small, &windows(48), Some(&windows(8)), &cfg).unwrap();
    assert_eq!((plan.micro_batch, plan.segment_len), (12, 0), "{plan}");
    assert_eq!(
        (plan.variant.as_deref(), plan.loss_chunk_rows),
        (None, None),
        "{plan}"
    );
}

/// The checkpoint lengths the plan tries: none, and for every length it skips, a shorter one
/// tried that makes as many segments (so holds the same segment inputs and less inside one).
#[test]
fn the_plan_tries_the_shortest_length_for_each_count_of_segments() {
    use plimsoll_trainer::plan::automatic_segments;
    assert_eq!(automatic_segments(0), [0]);
    assert_eq!(automatic_segments(3), [0, 1, 2, 3]);
    let tried = automatic_segments(48);
    assert_eq!(tried, [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 48]);
    for blocks in 1..=60usize {
        let tried = automatic_segments(blocks);
        for k in 1..=blocks {
            let segments = blocks.div_ceil(k);
            let shortest = tried
                .iter()
                .filter(|&&j| j > 0 && blocks.div_ceil(j) == segments)
                .min();
            assert!(
                shortest.is_some_and(|&j| j <= k),
                "{blocks} blocks, length {k}: {tried:?}"
            );
        }
    }
}

/// SmolLM2-135M's shape (a Llama: 30 layers, 9 query heads over 3 key/value heads, width 576,
/// SwiGLU 1536, tied head, vocabulary 49,152, context 2048), planned shapes-only at 8 GiB: its
/// parameters are Hugging Face's 134,515,008, the plan fits the budget with the fused attention
/// and the chunked loss, and every parameter tensor is in the parameter peak.
#[test]
fn the_smollm2_135m_shape_is_planned_shapes_only() {
    use plimsoll_kernels_wgsl::GpuOptions;
    use plimsoll_kernels_wgsl::testing::gpu_with;
    let gpu = gpu_with(GpuOptions {
        max_binding_bytes: Some(128 << 20),
        ..GpuOptions::from_env()
    });
    gpu.set_memory_budget(8 << 30);
    let (vocab, context) = (49_152, 2048);
    let spec = plimsoll_trainer::GptSpec {
        export: Default::default(),
        arch: plimsoll_trainer::Arch::Llama(plimsoll_trainer::LlamaShape {
            kv_heads: 3,
            mlp_width: 1536,
            rope_theta: 100_000.0,
            tie_embeddings: true,
        }),
        dropout: 0.0,
        attention: plimsoll_trainer::Attention::Auto,
        loss: Default::default(),
        config: plimsoll_nn::GptConfig {
            vocab_size: vocab,
            block_size: context,
            n_layer: 30,
            n_head: 9,
            n_embd: 576,
        },
        seed: 1,
        optimizer: adam_spec(&[1]).optimizer,
    };
    assert_eq!(spec.parameter_count(), 134_515_008);
    let tokens: std::sync::Arc<Vec<u32>> =
        std::sync::Arc::new((0..8192u32).map(|i| (i * 31 + i / 7) % 65).collect());
    let train = plimsoll_trainer::TokenData::windows(tokens.clone(), context, 65).unwrap();
    let val = plimsoll_trainer::TokenData::evenly_spaced(tokens, context, 65, 8).unwrap();
    let mut cfg = config(8, 1, 100, 1e-3);
    cfg.micro_batch = None;
    cfg.checkpointing = CheckpointPolicy::Automatic;
    cfg.eval_interval_steps = Some(50);
    let plan = plimsoll_trainer::plan::plan(&gpu, &spec, &train, Some(&val), &cfg).unwrap();
    assert!(plan.predicted_peak_reserved_bytes <= 8 << 30, "{plan}");
    assert!(
        plan.variant
            .as_deref()
            .is_some_and(|v| v.contains("fused attention and the chunked loss")),
        "{plan}"
    );
    let chosen = plan
        .probes
        .iter()
        .find(|p| p.micro_batch == plan.micro_batch && p.fits())
        .expect("the chosen probe");
    let parameters = 4 * spec.parameter_count() as u64;
    let parameter_peak = chosen.category_peaks[Category::Parameter.index()];
    assert!(
        parameter_peak >= parameters && parameter_peak < parameters + 300 * gpu.block_alignment(),
        "parameters {parameter_peak} vs {parameters}\n{plan}"
    );
}

/// A budget that follows the device: the tiny GPT planned at 64 MiB takes its whole batch of
/// 12 at once; after two steps the device's budget falls below that plan's peak (another
/// process took memory), and the next step plans again, with a smaller micro-batch or
/// checkpointing that fit, and says so. No step is lost, and the parameters after six steps
/// are the undisturbed run's (SGD: micro-batches and checkpointing give the same update to
/// rounding). A budget that grows back is planned again too.
#[test]
fn a_budget_that_shrinks_mid_run_is_planned_again_and_the_update_is_unchanged() {
    use plimsoll_kernels_wgsl::testing::fresh_gpu;
    let (gpt, tokens) = tiny_gpt(4000);
    let gpt = plimsoll_trainer::GptSpec {
        optimizer: sgd_spec(&[1]).optimizer,
        ..gpt
    };
    let windows = || plimsoll_trainer::TokenData::windows(tokens.clone(), 8, 13).unwrap();
    let mut cfg = config(12, 1, 6, 0.05);
    cfg.micro_batch = None;
    cfg.checkpointing = CheckpointPolicy::Automatic;
    cfg.memory_budget_bytes = Some(64 << 20);
    let undisturbed = {
        let gpu = fresh_gpu();
        let mut t = Trainer::new(&gpu, cfg.clone(), &gpt, windows(), None).unwrap();
        t.run(&mut plimsoll_trainer::Silent).unwrap();
        values(t.parameters())
    };
    let gpu = fresh_gpu();
    let mut t = Trainer::new(&gpu, cfg.clone(), &gpt, windows(), None).unwrap();
    let first = t.plan().unwrap().clone();
    assert_eq!((first.micro_batch, first.segment_len), (12, 0), "{first}");
    t.step().unwrap();
    t.step().unwrap();
    // Below what the step allocates at its peak (a tighter budget only packs segments
    // tighter), above the fixed state.
    let shrunk = first.predicted_peak_bytes * 3 / 4;
    gpu.set_memory_budget(shrunk);
    let report = t.step().unwrap();
    assert_eq!(report.step, 3);
    let second = t.plan().unwrap().clone();
    assert_eq!(second.budget_bytes, shrunk);
    assert!(
        (second.micro_batch, second.segment_len) != (12, 0)
            && second.predicted_peak_reserved_bytes <= shrunk,
        "{second}"
    );
    assert_eq!(report.micro_batch, second.micro_batch);
    assert!(
        t.log().iter().any(|l| l.contains("planned again")),
        "{:?}",
        t.log()
    );
    // The memory comes back: planned again, the whole batch again.
    gpu.set_memory_budget(64 << 20);
    t.step().unwrap();
    assert_eq!(t.plan().unwrap().micro_batch, 12);
    t.run(&mut plimsoll_trainer::Silent).unwrap();
    assert_eq!(t.position().step, 6);
    assert_params_close(&values(t.parameters()), &undisturbed, 1e-5);
}

/// The plan says how the batch splits as the step splits it (chunks of the micro-batch, the
/// last one what is left): 256 in micro-batches of 13 is 19 of 13 and one of 9, which
/// "20 micro-batch(es) of 13" (260) misstated.
#[test]
fn the_split_of_a_batch_is_said_as_it_is() {
    use plimsoll_trainer::plan::micro_batches_in_words as words;
    assert_eq!(words(256, 13), "19 micro-batches of 13 and one of 9");
    assert_eq!(words(256, 64), "4 micro-batches of 64");
    assert_eq!(words(16, 16), "1 micro-batch of 16");
    assert_eq!(words(20, 12), "1 micro-batch of 12 and one of 8");
}
