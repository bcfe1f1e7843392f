//! A planning device (`Gpu::planning_twin`) allocates exactly as the real device does: two
//! training steps and an evaluation of an MLP and of a tiny GPT (plain and checkpointed) give the
//! same allocator events (kind, size, offset, segment, label, category) on both, while the twin
//! dispatches nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::{CheckpointPolicy, Data, Gpu, Recipe, TokenData, Trainer};

type Event = (
    String,
    u64,
    u64,
    Option<u32>,
    Option<String>,
    Option<String>,
);

/// Two steps and an evaluation on `gpu`; the allocator's events and the step peaks.
fn events(
    gpu: &Gpu,
    recipe: &dyn Recipe,
    train: impl Data + 'static,
    test: Box<dyn Data>,
    checkpointing: CheckpointPolicy,
) -> (Vec<Event>, Vec<(u64, u64)>) {
    gpu.with_allocator(|a| a.set_trace_capacity(1 << 20));
    let mut config = config(16, 8, 2, 1e-3);
    config.checkpointing = checkpointing;
    let mut trainer = Trainer::new(gpu, config, recipe, train, Some(test)).unwrap();
    let mut peaks = Vec::new();
    for _ in 0..2 {
        let r = trainer.step().unwrap();
        peaks.push((r.peak_allocated_bytes, r.peak_reserved_bytes));
    }
    trainer.evaluate().unwrap();
    drop(trainer);
    let trace = gpu.with_allocator(|a| a.trace().clone());
    let events = trace
        .events
        .iter()
        .map(|e| {
            (
                format!("{:?}", e.kind),
                e.size_bytes,
                e.offset,
                e.segment.map(|s| s.0),
                e.label.clone(),
                e.category.map(|c| c.name().to_string()),
            )
        })
        .collect();
    (events, peaks)
}

fn assert_same(
    what: &str,
    real: (Vec<Event>, Vec<(u64, u64)>),
    twin: (Vec<Event>, Vec<(u64, u64)>),
) {
    assert_eq!(real.1, twin.1, "{what}: step peaks");
    assert_eq!(real.0.len(), twin.0.len(), "{what}: event counts");
    for (i, (a, b)) in real.0.iter().zip(&twin.0).enumerate() {
        assert_eq!(a, b, "{what}: event {i}");
    }
}

#[test]
fn a_planning_twin_allocates_exactly_as_the_device_does() {
    let mlp = adam_spec(&[32, 256, 10]);
    let real = fresh_gpu();
    let twin = fresh_gpu().planning_twin(real.memory_budget_bytes());
    assert!(twin.is_planning() && !real.is_planning());
    let run = |gpu: &Gpu| {
        events(
            gpu,
            &mlp,
            data(64, 32, 10),
            Box::new(data(40, 32, 10)),
            CheckpointPolicy::None,
        )
    };
    assert_same("mlp", run(&real), run(&twin));

    let (gpt, tokens) = tiny_gpt(400);
    let gpt_events = |gpu: &Gpu, checkpointing| {
        events(
            gpu,
            &gpt,
            TokenData::windows(Arc::clone(&tokens), 8, 13).unwrap(),
            Box::new(TokenData::windows(Arc::clone(&tokens), 8, 13).unwrap()),
            checkpointing,
        )
    };
    for checkpointing in [CheckpointPolicy::None, CheckpointPolicy::EveryBlocks(1)] {
        let real = fresh_gpu();
        let twin = fresh_gpu().planning_twin(real.memory_budget_bytes());
        let (on_device, planned) = (
            gpt_events(&real, checkpointing),
            gpt_events(&twin, checkpointing),
        );
        assert_same(&format!("gpt {checkpointing:?}"), on_device, planned);
    }

    // A GPU's multi-tensor launches (forced here) allocate their tables on both.
    let multi = || {
        plimsoll_kernels_wgsl::testing::gpu_with(plimsoll_kernels_wgsl::GpuOptions {
            tensor_launches: Some(plimsoll_kernels_wgsl::kernels::TensorLaunches::Multi),
            ..plimsoll_kernels_wgsl::GpuOptions::from_env()
        })
    };
    let real = multi();
    let twin = multi().planning_twin(real.memory_budget_bytes());
    let none = CheckpointPolicy::None;
    let (on_device, planned) = (gpt_events(&real, none), gpt_events(&twin, none));
    let tables = on_device
        .0
        .iter()
        .filter(|e| e.4.as_deref() == Some("adamw chunk table"))
        .count();
    assert!(tables > 0, "the multi-tensor update's table is allocated");
    assert_same("gpt, multi-tensor launches", on_device, planned);
}
