//! The trainer's promises on a tiny GPT (2 layers, width 32) over token windows: k micro-batches
//! give the update of one batch, checkpointed blocks give the plain update, a resumed run is
//! bit-identical, out-of-memory recovery keeps the update (in training and in evaluation), a
//! step past its deadline saves the state before it, evaluation is the mean loss over every
//! validation token, and every step passes the leak check (`config` makes a leak an error).

#![allow(clippy::unwrap_used)]

mod common;

use common::gpt::*;
use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_nn::SgdConfig;
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::{
    Attention, CheckpointPolicy, Data, GptSpec, OptimizerSpec, Recipe, RunLength, Silent,
    TokenData, Trainer,
};

fn train(
    spec: &GptSpec,
    batch: usize,
    micro: usize,
    checkpointing: CheckpointPolicy,
) -> Vec<(String, Vec<f32>)> {
    train_at(spec, 0.05, batch, micro, checkpointing)
}

/// Five steps at learning rate `lr`, clipped at 1.0; the parameters after.
fn train_at(
    spec: &GptSpec,
    lr: f32,
    batch: usize,
    micro: usize,
    checkpointing: CheckpointPolicy,
) -> Vec<(String, Vec<f32>)> {
    let gpu = fresh_gpu();
    let mut config = config(batch, micro, 5, lr);
    config.checkpointing = checkpointing;
    config.clip_grad_norm = Some(1.0);
    let mut trainer = Trainer::new(&gpu, config, spec, windows(200), None).unwrap();
    trainer.run(&mut Silent).unwrap();
    values(trainer.parameters())
}

#[test]
fn gpt_micro_batches_give_the_full_batch_update() {
    let spec = spec(sgd());
    let full = train(&spec, 12, 12, CheckpointPolicy::None);
    assert_params_close(&train(&spec, 12, 3, CheckpointPolicy::None), &full, 1e-5);
    // 12 = 5 + 5 + 2: unequal micro-batches.
    assert_params_close(&train(&spec, 12, 5, CheckpointPolicy::None), &full, 1e-5);
}

