//! `cargo xtask chaos`: every failure point of a training step, tried in turn.
//!
//! For each workload (a 16-256-10 MLP whose activations take segments of their own and a
//! one-layer GPT, the smallest that reach every kind of point, both with AdamW and two
//! micro-batches per step) and for its first step (which creates the optimizer state and most
//! segments) and its second (the steady state), one clean run counts the step's events at each
//! [`FaultPoint`]: every allocation, segment creation, submission, read-back, host allocation and
//! upload. Then, for every
//! one of those events and for both [`FaultAction`]s, a device runs the steps before cleanly
//! (saving a checkpoint before the first and after each), arms the fault and runs the step. The
//! device is the previous injection's, its cache emptied so the same events happen, and its
//! loss cleared when the loss was the injected one (`Gpu::revive_after_injected_loss`: the wgpu
//! device was never lost, and compiling every kernel again on a fresh device took two thirds of
//! the task's time); a fresh one after anything else. The allowed outcomes:
//! - **recovered**: step 2 succeeds and the parameters are bit-identical to an undisturbed run
//!   with the micro-batch schedule the step ended with (out-of-memory halves it);
//! - **typed error, model intact**: step 2 returns an error, the parameters and the optimizer
//!   state are bit-identical to before it, and step 1's checkpoint is on disk.
//!
//! A lost device must always end **recovered**: the trainer goes on with a new device from the
//! state it kept (`plimsoll_trainer::recovery`) and the step's parameters equal the undisturbed
//! run's. Here the "new device" is the injected one revived (its wgpu device was never lost, and
//! compiling every kernel again per injection would multiply the task's time); the trainer's
//! tests lose a real device (`Gpu::destroy`) and go on with a really new one.
//!
//! A third workload is the MLP under `--allocator planned`, faulted in its fourth step: the
//! first that replays the plan built from steps 2 and 3 (checked on the clean run). A fourth is
//! the MLP with `--precision f16` (activations stored in f16, the loss scaled), and a fifth the
//! MLP with `--offload optimizer` (AdamW's state in host memory: its read-backs and writes are
//! failure points, as is the host memory it asks for, and the host state must be intact after
//! a typed error). A sixth is the GPT
//! with `--offload activations`, checkpointed block by block: the segments' inputs go to host
//! memory after forward and come back for backward, more read-backs and uploads that fail. A
//! seventh is the MLP with a GPU's multi-tensor update and norm forced (`--tensor-launches
//! multi`): their tables are allocations and uploads that fail too.
//!
//! A workload whose clean steps reach no event of some kind of [`FaultPoint`] fails the task:
//! a smaller model must not lose a kind of point unnoticed.
//!
//! Anything else is counted as a failure: a panic, an untyped outcome, a changed model, an
//! uncaptured wgpu error. Every wait has the device's deadline, so a hang cannot happen
//! silently: it would end as a timeout and be judged like any other error. The task prints the
//! counts per workload and fails if any failure was seen.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use plimsoll_kernels_wgsl::fault::{FaultAction, FaultPoint};
use plimsoll_kernels_wgsl::kernels::TensorLaunches;
use plimsoll_kernels_wgsl::random::SplitMix64;
use plimsoll_kernels_wgsl::{Gpu, GpuOptions};
use plimsoll_nn::{Activation, AdamWConfig, GptConfig, LrSchedule};
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::{
    AllocatorMode, CheckpointPolicy, Data, Dataset, GptSpec, LeakPolicy, ModelSpec, Offload,
    OptimizerSpec, Precision, Recipe, RunLength, TokenData, TrainConfig, Trainer,
};

/// Values of every parameter and optimizer-state tensor, by name.
type Snapshot = Vec<(String, Vec<f32>)>;

struct Workload {
    name: &'static str,
    recipe: Box<dyn Recipe>,
    data: Box<dyn Fn() -> Box<dyn Data>>,
    batch: usize,
    micro: usize,
    allocator: AllocatorMode,
    /// The steps faulted.
    phases: &'static [Phase],
    /// The allocator's small-segment size: small enough that the workload's activations take
    /// segments of their own, so its steps create segments.
    small_segment_bytes: u64,
    /// What activations are stored in.
    precision: Precision,
    /// Kinds of point its faulted steps need not reach (every other kind must be reached).
    may_miss: &'static [FaultPoint],
    /// Where the optimizer's state lives.
    offload: Offload,
    /// How the update and the gradient norm go out (`None`: the device's choice, one launch
    /// per tensor on lavapipe).
    tensor_launches: Option<TensorLaunches>,
}

