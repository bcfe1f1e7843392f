//! Where in a step memory peaks: each step reports the peaks of its forward, backward and
//! optimizer phases, an evaluation its own, and the allocator's trace stamps every event with its
//! step and phase. Oracles: the step's overall peak (the phases cover the step), a peak measured
//! around the evaluation alone, and the order of the step's phases.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_allocator::{Phase, TraceEventKind};
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::Trainer;
use plimsoll_trainer::metrics::PhasePeak;

#[test]
fn a_step_reports_the_peaks_of_its_phases_and_an_evaluation_its_own() {
    let gpu = fresh_gpu();
    let spec = adam_spec(&[32, 256, 10]);
    let mut trainer = Trainer::new(
        &gpu,
        config(64, 32, 3, 1e-3),
        &spec,
        data(256, 32, 10),
        Some(Box::new(data(100, 32, 10))),
    )
    .unwrap();
    trainer.step().unwrap();
    gpu.with_allocator(|a| a.set_trace_capacity(1 << 16));
    let report = trainer.step().unwrap();
    let names: Vec<&str> = report.phases.keys().copied().collect();
    assert_eq!(names, ["backward", "forward", "optimizer"], "{report:?}");
    // Every moment of the step is in one of its phases, so the largest phase peak is the step's.
    let largest = |peak: fn(&PhasePeak) -> u64| report.phases.values().map(peak).max().unwrap();
    let largest_allocated = largest(|p| p.peak_allocated_bytes);
    assert_eq!(largest_allocated, report.peak_allocated_bytes, "{report:?}");
    assert_eq!(
        largest(|p| p.peak_reserved_bytes),
        report.peak_reserved_bytes
    );
    // Activations live in forward and backward; the graph is gone before the update.
    let activation = |phase: &str| {
        report.phases[phase]
            .categories
            .get("activation")
            .copied()
            .unwrap_or(0)
    };
    assert!(activation("forward") > 0 && activation("backward") > 0);
    assert_eq!(activation("optimizer"), 0, "{report:?}");
    assert!((0.0..=1.0).contains(&report.fragmentation));

    // The trace of step 2: every event stamped with step 2, phases in step order.
    let trace = gpu.with_allocator(|a| {
        let t = a.trace().clone();
        a.set_trace_capacity(0);
        t
    });
    let mut phases: Vec<Phase> = trace
        .events
        .iter()
        .filter(|e| e.kind == TraceEventKind::Phase)
        .map(|e| e.phase)
        .collect();
    phases.dedup();
    assert_eq!(
        phases,
        [
            Phase::Forward,
            Phase::Backward,
            Phase::Forward,
            Phase::Backward,
            Phase::Optimizer,
            Phase::Other
        ]
    );
    assert!(trace.events.iter().all(|e| e.step == 2));
    assert!(
        trace
            .events
            .iter()
            .any(|e| e.kind == TraceEventKind::Allocate && e.phase == Phase::Backward)
    );

    // An evaluation's peak, against the allocator's peak measured around it alone.
    gpu.with_allocator(|a| a.reset_peaks());
    let evaluation = trainer.evaluate().unwrap().unwrap();
    let around = gpu.with_allocator(|a| a.stats().clone());
    assert_eq!(evaluation.peak_allocated_bytes, around.peak_allocated_bytes);
    assert_eq!(evaluation.peak_reserved_bytes, around.peak_reserved_bytes);
    assert!(evaluation.peak_allocated_bytes > around.allocated_bytes);
}