/// The same with the optimizer the shakespeare run uses: nanoGPT's AdamW (betas 0.9 and 0.99,
/// weight decay 0.1 on matrices only, learning rate 1e-3) with clipping, at 1e-5 after 5 steps,
/// except where the gradient itself is rounding noise.
///
/// Adam divides by `sqrt(v)`, so an element whose gradient is a near-cancelled sum moves by
/// about the learning rate whatever its size, and the last bits of that sum depend on the
/// summation order. The attention key biases have a true gradient of zero (softmax ignores a
/// shift), so they only move by noise: they are held to Adam's bound (the learning rate per
/// step). A few weights have near-cancelled gradients (one `c_proj` weight: 6.3e-8 against
/// 2.3e-2 for its tensor in the full batch, 6.5e-8 summed over micro-batches of 3): elements
/// whose step-1 gradient is under 1e-5 of their tensor's largest are held to 1e-4; every other
/// to 1e-5.
#[test]
fn gpt_micro_batches_give_the_full_batch_update_under_nanogpts_adamw() {
    use plimsoll_nn::AdamWConfig;
    let adamw = spec(OptimizerSpec::AdamW(AdamWConfig {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
        decay_matrices_only: true,
    }));
    // The step-1 gradient: one plain SGD step at learning rate 1 moves each parameter by it.
    let plain = spec(OptimizerSpec::Sgd(SgdConfig {
        lr: 1.0,
        momentum: 0.0,
        ..SgdConfig::default()
    }));
    let gpu = fresh_gpu();
    let mut one = config(12, 12, 1, 1.0);
    one.clip_grad_norm = None;
    let mut trainer = Trainer::new(&gpu, one, &plain, windows(200), None).unwrap();
    let before = values(trainer.parameters());
    trainer.run(&mut Silent).unwrap();
    let noise: Vec<Vec<bool>> = before
        .iter()
        .zip(values(trainer.parameters()))
        .map(|((_, b), (_, a))| {
            let g: Vec<f32> = b.iter().zip(&a).map(|(x, y)| (x - y).abs()).collect();
            let scale = g.iter().fold(0f32, |m, &v| m.max(v));
            g.iter().map(|&v| v < 1e-5 * scale).collect()
        })
        .collect();
    drop(trainer);
    // The exception is a few elements (116 of 25 088 here: the key biases and a few dozen
    // weights), not the test.
    let (noisy, all) = (
        noise.iter().flatten().filter(|&&n| n).count(),
        noise.iter().flatten().count(),
    );
    assert!(
        noisy * 100 < all,
        "{noisy} of {all} elements have a noise-sized gradient"
    );

    let run = |micro, checkpointing| train_at(&adamw, 1e-3, 12, micro, checkpointing);
    let full = run(12, CheckpointPolicy::None);
    for (micro, checkpointing) in [
        (3, CheckpointPolicy::None),
        (5, CheckpointPolicy::None),
        (12, CheckpointPolicy::EveryBlocks(1)),
    ] {
        let got = run(micro, checkpointing);
        for (((name, a), (_, b)), noise) in got.iter().zip(&full).zip(&noise) {
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let width = adamw.config.n_embd;
            for (i, ((&x, &y), &noisy)) in a.iter().zip(b).zip(noise).enumerate() {
                if name.ends_with("attn.c_attn.bias") && (width..2 * width).contains(&i) {
                    // A key bias: no effect on the loss at all, so only Adam's bound holds
                    // (at most the learning rate per step, plus weight decay's nothing).
                    assert!(x.abs() <= 5e-3 && y.abs() <= 5e-3, "{name}[{i}]: {x}, {y}");
                    continue;
                }
                let rtol = if noisy { 1e-4 } else { 1e-5 };
                let tol = rtol * scale.max(x.abs()).max(y.abs());
                assert!(
                    (x - y).abs() <= tol,
                    "micro-batch {micro}: {name}[{i}]: {x} vs {y} (tolerance {tol}, noise: \
                     {noisy})"
                );
            }
        }
    }
}

#[test]
fn gpt_checkpointed_blocks_give_the_same_update() {
    let spec = spec(sgd());
    let plain = train(&spec, 12, 12, CheckpointPolicy::None);
    let every_block = train(&spec, 12, 12, CheckpointPolicy::EveryBlocks(1));
    assert_params_close(&every_block, &plain, 1e-5);
}

#[test]
fn a_resumed_gpt_run_is_bit_identical() {
    let spec = spec(sgd());
    let straight = train(&spec, 6, 3, CheckpointPolicy::None);
    assert_eq!(stopped_and_resumed(&spec, "gpt-resume"), straight);
}

/// [`train`]'s run of batch 6 in micro-batches of 3, stopped after 2 steps and resumed from
/// its checkpoint for 3 more: the parameters after.
fn stopped_and_resumed(spec: &GptSpec, name: &str) -> Vec<(String, Vec<f32>)> {
    let dir = temp_dir(name);
    let gpu = fresh_gpu();
    let mut first = config(6, 3, 2, 0.05);
    first.checkpoint_dir = Some(dir.clone());
    first.clip_grad_norm = Some(1.0);
    let mut t = Trainer::new(&gpu, first.clone(), spec, windows(200), None).unwrap();
    t.run(&mut Silent).unwrap();
    drop(t);
    let mut second = first;
    second.length = RunLength::Steps(5);
    let mut t = Trainer::new(&gpu, second, spec, windows(200), None).unwrap();
    t.resume(&latest_path(&dir)).unwrap();
    t.run(&mut Silent).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    values(t.parameters())
}