fn adamw() -> OptimizerSpec {
    OptimizerSpec::AdamW(AdamWConfig {
        beta2: 0.99,
        weight_decay: 0.1,
        decay_matrices_only: true,
        ..AdamWConfig::default()
    })
}

/// The MLP workloads' small-segment size: below their hidden activations' 64 KiB.
const MLP_SMALL_SEGMENT: u64 = 32 << 10;

/// The 16-256-10 MLP on `table`, batch 128 in micro-batches of 64 with 32 KiB small segments:
/// the hidden activations (64 x 256 floats, 64 KiB) take segments of their own, so a step
/// creates segments and each can fail. (The MLP is as small as that allows: its steps are most
/// of the task's time.) f32, the caching allocator, every phase, the state on the device.
fn mlp_workload(name: &'static str, table: &Dataset) -> Workload {
    let table = table.clone();
    Workload {
        name,
        recipe: Box::new(ModelSpec {
            widths: vec![16, 256, 10],
            activation: Activation::Relu,
            seed: 1,
            optimizer: adamw(),
        }),
        data: Box::new(move || -> Box<dyn Data> { Box::new(table.clone()) }),
        batch: 128,
        micro: 64,
        allocator: AllocatorMode::Caching,
        phases: &Phase::ALL,
        small_segment_bytes: MLP_SMALL_SEGMENT,
        precision: Precision::F32,
        // Nothing of it lives in host memory on purpose.
        may_miss: &[FaultPoint::HostAllocation],
        offload: Offload::None,
        tensor_launches: None,
    }
}

/// The one-block GPT (width 32) on `windows`, with `offload`.
fn gpt_workload(name: &'static str, windows: &TokenData, offload: Offload) -> Workload {
    let windows = windows.clone();
    Workload {
        name,
        recipe: Box::new(GptSpec::new(
            GptConfig {
                vocab_size: 13,
                block_size: 8,
                n_layer: 1,
                n_head: 2,
                n_embd: 32,
            },
            3,
            adamw(),
        )),
        data: Box::new(move || -> Box<dyn Data> { Box::new(windows.clone()) }),
        batch: 8,
        micro: 4,
        allocator: AllocatorMode::Caching,
        phases: &Phase::ALL,
        // Its tensors are a few KiB: in 32 KiB small segments its activations need segments
        // of their own, so segment creation fails in its steps too.
        small_segment_bytes: 32 << 10,
        precision: Precision::F32,
        may_miss: match offload {
            Offload::None => &[FaultPoint::HostAllocation],
            _ => &[],
        },
        offload,
        tensor_launches: None,
    }
}

fn workloads() -> Result<Vec<Workload>> {
    let table = Dataset::synthetic(256, 16, 10, 42).context("synthetic data")?;
    let mlp = mlp_workload("mlp 16-256-10", &table);
    // The same in f16: the conversions allocate too, and a skipped or failed step must leave
    // the model and the loss scale as they were.
    let mlp_f16 = Workload {
        precision: Precision::F16,
        ..mlp_workload("mlp 16-256-10 f16", &table)
    };
    let planned = Workload {
        allocator: AllocatorMode::Planned,
        phases: &[Phase {
            before: 3,
            empty_cache: false,
        }],
        // A replayed plan creates no segment (the other workloads fault segment creation).
        may_miss: &[FaultPoint::Segment, FaultPoint::HostAllocation],
        ..mlp_workload("mlp 16-256-10 planned", &table)
    };
    // The optimizer's state in host memory: the update's read-backs and writes fail too, and a
    // failed one must leave the model and the host state as they were.
    let mlp_offloaded = Workload {
        offload: Offload::OptimizerState,
        may_miss: &[],
        ..mlp_workload("mlp 16-256-10 offloaded", &table)
    };
    // A GPU's multi-tensor update and norm (forced here): their tables' allocations and uploads
    // fail too, and a failed one must leave the model as it was.
    let mlp_multi = Workload {
        tensor_launches: Some(TensorLaunches::Multi),
        ..mlp_workload("mlp 16-256-10 multi-tensor", &table)
    };
    let mut rng = SplitMix64::new(5);
    let tokens: Arc<Vec<u32>> = Arc::new((0..600).map(|_| rng.below(13) as u32).collect());
    let windows = TokenData::windows(tokens, 8, 13).context("GPT windows")?;
    let gpt = gpt_workload("gpt 1x32", &windows, Offload::None);
    // The GPT checkpointed block by block with its segments' inputs in host memory too: their
    // read-backs after forward and uploads before backward fail as well.
    let gpt_offloaded = gpt_workload(
        "gpt 1x32 offloaded activations",
        &windows,
        Offload::Activations,
    );
    // The GPT with its blocks' parameters streamed: each segment's restores (an allocation and
    // an upload each), its evictions and its gradients' read-backs fail as well.
    // Its first step (which creates segments and the host state) and a later one: the step
    // after an emptied cache adds only segment creation, which the first step has (and CI's
    // time).
    let gpt_streamed = Workload {
        phases: &[Phase::ALL[0], Phase::ALL[1]],
        ..gpt_workload(
            "gpt 1x32 streamed parameters",
            &windows,
            Offload::Parameters,
        )
    };
    Ok(vec![
        mlp,
        gpt,
        planned,
        mlp_f16,
        mlp_offloaded,
        gpt_offloaded,
        mlp_multi,
        gpt_streamed,
    ])
}

