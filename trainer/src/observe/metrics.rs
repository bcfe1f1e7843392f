//! What a run reports: [`StepReport`] (one per step, also one JSON line of `--metrics-out`),
//! the [`Observer`] a run calls, and [`JsonLines`], the metrics file writer.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use plimsoll_allocator::{Category, Phase, Stats};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::host_memory::HeapCounts;
use crate::task::Evaluation;

/// One step's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepReport {
    /// The step (1-based).
    pub step: u64,
    /// Its epoch (0-based).
    pub epoch: u64,
    /// Mean loss over the effective batch.
    pub loss: f32,
    /// Mean of `loss` over the last [`LOSS_WINDOW`](crate::trainer::LOSS_WINDOW) steps (fewer
    /// at the start of a run or of a resumed run): what the progress bar shows.
    pub loss_mean: f32,
    /// The learning rate used.
    pub lr: f32,
    /// The global gradient norm (before clipping).
    pub grad_norm: f32,
    /// The loss scale the step ran with (`--precision f16`; absent in f32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f32>,
    /// Whether the update was skipped because the scaled gradients overflowed (f16).
    pub skipped: bool,
    /// Samples in the batch.
    pub samples: usize,
    /// Samples per forward/backward.
    pub micro_batch: usize,
    /// Forward/backward passes.
    pub micro_batches: usize,
    /// Wall time of the step, leak check included.
    pub step_ms: f64,
    /// Samples per second over the step.
    pub samples_per_s: f64,
    /// Bytes allocated after the step.
    pub allocated_bytes: u64,
    /// Bytes reserved (segments) after the step.
    pub reserved_bytes: u64,
    /// Peak allocated bytes during the step.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes during the step.
    pub peak_reserved_bytes: u64,
    /// Fragmentation after the step: `1 - largest free block / free bytes`.
    pub fragmentation: f64,
    /// Processes training the model (1 unless launched under MPI).
    pub ranks: usize,
    /// Bytes this rank passed to the all-reduce of gradients (0 for one process).
    pub allreduce_bytes: u64,
    /// Milliseconds in the all-reduce calls of gradients: waiting for the slowest rank to
    /// arrive, then the sum (reading gradients back and writing the sums not included).
    pub allreduce_ms: f64,
    /// Milliseconds the step waited for its samples in host memory: the whole gather without
    /// prefetching, the wait on the loader thread's queue with it ([`crate::loader`]).
    pub data_wait_ms: f64,
    /// Peaks of each phase the step went through (`forward`, `backward`, `optimizer`; an
    /// evaluation's peaks are in its own [`EvalRecord`]).
    pub phases: BTreeMap<&'static str, PhasePeak>,
    /// Device losses during the step that the run went on from on a new device
    /// ([`crate::recovery`]); absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    pub device_losses: u64,
    /// The Rust heap after the step, where the process counts it
    /// ([`crate::host_memory::CountingAllocator`]; the `plimsoll` command does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_heap: Option<HeapCounts>,
    /// The process's resident memory after the step, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resident_bytes: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The peaks of one phase of a step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhasePeak {
    /// Highest allocated bytes in the phase.
    pub peak_allocated_bytes: u64,
    /// Highest reserved bytes in the phase.
    pub peak_reserved_bytes: u64,
    /// Highest allocated bytes of each category in the phase (categories with none left out).
    pub categories: BTreeMap<&'static str, u64>,
}

impl PhasePeak {
    /// The phases of `stats` that were entered since its peaks were last reset.
    pub fn of(stats: &Stats) -> BTreeMap<&'static str, PhasePeak> {
        Phase::ALL
            .iter()
            .filter(|&&phase| phase != Phase::Other)
            .map(|&phase| (phase, stats.phase(phase)))
            .filter(|(_, p)| p.peak_reserved_bytes > 0)
            .map(|(phase, p)| {
                let categories = Category::ALL
                    .iter()
                    .zip(p.peak_category_bytes)
                    .filter(|(_, bytes)| *bytes > 0)
                    .map(|(c, bytes)| (c.name(), bytes))
                    .collect();
                (
                    phase.name(),
                    PhasePeak {
                        peak_allocated_bytes: p.peak_allocated_bytes,
                        peak_reserved_bytes: p.peak_reserved_bytes,
                        categories,
                    },
                )
            })
            .collect()
    }
}

/// One evaluation, as a line of `--metrics-out` (beside the step lines, which have no
/// `eval_loss`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalRecord {
    /// The step after which it ran.
    pub step: u64,
    /// That step's epoch (0-based).
    pub epoch: u64,
    /// Mean loss per sample over the evaluation set.
    pub eval_loss: f32,
    /// Fraction correct, for classifiers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f32>,
    /// Samples evaluated.
    pub eval_samples: u64,
    /// Peak allocated bytes during the evaluation.
    pub eval_peak_allocated_bytes: u64,
    /// Peak reserved bytes during the evaluation.
    pub eval_peak_reserved_bytes: u64,
}

impl EvalRecord {
    /// The record of `evaluation` after `step` of `epoch`.
    pub fn new(epoch: u64, step: u64, evaluation: &Evaluation) -> Self {
        EvalRecord {
            step,
            epoch,
            eval_loss: evaluation.loss,
            eval_accuracy: evaluation.accuracy,
            eval_samples: evaluation.samples,
            eval_peak_allocated_bytes: evaluation.peak_allocated_bytes,
            eval_peak_reserved_bytes: evaluation.peak_reserved_bytes,
        }
    }
}

/// Receives a run's progress (the `plimsoll` command draws a progress bar from it).
pub trait Observer {
    /// After every step.
    fn on_step(&mut self, report: &StepReport);
    /// After an evaluation of the evaluation set.
    fn on_eval(&mut self, epoch: u64, step: u64, evaluation: &Evaluation);
    /// A log line (out-of-memory recovery, leak warning, checkpoint saved, interruption).
    fn on_log(&mut self, line: &str);
}

/// An observer that ignores everything.
#[derive(Debug, Default)]
pub struct Silent;

impl Observer for Silent {
    fn on_step(&mut self, _: &StepReport) {}
    fn on_eval(&mut self, _: u64, _: u64, _: &Evaluation) {}
    fn on_log(&mut self, _: &str) {}
}

/// A JSON-lines file, one object per step.
#[derive(Debug)]
pub struct JsonLines {
    path: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
}

impl JsonLines {
    /// Creates (truncates) `path`, or appends when `append` (a resumed run).
    pub fn create(path: &Path, append: bool) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(path)
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(JsonLines {
            path: path.to_path_buf(),
            file: std::io::BufWriter::new(file),
        })
    }

    /// Writes one line and flushes it (a crash loses at most the current step).
    pub fn write(&mut self, record: &impl Serialize) -> Result<()> {
        let io = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        let line = serde_json::to_string(record)
            .map_err(|e| Error::invalid(self.path.display().to_string(), e.to_string()))?;
        writeln!(self.file, "{line}").map_err(io)?;
        self.file.flush().map_err(io)
    }
}
