//! Accumulation: k micro-batches give the update one batch of k times the size gives, and a
//! checkpointed backward gives the update a plain one gives.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::{CheckpointPolicy, Silent, Trainer};

fn train(
    spec: &plimsoll_trainer::ModelSpec,
    micro: usize,
    checkpointing: CheckpointPolicy,
) -> Vec<(String, Vec<f32>)> {
    let gpu = fresh_gpu();
    let mut config = config(32, micro, 5, 0.05);
    config.checkpointing = checkpointing;
    let mut trainer = Trainer::new(&gpu, config, spec, data(80, 12, 5), None).unwrap();
    trainer.run(&mut Silent).unwrap();
    if micro < 32 {
        assert_eq!(trainer.micro_batch(), micro);
    }
    values(trainer.parameters())
}

#[test]
fn micro_batches_give_the_full_batch_update() {
    let spec = sgd_spec(&[12, 24, 24, 5]);
    let full = train(&spec, 32, CheckpointPolicy::None);
    // 4 micro-batches of 8, and an uneven split (32 = 12 + 12 + 8).
    assert_params_close(&train(&spec, 8, CheckpointPolicy::None), &full, 1e-5);
    assert_params_close(&train(&spec, 12, CheckpointPolicy::None), &full, 1e-5);
}

#[test]
fn adam_micro_batches_give_the_full_batch_update() {
    let spec = adam_spec(&[12, 24, 5]);
    let full = train(&spec, 32, CheckpointPolicy::None);
    assert_params_close(&train(&spec, 8, CheckpointPolicy::None), &full, 1e-5);
}

#[test]
fn checkpointed_backward_gives_the_plain_update() {
    let spec = sgd_spec(&[12, 24, 24, 24, 5]);
    let plain = train(&spec, 16, CheckpointPolicy::None);
    assert_params_close(
        &train(&spec, 16, CheckpointPolicy::EveryBlocks(2)),
        &plain,
        1e-5,
    );
}

/// Clipping scales the gradients by `max / (norm + 1e-6)` inside the update: with plain SGD that
/// is the step an unclipped run takes with the learning rate scaled the same way.
#[test]
fn clipping_is_the_update_with_gradients_scaled_to_the_norm() {
    let spec = plimsoll_trainer::ModelSpec {
        optimizer: plimsoll_trainer::OptimizerSpec::Sgd(plimsoll_nn::SgdConfig::default()),
        ..sgd_spec(&[12, 24, 5])
    };
    let run = |clip: Option<f32>, lr: f32| {
        let gpu = fresh_gpu();
        let mut config = config(32, 32, 1, lr);
        config.clip_grad_norm = clip;
        let mut trainer = Trainer::new(&gpu, config, &spec, data(80, 12, 5), None).unwrap();
        let report = trainer.step().unwrap();
        (report.grad_norm, values(trainer.parameters()))
    };
    let (norm, unclipped) = run(None, 0.05);
    assert!(norm > 0.05, "the test needs a norm above the clip: {norm}");
    let (clipped_norm, clipped) = run(Some(0.05), 0.05);
    assert_eq!(clipped_norm, norm, "the norm is reported before clipping");
    let (_, scaled_lr) = run(None, 0.05 * 0.05 / (norm + 1e-6));
    assert_params_close(&clipped, &scaled_lr, 1e-5);
    // And clipping changed something.
    assert!(unclipped != clipped);
}
