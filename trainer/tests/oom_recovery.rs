//! Out-of-memory recovery: under a budget that cannot hold the full batch's activations the step
//! is run again with half the micro-batch, says so, and ends with the unconstrained parameters.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_autograd::{Category, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::fault::{FaultAction, FaultPoint};
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_nn::{BlockKind, ResNetConfig, SgdConfig};
use plimsoll_trainer::{OptimizerSpec, Precision, ResNetSpec, SyntheticImages, Trainer};

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

/// A ResNet (one basic block per stage, BatchNorm after every convolution) on 32x32 images in
/// batches of 4. A step that runs out of memory at micro-batch 4 (an allocation in its
/// backward, after every BatchNorm moved its running statistics) and runs again at 2 ends with
/// the running statistics of a step run at 2 from the start, bit for bit: the failed attempt's
/// moves are undone. A step that fails outright (its loss cannot be read back) leaves them,
/// and the parameters, as they were.
#[test]
fn batch_norm_statistics_are_as_they_were_after_a_failed_step() {
    let image = [3, 32, 32];
    let spec = ResNetSpec {
        config: ResNetConfig {
            block: BlockKind::Basic,
            layers: [1, 1, 1, 1],
            classes: 4,
        },
        depth: 10,
        image,
        seed: 1,
        optimizer: OptimizerSpec::Sgd(SgdConfig {
            lr: 0.05,
            ..SgdConfig::default()
        }),
    };
    let images = SyntheticImages {
        len: 8,
        image,
        classes: 4,
        seed: 2,
    };
    let trainer = |micro: usize| {
        let mut config = config(4, micro, 2, 0.05);
        config.leak_policy = plimsoll_trainer::LeakPolicy::Off;
        Trainer::new(&fresh_gpu(), config, &spec, images, None).unwrap()
    };
    let buffers = |t: &Trainer| values(&t.buffers());

    let mut straight = trainer(2);
    straight.step().unwrap();
    let mut probe = trainer(4);
    probe.gpu().reset_fault_counts();
    probe.step().unwrap();
    let allocations = probe.gpu().fault_counts()[FaultPoint::Allocation.index()];
    assert_ne!(
        buffers(&probe),
        buffers(&straight),
        "micro-batches of 2 move the statistics differently from one of 4"
    );

    let mut recovered = trainer(4);
    recovered.gpu().reset_fault_counts();
    recovered.gpu().arm_fault(
        FaultPoint::Allocation,
        allocations * 3 / 4,
        FaultAction::Fail,
    );
    let report = recovered.step().unwrap();
    assert_eq!(report.micro_batch, 2, "{:?}", recovered.log());
    assert_eq!(buffers(&recovered), buffers(&straight));
    assert_params_close(
        &values(recovered.parameters()),
        &values(straight.parameters()),
        1e-5,
    );

    let (kept, params) = (buffers(&recovered), values(recovered.parameters()));
    recovered.gpu().reset_fault_counts();
    recovered
        .gpu()
        .arm_fault(FaultPoint::ReadBack, 0, FaultAction::Fail);
    let err = recovered.step().unwrap_err();
    assert!(
        !recovered.gpu().disarm_fault(),
        "the read-back fault fired: {err}"
    );
    assert_eq!(buffers(&recovered), kept, "after: {err}");
    assert_eq!(values(recovered.parameters()), params);
}
