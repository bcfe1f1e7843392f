//! Host memory that holds still: the snapshot of the training state a lost device goes on from
//! is refreshed in the memory of the one before it, so a run that keeps one allocates no new
//! copy of the model each time (counted by this test binary's allocator, the library's
//! `CountingAllocator`).

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::host_memory::{CountingAllocator, heap};
use plimsoll_trainer::{SnapshotEvery, Trainer};

#[global_allocator]
static HEAP: CountingAllocator = CountingAllocator;

/// Bytes the heap handed out over each of `steps` steps after three of warm-up, with
/// `snapshot_every`, and the bytes of the training state (parameters and both AdamW moments).
fn allocated_per_step(snapshot_every: SnapshotEvery, steps: usize) -> (Vec<u64>, u64) {
    let gpu = fresh_gpu();
    // 64-512-10: 38,410 parameters, a state of 3 x 153,640 bytes, far more than a step of this
    // MLP allocates otherwise.
    let spec = adam_spec(&[64, 512, 10]);
    let mut config = config(16, 16, 3 + steps as u64, 1e-3);
    config.snapshot_every = snapshot_every;
    let mut trainer = Trainer::new(&gpu, config, &spec, data(256, 64, 10), None).unwrap();
    for _ in 0..3 {
        trainer.step().unwrap();
    }
    let state: u64 = trainer
        .parameters()
        .iter()
        .map(|(_, t)| t.numel() as u64 * 4 * 3)
        .sum();
    let mut per_step = Vec::new();
    for _ in 0..steps {
        let before = heap().unwrap().allocated_bytes;
        trainer.step().unwrap();
        per_step.push(heap().unwrap().allocated_bytes - before);
    }
    (per_step, state)
}

#[test]
fn a_snapshot_every_step_allocates_no_copy_of_the_state() {
    let (without, state) = allocated_per_step(SnapshotEvery::Off, 6);
    let (with, _) = allocated_per_step(SnapshotEvery::Steps(1), 6);
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (without, with) = (median(without), median(with));
    // Refreshed in place, a snapshot allocates its names and metadata and wgpu's bookkeeping of
    // one read-back submission per tensor (about 9 KiB each, 114 KiB here); a new copy would
    // allocate the whole state (and, read through `to_vec`, twice).
    assert!(
        with.saturating_sub(without) < state / 2,
        "a step that snapshots allocates {with} bytes, one that does not {without}: the \
         snapshot made a new copy of the {state}-byte state"
    );
}
