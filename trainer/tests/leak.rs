//! Leak check: memory kept across a step beyond parameters, gradients and optimizer state is
//! reported by label.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_autograd::{Category, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::{Error, LeakPolicy, Trainer};

#[test]
fn a_retained_tensor_is_named() {
    let gpu = fresh_gpu();
    let spec = adam_spec(&[8, 16, 4]);
    let mut trainer =
        Trainer::new(&gpu, config(16, 8, 4, 1e-3), &spec, data(64, 8, 4), None).unwrap();
    trainer.step().unwrap(); // clean
    let options = TensorOptions {
        category: Category::Activation,
        label: "deliberately retained",
        requires_grad: false,
    };
    let kept = Tensor::zeros(&gpu, &[1000], options).unwrap();
    let err = trainer.step().unwrap_err();
    assert!(matches!(err, Error::Leak { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("deliberately retained"), "{message}");
    assert!(message.contains("activation"), "{message}");
    drop(kept);
    trainer.step().unwrap(); // clean again
}

#[test]
fn warn_policy_logs_the_leak_and_goes_on() {
    let gpu = fresh_gpu();
    let spec = adam_spec(&[8, 16, 4]);
    let mut config = config(16, 16, 4, 1e-3);
    config.leak_policy = LeakPolicy::Warn;
    let mut trainer = Trainer::new(&gpu, config, &spec, data(64, 8, 4), None).unwrap();
    let _kept = Tensor::from_slice(&gpu, &[1.0; 64], &[64]).unwrap();
    trainer.step().unwrap();
    assert!(
        trainer
            .log()
            .iter()
            .any(|l| l.contains("warning") && l.contains("'input'"))
    );
}
