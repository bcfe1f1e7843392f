//! Steps recorded ahead: [`Trainer::run`] records step k+1 while the device runs step k (the
//! update decided on the device), against the same steps one by one ([`Trainer::step`], which
//! waits for each step's read-back): the same losses and parameters, bit for bit; and a step
//! found not finite only after the next one was recorded leaves the model as it was before it.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_nn::SgdConfig;
use plimsoll_trainer::{
    Error, Evaluation, ModelSpec, Observer, OptimizerSpec, StepReport, TrainConfig, Trainer,
};

/// Collects the evaluations' losses.
struct Evaluations(Vec<(u64, u32)>);

impl Observer for Evaluations {
    fn on_step(&mut self, _: &StepReport) {}
    fn on_eval(&mut self, _: u64, step: u64, evaluation: &Evaluation) {
        self.0.push((step, evaluation.loss.to_bits()));
    }
    fn on_log(&mut self, _: &str) {}
}

/// Gives `p` an infinite gradient (the backward of `sum(inf * p)`), which the next step's
/// backward accumulates into.
fn poison(p: &Tensor) {
    let poison = p.mul_scalar(f32::INFINITY).unwrap().sum_all().unwrap();
    poison.backward().unwrap();
}

/// Batches of 8 of 64 samples: an epoch of 8 steps, clipped (so the device's clip factor is
/// used), no evaluation set.
fn setup(steps: u64) -> (plimsoll_autograd::Gpu, Trainer, TrainConfig) {
    setup_with(steps, &adam_spec(&[8, 16, 4]))
}

/// [`setup`] of the MLP `spec`.
fn setup_with(steps: u64, spec: &ModelSpec) -> (plimsoll_autograd::Gpu, Trainer, TrainConfig) {
    let gpu = fresh_gpu();
    let mut config = config(8, 8, steps, 3e-3);
    config.clip_grad_norm = Some(0.05);
    let trainer = Trainer::new(&gpu, config.clone(), spec, data(64, 8, 4), None).unwrap();
    (gpu, trainer, config)
}

/// SGD with momentum and dampening: a first step (`buf = g`) differs from a later one
/// (`buf = momentum * buf + (1 - dampening) * g`) even from a zero buffer.
fn sgd_dampened() -> ModelSpec {
    ModelSpec {
        optimizer: OptimizerSpec::Sgd(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.5,
            ..SgdConfig::default()
        }),
        ..adam_spec(&[8, 16, 4])
    }
}

#[test]
fn steps_recorded_ahead_train_as_steps_one_by_one_bit_for_bit() {
    let (_gpu, mut ahead, _) = setup(7);
    let mut seen = Reports(Vec::new(), None);
    ahead.run(&mut seen).unwrap();
    // After steps 1..=6 the next step began ahead; after step 7 the run ends.
    assert_eq!(ahead.steps_begun_ahead(), 6, "{:?}", ahead.log());
    let (_gpu2, mut one_by_one, _) = setup(7);
    let mut want = Vec::new();
    for _ in 0..7 {
        let report = one_by_one.step().unwrap();
        want.push(summary(&report));
        assert!(
            report.grad_norm > 0.05,
            "clipped: norm {}",
            report.grad_norm
        );
    }
    assert_eq!(one_by_one.steps_begun_ahead(), 0);
    assert_eq!(seen.0, want);
    assert_eq!(values(ahead.parameters()), values(one_by_one.parameters()));
    assert_eq!(ahead.optimizer().step_count(), 7);
}

#[test]
fn a_step_found_not_finite_after_the_next_began_leaves_the_model_as_it_was() {
    for spec in [adam_spec(&[8, 16, 4]), sgd_dampened()] {
        let (_gpu, mut trainer, _) = setup_with(7, &spec);
        // Poisoned after step 2's report, which comes once step 3 began: step 4 takes it.
        let poisoned = trainer.parameters()[2].1.clone();
        let err = trainer
            .run(&mut Reports(Vec::new(), Some((2, poisoned))))
            .unwrap_err();
        assert!(matches!(err, Error::NonFinite { step: 4, .. }), "{err}");
        // Step 5 was recorded behind step 4 (its update halted on the device).
        assert!(trainer.steps_begun_ahead() >= 4, "{:?}", trainer.log());
        let (_gpu2, mut clean, _) = setup_with(7, &spec);
        for _ in 0..3 {
            clean.step().unwrap();
        }
        assert_eq!(trainer.position().step, 3);
        assert_eq!(trainer.optimizer().step_count(), 3);
        assert_eq!(
            values(trainer.parameters()),
            values(clean.parameters()),
            "{spec:?}: the model after step 3: steps 4 and 5 wrote nothing"
        );
        // The halt is lifted and the step count taken back: step 4 again is the clean one.
        let again = trainer.step().unwrap();
        let want = clean.step().unwrap();
        assert_eq!((again.step, again.loss.to_bits()), (4, want.loss.to_bits()));
        assert_eq!(values(trainer.parameters()), values(clean.parameters()));
    }
}

