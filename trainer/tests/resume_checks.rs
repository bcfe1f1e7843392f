//! What resuming refuses and what it accepts: a checkpoint with a non-finite weight or without
//! optimizer state loads nothing (unless the optimizer is reset explicitly), and a run resumed
//! with another effective batch finishes its epochs over exactly the samples left.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::*;
use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_nn::state;
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::{Evaluation, Observer, RunLength, Silent, StepReport, Trainer};

/// Rewrites the checkpoint at `path` through `edit` (name, values) -> new values, or `None` to
/// drop the tensor.
fn rewrite(path: &Path, edit: impl Fn(&str, Vec<f32>) -> Option<Vec<f32>>) {
    let gpu = fresh_gpu();
    let loaded = state::load(path).unwrap();
    let mut tensors = Vec::new();
    for (name, t) in &loaded.tensors {
        if let Some(data) = edit(name, t.data.clone()) {
            tensors.push((
                name.clone(),
                Tensor::from_slice(&gpu, &data, &t.shape).unwrap(),
            ));
        }
    }
    state::save(path, &tensors, &loaded.metadata).unwrap();
}

/// A trainer that has saved one step to `dir`, and a fresh one (same seed) to resume into.
fn saved_run(dir: &Path) -> Trainer {
    let gpu = fresh_gpu();
    let mut c = config(16, 16, 1, 1e-2);
    c.checkpoint_dir = Some(dir.to_path_buf());
    let spec = adam_spec(&[10, 8, 3]);
    let mut t = Trainer::new(&gpu, c.clone(), &spec, data(40, 10, 3), None).unwrap();
    t.run(&mut Silent).unwrap();
    c.length = RunLength::Steps(3);
    Trainer::new(&fresh_gpu(), c, &spec, data(40, 10, 3), None).unwrap()
}

#[test]
fn a_non_finite_weight_is_refused_and_nothing_is_loaded() {
    let dir = temp_dir("nan-weight");
    let mut t = saved_run(&dir);
    let before = values(t.parameters());
    rewrite(&latest_path(&dir), |name, mut v| {
        if name == "param.2.bias" {
            v[1] = f32::NAN;
        }
        Some(v)
    });
    let e = t.resume(&latest_path(&dir)).unwrap_err().to_string();
    assert!(e.contains("\"2.bias\"") && e.contains("non-finite"), "{e}");
    assert_eq!(
        values(t.parameters()),
        before,
        "a refused checkpoint changed the model"
    );
    assert_eq!(t.position().step, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_without_optimizer_state_needs_reset_optimizer() {
    let dir = temp_dir("no-optim");
    let mut t = saved_run(&dir);
    let before = values(t.parameters());
    rewrite(&latest_path(&dir), |name, v| {
        (!name.starts_with("optim.")).then_some(v)
    });
    let e = t.resume(&latest_path(&dir)).unwrap_err().to_string();
    assert!(
        e.contains("--reset-optimizer") && e.contains("exp_avg"),
        "{e}"
    );
    assert_eq!(
        values(t.parameters()),
        before,
        "a refused checkpoint changed the model"
    );
    t.resume_with(&latest_path(&dir), true).unwrap();
    assert_eq!(t.position().step, 1);
    assert_eq!(
        t.optimizer().step_count(),
        0,
        "the optimizer did not start afresh"
    );
    assert_ne!(
        values(t.parameters()),
        before,
        "the parameters were not loaded"
    );
    t.run(&mut Silent).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Samples per step.
#[derive(Default)]
struct Samples(Vec<usize>);

impl Observer for Samples {
    fn on_step(&mut self, r: &StepReport) {
        self.0.push(r.samples);
    }
    fn on_eval(&mut self, _: u64, _: u64, _: &Evaluation) {}
    fn on_log(&mut self, _: &str) {}
}

/// 40 samples, 2 epochs: one step of 16, then resumed at batch 8, the run takes the 24 samples
/// left of epoch 0 and the 40 of epoch 1 (3 + 5 steps), where counting the position in batches
/// would have skipped or repeated samples.
#[test]
fn a_run_resumed_with_another_batch_finishes_its_epochs_exactly() {
    let dir = temp_dir("rebatch");
    let spec = adam_spec(&[10, 8, 3]);
    let mut c = config(16, 16, 0, 1e-2);
    c.length = RunLength::Epochs(2);
    c.checkpoint_dir = Some(dir.clone());
    let mut t = Trainer::new(&fresh_gpu(), c.clone(), &spec, data(40, 10, 3), None).unwrap();
    t.step().unwrap();
    t.save_checkpoint().unwrap();
    drop(t);
    c.effective_batch = 8;
    c.micro_batch = Some(8);
    let mut t = Trainer::new(&fresh_gpu(), c, &spec, data(40, 10, 3), None).unwrap();
    t.resume(&latest_path(&dir)).unwrap();
    assert_eq!(t.total_steps(), 1 + 3 + 5);
    let mut seen = Samples::default();
    let summary = t.run(&mut seen).unwrap();
    assert_eq!(seen.0, vec![8, 8, 8, 8, 8, 8, 8, 8]);
    assert_eq!(summary.steps, 9);
    assert_eq!(t.position().epoch, 2);
    let _ = std::fs::remove_dir_all(&dir);
}