/// Dropout (nanoGPT's: embeddings, attention probabilities, both residual branches): the fused
/// attention and the reference path drop the same probabilities for the same random state, a
/// checkpointed segment's recomputation redraws the same masks, a resumed run continues the
/// same masks bit for bit, and it changes the update.
#[test]
fn gpt_dropout_is_the_same_on_both_paths_under_checkpointing_and_across_a_resume() {
    let dropped = |attention| GptSpec {
        dropout: 0.2,
        attention,
        ..spec(sgd())
    };
    let fused = train(&dropped(Attention::Fused), 12, 12, CheckpointPolicy::None);
    let reference = train(
        &dropped(Attention::Reference),
        12,
        12,
        CheckpointPolicy::None,
    );
    assert_params_close(&fused, &reference, 1e-5);
    let recomputed = train(
        &dropped(Attention::Fused),
        12,
        12,
        CheckpointPolicy::EveryBlocks(1),
    );
    assert_params_close(&recomputed, &fused, 1e-5);
    let none = train(&spec(sgd()), 12, 12, CheckpointPolicy::None);
    let moved = fused
        .iter()
        .zip(&none)
        .any(|((_, a), (_, b))| a.iter().zip(b).any(|(x, y)| (x - y).abs() > 1e-4));
    assert!(moved, "dropout changed no parameter");

    let spec = dropped(Attention::Fused);
    let straight = train(&spec, 6, 3, CheckpointPolicy::None);
    assert_eq!(stopped_and_resumed(&spec, "gpt-dropout-resume"), straight);
}

/// The trainer's evaluation (chunks of the micro-batch, sums over tokens) is the mean
/// cross-entropy of the whole set computed as one batch by the model itself.
#[test]
fn evaluation_is_the_mean_loss_over_every_validation_token() {
    let gpu = fresh_gpu();
    let spec = spec(sgd());
    let val = TokenData::evenly_spaced(tokens(300, 9), CONTEXT, VOCAB, 21).unwrap();
    let everything: Vec<usize> = (0..val.len()).collect();
    let config = config(6, 4, 1, 0.05);
    let mut trainer = Trainer::new(
        &gpu,
        config,
        &spec,
        windows(200),
        Some(Box::new(val.clone())),
    )
    .unwrap();
    let evaluation = trainer.evaluate().unwrap().unwrap();
    assert_eq!(evaluation.samples, (21 * CONTEXT) as u64);
    assert_eq!(evaluation.accuracy, None);
    let (model, _) = spec.build(&gpu).unwrap();
    let _no_grad = plimsoll_autograd::no_grad();
    let batch = val.upload(&gpu, &everything).unwrap();
    let want = model.loss(&batch, 0, 0.0).unwrap().item().unwrap();
    let diff = (evaluation.loss - want).abs();
    assert!(diff <= 1e-5 * want.abs(), "{} vs {want}", evaluation.loss);
}

/// Greedy sampling (top-k 1) picks, at every position, the arg-max of the logits one causal
/// forward of the whole generated text gives at the position before: what the model predicts
/// from exactly the text before it.
#[test]
fn greedy_samples_are_the_causal_arg_max() {
    use plimsoll_nn::{Gpt, Module};
    use plimsoll_trainer::{SampleOptions, sample};
    let gpu = fresh_gpu();
    let gpt = Gpt::new(&gpu, spec(sgd()).config, 3).unwrap();
    let options = SampleOptions {
        vocab: None,
        tokens: 5,
        temperature: 0.7,
        top_k: Some(1),
        seed: 1,
    };
    let out = sample(&gpt, &[4, 2], &options).unwrap().tokens;
    assert_eq!(out.len(), 7);
    assert_eq!(out[..2], [4, 2]);
    let ids = plimsoll_autograd::Tensor::from_indices(&gpu, &out, &[1, 7]).unwrap();
    let logits = gpt.forward(&ids).unwrap().to_vec().unwrap();
    for i in 2..7 {
        let row = &logits[(i - 1) * VOCAB..i * VOCAB];
        let best = (0..VOCAB).fold(0, |b, j| if row[j] > row[b] { j } else { b });
        assert_eq!(out[i] as usize, best, "position {i}");
    }
    let again = sample(&gpt, &[4, 2], &options).unwrap();
    assert_eq!(again.tokens, out);
}

