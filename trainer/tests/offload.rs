//! `--offload optimizer`: AdamW's moments in host memory and the update on the host. On a tiny
//! GPT the update is the device's within f32 rounding, a resumed run is bit-identical, and the
//! plan sees a device without optimizer state (so a budget too small for the state on the
//! device fits), stepping at its prediction. One rank of a sharded run (`--shard`) steps at its
//! plan with half the state.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::{
    CheckpointPolicy, Error, Offload, RunLength, Silent, TokenData, TrainConfig, Trainer,
};

fn windows() -> TokenData {
    let (_, tokens) = tiny_gpt(600);
    TokenData::windows(tokens, 8, 13).unwrap()
}

fn offloaded(mut config: TrainConfig) -> TrainConfig {
    config.offload = Offload::OptimizerState;
    config
}

/// Trains the tiny GPT under `config` on a device of its own; the parameters after.
fn train(config: TrainConfig) -> Values {
    let (spec, _) = tiny_gpt(1);
    let gpu = fresh_gpu();
    let mut t = Trainer::new(&gpu, config, &spec, windows(), None).unwrap();
    t.run(&mut Silent).unwrap();
    values(t.parameters())
}

/// Five steps with the state in host memory end where five on the device do, within f32
/// rounding (the host runs the kernel's arithmetic; the device's square root may round
/// differently).
#[test]
fn offloaded_optimizer_keeps_the_update() {
    let on_device = train(config(16, 8, 5, 1e-2));
    let on_host = train(offloaded(config(16, 8, 5, 1e-2)));
    assert_params_close(&on_host, &on_device, 1e-5);
}

/// A run with the state in host memory saved after three steps and resumed to six equals the
/// straight six-step run bit for bit: the checkpoint holds the host state under AdamW's names.
#[test]
fn an_offloaded_run_resumes_bit_identically() {
    let straight = train(offloaded(config(16, 8, 6, 1e-2)));
    let resumed = saved_and_resumed(offloaded(config(16, 8, 3, 1e-2)), 6, |checkpoint| {
        let saved = plimsoll_nn::state::load(checkpoint).unwrap();
        let count = |prefix: &str| {
            saved
                .tensors
                .keys()
                .filter(|k| k.starts_with(prefix))
                .count()
        };
        let (moments, tensors) = (
            count("optim.exp_avg"),
            count(plimsoll_trainer::checkpoint_io::PARAM_PREFIX),
        );
        assert!(tensors >= 3, "{tensors} parameters saved");
        assert_eq!(moments, 2 * tensors, "both moments of every parameter");
    });
    assert_eq!(resumed, straight);
}

/// Runs the tiny GPT under `first` (saving to a directory of its own), calls `between` with
/// its latest checkpoint, then resumes it to `steps` on the same device; the parameters after.
fn saved_and_resumed(
    first: TrainConfig,
    steps: u64,
    between: impl FnOnce(&std::path::Path),
) -> Values {
    let (spec, _) = tiny_gpt(1);
    let dir = temp_dir("offload-resume");
    let gpu = fresh_gpu();
    let first = TrainConfig {
        checkpoint_dir: Some(dir.clone()),
        ..first
    };
    let mut t = Trainer::new(&gpu, first.clone(), &spec, windows(), None).unwrap();
    t.run(&mut Silent).unwrap();
    drop(t);
    between(&latest_path(&dir));
    let second = TrainConfig {
        length: RunLength::Steps(steps),
        ..first
    };
    let mut t = Trainer::new(&gpu, second, &spec, windows(), None).unwrap();
    t.resume(&latest_path(&dir)).unwrap();
    t.run(&mut Silent).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    values(t.parameters())
}