fn config(w: &Workload, micro: usize, dir: &Path) -> TrainConfig {
    TrainConfig {
        effective_batch: w.batch,
        micro_batch: Some(micro),
        length: RunLength::Steps(2),
        schedule: LrSchedule::Constant { lr: 1e-3 },
        seed: 3,
        // Offloaded activations are what checkpointed segments keep: one block per segment.
        checkpointing: match w.offload.activations_on_host() {
            true => CheckpointPolicy::EveryBlocks(1),
            false => CheckpointPolicy::None,
        },
        fence_deadline: Duration::from_secs(20),
        leak_policy: LeakPolicy::Error,
        clip_grad_norm: Some(1.0),
        checkpoint_dir: Some(dir.to_path_buf()),
        allocator: w.allocator,
        precision: w.precision,
        offload: w.offload,
        ..TrainConfig::default()
    }
}

fn fresh_gpu(w: &Workload) -> Result<Gpu> {
    let options = GpuOptions {
        small_segment_bytes: Some(w.small_segment_bytes),
        tensor_launches: w.tensor_launches,
        ..GpuOptions::from_env()
    };
    Gpu::with_options(options).context("opening a device")
}

/// A trainer after `steps` clean steps, whose checkpoint is in `dir` (saved before the first
/// step too: the last good state of a run is always on disk), on `gpu` or a fresh device.
fn after_steps(
    w: &Workload,
    micro: usize,
    dir: &Path,
    steps: u64,
    gpu: Option<Gpu>,
) -> Result<(Gpu, Trainer)> {
    let _ = std::fs::remove_dir_all(dir);
    let gpu = match gpu {
        Some(gpu) => {
            // As a fresh device is: nothing cached, so the same events happen.
            gpu.flush("chaos")?;
            gpu.empty_cache();
            gpu
        }
        None => fresh_gpu(w)?,
    };
    let config = config(w, micro, dir);
    let mut trainer = Trainer::new(&gpu, config, w.recipe.as_ref(), (w.data)(), None)
        .context("building the trainer")?;
    trainer.save_checkpoint().context("saving step 0")?;
    for step in 1..=steps {
        trainer.step().with_context(|| format!("step {step}"))?;
        trainer.save_checkpoint().context("saving")?;
    }
    Ok((gpu, trainer))
}

fn snapshot(trainer: &Trainer) -> Result<Snapshot> {
    let mut out = Vec::new();
    let state = trainer.optimizer().state();
    for (name, t) in trainer.parameters().iter().cloned().chain(state) {
        out.push((name, t.to_vec().context("reading the model back")?));
    }
    // An offloaded optimizer's state is in host memory.
    let host = trainer.optimizer().host_state().unwrap_or_default();
    out.extend(host.into_iter().map(|(name, t)| (name, t.data)));
    Ok(out)
}

/// The parameters after step `before + 1` of an undisturbed run whose last step uses
/// micro-batches of `micro` (the steps before use the workload's): those steps, saved, resumed
/// by a trainer configured with `micro` (resuming is bit-identical).
fn reference(w: &Workload, before: u64, micro: usize, dir: &Path) -> Result<Snapshot> {
    let (gpu, first) = after_steps(w, w.micro, dir, before, None)?;
    drop(first);
    let mut config = config(w, micro, dir);
    config.checkpoint_dir = None;
    let mut trainer = Trainer::new(&gpu, config, w.recipe.as_ref(), (w.data)(), None)?;
    trainer.resume(&latest_path(dir))?;
    trainer.step().context("reference step")?;
    snapshot(&trainer)
}

