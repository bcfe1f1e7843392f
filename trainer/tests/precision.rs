//! `--precision f16`: the loss scaler against a plain model of PyTorch's GradScaler, skipped
//! steps that leave the model as it was (and a resumed run that keeps the scale), the error
//! when no scale helps, and the f16 GPT and MLP against their f32 runs (the loss after 300
//! steps, accumulation, out-of-memory recovery).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use plimsoll_autograd::{Tensor, TensorOptions};
use plimsoll_kernels_wgsl::Gpu;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_nn::{AdamWConfig, GptConfig, LrSchedule, Optimizer, SgdConfig};
use plimsoll_trainer::scaler::{GROWTH_INTERVAL, INITIAL_SCALE, LossScaler, ScaleChange};
use plimsoll_trainer::task::{Batch, EvalSums, Model};
use plimsoll_trainer::{
    CharCorpus, Data, Error, GptSpec, OptimizerSpec, Precision, Recipe, Result, RunLength, Silent,
    TokenData, Trainer,
};
use proptest::prelude::*;

/// GradScaler's update as its documentation states it, written from scratch, with Plimsoll's
/// cap (2^24) and its end (an overflow at scale 1): the scale after each step of an overflow
/// sequence and which steps updated the model, up to the step that exhausts the scaler.
fn plain_grad_scaler(overflows: &[bool]) -> (Vec<f64>, Vec<bool>, Option<usize>) {
    let (mut scale, mut tracker) = (65536.0f64, 0u32);
    let mut scales = Vec::new();
    let mut updated = Vec::new();
    for (i, &inf) in overflows.iter().enumerate() {
        if inf {
            if scale <= 1.0 {
                return (scales, updated, Some(i));
            }
            scale *= 0.5;
            tracker = 0;
        } else {
            tracker += 1;
            if tracker == 2000 {
                scale = (scale * 2.0).min(16_777_216.0);
                tracker = 0;
            }
        }
        scales.push(scale);
        updated.push(!inf);
    }
    (scales, updated, None)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Runs of good steps, some long enough to grow the scale, broken by runs of overflows,
    /// some long enough to exhaust it.
    #[test]
    fn the_scaler_is_pytorchs_grad_scaler(
        runs in prop::collection::vec((0u32..6500, 1usize..12), 1..10)
    ) {
        let mut overflows = Vec::new();
        for (good, bad) in runs {
            overflows.extend(std::iter::repeat_n(false, good as usize));
            overflows.extend(std::iter::repeat_n(true, bad));
        }
        let (scales, updated, exhausted) = plain_grad_scaler(&overflows);
        let mut scaler = LossScaler::default();
        prop_assert_eq!(scaler.scale, INITIAL_SCALE);
        for (i, &inf) in overflows.iter().enumerate() {
            let change = scaler.update(inf);
            if exhausted == Some(i) {
                prop_assert_eq!(change, ScaleChange::Exhausted);
                break;
            }
            prop_assert_eq!(change == ScaleChange::Skipped, !updated[i]);
            prop_assert_eq!(f64::from(scaler.scale), scales[i], "after step {}", i + 1);
        }
        let skipped = updated.iter().filter(|&&u| !u).count() as u64;
        prop_assert_eq!(scaler.skipped_steps, skipped);
    }
}

#[test]
fn the_scale_stops_at_one_and_grows_every_interval() {
    let mut s = LossScaler::default();
    for _ in 0..16 {
        assert_eq!(s.update(true), ScaleChange::Skipped);
    }
    assert_eq!(s.scale, 1.0);
    assert_eq!(s.update(true), ScaleChange::Exhausted);
    assert_eq!(
        (s.scale, s.skipped_steps),
        (1.0, 16),
        "exhausted changes nothing"
    );
    for _ in 1..GROWTH_INTERVAL {
        assert_eq!(s.update(false), ScaleChange::Kept);
    }
    assert_eq!(s.update(false), ScaleChange::Grew);
    assert_eq!(s.scale, 2.0);
}

