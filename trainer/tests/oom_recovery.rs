//! Out-of-memory recovery: under a budget that cannot hold the full batch's activations the step
//! is run again with half the micro-batch, says so, and ends with the unconstrained parameters.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_autograd::{Category, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::{Precision, Trainer};

#[test]
fn out_of_memory_halves_the_micro_batch_and_keeps_the_update() {
    // Activations of (1024, 1024) f32 are 4 MiB: dedicated segments, so reserved bytes follow
    // them.
    let (constrained, full, split) = oom_split(Precision::F32);
    assert!(split.contains("micro-batch 512"));
    assert_params_close(&constrained, &full, 1e-5);
}

#[test]
fn out_of_memory_at_micro_batch_one_reaches_the_user() {
    let gpu = fresh_gpu();
    let spec = adam_spec(&[32, 1024, 10]);
    let mut config = config(4, 4, 1, 1e-3);
    config.leak_policy = plimsoll_trainer::LeakPolicy::Off;
    let mut trainer = Trainer::new(&gpu, config, &spec, data(8, 32, 10), None).unwrap();
    // Parameters exist; fill every free byte of the reserved segments and forbid new ones.
    let mut fillers = Vec::new();
    loop {
        let free = gpu.with_allocator(|a| a.largest_free_bytes());
        if free < 4 {
            break;
        }
        let options = TensorOptions {
            category: Category::Other,
            label: "filler",
            requires_grad: false,
        };
        fillers.push(Tensor::zeros(&gpu, &[(free / 4) as usize], options).unwrap());
    }
    let reserved = gpu.with_allocator(|a| a.stats().reserved_bytes);
    gpu.set_memory_budget(reserved);
    let err = trainer.step().unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let message = err.to_string();
    assert!(message.contains("micro-batch of 1"), "{message}");
    assert!(message.contains("hint"), "{message}");
}

/// A model whose parameters alone exceed the budget is `ModelTooLarge`, with advice that fits
/// it (not "reduce the micro-batch", which cannot help), whether the plan runs or not.
#[test]
fn parameters_over_the_budget_are_model_too_large() {
    let spec = adam_spec(&[32, 1024, 10]); // 32·1024 + 1024 + 1024·10 + 10 = 44 042 parameters, 172 KiB
    for micro in [None, Some(4)] {
        let gpu = fresh_gpu();
        let mut config = config(4, 4, 1, 1e-3);
        config.micro_batch = micro;
        config.memory_budget_bytes = Some(100 * 1024);
        let err = match Trainer::new(&gpu, config, &spec, data(8, 32, 10), None) {
            Ok(_) => panic!("a 172 KiB model fitted a 100 KiB budget"),
            Err(e) => e,
        };
        assert!(
            matches!(
                err,
                plimsoll_trainer::Error::ModelTooLarge {
                    parameters: 44_042,
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.to_string().contains("reduce the micro-batch"), "{err}");
    }
}
