//! [`MemoryPlan`]: what the plan chose, with every dry run behind it, and how it reads.

use std::fmt;

use plimsoll_allocator::format_bytes;

use plimsoll_kernels_wgsl::Category;

use super::dry_run::MAX_REPLAYED_EVENTS;
use super::{Probe, segment_name};

/// The plan: what the trainer will use, and why.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct MemoryPlan {
    /// The budget planned against.
    pub budget_bytes: u64,
    /// Bytes kept free for what the dry run cannot see (see the module docs).
    pub margin_bytes: u64,
    /// The effective batch.
    pub effective_batch: usize,
    /// The chosen micro-batch.
    pub micro_batch: usize,
    /// The chosen checkpoint segment length (0: none).
    pub segment_len: usize,
    /// What activations are stored in (`f32` or `f16`: the run's `--precision`).
    pub precision: String,
    /// Predicted peak allocated bytes of a step with the choice.
    pub predicted_peak_bytes: u64,
    /// Predicted peak reserved bytes of the run (steps and evaluation).
    pub predicted_peak_reserved_bytes: u64,
    /// Predicted peak allocated bytes of evaluating in chunks of the chosen micro-batch.
    pub predicted_eval_peak_bytes: Option<u64>,
    /// Rows per chunk of the loss at the chosen micro-batch (`None`: not chunked).
    pub loss_chunk_rows: Option<usize>,
    /// The recipe's memory-efficient variant, when the plan chose it
    /// ([`crate::Recipe::memory_efficient_variant`]): what it changes and why.
    pub variant: Option<String>,
    /// Training batches the loader thread keeps ready in host memory (`TrainConfig::prefetch`).
    pub prefetch: usize,
    /// Host bytes those batches take (not device memory: each micro-batch is uploaded when the
    /// step reaches it, as the dry runs did).
    pub loader_host_bytes: u64,
    /// Said when the choice splits the batch of a model that is not micro-batch invariant
    /// ([`crate::Recipe::micro_batch_invariant`]: BatchNorm).
    pub micro_batch_note: Option<String>,
    /// Where the optimizer's state lives (`none`: on the device; `optimizer`: in host memory,
    /// [`crate::config::Offload`]); with `--offload auto` the plan's choice.
    pub offload: String,
    /// Host bytes the offloaded state takes (0 on the device).
    pub offload_host_bytes: u64,
    /// Host bytes the offloaded activations take at most in a step ([`crate::Offload::Activations`];
    /// 0 otherwise).
    pub offload_activation_bytes: u64,
    /// Parameters streamed: in host memory between their uses, with their gradients (8 bytes
    /// each there; [`crate::Offload::Parameters`]; 0 otherwise).
    pub offload_streamed_parameters: u64,
    /// Bytes the offloaded update moves between host and device each step (0 on the device).
    pub offload_transfer_bytes: u64,
    /// Every dry run, in the order made.
    pub probes: Vec<Probe>,
    /// Wall time of the plan, ms.
    pub plan_ms: f64,
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "memory plan (budget {}; {} dry runs on a planning device, no kernel run, in {:.0} ms)",
            format_bytes(self.budget_bytes),
            self.probes.len(),
            self.plan_ms
        )?;
        writeln!(
            f,
            "  {:<14} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            "checkpointing",
            "micro",
            "peak",
            "reserved",
            "parameter",
            "optimizer",
            "activation",
            "eval peak",
            "fits"
        )?;
        for p in &self.probes {
            let c = |cat: Category| format_bytes(p.category_peaks[cat.index()]);
            writeln!(
                f,
                "  {:<14} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
                segment_name(p.segment_len) + if p.variant { " *" } else { "" },
                p.micro_batch,
                format_bytes(p.peak_allocated_bytes),
                format_bytes(p.peak_reserved_bytes),
                c(Category::Parameter),
                c(Category::OptimizerState),
                c(Category::Activation),
                p.eval_peak_allocated_bytes
                    .map_or("-".to_string(), format_bytes),
                if p.fits() {
                    "yes"
                } else if p.too_large.is_some() {
                    "past one binding"
                } else if p.past_loop_limit.is_some() {
                    "past the loop limit"
                } else {
                    "out of memory"
                },
            )?;
        }
        if self.probes.iter().any(|p| p.variant) {
            writeln!(
                f,
                "  *: a dry run of the model's memory-efficient variant (a language model's fused attention or chunked loss)"
            )?;
        }
        let replayed = self.probes.iter().map(|p| p.events_replayed).max();
        writeln!(
            f,
            "  margin: {} (each dry run replays the run's steps, partial batches and evaluations \
             until the allocator's state repeats: at most {} of them here)",
            format_bytes(self.margin_bytes),
            replayed.unwrap_or(0)
        )?;
        if self.probes.iter().any(|p| !p.converged) {
            writeln!(
                f,
                "  note: in some dry runs the allocator's state did not repeat within {} steps \
                 and evaluation chunks; later steps may reserve more than predicted \
                 (out-of-memory recovery covers them)",
                MAX_REPLAYED_EVENTS
            )?;
        }
        write!(
            f,
            "  choice: effective batch {} = {}, checkpointing {}, {}; predicted peak {} \
             allocated, {} reserved ({:.0}% of the budget); evaluation in chunks of {}: {}",
            self.effective_batch,
            super::micro_batches_in_words(self.effective_batch, self.micro_batch),
            segment_name(self.segment_len),
            self.precision,
            format_bytes(self.predicted_peak_bytes),
            format_bytes(self.predicted_peak_reserved_bytes),
            100.0 * self.predicted_peak_reserved_bytes as f64 / self.budget_bytes.max(1) as f64,
            self.micro_batch,
            match self.predicted_eval_peak_bytes {
                None => "out of memory (it will split its chunks)".to_string(),
                Some(0) => "none (no evaluation set)".to_string(),
                Some(b) => format!("peak {}", format_bytes(b)),
            }
        )?;
        if let Some(rows) = self.loss_chunk_rows {
            write!(f, "; loss in chunks of {rows} rows")?;
        }
        if let Some(variant) = &self.variant {
            write!(f, "; {variant}")?;
        }
        if let Some(note) = &self.micro_batch_note {
            write!(f, "\n  note: {note}")?;
        }
        if self.offload_host_bytes > 0 {
            let activations = match self.offload_activation_bytes {
                0 => String::new(),
                n => format!(
                    ", and the inputs checkpointed segments keep ({} at most)",
                    format_bytes(n)
                ),
            };
            let streamed = match self.offload_streamed_parameters {
                0 => String::new(),
                n => format!(
                    ", and {n} parameters of the blocks streamed ({} in host memory with their \
                     gradients; each segment's brought up for its forward and its \
                     recomputation, their gradients accumulated on the host)",
                    format_bytes(n.saturating_mul(8))
                ),
            };
            write!(
                f,
                "\n  offload: the optimizer's state in host memory ({}; --offload {}), its update \
                 on the host{activations}{streamed}; each step moves {} between host and device",
                format_bytes(self.offload_host_bytes),
                self.offload,
                format_bytes(self.offload_transfer_bytes)
            )?;
        }
        if self.loader_host_bytes > 0 {
            write!(
                f,
                "\n  host: {} for the batches the loader builds ({} ahead; --prefetch)",
                format_bytes(self.loader_host_bytes),
                self.prefetch
            )?;
        }
        Ok(())
    }
}