/// A model whose loss is `c * sum(w)` (a scalar times a scalar: f32 under f16 activations) or
/// `sum(sqrt(w))`: its gradient is `c` times the loss scale, which overflows the check (the four
/// squares' sum in f32) from `c * scale >= 9.2e18`; or infinite at `w = 0` at every scale while
/// the loss is 0. SGD at learning rate 1e-33 moves
/// `w` by 3e-18 per update of the first kind (the rate times the unscaling factor stays a normal
/// f32, which a device need not keep for subnormals).
#[derive(Clone, Copy)]
enum Overflowing {
    Times(f32),
    Sqrt,
    /// `sum(w * 1e5)` at `w = 1`: the product, an activation, is beyond f16's range.
    Activation,
}

struct Probe {
    kind: Overflowing,
    w: Tensor,
}

impl Model for Probe {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("w".to_string(), self.w.clone())]
    }
    fn loss(&self, _: &Batch, _: usize, _: f32) -> Result<Tensor> {
        Ok(match self.kind {
            Overflowing::Times(c) => self.w.sum_all()?.mul_scalar(c)?,
            Overflowing::Sqrt => self.w.sqrt()?.sum_all()?,
            Overflowing::Activation => self.w.mul_scalar(1e5)?.sum_all()?,
        })
    }
    fn evaluate(&self, _: &Batch) -> Result<EvalSums> {
        Ok(EvalSums::default())
    }
    fn set_training(&mut self, _: bool) {}
}

impl Recipe for Overflowing {
    fn build(&self, gpu: &Gpu) -> Result<(Box<dyn Model>, Box<dyn Optimizer>)> {
        let w0 = match *self {
            Overflowing::Times(_) => 1e-34,
            Overflowing::Sqrt => 0.0,
            Overflowing::Activation => 1.0,
        };
        let w = Tensor::full(gpu, &[4], w0, TensorOptions::parameter("w"))?;
        let model = Probe { kind: *self, w };
        let sgd = OptimizerSpec::Sgd(SgdConfig {
            lr: 1e-33,
            ..SgdConfig::default()
        });
        Ok((Box::new(model), sgd.build()))
    }
    fn blocks(&self) -> usize {
        1
    }
    fn parameter_count(&self) -> usize {
        4
    }
    fn check(&self, _: &dyn Data) -> Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "overflow probe".to_string()
    }
}

fn probe_trainer(
    gpu: &Gpu,
    kind: Overflowing,
    steps: u64,
    dir: Option<&std::path::Path>,
) -> Trainer {
    let mut config = config(4, 4, steps, 1.0);
    config.checkpoint_dir = dir.map(|d| d.to_path_buf());
    config.precision = Precision::F16;
    config.schedule = LrSchedule::Constant { lr: 1e-33 };
    Trainer::new(gpu, config, &kind, data(8, 3, 2), None).unwrap()
}

/// `c = 3e15`: the scaled gradients' squares overflow f32 at the scales 65536 down to 4096
/// (3e15 * 4096 = 1.2e19) and not at 2048: five steps are skipped with the model untouched, the
/// sixth updates.
#[test]
fn overflowing_steps_are_skipped_until_the_scale_fits_and_a_resume_keeps_it() {
    let gpu = fresh_gpu();
    let dir = temp_dir("f16-skips");
    let mut trainer = probe_trainer(&gpu, Overflowing::Times(3e15), 8, Some(&dir));
    let w0 = trainer.parameters()[0].1.to_vec().unwrap();
    let mut scales = Vec::new();
    for step in 1..=6 {
        let report = trainer.step().unwrap();
        scales.push(report.loss_scale.unwrap());
        let w = trainer.parameters()[0].1.to_vec().unwrap();
        assert_eq!(report.skipped, step <= 5, "step {step}");
        assert_eq!(
            w == w0,
            step <= 5,
            "step {step}: the model moves only when not skipped"
        );
        // The loss of the model before the step: 4 * 1e-34 * 3e15.
        assert!(
            (report.loss / 1.2e-18 - 1.0).abs() < 1e-5,
            "step {step}: loss {}",
            report.loss
        );
    }
    assert_eq!(scales, [65536.0, 32768.0, 16384.0, 8192.0, 4096.0, 2048.0]);
    let logged = trainer.log().join("\n");
    assert!(
        logged.contains(
            "step 5: gradients overflowed (first: w) at loss scale 4096; update \
                         skipped, loss scale now 2048 (5 skipped so far)"
        ),
        "{logged}"
    );
    assert_eq!(trainer.position().loss_scaler.unwrap().scale, 2048.0);
    // Saved and resumed: the scale and the count come back.
    let path = trainer.save_checkpoint().unwrap().unwrap();
    drop(trainer);
    let mut config = config(4, 4, 8, 1.0);
    config.precision = Precision::F16;
    let mut resumed =
        Trainer::new(&gpu, config, &Overflowing::Times(3e15), data(8, 3, 2), None).unwrap();
    resumed.resume(&path).unwrap();
    let scaler = resumed.position().loss_scaler.unwrap();
    assert_eq!(
        (scaler.scale, scaler.skipped_steps, scaler.good_steps),
        (2048.0, 5, 1)
    );
    let report = resumed.step().unwrap();
    assert_eq!((report.loss_scale, report.skipped), (Some(2048.0), false));
    std::fs::remove_dir_all(&dir).ok();
}