#[derive(Default)]
struct Tally {
    tried: usize,
    fired: usize,
    recovered: usize,
    /// Of `recovered`, the runs that went on after a lost device.
    recovered_losses: usize,
    typed_intact: usize,
    failures: Vec<String>,
}

/// Which step a fault goes into.
#[derive(Debug, Clone, Copy)]
struct Phase {
    /// Clean steps before it.
    before: u64,
    /// Whether the allocator's cache is emptied just before it, so the step creates segments.
    empty_cache: bool,
}

impl Phase {
    const ALL: [Phase; 3] = [
        Phase {
            before: 0,
            empty_cache: false,
        },
        Phase {
            before: 1,
            empty_cache: false,
        },
        Phase {
            before: 1,
            empty_cache: true,
        },
    ];

    fn name(self) -> String {
        let emptied = if self.empty_cache {
            " after the cache was emptied"
        } else {
            ""
        };
        format!("step {}{emptied}", self.before + 1)
    }

    /// Empties the cache if the phase asks for it.
    fn prepare(self, gpu: &Gpu) -> Result<()> {
        if self.empty_cache {
            gpu.flush("chaos")?;
            gpu.empty_cache();
        }
        Ok(())
    }
}

/// Parameters (the first `params` entries) equal.
fn same_parameters(a: &Snapshot, b: &Snapshot, params: usize) -> bool {
    a.get(..params) == b.get(..params)
}

/// The device a faulted trainer goes on with after a loss: the injected one revived (see the
/// module docs), or a new one after anything else.
fn reopen_injected(lost: &Gpu) -> plimsoll_kernels_wgsl::Result<Gpu> {
    match lost.revive_after_injected_loss() {
        true => Ok(lost.clone()),
        false => lost.reopen(),
    }
}

/// One injection into the step `phase` names, judged. Runs on `spare` (a device a previous
/// injection left healthy or lost only by the injection, which keeps its compiled kernels) or a
/// fresh one; returns the device when it can go on.
fn inject(
    w: &Workload,
    phase: Phase,
    (point, index, action): (FaultPoint, u64, FaultAction),
    (dir, references): (&Path, &mut HashMap<(u64, usize), Snapshot>),
    (tally, spare): (&mut Tally, Option<Gpu>),
) -> Result<Option<Gpu>> {
    let before = phase.before;
    let what = format!(
        "{} {} {} #{index} {action:?}",
        w.name,
        phase.name(),
        point.name()
    );
    let (gpu, mut trainer) = after_steps(w, w.micro, dir, before, spare)?;
    trainer.set_reopen(Box::new(reopen_injected));
    let snapshot_before = snapshot(&trainer)?;
    phase.prepare(&gpu)?;
    gpu.reset_fault_counts();
    gpu.arm_fault(point, index, action);
    let outcome = catch_unwind(AssertUnwindSafe(|| trainer.step()));
    let fired = !gpu.disarm_fault();
    tally.tried += 1;
    tally.fired += usize::from(fired);
    let uncaptured = gpu.take_uncaptured_errors();
    if !uncaptured.is_empty() {
        let failure = format!("{what}: uncaptured wgpu errors {uncaptured:?}");
        tally.failures.push(failure);
        return Ok(None);
    }
    match outcome {
        Err(_) => tally.failures.push(format!("{what}: panicked")),
        Ok(Ok(report)) => {
            let key = (before, report.micro_batch);
            let reference = match references.entry(key) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(reference(
                    w,
                    before,
                    report.micro_batch,
                    &dir.join("reference"),
                )?),
            };
            let after = snapshot(&trainer)?;
            let params = trainer.parameters().len();
            if action == FaultAction::LoseDevice && fired && trainer.device_losses() == 0 {
                tally.failures.push(format!(
                    "{what}: the device was lost and the trainer never saw it"
                ));
            } else if same_parameters(reference, &after, params) {
                tally.recovered += 1;
                tally.recovered_losses += usize::from(trainer.device_losses() > 0);
            } else {
                tally.failures.push(format!(
                    "{what}: recovered (micro-batch {}, fault fired: {fired}) with parameters \
                     unlike an undisturbed run's",
                    report.micro_batch
                ));
            }
        }
        Ok(Err(error)) if action == FaultAction::LoseDevice => tally.failures.push(format!(
            "{what}: the run did not go on from the lost device: {}",
            error.to_string().lines().next().unwrap_or_default()
        )),
        Ok(Err(error)) => {
            let on_disk = std::fs::metadata(latest_path(dir)).is_ok();
            let (intact, why) = match snapshot(&trainer) {
                Ok(now) => {
                    let changed = now
                        .iter()
                        .zip(&snapshot_before)
                        .find(|(a, b)| a != b)
                        .map(|(a, _)| format!("; {} changed", a.0));
                    (now == snapshot_before, changed.unwrap_or_default())
                }
                Err(e) => (false, format!("; reading back: {e:#}")),
            };
            if intact && on_disk {
                tally.typed_intact += 1;
            } else {
                tally.failures.push(format!(
                    "{what}: an error with the model changed or no checkpoint (intact: \
                     {intact}{why}; checkpoint on disk: {on_disk}): {}",
                    error.to_string().lines().next().unwrap_or_default()
                ));
            }
        }
    }
    drop(trainer);
    // A loss the fault injected leaves the wgpu device whole: go on with it (its pipelines
    // compiled) rather than a fresh one, which compiles them all again.
    let healthy = gpu.check_alive().is_ok() || gpu.revive_after_injected_loss();
    Ok(healthy.then_some(gpu))
}

