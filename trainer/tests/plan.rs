//! Budget first: the dry run's predicted peak is within 10% of the measured one, and a small
//! budget makes the plan choose a smaller micro-batch.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_trainer::{CheckpointPolicy, Trainer};

#[test]
fn predicted_peak_is_within_ten_percent_of_the_measured_one() {
    let gpu = gpu();
    let spec = adam_spec(&[64, 512, 512, 10]);
    let mut config = config(128, 1, 3, 1e-3);
    config.micro_batch = None;
    let mut trainer = Trainer::new(&gpu, config, &spec, data(512, 64, 10), None).unwrap();
    let plan = trainer.plan().unwrap().clone();
    assert_eq!(plan.micro_batch, 128, "{plan}");
    assert_eq!(plan.segment_len, 0, "{plan}");
    let mut measured = 0;
    for _ in 0..3 {
        let report = trainer.step().unwrap();
        measured = measured.max(report.peak_allocated_bytes);
    }
    let predicted = plan.predicted_peak_bytes as f64;
    let error = (predicted - measured as f64).abs() / measured as f64;
    assert!(
        error <= 0.10,
        "predicted {predicted}, measured {measured} ({:.1}%)\n{plan}",
        100.0 * error
    );
}

#[test]
fn small_budget_gives_a_smaller_micro_batch() {
    let spec = adam_spec(&[64, 1024, 1024, 10]);
    let mut config = config(256, 1, 1, 1e-3);
    config.micro_batch = None;
    config.checkpointing = CheckpointPolicy::None;
    let gpu = gpu();
    let full = Trainer::new(&gpu, config.clone(), &spec, data(512, 64, 10), None).unwrap();
    let full_plan = full.plan().unwrap().clone();
    assert_eq!(full_plan.micro_batch, 256, "{full_plan}");
    drop(full);
    let model = &full_plan.models[0];
    // A budget where only about half the batch fits.
    let budget = ((model.predict(128) as f64) / plimsoll_trainer::plan::HEADROOM) as u64;
    config.memory_budget_bytes = Some(budget);
    let gpu = common::gpu();
    let small = Trainer::new(&gpu, config, &spec, data(512, 64, 10), None).unwrap();
    let plan = small.plan().unwrap();
    assert!(plan.micro_batch < 256 && plan.micro_batch >= 64, "{plan}");
    assert!(plan.predicted_peak_bytes <= budget);
}