/// The plan of an offloaded run holds no optimizer state on the device (only a read-back
/// bucket of at most 4 MiB): for an MLP of 4.7 million parameters, a budget between the two predictions refuses the run on the device and
/// fits it offloaded, which then steps at its prediction, allocated and reserved. SGD has no
/// host form: asking for one is an error.
#[test]
fn an_offloaded_plan_fits_a_smaller_budget() {
    let spec = adam_spec(&[256, 2048, 2048, 10]);
    let mut planned = config(16, 16, 2, 1e-3);
    planned.checkpointing = CheckpointPolicy::Automatic;
    planned.micro_batch = None;
    let run = |config: TrainConfig| -> Result<[u64; 4], Error> {
        let gpu = fresh_gpu();
        let mut t = Trainer::new(&gpu, config, &spec, data(64, 256, 10), None)?;
        t.run(&mut Silent)?;
        let p = t.plan().expect("planned");
        let stats = gpu.with_allocator(|a| a.stats().clone());
        Ok([
            p.predicted_peak_bytes,
            p.predicted_peak_reserved_bytes,
            stats.peak_allocated_bytes,
            stats.peak_reserved_bytes,
        ])
    };
    let device = run(planned.clone()).unwrap();
    let host = run(offloaded(planned.clone())).unwrap();
    let moments = 8 * 4_743_178u64; // 256·2048 + 2048 + 2048·2048 + 2048 + 2048·10 + 10 parameters
    // Off the device: the moments, less the 4 MiB at most that a bucket of small gradients or
    // parameters takes gathered for its read-back.
    let bucket = 4u64 << 20;
    assert!(
        device[0] - host[0] >= moments - bucket,
        "{host:?} vs {device:?}: the moments' {moments} bytes are off the device"
    );
    assert_eq!(
        [host[2], host[3]],
        [host[0], host[1]],
        "steps at the prediction"
    );
    let budget = (host[1] + device[1]) / 2;
    let mut tight = planned.clone();
    tight.memory_budget_bytes = Some(budget);
    match run(tight.clone()) {
        Err(Error::BudgetTooSmall { .. }) => {}
        Err(e) => panic!("expected BudgetTooSmall, got {e}"),
        Ok(p) => panic!("the state on the device fitted {budget} bytes: {p:?}"),
    }
    let fitted = run(offloaded(tight.clone())).unwrap();
    assert!(fitted[3] <= budget, "{fitted:?} within {budget}");
    // `Offload::Auto` offloads under that budget, and keeps everything on the device where
    // it fits.
    let decided = |config: TrainConfig| {
        let t = Trainer::new(&fresh_gpu(), config, &spec, data(64, 256, 10), None).unwrap();
        t.plan().unwrap().offload.clone()
    };
    let auto = |config: TrainConfig| TrainConfig {
        offload: Offload::Auto,
        ..config
    };
    assert_eq!(decided(auto(tight.clone())), "optimizer");
    assert_eq!(decided(auto(planned.clone())), "none");
    // A host budget too small for the moments: `Auto` does not offload (the device's refusal
    // stands), and an explicit offload is refused before step 1 with the parts named.
    let small_host = TrainConfig {
        host_memory_budget: Some(1 << 20),
        ..tight
    };
    match run(auto(small_host.clone())) {
        Err(Error::BudgetTooSmall { .. }) => {}
        other => panic!("expected the device's refusal, got {other:?}"),
    }
    match run(offloaded(small_host)) {
        Err(e @ Error::HostBudgetTooSmall { .. }) => {
            assert!(
                e.to_string().contains("the optimizer's state 36.2 MiB"),
                "{e}"
            )
        }
        other => panic!("expected HostBudgetTooSmall, got {other:?}"),
    }
    let sgd = plimsoll_trainer::ModelSpec {
        optimizer: sgd_spec(&[4, 3]).optimizer,
        ..adam_spec(&[4, 8, 3])
    };
    let err = Trainer::new(
        &fresh_gpu(),
        offloaded(config(4, 4, 1, 0.1)),
        &sgd,
        data(8, 4, 3),
        None,
    )
    .err()
    .expect("SGD has no host form");
    assert!(err.to_string().contains("--offload"), "{err}");
}

