//! Helpers shared by the trainer's tests: small synthetic data, small models, and parameter
//! comparison. Each test takes a device of its own (`testing::fresh_gpu()`): the trainer checks
//! for leaked blocks after every step, which another test's tensors on a shared device would be.
#![allow(dead_code, clippy::unwrap_used)]

pub mod cli;
pub mod gpt;

use std::path::PathBuf;
use std::time::Duration;

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::testing::close;
use plimsoll_nn::{Activation, AdamWConfig, GptConfig, LrSchedule, SgdConfig};
use plimsoll_trainer::{
    CheckpointPolicy, Dataset, GptSpec, LeakPolicy, ModelSpec, OptimizerSpec, RunLength,
    TrainConfig,
};

/// `len` synthetic samples with `dim` features and `classes` classes.
pub fn data(len: usize, dim: usize, classes: usize) -> Dataset {
    Dataset::synthetic(len, dim, classes, 42).unwrap()
}

/// An MLP spec with Adam (no weight decay).
pub fn adam_spec(widths: &[usize]) -> ModelSpec {
    ModelSpec {
        widths: widths.to_vec(),
        activation: Activation::Relu,
        seed: 7,
        optimizer: OptimizerSpec::AdamW(AdamWConfig {
            weight_decay: 0.0,
            ..AdamWConfig::default()
        }),
    }
}

/// A tiny GPT (vocabulary 13, context 8, 2 layers, 2 heads, width 32) with Adam, and `len`
/// tokens of a fixed pattern for it.
pub fn tiny_gpt(len: u32) -> (GptSpec, std::sync::Arc<Vec<u32>>) {
    let spec = GptSpec::new(
        GptConfig {
            vocab_size: 13,
            block_size: 8,
            n_layer: 2,
            n_head: 2,
            n_embd: 32,
        },
        11,
        adam_spec(&[1]).optimizer,
    );
    let tokens = (0..len).map(|i| (i * 7 + i / 3) % 13).collect();
    (spec, std::sync::Arc::new(tokens))
}

/// An MLP spec with SGD and momentum.
pub fn sgd_spec(widths: &[usize]) -> ModelSpec {
    ModelSpec {
        optimizer: OptimizerSpec::Sgd(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            ..SgdConfig::default()
        }),
        ..adam_spec(widths)
    }
}

/// A configuration for `steps` steps of `batch` samples in micro-batches of `micro`, no plan,
/// no checkpointing, leaks as errors.
pub fn config(batch: usize, micro: usize, steps: u64, lr: f32) -> TrainConfig {
    TrainConfig {
        effective_batch: batch,
        micro_batch: Some(micro),
        length: RunLength::Steps(steps),
        schedule: LrSchedule::Constant { lr },
        seed: 3,
        checkpointing: CheckpointPolicy::None,
        fence_deadline: Duration::from_secs(60),
        leak_policy: LeakPolicy::Error,
        ..TrainConfig::default()
    }
}

/// Every parameter's values, in order.
pub fn values(params: &[(String, Tensor)]) -> Vec<(String, Vec<f32>)> {
    params
        .iter()
        .map(|(n, t)| (n.clone(), t.to_vec().unwrap()))
        .collect()
}

/// Asserts, for every tensor, `|a_i - b_i| <= rtol * max(|a_i|, |b_i|, max_j |a_j|)`: relative to
/// the element or, for near-zero elements, to the tensor's largest magnitude (its max norm),
/// judged by `testing::close` (so a NaN or an infinity must be matched exactly; magnitudes are
/// taken over finite values only). Prints the first mismatch.
pub fn assert_params_close(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)], rtol: f64) {
    assert_eq!(a.len(), b.len());
    let magnitude = |v: f32| {
        if v.is_finite() {
            f64::from(v.abs())
        } else {
            0.0
        }
    };
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        let scale = va.iter().fold(0f64, |m, &v| m.max(magnitude(v)));
        for (i, (&x, &y)) in va.iter().zip(vb).enumerate() {
            let tol = rtol * magnitude(x).max(magnitude(y)).max(scale);
            assert!(
                close(f64::from(x), f64::from(y), tol, 0.0),
                "{na}[{i}]: {x} vs {y} (difference {}, tolerance {tol})",
                (f64::from(x) - f64::from(y)).abs()
            );
        }
    }
}

/// A fresh, empty temporary directory for this test.
pub fn temp_dir(name: &str) -> PathBuf {
    plimsoll_kernels_wgsl::testing::fresh_dir("trainer", name)
}

/// Parameters as [`values`] gives them.
pub type Values = Vec<(String, Vec<f32>)>;

/// The batch of [`oom_run`].
pub const OOM_BATCH: usize = 1024;

/// The out-of-memory tests' run: a 32-1024-10 MLP with SGD (Adam's `m / sqrt(v)` magnifies
/// summation-order differences of near-zero gradients), three steps of [`OOM_BATCH`] in
/// micro-batches of `micro` under `budget` in `precision`; the parameters after, the peak
/// reserved bytes and the log.
pub fn oom_run(
    micro: usize,
    budget: Option<u64>,
    precision: plimsoll_trainer::Precision,
) -> (Values, u64, Vec<String>) {
    let mut config = config(OOM_BATCH, micro, 3, 0.05);
    config.memory_budget_bytes = budget;
    config.precision = precision;
    let spec = sgd_spec(&[32, 1024, 10]);
    run_measured(config, &spec, data(OOM_BATCH * 2, 32, 10))
}

/// The out-of-memory recovery scenario in `precision`: [`oom_run`] at [`OOM_BATCH`] and at half
/// of it unbudgeted, then at [`OOM_BATCH`] under a budget between their two peaks. Asserts that
/// half the micro-batch peaks lower, that the budgeted run kept within the budget and that its
/// log tells of the split at micro-batch 1024; returns the budgeted run's parameters, the
/// unbudgeted full batch's and that log line.
pub fn oom_split(precision: plimsoll_trainer::Precision) -> (Values, Values, String) {
    let (full, full_peak, _) = oom_run(OOM_BATCH, None, precision);
    let (_, half_peak, _) = oom_run(OOM_BATCH / 2, None, precision);
    assert!(half_peak < full_peak, "{half_peak} vs {full_peak}");
    let budget = (full_peak + half_peak) / 2;
    let (constrained, constrained_peak, log) = oom_run(OOM_BATCH, Some(budget), precision);
    assert!(constrained_peak <= budget);
    let split = log
        .iter()
        .find(|l| l.contains("out of memory at micro-batch 1024"));
    assert!(split.is_some(), "no split in the log: {log:#?}");
    (constrained, full, split.unwrap().clone())
}

/// Runs `recipe` on `train` to the end of `config` on a device of its own; the parameters after,
/// the peak reserved bytes and the log.
pub fn run_measured(
    config: TrainConfig,
    recipe: &dyn plimsoll_trainer::Recipe,
    train: impl plimsoll_trainer::Data + 'static,
) -> (Values, u64, Vec<String>) {
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let mut trainer = plimsoll_trainer::Trainer::new(&gpu, config, recipe, train, None).unwrap();
    trainer.run(&mut plimsoll_trainer::Silent).unwrap();
    let peak = gpu.with_allocator(|a| a.stats().peak_reserved_bytes);
    (values(trainer.parameters()), peak, trainer.log().to_vec())
}
