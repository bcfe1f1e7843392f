//! Checkpoints: a run stopped at step N and resumed ends bit-identical to one that never stopped;
//! the stop flag (Ctrl-C) saves and ends the run cleanly.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use common::*;
use plimsoll_kernels_wgsl::fault::{FaultAction, FaultPoint};
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::checkpoint_io::{best_path, latest_path};
use plimsoll_trainer::{
    Evaluation, Gpu, LOSS_WINDOW, Observer, RunLength, Silent, SnapshotEvery, StepReport,
    TokenData, Trainer,
};

#[test]
fn a_resumed_run_is_bit_identical() {
    let spec = adam_spec(&[10, 24, 24, 3]);
    let data = data(40, 10, 3); // 3 steps per epoch of 16: the run crosses epochs
    let straight = {
        let gpu = fresh_gpu();
        let mut t = Trainer::new(&gpu, config(16, 8, 7, 1e-2), &spec, data.clone(), None).unwrap();
        t.run(&mut Silent).unwrap();
        values(t.parameters())
    };
    let dir = temp_dir("resume");
    let gpu = fresh_gpu();
    let mut first = config(16, 8, 4, 1e-2);
    first.checkpoint_dir = Some(dir.clone());
    let mut t = Trainer::new(&gpu, first.clone(), &spec, data.clone(), None).unwrap();
    let summary = t.run(&mut Silent).unwrap();
    assert_eq!(summary.steps, 4);
    drop(t);
    let mut second = first;
    second.length = RunLength::Steps(7);
    let mut t = Trainer::new(&gpu, second, &spec, data, None).unwrap();
    t.resume(&latest_path(&dir)).unwrap();
    assert_eq!(t.position().step, 4);
    t.run(&mut Silent).unwrap();
    assert_eq!(values(t.parameters()), straight);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_stop_flag_saves_and_ends_the_run() {
    let dir = temp_dir("stop");
    let gpu = fresh_gpu();
    let mut config = config(16, 16, 50, 1e-2);
    config.checkpoint_dir = Some(dir.clone());
    let mut t = Trainer::new(&gpu, config, &adam_spec(&[10, 8, 3]), data(40, 10, 3), None).unwrap();
    t.step().unwrap();
    t.stop_flag().store(true, Ordering::SeqCst);
    let summary = t.run(&mut Silent).unwrap();
    assert!(summary.interrupted);
    assert_eq!(summary.steps, 1);
    assert_eq!(summary.checkpoint, Some(latest_path(&dir)));
    assert!(
        t.log()
            .iter()
            .any(|l| l.contains("interrupted after step 1"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Records every step report and evaluation.
#[derive(Default)]
struct Recorder {
    steps: Vec<StepReport>,
    evaluations: Vec<(u64, Evaluation)>,
}

impl Observer for Recorder {
    fn on_step(&mut self, r: &StepReport) {
        self.steps.push(r.clone());
    }
    fn on_eval(&mut self, _: u64, step: u64, e: &Evaluation) {
        self.evaluations.push((step, *e));
    }
    fn on_log(&mut self, _: &str) {}
}

#[test]
fn best_checkpoint_holds_the_lowest_evaluation_and_survives_resume() {
    // A learning rate high enough that the evaluation loss goes up as well as down.
    let spec = adam_spec(&[10, 24, 3]);
    let (train, test) = (data(48, 10, 3), data(30, 10, 3));
    let dir = temp_dir("best");
    let gpu = fresh_gpu();
    let mut first = config(16, 16, 6, 0.3);
    first.eval_interval_steps = Some(1);
    first.checkpoint_dir = Some(dir.clone());
    let mut t = Trainer::new(
        &gpu,
        first.clone(),
        &spec,
        train.clone(),
        Some(Box::new(test.clone())),
    )
    .unwrap();
    let mut seen = Recorder::default();
    t.run(&mut seen).unwrap();
    drop(t);
    let mut second = first;
    second.length = RunLength::Steps(12);
    let mut t = Trainer::new(
        &gpu,
        second.clone(),
        &spec,
        train,
        Some(Box::new(test.clone())),
    )
    .unwrap();
    t.resume(&latest_path(&dir)).unwrap();
    let summary = t.run(&mut seen).unwrap();
    drop(t);

    // The oracle: the lowest of the twelve evaluations the observer saw, the first one on ties.
    assert_eq!(seen.evaluations.len(), 12);
    let (best_step, best) = seen
        .evaluations
        .iter()
        .fold(None::<&(u64, Evaluation)>, |b, e| match b {
            Some(b) if b.1.loss <= e.1.loss => Some(b),
            _ => Some(e),
        })
        .unwrap();
    let worst = seen
        .evaluations
        .iter()
        .map(|e| e.1.loss)
        .fold(0.0, f32::max);
    assert!(worst > best.loss, "the evaluations must differ");
    assert!(
        *best_step <= 6,
        "the test needs its best before the resume, so that a later, worse evaluation could \
         wrongly replace it: {:?}",
        seen.evaluations
    );
    assert_eq!(summary.best_eval_loss, Some(best.loss));
    let saved = plimsoll_nn::state::load(&best_path(&dir)).unwrap();
    assert_eq!(saved.metadata["step"], best_step.to_string());
    assert_eq!(saved.metadata["best_eval_loss"], best.loss.to_string());
    // Loading it back gives that model: its evaluation is the recorded one, bit for bit.
    let mut t = Trainer::new(&gpu, second, &spec, data(48, 10, 3), Some(Box::new(test))).unwrap();
    t.resume(&best_path(&dir)).unwrap();
    let again = t.evaluate().unwrap().unwrap();
    assert_eq!(again.loss.to_bits(), best.loss.to_bits());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_reported_loss_mean_is_the_mean_of_the_last_steps() {
    let gpu = fresh_gpu();
    let mut t = Trainer::new(
        &gpu,
        config(16, 16, 30, 1e-2),
        &adam_spec(&[10, 8, 3]),
        data(40, 10, 3),
        None,
    )
    .unwrap();
    let mut seen = Recorder::default();
    t.run(&mut seen).unwrap();
    assert_eq!(seen.steps.len(), 30);
    for (i, r) in seen.steps.iter().enumerate() {
        let window = &seen.steps[i.saturating_sub(LOSS_WINDOW - 1)..=i];
        let naive = window.iter().map(|w| w.loss as f64).sum::<f64>() / window.len() as f64;
        assert!(
            (r.loss_mean as f64 - naive).abs() <= 1e-6 * naive.abs().max(1.0),
            "step {}: loss_mean {} against the mean of the last {} losses {naive}",
            r.step,
            r.loss_mean,
            window.len()
        );
    }
}

/// The exported MLP is what `torch.nn.Sequential(Linear(10, 24), ReLU(), Linear(24, 3))`'s
/// `state_dict()` holds: `<index>.weight` as `[out, in]` and `<index>.bias`, with the values.
#[test]
fn the_exported_mlp_has_sequentials_state_dict() {
    let gpu = fresh_gpu();
    let dir = temp_dir("mlp-export");
    let mut config = config(16, 16, 2, 1e-2);
    config.checkpoint_dir = Some(dir.clone());
    let mut t = Trainer::new(
        &gpu,
        config,
        &adam_spec(&[10, 24, 3]),
        data(40, 10, 3),
        None,
    )
    .unwrap();
    t.run(&mut Silent).unwrap();
    let saved = plimsoll_nn::state::load(&dir.join(plimsoll_trainer::MODEL_FILE)).unwrap();
    let shapes: BTreeMap<&str, &[usize]> = saved
        .tensors
        .iter()
        .map(|(n, t)| (n.as_str(), t.shape.as_slice()))
        .collect();
    let want: BTreeMap<&str, &[usize]> = BTreeMap::from([
        ("0.weight", &[24, 10][..]),
        ("0.bias", &[24][..]),
        ("2.weight", &[3, 24][..]),
        ("2.bias", &[3][..]),
    ]);
    assert_eq!(shapes, want);
    for (name, values) in values(t.parameters()) {
        assert_eq!(saved.tensors[&name].data, values, "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint that does not fit is refused before it writes anything: another data seed, or
/// a model whose first layer matches and whose last does not.
#[test]
fn a_refused_resume_leaves_the_model_as_it_was() {
    let dir = temp_dir("refused");
    let gpu = fresh_gpu();
    let mut saved = config(16, 16, 2, 1e-2);
    saved.checkpoint_dir = Some(dir.clone());
    let mut t = Trainer::new(&gpu, saved, &adam_spec(&[10, 24, 3]), data(40, 10, 3), None).unwrap();
    t.run(&mut Silent).unwrap();
    drop(t);
    let path = latest_path(&dir);

    let mut other_seed = config(16, 16, 2, 1e-2);
    other_seed.seed = 99;
    let mut t = Trainer::new(
        &gpu,
        other_seed,
        &adam_spec(&[10, 24, 3]),
        data(40, 10, 3),
        None,
    )
    .unwrap();
    let before = values(t.parameters());
    let err = t.resume(&path).unwrap_err().to_string();
    assert!(err.contains("pass --seed 3"), "{err}");
    assert_eq!(values(t.parameters()), before, "nothing written");
    assert_eq!(t.position().step, 0);

    let mut t = Trainer::new(
        &gpu,
        config(16, 16, 2, 1e-2),
        &adam_spec(&[10, 24, 4]),
        data(40, 10, 4),
        None,
    )
    .unwrap();
    let before = values(t.parameters());
    let err = t.resume(&path).unwrap_err().to_string();
    assert!(
        err.contains("\"2.weight\" has shape [4, 24], saved [3, 24]"),
        "{err}"
    );
    assert_eq!(
        values(t.parameters()),
        before,
        "0.weight and 0.bias matched, yet nothing written"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GPT with dropout (so the replayed steps must draw the same masks) over windows that cross
/// an epoch in the run: its parameters after `steps` steps, the trainer, and what `lose` did
/// to it before each step (`lose(trainer, step)`).
fn gpt_run(
    steps: u64,
    snapshot_every: SnapshotEvery,
    mut lose: impl FnMut(&mut Trainer, u64),
) -> (Vec<(String, Vec<f32>)>, Trainer) {
    let (mut spec, tokens) = tiny_gpt(120);
    spec.dropout = 0.1;
    let windows = TokenData::windows(tokens, 8, 13).unwrap();
    let gpu = fresh_gpu();
    let mut config = config(8, 4, steps, 1e-2);
    config.snapshot_every = snapshot_every;
    let mut t = Trainer::new(&gpu, config, &spec, windows, None).unwrap();
    for step in 1..=steps {
        lose(&mut t, step);
        let report = t.step().unwrap();
        assert_eq!(report.step, step);
    }
    (values(t.parameters()), t)
}

#[test]
fn a_lost_device_is_replaced_and_the_run_ends_bit_identical() {
    let (straight, _) = gpt_run(6, SnapshotEvery::Steps(3), |_, _| {});
    let started_on = std::cell::Cell::new(None::<Gpu>);
    let (recovered, t) = gpt_run(6, SnapshotEvery::Steps(3), |t, step| match step {
        // The wgpu device itself destroyed between steps: step 2 finds it lost, goes on from
        // the state kept before step 1 on a new device and runs step 1 again.
        2 => {
            started_on.set(Some(t.gpu().clone()));
            t.gpu().destroy();
        }
        // Lost at the third submission of step 5: back to the state kept before step 4.
        5 => {
            t.gpu().reset_fault_counts();
            t.gpu()
                .arm_fault(FaultPoint::Submission, 2, FaultAction::LoseDevice);
        }
        _ => {}
    });
    assert_eq!(recovered, straight, "parameters after two device losses");
    assert_eq!(t.device_losses(), 2);
    // The run ended on a working device, not the one it started on (which stays lost).
    let lost = started_on
        .take()
        .unwrap()
        .check_alive()
        .expect_err("still lost");
    assert!(
        matches!(lost, plimsoll_kernels_wgsl::Error::DeviceLost { .. }),
        "{lost}"
    );
    t.gpu().check_alive().unwrap();
    let log = t.log().join("\n");
    assert!(
        log.contains("after step 1 the device was lost")
            && log.contains("running steps 1..=1 again"),
        "{log}"
    );
    assert!(
        log.contains("after step 4 the device was lost") && log.contains("from step 3"),
        "{log}"
    );
}

#[test]
fn a_device_lost_again_and_again_ends_the_run_after_the_allowed_losses() {
    let (spec, tokens) = tiny_gpt(120);
    let windows = TokenData::windows(tokens, 8, 13).unwrap();
    let gpu = fresh_gpu();
    let mut t = Trainer::new(&gpu, config(8, 8, 3, 1e-2), &spec, windows, None).unwrap();
    t.step().unwrap();
    // Every new device is lost at once.
    t.set_reopen(Box::new(|lost: &Gpu| {
        let gpu = lost.reopen()?;
        gpu.destroy();
        Ok(gpu)
    }));
    t.gpu().destroy();
    let error = t.step().unwrap_err();
    assert!(error.is_device_lost(), "{error}");
    let log = t.log().join("\n");
    assert!(
        log.contains("lost 4 times in a row") && log.contains("--max-device-losses"),
        "{log}"
    );
    assert_eq!(t.device_losses(), 3, "the losses the run went on from");
}

/// A lost device after out-of-memory recovery halved the micro-batch: the steps since the
/// snapshot run again with the micro-batch they ran with (the snapshot's, not the configured
/// one), so the run equals the same run with no loss, bit for bit.
#[test]
fn a_lost_device_after_a_halved_micro_batch_runs_the_steps_again_as_they_ran() {
    let run = |lose: bool| {
        let gpu = fresh_gpu();
        let mut config = config(16, 8, 5, 1e-2);
        config.snapshot_every = SnapshotEvery::Steps(2);
        let spec = adam_spec(&[10, 24, 24, 3]);
        let mut t = Trainer::new(&gpu, config, &spec, data(40, 10, 3), None).unwrap();
        for step in 1..=5u64 {
            let gpu = t.gpu().clone();
            gpu.reset_fault_counts();
            match step {
                // Out of memory at an allocation of step 2: halved to 4 from then on.
                2 => gpu.arm_fault(FaultPoint::Allocation, 5, FaultAction::Fail),
                4 if lose => gpu.arm_fault(FaultPoint::Submission, 1, FaultAction::LoseDevice),
                _ => {}
            }
            let report = t.step().unwrap();
            assert_eq!(
                report.micro_batch,
                if step >= 2 { 4 } else { 8 },
                "step {step}"
            );
        }
        (values(t.parameters()), t.device_losses())
    };
    let (undisturbed, none) = run(false);
    let (recovered, losses) = run(true);
    assert_eq!((none, losses), (0, 1));
    assert!(recovered == undisturbed, "the replayed steps ran otherwise");
}