/// One rank of a sharded run, in one process: rank 0 of 2 with the [`Planning`] collective
/// (every call answers with values of the real call's length: zeros), so that the real step's
/// allocations run on a real device beside its plan's dry runs. Unsharded and for both stages
/// the steps peak at the prediction, allocated and reserved (the dry run makes the run's
/// collective calls, and weights the rank's loss by its share of the whole batch, as the run
/// does: without, the run's scaling of the loss took 256 bytes the plan had not counted), and
/// the optimizer state is half the unsharded run's (within the rows at the cut and the
/// allocator's block rounding).
///
/// [`Planning`]: plimsoll_trainer::collective::Planning
#[test]
fn a_sharded_rank_steps_at_its_plan_with_half_the_state() {
    use plimsoll_kernels_wgsl::Category;
    use plimsoll_trainer::Shard;
    use plimsoll_trainer::collective::Planning;
    let (spec, _) = tiny_gpt(1);
    let run = |shard: Shard, ranks: usize| {
        let mut planned = config(16, 8, 4, 1e-2);
        planned.micro_batch = None;
        planned.shard = shard;
        let gpu = fresh_gpu();
        let collective = Box::new(Planning { rank: 0, ranks });
        let mut t =
            Trainer::new_distributed(&gpu, planned, &spec, windows(), None, collective).unwrap();
        // Steps alone: the end of a run gathers the other ranks' state, which they lack here.
        for _ in 0..4 {
            t.step().unwrap();
        }
        let p = t.plan().expect("planned").clone();
        let stats = gpu.with_allocator(|a| a.stats().clone());
        let state = stats.category(Category::OptimizerState).allocated_bytes;
        (
            [p.predicted_peak_bytes, p.predicted_peak_reserved_bytes],
            [stats.peak_allocated_bytes, stats.peak_reserved_bytes],
            state,
        )
    };
    let (_, _, whole) = run(Shard::None, 1);
    let (predicted, measured, _) = run(Shard::None, 2);
    assert_eq!(
        measured, predicted,
        "unsharded on 2 ranks: steps at the prediction"
    );
    for shard in [Shard::OptimizerState, Shard::Gradients] {
        let (predicted, measured, state) = run(shard, 2);
        assert_eq!(
            measured, predicted,
            "--shard {shard}: steps at the prediction"
        );
        assert!(
            state as f64 <= 0.55 * whole as f64,
            "--shard {shard}: {state} of {whole} bytes of optimizer state"
        );
    }
}

/// `--offload activations`: the inputs checkpointed segments keep go to host memory too. On the
/// tiny GPT, checkpointed block by block, five steps equal the state-only offload's bit for bit
/// (the values make a round trip), in f32 and in f16. At the same micro-batch its plan predicts less device
/// memory (the segments' inputs are off the device, and counted as host bytes), and the run
/// steps at that prediction; its memory timeline names those host bytes. (`auto`'s order of
/// levels: `plan`'s unit tests.)
#[test]
fn offloaded_activations_keep_the_update_and_need_less_device_memory() {
    let activations = |config: TrainConfig| TrainConfig {
        offload: Offload::Activations,
        ..config
    };
    let mut every_block = offloaded(config(16, 8, 5, 1e-2));
    every_block.checkpointing = CheckpointPolicy::EveryBlocks(1);
    let state_only = train(every_block.clone());
    assert_eq!(train(activations(every_block.clone())), state_only);
    // In f16 too: an input kept in f16 on the device comes back from the host as those values.
    let f16 = TrainConfig {
        precision: plimsoll_trainer::Precision::F16,
        ..every_block
    };
    assert_eq!(train(activations(f16.clone())), train(f16));

    let (spec, _) = tiny_gpt(1);
    // Checkpointed block by block, the micro-batch planned (16 fits either way).
    let mut planned = offloaded(config(16, 16, 3, 1e-2));
    planned.checkpointing = CheckpointPolicy::EveryBlocks(1);
    planned.micro_batch = None;
    let run = |mut config: TrainConfig| -> Result<([u64; 4], u64), Error> {
        config.memory_timeline = Some(plimsoll_trainer::StepSpan { first: 2, last: 3 });
        let gpu = fresh_gpu();
        let mut t = Trainer::new(&gpu, config, &spec, windows(), None)?;
        t.run(&mut Silent)?;
        let p = t.plan().expect("planned");
        // The memory timeline names the host bytes beside the device's.
        let host = t.timeline().expect("a timeline").host;
        assert_eq!(host.optimizer_state, p.offload_host_bytes);
        assert_eq!(host.activations, p.offload_activation_bytes);
        assert!(host.optimizer_state > 0 && host.loader > 0, "{host:?}");
        let stats = gpu.with_allocator(|a| a.stats().clone());
        let peaks = [
            p.predicted_peak_bytes,
            p.predicted_peak_reserved_bytes,
            stats.peak_allocated_bytes,
            stats.peak_reserved_bytes,
        ];
        Ok((peaks, p.offload_activation_bytes))
    };
    let (state, none_moved) = run(planned.clone()).unwrap();
    let (moved, host) = run(activations(planned.clone())).unwrap();
    assert_eq!(none_moved, 0);
    // The two segments' inputs, [16, 8, 32] f32 each, at most at once.
    assert_eq!(
        host,
        2 * 16 * 8 * 32 * 4,
        "host bytes of the offloaded inputs"
    );
    assert!(moved[0] < state[0], "{moved:?} vs {state:?}");
    assert_eq!(
        [moved[2], moved[3]],
        [moved[0], moved[1]],
        "steps at the prediction"
    );
}

