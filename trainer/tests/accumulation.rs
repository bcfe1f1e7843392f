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