/// Steps `trainer`, `done` steps in, until its scaler is exhausted: every step up to the 16th
/// skipped, then the 17th's error.
fn skipped_until_exhausted(trainer: &mut Trainer, done: usize) -> Error {
    for _ in done..16 {
        assert!(trainer.step().unwrap().skipped);
    }
    trainer.step().unwrap_err()
}

/// `sqrt(w)` at `w = 0`: the gradient is infinite at every scale while the loss is 0. Sixteen
/// steps are skipped (65536 down to 1), then the step at scale 1 is the error.
#[test]
fn gradients_that_overflow_at_every_scale_are_an_error_naming_the_parameter() {
    let gpu = fresh_gpu();
    let mut trainer = probe_trainer(&gpu, Overflowing::Sqrt, 20, None);
    let err = skipped_until_exhausted(&mut trainer, 0);
    assert!(
        matches!(
            err,
            Error::LossScaleExhausted {
                step: 17,
                skipped: 16,
                ..
            }
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("first parameter with a non-finite gradient: w"),
        "{text}"
    );
    assert!(text.contains("--precision f32"), "{text}");
    assert_eq!(trainer.parameters()[0].1.to_vec().unwrap(), [0.0; 4]);
}

/// An activation beyond f16's 65504 is infinite in the forward: the loss is not finite, so the
/// step is skipped (GradScaler's rule; the scale cannot help a forward, so the run ends at
/// scale 1 with an error that names no parameter).
#[test]
fn an_activation_beyond_f16_skips_the_step_and_ends_at_scale_one() {
    let gpu = fresh_gpu();
    let mut trainer = probe_trainer(&gpu, Overflowing::Activation, 20, None);
    let report = trainer.step().unwrap();
    assert!(report.skipped && !report.loss.is_finite(), "{report:?}");
    let logged = "step 1: the loss was not finite at loss scale 65536; update skipped";
    assert!(trainer.log().iter().any(|l| l.contains(logged)));
    let err = skipped_until_exhausted(&mut trainer, 1);
    assert!(
        matches!(
            err,
            Error::LossScaleExhausted {
                first_parameter: None,
                skipped: 16,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("none (only the loss)"), "{err}");
    assert_eq!(trainer.parameters()[0].1.to_vec().unwrap(), [1.0; 4]);
}

/// A small GPT on Shakespeare (2 layers, width 32, context 16) from the same initial weights:
/// after 300 steps the f16 run's validation loss is within 2% of the f32 run's (2.628 against
/// 2.612 on lavapipe: 0.6% apart). The model is as small as keeps the comparison meaningful:
/// its 600 steps are the longest test of the suite on lavapipe (47 s; 137 s at width 64 and
/// context 32).
#[test]
fn an_f16_gpt_ends_300_steps_within_2_percent_of_f32() {
    let corpus = CharCorpus::shakespeare().unwrap();
    let vocab = corpus.vocab_size();
    let context = 16;
    let run = |precision: Precision| {
        let gpu = fresh_gpu();
        let train = TokenData::windows(Arc::new(corpus.train().to_vec()), context, vocab).unwrap();
        let val =
            TokenData::evenly_spaced(Arc::new(corpus.val().to_vec()), context, vocab, 64).unwrap();
        let spec = GptSpec::new(
            GptConfig {
                vocab_size: vocab,
                block_size: context,
                n_layer: 2,
                n_head: 2,
                n_embd: 32,
            },
            1,
            OptimizerSpec::AdamW(AdamWConfig {
                beta2: 0.99,
                weight_decay: 0.1,
                ..AdamWConfig::default()
            }),
        );
        let mut config = config(12, 12, 300, 3e-3);
        config.length = RunLength::Steps(300);
        config.eval_interval_steps = Some(300);
        config.clip_grad_norm = Some(1.0);
        config.precision = precision;
        let mut trainer = Trainer::new(&gpu, config, &spec, train, Some(Box::new(val))).unwrap();
        let summary = trainer.run(&mut Silent).unwrap();
        let skipped = trainer
            .position()
            .loss_scaler
            .map_or(0, |s| s.skipped_steps);
        (summary.last_evaluation.unwrap().loss, skipped)
    };
    let (full, _) = run(Precision::F32);
    let (half, skipped) = run(Precision::F16);
    let gap = (half - full).abs() / full;
    assert!(
        gap < 0.02,
        "validation loss {half} in f16 against {full} in f32: {:.2}% apart",
        100.0 * gap
    );
    assert!(full < 2.7, "the model learned something ({full})");
    assert_eq!(skipped, 0, "no overflow in a healthy run");
}

/// The MLP in f16: micro-batches of 8 give the update of the whole batch of 32, as in f32.
#[test]
fn f16_micro_batches_give_the_full_batch_update() {
    let run = |micro: usize| {
        let gpu = fresh_gpu();
        let mut config = config(32, micro, 4, 1e-2);
        config.precision = Precision::F16;
        let spec = sgd_spec(&[12, 48, 48, 5]);
        let mut trainer = Trainer::new(&gpu, config, &spec, data(64, 12, 5), None).unwrap();
        trainer.run(&mut Silent).unwrap();
        values(trainer.parameters())
    };
    assert_params_close(&run(8), &run(32), 1e-5);
}

/// The MLP in f16 under a budget between the peaks of micro-batches 1024 and 512: the step
/// halves the micro-batch and ends with the update of the unbudgeted run.
#[test]
fn f16_out_of_memory_halves_the_micro_batch_and_keeps_the_update() {
    let (constrained, full, _split) = oom_split(Precision::F16);
    assert_params_close(&constrained, &full, 1e-5);
}

/// A budget between the f16 and the f32 plans of the same run: the f32 plan's refusal says
/// that f16 fits, with the f16 plan's micro-batch and peak.
#[test]
fn a_budget_only_f16_fits_is_refused_with_f16_suggested() {
    // Deep and narrow, so activations dominate: twelve 256-wide layers at batch 2048.
    let mut widths = vec![32];
    widths.extend([256; 12]);
    widths.push(10);
    let spec = sgd_spec(&widths);
    let data = data(2048, 32, 10);
    let plan_at = |budget: Option<u64>, precision: Precision| {
        let gpu = fresh_gpu();
        if let Some(b) = budget {
            gpu.set_memory_budget(b);
        }
        let mut config = config(2048, 2048, 1, 1e-2);
        config.precision = precision;
        plimsoll_trainer::plan::plan(&gpu, &spec, &data, Some(&data), &config)
    };
    let full = plan_at(None, Precision::F32).unwrap();
    let half = plan_at(None, Precision::F16).unwrap();
    let (full, half) = (
        full.predicted_peak_reserved_bytes,
        half.predicted_peak_reserved_bytes,
    );
    assert!(half < full, "f16 {half} B, f32 {full} B");
    let budget = (half + full) / 2;
    let fitting = plan_at(Some(budget), Precision::F16).unwrap();
    let err = plan_at(Some(budget), Precision::F32).unwrap_err();
    match &err {
        Error::BudgetTooSmall {
            f16_fits: Some((micro, reserved)),
            ..
        } => {
            assert_eq!(*micro, fitting.micro_batch);
            assert_eq!(*reserved, fitting.predicted_peak_reserved_bytes);
        }
        other => panic!("{other}"),
    }
    assert!(
        err.to_string().contains("--precision f16 fits this budget"),
        "{err}"
    );
}
