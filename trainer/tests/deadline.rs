//! Deadlines and non-finite values: a step past the fence deadline returns the timeout with the
//! recent submissions after saving the last good state; a step many times the deadline finishes
//! when its submissions are bounded (the default); a NaN stops the step and names where.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::{Error, Trainer};

#[test]
fn a_step_past_the_deadline_saves_the_last_good_state_and_reports_the_submissions() {
    let gpu = fresh_gpu();
    let dir = temp_dir("deadline");
    // Wide enough that a step's GPU work takes far longer than the 1 µs deadline below, so the
    // timeout cannot be missed by a step that finished before its first poll (seen once, with
    // [64, 256, 10], on a loaded machine).
    let spec = adam_spec(&[64, 1024, 1024, 10]);
    let mut config = config(64, 64, 10, 1e-3);
    config.checkpoint_dir = Some(dir.clone());
    let mut trainer = Trainer::new(&gpu, config, &spec, data(256, 64, 10), None).unwrap();
    trainer.step().unwrap();
    trainer.step().unwrap();
    let good = values(trainer.parameters());
    gpu.set_default_deadline(Duration::from_micros(1));
    let err = trainer.step().unwrap_err();
    gpu.set_default_deadline(Duration::from_secs(60));
    assert!(err.is_timeout(), "{err}");
    assert!(matches!(err, Error::StepTimeout { step: 3, .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("Recent submissions"), "{message}");
    assert!(message.contains("step 2"), "{message}");
    assert!(latest_path(&dir).exists());
    // The saved state is the state after step 2.
    let mut resumed = Trainer::new(
        &gpu,
        common::config(64, 64, 10, 1e-3),
        &spec,
        data(256, 64, 10),
        None,
    )
    .unwrap();
    resumed.resume(&latest_path(&dir)).unwrap();
    assert_eq!(resumed.position().step, 2);
    assert_eq!(values(resumed.parameters()), good);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Only one parameter's gradient is non-finite, and it is neither the first parameter nor the
/// last: the error must name that one. (A NaN in the data would make every gradient NaN, and
/// "the first parameter" would then be whatever comes first in module order.)
///
/// Why the gradient is planted rather than produced by the data: IEEE arithmetic spreads any
/// non-finite value in the forward into every later value (inf * 0 = NaN), so no input makes
/// just one gradient non-finite. Planting works because gradients accumulate with `+=`: a
/// backward of `sum(inf * w)` before the step leaves `dw = inf` everywhere, the step's own
/// backward adds finite values to it, and every other parameter gets only finite gradients.
#[test]
fn a_non_finite_gradient_stops_the_step_and_names_its_parameter() {
    let gpu = fresh_gpu();
    let spec = adam_spec(&[8, 16, 16, 4]);
    let mut trainer =
        Trainer::new(&gpu, config(32, 16, 1, 1e-3), &spec, data(32, 8, 4), None).unwrap();
    let names: Vec<&str> = trainer
        .parameters()
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"
        ]
    );
    let before = values(trainer.parameters());
    let (poisoned_name, poisoned) = trainer.parameters()[2].clone();
    poisoned
        .mul_scalar(f32::INFINITY)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert!(
        poisoned
            .grad()
            .unwrap()
            .to_vec()
            .unwrap()
            .iter()
            .all(|g| g.is_infinite()),
        "d sum(inf * w) / dw = inf"
    );
    drop(poisoned);
    let err = trainer.step().unwrap_err();
    match &err {
        Error::NonFinite {
            step,
            loss,
            first_parameter,
        } => {
            assert_eq!(*step, 1);
            assert!(
                loss.is_finite(),
                "the data is clean, so the loss is finite: {loss}"
            );
            assert_eq!(first_parameter.as_deref(), Some(poisoned_name.as_str()));
        }
        other => panic!("expected NonFinite, got {other}"),
    }
    assert!(err.to_string().contains(&poisoned_name), "{err}");
    assert_eq!(
        values(trainer.parameters()),
        before,
        "the step must not be applied"
    );
}

#[test]
fn a_step_reads_back_once() {
    let gpu = fresh_gpu();
    let spec = adam_spec(&[16, 32, 4]);
    let mut trainer =
        Trainer::new(&gpu, config(32, 8, 3, 1e-3), &spec, data(64, 16, 4), None).unwrap();
    trainer.step().unwrap();
    let last =
        |gpu: &plimsoll_autograd::Gpu| gpu.recent_submissions().0.last().map_or(0, |r| r.serial);
    let before = last(&gpu);
    trainer.step().unwrap(); // 4 micro-batches
    let recent = gpu.recent_submissions().0;
    let reads: Vec<_> = recent
        .iter()
        .filter(|r| r.serial > before && r.label.starts_with("read"))
        .collect();
    assert_eq!(reads.len(), 1, "{recent:#?}");
    assert!(
        recent.iter().filter(|r| r.serial > before).count() < 16,
        "ring overflowed"
    );
}

/// Giving up saves the last good state first: after two clean steps (no checkpoint saved by
/// them), a non-finite third step stops the run, and `latest` on disk holds step 2 with its
/// exact parameters (the update is all or nothing, so the trainer still holds them).
#[test]
fn giving_up_on_a_non_finite_step_saves_the_last_good_state() {
    let gpu = fresh_gpu();
    let dir = temp_dir("give-up");
    let spec = adam_spec(&[8, 16, 4]);
    let mut config = config(32, 16, 5, 1e-3);
    config.checkpoint_dir = Some(dir.clone());
    let mut trainer = Trainer::new(&gpu, config.clone(), &spec, data(64, 8, 4), None).unwrap();
    trainer.step().unwrap();
    trainer.step().unwrap();
    assert!(!latest_path(&dir).exists());
    let good = values(trainer.parameters());
    let (_, poisoned) = trainer.parameters()[0].clone();
    let poison = poisoned
        .mul_scalar(f32::INFINITY)
        .unwrap()
        .sum_all()
        .unwrap();
    poison.backward().unwrap();
    drop((poison, poisoned));
    let err = trainer.step().unwrap_err();
    assert!(matches!(err, Error::NonFinite { step: 3, .. }), "{err}");
    assert!(
        trainer
            .log()
            .iter()
            .any(|l| l.contains("saved checkpoint at step 2")),
        "{:?}",
        trainer.log()
    );
    config.checkpoint_dir = None;
    let mut resumed = Trainer::new(&gpu, config, &spec, data(64, 8, 4), None).unwrap();
    resumed.resume(&latest_path(&dir)).unwrap();
    assert_eq!(resumed.position().step, 2);
    assert_eq!(values(resumed.parameters()), good);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Giving up never waits on stalled work longer than the deadline: a resumed run whose step
/// takes far longer than its 300 ms deadline (batch 4096 of a 784-1024-1024-10 MLP: the step
/// and the save after it took 1.7 s on lavapipe when the save waited for the stalled work)
/// returns the timeout within twice the deadline (plus 500 ms for the host), and the save that
/// could not finish in time is reported with the step the checkpoint on disk holds. The short
/// run before it uses the same device, so its kernels are compiled before the clock starts: on a
/// fresh device, compiling them took 0.5 s of host time on lavapipe, which no deadline bounds.
#[test]
fn giving_up_on_a_stalled_step_takes_at_most_twice_the_deadline() {
    let dir = temp_dir("stalled");
    let spec = adam_spec(&[784, 1024, 1024, 10]);
    let data = || data(4096, 784, 10);
    let gpu = fresh_gpu();
    let mut small = config(16, 16, 1, 1e-3);
    small.checkpoint_dir = Some(dir.clone());
    let mut first = Trainer::new(&gpu, small, &spec, data(), None).unwrap();
    first.step().unwrap();
    first.save_checkpoint().unwrap();
    drop(first);

    let deadline = Duration::from_millis(300);
    // The whole step in one submission, as a stalled device gives: bounded submissions (the
    // default) would finish it.
    gpu.set_max_submission(None);
    let mut big = config(4096, 4096, 3, 1e-3);
    big.fence_deadline = deadline;
    big.checkpoint_dir = Some(dir.join("big"));
    let mut trainer = Trainer::new(&gpu, big, &spec, data(), None).unwrap();
    trainer.resume(&latest_path(&dir)).unwrap();
    let start = std::time::Instant::now();
    let err = trainer.step().unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::StepTimeout { step: 2, .. }), "{err}");
    assert!(
        took <= 2 * deadline + Duration::from_millis(500),
        "gave up after {took:?} with a deadline of {deadline:?}"
    );
    assert!(
        trainer.log().iter().any(|l| l.contains("holds step 1")),
        "{:?}",
        trainer.log()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The memory plan waits on no GPU (its dry runs are on a planning twin): with a 1 µs fence
/// deadline it still plans, and the device it plans for allocated nothing but the model.
#[test]
fn the_plan_waits_on_no_gpu() {
    let gpu = fresh_gpu();
    let spec = adam_spec(&[64, 1024, 1024, 10]);
    let mut config = config(64, 64, 1, 1e-3);
    config.micro_batch = None;
    config.fence_deadline = Duration::from_micros(1);
    let trainer = Trainer::new(&gpu, config, &spec, data(256, 64, 10), None).unwrap();
    assert!(trainer.plan().is_some());
    let allocations = gpu.with_allocator(|a| a.stats().allocations);
    assert_eq!(allocations, trainer.parameters().len() as u64);
}

/// A deadline catches a stall, never a slow device: a GPT whose step takes several times its
/// 400 ms deadline on lavapipe (one step ran in about 2 s there) trains 3 steps and evaluates
/// under the default bound on submissions (an eighth of the deadline), with the loss falling;
/// the same run with the bound off puts a step in one submission and stops at the deadline.
#[test]
fn a_step_many_times_the_deadline_finishes_in_bounded_submissions() {
    use common::cli::{folder, run, words};
    let dir = folder("deadline", "bounded");
    let line = "train shakespeare --width 256 --layers 2 --heads 4 --context 128 --batch 8 \
                --steps 3 --eval-windows 4 --deadline-ms 400 --memory-timeline off \
                --run-dir run";
    let bounded = run(&dir, &words(line));
    let stderr = String::from_utf8_lossy(&bounded.stderr);
    assert!(bounded.status.success(), "{stderr}");
    let metrics = std::fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap();
    let losses: Vec<f64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("loss").and_then(serde_json::Value::as_f64))
        .collect();
    assert_eq!(losses.len(), 3, "{metrics}");
    assert!(losses[2] < losses[0], "the loss did not fall: {losses:?}");

    let off = format!(
        "{} --max-submission-ms off",
        line.replace("--run-dir run", "--run-dir off")
    );
    let unbounded = run(&dir, &words(&off));
    let stderr = String::from_utf8_lossy(&unbounded.stderr);
    assert!(!unbounded.status.success(), "{stderr}");
    assert!(stderr.contains("deadline"), "{stderr}");
    assert!(!stderr.contains("leaking"), "{stderr}");
}