/// An upload refused in the middle of the host update (a parameter's new values refused after
/// others went up) ends the step in a typed error with the parameters and the host state as
/// they were, and the run steps on from there.
#[cfg(debug_assertions)]
#[test]
fn a_refused_upload_in_the_host_update_leaves_the_model_as_it_was() {
    use plimsoll_kernels_wgsl::fault::{FaultAction, FaultPoint};
    let (spec, _) = tiny_gpt(1);
    let config = offloaded(config(16, 8, 4, 1e-2));
    let gpu = fresh_gpu();
    let mut t = Trainer::new(&gpu, config, &spec, windows(), None).unwrap();
    t.step().unwrap();
    // A clean step's uploads: the host update's are its last, one per trained parameter.
    gpu.reset_fault_counts();
    t.step().unwrap();
    let uploads = gpu.fault_counts()[FaultPoint::Upload.index()];
    let trained = t.parameters().len() as u64;
    assert!(
        uploads > trained && trained >= 3,
        "{uploads} uploads, {trained} parameters"
    );
    let before = values(t.parameters());
    let state = t
        .optimizer()
        .host_state()
        .expect("the state is on the host");
    // The next step's last parameter but one is refused: all the others but the last went up.
    gpu.reset_fault_counts();
    gpu.arm_fault(FaultPoint::Upload, uploads - 2, FaultAction::Fail);
    let err = t.step().expect_err("the refused upload fails the step");
    assert!(err.to_string().contains("upload"), "{err}");
    assert!(!gpu.disarm_fault(), "the fault fired");
    assert!(
        values(t.parameters()) == before,
        "the parameters as they were"
    );
    let after = t.optimizer().host_state().expect("host state");
    assert!(after == state, "the host state as it was");
    assert_eq!(t.optimizer().step_count(), 2);
    t.step().unwrap();
    assert!(values(t.parameters()) != before, "the run steps on");
}

