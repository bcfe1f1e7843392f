//! The after-step leak check. After a step (gradients cleared, open batch submitted) the only
//! memory that may stay allocated is parameters, gradients and optimizer state: the trainer
//! keeps nothing else across steps (the loss accumulator, batches, flags and the graph are all
//! dropped inside the step). Anything else is reported by label, category and size, largest
//! first, from an allocator snapshot.

use std::collections::BTreeMap;

use plimsoll_allocator::format_bytes;
use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::Category;

use crate::config::LeakPolicy;
use crate::error::Error;
use crate::observe::hooks::{CheckFailure, HookContext, StepHook};

/// Categories that may stay allocated between steps.
pub const KEPT_CATEGORIES: [Category; 3] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
];

/// One holder of memory that should have been freed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakHolder {
    /// The allocation label.
    pub label: String,
    /// Its category.
    pub category: Category,
    /// Bytes held (block sizes) under this label and category.
    pub bytes: u64,
    /// Number of live blocks.
    pub blocks: u64,
}

/// What the leak check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakReport {
    /// Bytes allocated in the kept categories.
    pub expected_bytes: u64,
    /// Bytes allocated outside them.
    pub leaked_bytes: u64,
    /// Who holds the leaked bytes, largest first.
    pub holders: Vec<LeakHolder>,
}

impl LeakReport {
    /// Whether nothing leaked.
    pub fn is_clean(&self) -> bool {
        self.leaked_bytes == 0
    }

    /// `label (category): size` for each holder, largest first.
    pub fn holders_text(&self) -> String {
        self.holders
            .iter()
            .map(|h| {
                format!(
                    "'{}' ({}, {} block{}): {}",
                    h.label,
                    h.category.name(),
                    h.blocks,
                    if h.blocks == 1 { "" } else { "s" },
                    format_bytes(h.bytes)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Submits the open batch (so blocks freed during the step are returned) and lists every live
/// block outside [`KEPT_CATEGORIES`].
pub fn check(gpu: &Gpu) -> plimsoll_kernels_wgsl::Result<LeakReport> {
    gpu.flush("end of step")?;
    let snapshot = gpu.with_allocator(|a| a.snapshot());
    let mut expected_bytes = 0;
    let mut leaked_bytes = 0;
    let mut by_label: BTreeMap<(String, Category), (u64, u64)> = BTreeMap::new();
    for segment in &snapshot.segments {
        for block in segment.blocks.iter().filter(|b| !b.free) {
            let category = block.category.unwrap_or(Category::Other);
            if KEPT_CATEGORIES.contains(&category) {
                expected_bytes += block.size_bytes;
                continue;
            }
            leaked_bytes += block.size_bytes;
            let label = block.label.clone().unwrap_or_else(|| "?".to_string());
            let entry = by_label.entry((label, category)).or_default();
            entry.0 += block.size_bytes;
            entry.1 += 1;
        }
    }
    let mut holders: Vec<LeakHolder> = by_label
        .into_iter()
        .map(|((label, category), (bytes, blocks))| LeakHolder {
            label,
            category,
            bytes,
            blocks,
        })
        .collect();
    holders.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.label.cmp(&b.label)));
    Ok(LeakReport {
        expected_bytes,
        leaked_bytes,
        holders,
    })
}

/// The check after every step, as the configuration's leak policy says: off, a warning in the
/// log, or [`Error::Leak`].
#[derive(Debug, Default)]
pub(crate) struct LeakCheck;

impl StepHook for LeakCheck {
    fn check_step(&mut self, cx: &mut HookContext<'_>, step: u64) -> Result<(), CheckFailure> {
        if cx.config.leak_policy == LeakPolicy::Off {
            return Ok(());
        }
        // After the update was submitted: the state after this step is the good one.
        let report = check(cx.gpu).map_err(|e| CheckFailure::Device(e.into()))?;
        if report.is_clean() {
            return Ok(());
        }
        let error = Error::Leak {
            step,
            leaked_bytes: report.leaked_bytes,
            expected_bytes: report.expected_bytes,
            holders: report.holders_text(),
        };
        match cx.config.leak_policy {
            LeakPolicy::Error => Err(CheckFailure::Refused(error)),
            _ => {
                cx.note(format!("warning: {error}"));
                Ok(())
            }
        }
    }
}
