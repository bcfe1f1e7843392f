//! The memory timeline of chosen steps: its events replay to the allocator's own figures (the
//! steps' peaks, the final allocated and reserved bytes), the page is self-contained, and the
//! memory_viz snapshot passes `memory_viz_check.py` (Python's pickle, the viewer's structure,
//! the same events as the timeline). A step that runs out of memory shows it.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::timeline::{SNAPSHOT_PICKLE, TIMELINE_HTML, TIMELINE_JSON};
use plimsoll_trainer::{Evaluation, Observer, StepReport, StepSpan, Trainer};

#[derive(Default)]
struct Reports(Vec<StepReport>);

impl Observer for Reports {
    fn on_step(&mut self, report: &StepReport) {
        self.0.push(report.clone());
    }
    fn on_eval(&mut self, _: u64, _: u64, _: &Evaluation) {}
    fn on_log(&mut self, _: &str) {}
}

/// Replays the timeline's events: (peak allocated, final allocated, final reserved, kinds seen).
fn replay(data: &serde_json::Value) -> (u64, u64, u64, Vec<u64>) {
    let mut allocated: u64 = data["initial"]["live"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b[2].as_u64().unwrap())
        .sum();
    let mut reserved = data["initial"]["reserved"].as_u64().unwrap();
    let mut peak = allocated;
    let mut kinds = Vec::new();
    for e in data["events"].as_array().unwrap() {
        let (kind, size) = (e[1].as_u64().unwrap(), e[2].as_u64().unwrap());
        match kind {
            0 => allocated += size,
            1 => allocated -= size,
            2 => reserved += size,
            3 => reserved -= size,
            _ => {}
        }
        peak = peak.max(allocated);
        kinds.push(kind);
    }
    (peak, allocated, reserved, kinds)
}

fn check_with_python(dir: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/memory_viz_check.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(dir.join(SNAPSHOT_PICKLE))
        .arg(dir.join(TIMELINE_JSON))
        .output()
        .expect("python3 runs (CI installs it)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn a_timeline_replays_to_the_steps_peaks_and_memory_viz_reads_it() {
    let gpu = fresh_gpu();
    let dir = temp_dir("timeline");
    let mut config = config(64, 32, 4, 1e-3);
    config.memory_timeline = Some(StepSpan { first: 2, last: 3 });
    config.checkpoint_dir = Some(dir.clone());
    let spec = adam_spec(&[32, 256, 10]);
    let mut trainer = Trainer::new(&gpu, config, &spec, data(512, 32, 10), None).unwrap();
    let mut reports = Reports::default();
    trainer.run(&mut reports).unwrap();
    let timeline = trainer.timeline().unwrap();
    assert_eq!(timeline.span, StepSpan { first: 2, last: 3 });
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(TIMELINE_JSON)).unwrap()).unwrap();
    let (peak, allocated, reserved, kinds) = replay(&data);
    let steps_peak = reports.0[1..3]
        .iter()
        .map(|r| r.peak_allocated_bytes)
        .max()
        .unwrap();
    assert_eq!(peak, steps_peak, "the replayed peak is the steps' peak");
    assert_eq!(allocated, timeline.end.stats.allocated_bytes);
    assert_eq!(reserved, timeline.end.stats.reserved_bytes);
    assert!(kinds.contains(&0) && kinds.contains(&1) && kinds.contains(&5));
    let steps: Vec<u64> = data["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[5].as_u64().unwrap())
        .collect();
    assert_eq!(steps.first(), Some(&2));
    assert_eq!(steps.last(), Some(&3));
    let html = std::fs::read_to_string(dir.join(TIMELINE_HTML)).unwrap();
    assert!(!html.contains("http://") && !html.contains("https://"));
    assert!(!html.contains("<script src"));
    let out = check_with_python(&dir);
    assert!(out.contains("memory_viz snapshot ok"), "{out}");
}

#[test]
fn an_out_of_memory_and_its_recovery_are_in_the_timeline() {
    // Budget between the peaks of micro-batches 512 and 1024: step 1 runs out of memory once
    // and recovers (trainer/tests/oom_recovery.rs measures the same budget).
    const BATCH: usize = 1024;
    let peak = |micro: usize| {
        let gpu = fresh_gpu();
        let spec = sgd_spec(&[32, 1024, 10]);
        let mut trainer = Trainer::new(
            &gpu,
            config(BATCH, micro, 1, 0.05),
            &spec,
            data(BATCH, 32, 10),
            None,
        )
        .unwrap();
        trainer.step().unwrap();
        gpu.with_allocator(|a| a.stats().peak_reserved_bytes)
    };
    let budget = (peak(BATCH) + peak(BATCH / 2)) / 2;
    let gpu = fresh_gpu();
    let dir = temp_dir("timeline-oom");
    let mut config = config(BATCH, BATCH, 1, 0.05);
    config.memory_budget_bytes = Some(budget);
    config.memory_timeline = Some(StepSpan { first: 1, last: 1 });
    config.checkpoint_dir = Some(dir.clone());
    let spec = sgd_spec(&[32, 1024, 10]);
    let mut trainer = Trainer::new(&gpu, config, &spec, data(BATCH, 32, 10), None).unwrap();
    trainer.run(&mut Reports::default()).unwrap();
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(TIMELINE_JSON)).unwrap()).unwrap();
    let (peak, _, _, kinds) = replay(&data);
    assert!(kinds.contains(&4), "an out-of-memory event");
    let notes: Vec<&str> = data["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e[1] == 6)
        .map(|e| {
            data["labels"][e[4].as_u64().unwrap() as usize]
                .as_str()
                .unwrap()
        })
        .collect();
    assert!(
        notes.iter().any(|n| n.contains("micro-batch 512")),
        "{notes:?}"
    );
    assert!(peak <= budget);
    assert_eq!(data["budget"].as_u64(), Some(budget));
    let out = check_with_python(&dir);
    assert!(out.contains("\"oom\": "), "{out}");
}

/// A span of one step reads "step 2" ("steps 2-2" before), of several "steps 1-3".
#[test]
fn a_span_of_steps_is_said_in_words() {
    use plimsoll_trainer::StepSpan;
    assert_eq!(StepSpan { first: 2, last: 2 }.to_string(), "step 2");
    assert_eq!(StepSpan { first: 1, last: 3 }.to_string(), "steps 1-3");
}