/// `--offload parameters`: the blocks' parameters live in host memory and come up for their
/// segments. Five steps of two micro-batches each end bit for bit as with only the optimizer and the
/// activations offloaded; a run saved after three and resumed to six equals the straight six;
/// the plan predicts less device memory (one block's parameters and gradients at a time), the
/// run steps at that prediction, and the plan and the timeline count the streamed parameters.
/// Under the streamed level's least budget the activations level is refused, and the streamed
/// run trains within it as the activations level does without a budget.
#[test]
fn streamed_parameters_keep_the_update_and_need_less_device_memory() {
    let at = |offload: Offload, config: TrainConfig| TrainConfig { offload, ..config };
    let mut every_block = config(16, 8, 5, 1e-2);
    every_block.checkpointing = CheckpointPolicy::EveryBlocks(1);
    let activations = train(at(Offload::Activations, every_block.clone()));
    let stepped = train(at(Offload::Parameters, every_block.clone()));
    assert_eq!(stepped, activations);

    // Saved after three steps (the parameters read from host memory) and resumed to six (the
    // values written there).
    let (spec, _) = tiny_gpt(1);
    let straight = train(at(Offload::Parameters, config(16, 8, 6, 1e-2)));
    let first = at(Offload::Parameters, config(16, 8, 3, 1e-2));
    assert_eq!(saved_and_resumed(first, 6, |_| {}), straight);

    let mut planned = config(16, 16, 3, 1e-2);
    planned.checkpointing = CheckpointPolicy::EveryBlocks(1);
    planned.micro_batch = None;
    let run = |config: TrainConfig| -> ([u64; 5], u64) {
        let config = TrainConfig {
            memory_timeline: Some(plimsoll_trainer::StepSpan { first: 2, last: 3 }),
            ..config
        };
        let gpu = fresh_gpu();
        let mut t = Trainer::new(&gpu, config, &spec, windows(), None).unwrap();
        t.run(&mut Silent).unwrap();
        let p = t.plan().expect("planned").clone();
        let host = t.timeline().expect("a timeline").host;
        assert_eq!(host.parameters, 8 * p.offload_streamed_parameters);
        let stats = gpu.with_allocator(|a| a.stats().clone());
        let parameter_peak = stats
            .category(plimsoll_kernels_wgsl::Category::Parameter)
            .peak_allocated_bytes;
        let peaks = [
            p.predicted_peak_bytes,
            p.predicted_peak_reserved_bytes,
            stats.peak_allocated_bytes,
            stats.peak_reserved_bytes,
            parameter_peak,
        ];
        (peaks, p.offload_streamed_parameters)
    };
    let (kept, none) = run(at(Offload::Activations, planned.clone()));
    let (moved, streamed) = run(at(Offload::Parameters, planned));
    assert_eq!(none, 0);
    // Two blocks of width 32: weights 12 c², biases 9 c, two layer norms 4 c.
    let blocks = 2 * (12 * 32 * 32 + 9 * 32 + 4 * 32);
    assert_eq!(streamed, blocks, "the blocks' parameters stream");
    assert!(moved[0] < kept[0], "{moved:?} vs {kept:?}");
    assert!(moved[4] < kept[4], "parameter peak {moved:?} vs {kept:?}");
    assert_eq!(
        [moved[2], moved[3]],
        [moved[0], moved[1]],
        "steps at the prediction"
    );
    // On a device of 32 KiB small segments (reserved bytes then follow the allocated ones),
    // under the streamed run's least budget the activations level is refused and the streamed
    // one trains as without the budget.
    let small = || {
        plimsoll_kernels_wgsl::testing::gpu_with(plimsoll_kernels_wgsl::GpuOptions {
            small_segment_bytes: Some(32 << 10),
            ..plimsoll_kernels_wgsl::GpuOptions::from_env()
        })
    };
    // The micro-batch planned.
    let tight = |offload, budget| TrainConfig {
        memory_budget_bytes: Some(budget),
        micro_batch: None,
        ..at(offload, every_block.clone())
    };
    // Refused budgets: one that holds the parameters (the activations level's parameters
    // must fit), one byte streaming them.
    let refused = |offload| match offload {
        Offload::Parameters => 1,
        _ => 6 * plimsoll_trainer::Recipe::parameter_count(&spec) as u64,
    };
    let least = |offload| match Trainer::new(
        &small(),
        tight(offload, refused(offload)),
        &spec,
        windows(),
        None,
    ) {
        Err(Error::BudgetTooSmall {
            predicted_bytes, ..
        }) => predicted_bytes,
        other => panic!("{:?}", other.map(|_| "fitted")),
    };
    let (kept, streamed) = (least(Offload::Activations), least(Offload::Parameters));
    assert!(streamed < kept, "{streamed} vs {kept}");
    let gpu = small();
    let mut t = Trainer::new(
        &gpu,
        tight(Offload::Parameters, streamed),
        &spec,
        windows(),
        None,
    )
    .unwrap();
    t.run(&mut Silent).unwrap();
    // As the activations level without a budget at the micro-batch the plan chose, and of the
    // model the plan chose: under this budget, the memory-efficient variant (fused attention,
    // chunked loss), whose backward adds a stream's gradients in another order than the
    // reference path's, so the two need not agree to the last bit.
    let plan = t.plan().expect("planned");
    let unbudgeted = TrainConfig {
        micro_batch: Some(plan.micro_batch),
        ..at(Offload::Activations, every_block.clone())
    };
    let variant = plimsoll_trainer::Recipe::memory_efficient_variant(&spec);
    let recipe: &dyn plimsoll_trainer::Recipe = match (&variant, &plan.variant) {
        (Some((_, r)), Some(_)) => r.as_ref(),
        _ => &spec,
    };
    let gpu_b = fresh_gpu();
    let mut b = Trainer::new(&gpu_b, unbudgeted, recipe, windows(), None).unwrap();
    b.run(&mut Silent).unwrap();
    assert_eq!(values(t.parameters()), values(b.parameters()));
    assert!(gpu.with_allocator(|a| a.stats().peak_reserved_bytes) <= streamed);
}