/// Sampling is planned: its plan measures the forward over the longest context it will use,
/// and that is the peak of the whole sampling; under a budget below that peak, sampling fails
/// before its first token with [`Error::SampleOutOfMemory`] naming the context, and the same
/// budget with a context short enough to fit samples.
#[test]
fn sampling_peaks_at_its_plan_and_a_budget_below_it_fails_first() {
    use plimsoll_nn::Gpt;
    use plimsoll_trainer::{Error, SampleOptions, sample};
    let options = SampleOptions {
        vocab: None,
        tokens: 2 * CONTEXT,
        temperature: 1.0,
        top_k: None,
        seed: 5,
    };
    let gpu = fresh_gpu();
    let gpt = Gpt::new(&gpu, spec(sgd()).config, 3).unwrap();
    let sampled = sample(&gpt, &[1], &options).unwrap();
    assert_eq!(sampled.plan.context, CONTEXT);
    assert_eq!(sampled.recoveries, 0);
    // The peak over all of sampling (the plan's forward and every generating one) is the plan's.
    let whole = gpu.with_allocator(|a| a.stats().peak_allocated_bytes);
    assert_eq!(whole, sampled.plan.peak_allocated_bytes);
    let parameters = gpu.with_allocator(|a| {
        a.stats()
            .category(plimsoll_kernels_wgsl::Category::Parameter)
            .allocated_bytes
    });
    assert!(sampled.plan.peak_allocated_bytes > parameters);

    // A budget between the parameters and the plan's peak: the longest context cannot run.
    let budget = (parameters + sampled.plan.peak_allocated_bytes) / 2;
    let gpu = fresh_gpu();
    gpu.set_memory_budget(budget);
    let gpt = Gpt::new(&gpu, spec(sgd()).config, 3).unwrap();
    match sample(&gpt, &[1], &options) {
        Err(e @ Error::SampleOutOfMemory { .. }) => {
            let Error::SampleOutOfMemory { context, .. } = &e else {
                unreachable!()
            };
            assert_eq!(*context, CONTEXT, "{e}");
            assert!(e.is_out_of_memory());
            assert!(e.to_string().contains("raise --memory-budget"), "{e}");
        }
        other => panic!("expected SampleOutOfMemory, got {other:?}"),
    }
    // Two tokens after a one-token prompt: a context of two fits.
    let short = SampleOptions {
        vocab: None,
        tokens: 2,
        ..options
    };
    let sampled = sample(&gpt, &[1], &short).unwrap();
    assert_eq!(sampled.plan.context, 2);
    assert!(sampled.plan.peak_allocated_bytes <= budget);
}

/// Windows per batch in the out-of-memory tests: the MLP's hidden activations, 4096 tokens of
/// width 128, are 2 MiB, so they take dedicated segments and reserved bytes follow them.
const OOM_BATCH: usize = 512;

/// Trains 3 steps of `OOM_BATCH` windows; returns the parameters, peak reserved bytes, log.
fn gpt_oom_run(micro: usize, budget: Option<u64>) -> (Values, u64, Vec<String>) {
    let mut config = config(OOM_BATCH, micro, 3, 0.05);
    config.memory_budget_bytes = budget;
    run_measured(config, &spec(sgd()), windows(2000))
}

#[test]
fn gpt_out_of_memory_halves_the_micro_batch_and_keeps_the_update() {
    let (full, full_peak, _) = gpt_oom_run(OOM_BATCH, None);
    let (_, half_peak, _) = gpt_oom_run(OOM_BATCH / 2, None);
    assert!(half_peak < full_peak, "{half_peak} vs {full_peak}");
    let budget = (full_peak + half_peak) / 2;
    let (constrained, constrained_peak, log) = gpt_oom_run(OOM_BATCH, Some(budget));
    assert!(constrained_peak <= budget, "{constrained_peak} > {budget}");
    assert!(
        log.iter().any(
            |l| l.contains("out of memory at micro-batch 512") && l.contains("micro-batch 256")
        ),
        "no split in the log: {log:#?}"
    );
    assert_params_close(&constrained, &full, 1e-5);
}