/// `cargo xtask chaos [WORKLOAD [POINT]]`: all workloads and points, or those whose names
/// contain the words given (`cargo xtask chaos gpt read-back`).
pub fn run(args: &[String]) -> Result<()> {
    let wanted = |word: Option<&String>, name: &str| word.is_none_or(|w| name.contains(w.as_str()));
    let root = std::env::temp_dir().join(format!("plimsoll-chaos-{}", std::process::id()));
    let mut failed = 0;
    for w in workloads()? {
        if !wanted(args.first(), w.name) {
            continue;
        }
        let start = Instant::now();
        let dir: PathBuf = root.join(w.name.replace(' ', "-"));
        let mut references = HashMap::new();
        let mut tally = Tally::default();
        let mut spare = None;
        let mut reached = [0u64; FaultPoint::ALL.len()];
        for &phase in w.phases {
            // Count the step's events at each point, on a fresh device.
            let (gpu, mut trainer) = after_steps(&w, w.micro, &dir, phase.before, None)?;
            phase.prepare(&gpu)?;
            gpu.reset_fault_counts();
            trainer.step().context("clean step")?;
            let counts = gpu.fault_counts();
            for (r, c) in reached.iter_mut().zip(counts.iter()) {
                *r += c;
            }
            let replayed = gpu.with_allocator(|a| a.step_plan_stats().steps_replayed);
            if w.allocator == AllocatorMode::Planned && replayed == 0 {
                bail!("{}: {} did not replay a plan", w.name, phase.name());
            }
            drop((trainer, gpu));
            for point in FaultPoint::ALL {
                if !wanted(args.get(1), point.name()) {
                    continue;
                }
                for index in 0..counts[point.index()] {
                    for action in [FaultAction::Fail, FaultAction::LoseDevice] {
                        let fault = (point, index, action);
                        let files = (dir.as_path(), &mut references);
                        spare = inject(&w, phase, fault, files, (&mut tally, spare.take()))?;
                    }
                }
            }
            let points: Vec<String> = FaultPoint::ALL
                .iter()
                .map(|p| format!("{} {}", counts[p.index()], p.name()))
                .collect();
            println!(
                "{} {}: {} failure points ({})",
                w.name,
                phase.name(),
                counts.iter().sum::<u64>(),
                points.join(", ")
            );
        }
        let unreached: Vec<&str> = FaultPoint::ALL
            .iter()
            .filter(|p| reached[p.index()] == 0 && !w.may_miss.contains(p))
            .filter(|p| wanted(args.get(1), p.name()))
            .map(|p| p.name())
            .collect();
        if !unreached.is_empty() {
            bail!(
                "{}: its steps reach no {} event, so no fault of that kind was tried; make \
                 the workload reach one (its small segments, its sizes)",
                w.name,
                unreached.join(" or ")
            );
        }
        println!(
            "{}: each point made to fail and to lose the device in turn: {} tried ({} fired), {} \
             recovered ({} of them from a lost device), {} typed errors with the model intact, \
             {} other outcomes ({:.0} s)",
            w.name,
            tally.tried,
            tally.fired,
            tally.recovered,
            tally.recovered_losses,
            tally.typed_intact,
            tally.failures.len(),
            start.elapsed().as_secs_f64()
        );
        for f in &tally.failures {
            println!("  FAILED {f}");
        }
        failed += tally.failures.len();
    }
    let _ = std::fs::remove_dir_all(&root);
    if failed > 0 {
        bail!("{failed} injected faults ended outside the two allowed outcomes");
    }
    Ok(())
}