/// SGD's momentum buffers are created by the first step that sees a parameter: one created by
/// a step the device skipped is dropped again ([`Optimizer::rewind`]), so the next step is a
/// first step for it. Here the first step itself is not finite.
#[test]
fn a_first_sgd_step_refused_after_the_next_began_creates_its_buffers_again() {
    let (_gpu, mut trainer, _) = setup_with(7, &sgd_dampened());
    poison(&trainer.parameters()[0].1.clone());
    // With no memory timeline, steps run ahead from step 1.
    let err = trainer.run(&mut Reports(Vec::new(), None)).unwrap_err();
    assert!(matches!(err, Error::NonFinite { step: 1, .. }), "{err}");
    assert!(
        trainer.optimizer().state().is_empty(),
        "{:?}",
        trainer.optimizer().state()
    );
    let (_gpu2, mut clean, _) = setup_with(7, &sgd_dampened());
    for _ in 0..2 {
        trainer.step().unwrap();
        clean.step().unwrap();
    }
    assert_eq!(values(trainer.parameters()), values(clean.parameters()));
}

/// An evaluation every 3 steps sees the model after its step, never the next one's update: the
/// steps around it do not run ahead, and its losses equal those of steps one by one evaluated
/// at the same steps, bit for bit.
#[test]
fn evaluations_between_steps_recorded_ahead_see_the_model_of_their_step() {
    let make = || {
        let gpu = fresh_gpu();
        let mut config = config(8, 8, 7, 3e-3);
        config.eval_interval_steps = Some(3);
        let trainer = Trainer::new(
            &gpu,
            config,
            &adam_spec(&[8, 16, 4]),
            data(64, 8, 4),
            Some(Box::new(data(16, 8, 4))),
        )
        .unwrap();
        (gpu, trainer)
    };
    let (_gpu, mut ahead) = make();
    let mut seen = Evaluations(Vec::new());
    ahead.run(&mut seen).unwrap();
    // Ahead after steps 1, 2, 4 and 5 only: evaluations follow steps 3, 6 and the last, 7.
    assert_eq!(ahead.steps_begun_ahead(), 4, "{:?}", ahead.log());
    let (_gpu2, mut one_by_one) = make();
    let mut want = Vec::new();
    for step in 1..=7u64 {
        one_by_one.step().unwrap();
        if step % 3 == 0 || step == 7 {
            let evaluation = one_by_one.evaluate().unwrap().unwrap();
            want.push((step, evaluation.loss.to_bits()));
        }
    }
    assert_eq!(seen.0, want);
    assert_eq!(values(ahead.parameters()), values(one_by_one.parameters()));
}

/// f16: an overflow is found only in the read-back, once the next step was recorded with the
/// scale it would have halved. The device skipped both updates; the skipped step is reported,
/// the scale backs off, and the next step runs again at the new scale: losses, skips, scales
/// and parameters equal those of steps one by one given the same overflow, bit for bit.
#[test]
fn an_f16_overflow_found_after_the_next_began_runs_that_step_again() {
    let make = || {
        let gpu = fresh_gpu();
        let mut config = config(8, 8, 7, 3e-3);
        config.precision = plimsoll_trainer::Precision::F16;
        let trainer =
            Trainer::new(&gpu, config, &adam_spec(&[8, 16, 4]), data(64, 8, 4), None).unwrap();
        (gpu, trainer)
    };
    let (_gpu, mut ahead) = make();
    // Poisoned after step 2's report, which comes once step 3 began: step 4 takes it.
    let poisoned = ahead.parameters()[2].1.clone();
    let mut seen = Reports(Vec::new(), Some((2, poisoned)));
    ahead.run(&mut seen).unwrap();
    assert!(ahead.steps_begun_ahead() >= 5, "{:?}", ahead.log());
    let (_gpu2, mut one_by_one) = make();
    let poisoned = one_by_one.parameters()[2].1.clone();
    let mut want = Vec::new();
    for step in 1..=7u64 {
        if step == 4 {
            poison(&poisoned);
        }
        want.push(summary(&one_by_one.step().unwrap()));
    }
    assert!(want[3].1, "step 4 overflowed: {want:?}");
    assert_eq!(seen.0, want);
    assert_eq!(values(ahead.parameters()), values(one_by_one.parameters()));
    assert_eq!(ahead.optimizer().step_count(), 6);
    assert_eq!(one_by_one.optimizer().step_count(), 6);
}

/// (step, skipped, loss scale, loss bits) of a report.
fn summary(r: &StepReport) -> (u64, bool, Option<u32>, u32) {
    (
        r.step,
        r.skipped,
        r.loss_scale.map(f32::to_bits),
        r.loss.to_bits(),
    )
}

/// Collects [`summary`]s; at the report of step `.1.0` gives `.1.1` an infinite gradient.
struct Reports(Vec<(u64, bool, Option<u32>, u32)>, Option<(u64, Tensor)>);

impl Observer for Reports {
    fn on_step(&mut self, report: &StepReport) {
        self.0.push(summary(report));
        if let Some((after, p)) = &self.1
            && report.step == *after
        {
            poison(p);
        }
    }
    fn on_eval(&mut self, _: u64, _: u64, _: &Evaluation) {}
    fn on_log(&mut self, _: &str) {}
}