/// An evaluation chunk that does not fit is split and the evaluation goes on: the result is the
/// unconstrained one, and the log says so.
#[test]
fn gpt_evaluation_out_of_memory_splits_the_chunk_and_keeps_the_result() {
    let val = TokenData::evenly_spaced(tokens(3000, 9), CONTEXT, VOCAB, OOM_BATCH).unwrap();
    // Peak reserved bytes of one evaluation with chunks of `micro` windows, and its result.
    let evaluate = |micro: usize, budget: Option<u64>| {
        let gpu = fresh_gpu();
        let mut trainer = Trainer::new(
            &gpu,
            config(OOM_BATCH, micro, 1, 0.05),
            &spec(sgd()),
            windows(2000),
            Some(Box::new(val.clone())),
        )
        .unwrap();
        if let Some(b) = budget {
            gpu.set_memory_budget(b);
        }
        gpu.with_allocator(|a| a.reset_peaks());
        let evaluation = trainer.evaluate().unwrap().unwrap();
        let peak = gpu.with_allocator(|a| a.stats().peak_reserved_bytes);
        (evaluation, peak, trainer.log().to_vec())
    };
    let (whole, whole_peak, _) = evaluate(OOM_BATCH, None);
    let (_, half_peak, _) = evaluate(OOM_BATCH / 2, None);
    assert!(half_peak < whole_peak, "{half_peak} vs {whole_peak}");
    let (split, split_peak, log) = evaluate(OOM_BATCH, Some((whole_peak + half_peak) / 2));
    assert!(split_peak < whole_peak);
    assert!(
        log.iter()
            .any(|l| l.contains("evaluation: out of memory at 512 samples per chunk")),
        "no split in the log: {log:#?}"
    );
    assert_eq!(split.samples, whole.samples);
    let diff = (split.loss - whole.loss).abs();
    assert!(
        diff <= 1e-5 * whole.loss,
        "{} vs {}",
        split.loss,
        whole.loss
    );
}

/// A GPT step past the fence deadline is a timeout naming the step, after saving the state of
/// the step before; resuming from it gives exactly that state.
#[test]
fn a_gpt_step_past_the_deadline_saves_the_last_good_state() {
    let gpu = fresh_gpu();
    let dir = temp_dir("gpt-deadline");
    let mut config = config(64, 64, 10, 0.05);
    config.checkpoint_dir = Some(dir.clone());
    let spec = spec(sgd());
    let mut trainer = Trainer::new(&gpu, config.clone(), &spec, windows(400), None).unwrap();
    trainer.step().unwrap();
    let good = values(trainer.parameters());
    gpu.set_default_deadline(std::time::Duration::from_micros(1));
    let err = trainer.step().unwrap_err();
    gpu.set_default_deadline(std::time::Duration::from_secs(60));
    assert!(err.is_timeout(), "{err}");
    assert!(
        matches!(err, plimsoll_trainer::Error::StepTimeout { step: 2, .. }),
        "{err}"
    );
    config.checkpoint_dir = None;
    let mut resumed = Trainer::new(&gpu, config, &spec, windows(400), None).unwrap();
    resumed.resume(&latest_path(&dir)).unwrap();
    assert_eq!(resumed.position().step, 1);
    assert_eq!(values(resumed.parameters()), good);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Evaluation stays inside the memory plan: chunks of the planned micro-batch under `no_grad`
/// peak below the planned training step, so a run whose plan fits does not die evaluating.
#[test]
fn gpt_evaluation_peaks_under_the_planned_step() {
    let gpu = fresh_gpu();
    let val = TokenData::evenly_spaced(tokens(20_000, 9), CONTEXT, VOCAB, 2000).unwrap();
    let mut config = config(48, 48, 1, 0.05);
    config.micro_batch = None;
    let mut trainer = Trainer::new(
        &gpu,
        config,
        &spec(sgd()),
        windows(2000),
        Some(Box::new(val)),
    )
    .unwrap();
    let predicted = trainer.plan().unwrap().predicted_peak_bytes;
    gpu.with_allocator(|a| a.reset_peaks());
    trainer.evaluate().unwrap().unwrap();
    let evaluation_peak = gpu.with_allocator(|a| a.stats().peak_allocated_bytes);
    assert!(
        evaluation_peak <= predicted,
        "evaluation peaked at {evaluation_peak} B, over the planned step's {predicted} B"
    );
}

/// A Llama (grouped-query heads, rotary positions, RMSNorm, SwiGLU) through the trainer: micro-
/// batches and checkpointed blocks give the full batch's update, the fused attention the
/// reference path's, a resumed run is bit-identical, and training lowers the loss.
#[test]
fn a_llama_trains_with_micro_batches_checkpointing_and_a_resume() {
    let llama = GptSpec {
        arch: plimsoll_trainer::Arch::Llama(plimsoll_trainer::LlamaShape {
            kv_heads: 1,
            mlp_width: 40,
            rope_theta: 10_000.0,
            tie_embeddings: false,
        }),
        attention: Attention::Reference,
        ..spec(sgd())
    };
    let full = train(&llama, 12, 12, CheckpointPolicy::None);
    assert_params_close(&train(&llama, 12, 5, CheckpointPolicy::None), &full, 1e-5);
    assert_params_close(
        &train(&llama, 12, 12, CheckpointPolicy::EveryBlocks(1)),
        &full,
        1e-5,
    );
    let fused = GptSpec {
        attention: Attention::Fused,
        ..llama
    };
    assert_params_close(&train(&fused, 12, 12, CheckpointPolicy::None), &full, 1e-5);
    assert!(
        full.iter()
            .any(|(n, _)| n == "model.layers.1.self_attn.k_proj.weight")
    );
    let straight = train(&llama, 6, 3, CheckpointPolicy::None);
    assert_eq!(stopped_and_resumed(&llama, "llama-resume"), straight);
    // The loss falls over 30 steps.
    let gpu = fresh_gpu();
    let mut trainer =
        Trainer::new(&gpu, config(12, 12, 30, 0.3), &llama, windows(400), None).unwrap();
    let first = trainer.step().unwrap().loss;
    let mut last = first;
    for _ in 1..30 {
        last = trainer.step().unwrap().loss;
    }
    assert!(last < first * 0.95, "loss {first} -> {last}");
}

/// The multi-tensor launches a GPU takes for AdamW's update and the read-back's sums of squares
/// (forced here on lavapipe, which takes one launch per tensor) train the GPT as one launch per
/// tensor does: the same loss-clipped AdamW steps, the same parameters after five of them.
#[test]
fn multi_tensor_launches_train_as_one_launch_per_tensor_does() {
    use plimsoll_kernels_wgsl::GpuOptions;
    use plimsoll_kernels_wgsl::kernels::TensorLaunches;
    use plimsoll_kernels_wgsl::testing::gpu_with;
    use plimsoll_nn::AdamWConfig;
    let spec = spec(OptimizerSpec::AdamW(AdamWConfig {
        lr: 1e-2,
        weight_decay: 0.1,
        decay_matrices_only: true,
        ..AdamWConfig::default()
    }));
    let run = |launches| {
        let gpu = gpu_with(GpuOptions {
            tensor_launches: Some(launches),
            ..GpuOptions::from_env()
        });
        let mut config = config(12, 6, 5, 1e-2);
        // Clipped at a norm the gradients pass: the sums of squares steer the update.
        config.clip_grad_norm = Some(0.5);
        let mut trainer = Trainer::new(&gpu, config, &spec, windows(200), None).unwrap();
        trainer.run(&mut Silent).unwrap();
        values(trainer.parameters())
    };
    let one = run(TensorLaunches::OnePerTensor);
    let multi = run(TensorLaunches::Multi);
    assert_params_close(&multi, &one, 1e-6);
}
