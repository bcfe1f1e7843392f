//! The `torch.cuda.memory_summary()`-style table.

use std::fmt;

use serde::Serialize;

use crate::{Category, Stats, format_bytes};

/// Bytes held under one label.
#[derive(Clone, Debug, Serialize)]
pub struct LabelUsage {
    /// The label.
    pub label: String,
    /// Bytes in its live allocations.
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` since creation (`reset_peaks` does not reset it).
    pub peak_allocated_bytes: u64,
    /// Its live allocations.
    pub live_allocations: u64,
}

/// What `Display` prints as a table: statistics, budget and the ten largest labels.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The statistics.
    pub stats: Stats,
    /// The budget on reserved bytes (`u64::MAX`: none).
    pub budget_bytes: u64,
    /// The ten labels holding the most bytes now, largest first.
    pub top_labels: Vec<LabelUsage>,
}

impl<S: crate::SegmentSource> crate::BufferAllocator<S> {
    /// The memory summary; print it with `{}`.
    pub fn summary(&self) -> Summary {
        let top_labels = self
            .labels
            .top(10)
            .into_iter()
            .map(|entry| LabelUsage {
                label: entry.name.to_string(),
                allocated_bytes: entry.allocated_bytes,
                peak_allocated_bytes: entry.lifetime_peak_bytes.max(entry.peak_allocated_bytes),
                live_allocations: entry.live_allocations,
            })
            .collect();
        Summary {
            stats: self.stats(),
            budget_bytes: self.config.budget_bytes,
            top_labels,
        }
    }
}

const RULE: &str = "|===========================================================================|";
const THIN: &str = "|---------------------------------------------------------------------------|";

fn row(f: &mut fmt::Formatter<'_>, name: &str, current: String, peak: String) -> fmt::Result {
    writeln!(f, "| {name:<35} | {current:>16} | {peak:>16} |")
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stats = &self.stats;
        let bytes = |value: u64| format_bytes(value);
        writeln!(f, "{RULE}")?;
        writeln!(f, "| {:<73} |", "Plimsoll memory summary")?;
        writeln!(f, "{RULE}")?;
        row(f, "metric", "current".into(), "peak".into())?;
        writeln!(f, "{THIN}")?;
        row(
            f,
            "allocated",
            bytes(stats.allocated_bytes),
            bytes(stats.lifetime.allocated_bytes),
        )?;
        for category in Category::ALL {
            let entry = stats.category(category);
            row(
                f,
                &format!("  {}", category.name()),
                bytes(entry.allocated_bytes),
                bytes(stats.lifetime.category_allocated_bytes[category.index()]),
            )?;
        }
        row(
            f,
            "requested",
            bytes(stats.requested_bytes),
            bytes(stats.lifetime.requested_bytes),
        )?;
        row(
            f,
            "reserved",
            bytes(stats.reserved_bytes),
            bytes(stats.lifetime.reserved_bytes),
        )?;
        let budget = if self.budget_bytes == u64::MAX {
            "none".to_owned()
        } else {
            bytes(self.budget_bytes)
        };
        row(f, "budget", budget, String::new())?;
        writeln!(f, "{THIN}")?;
        row(
            f,
            "free in reserved",
            bytes(stats.free_bytes),
            String::new(),
        )?;
        row(
            f,
            "largest free block",
            bytes(stats.largest_free_bytes),
            String::new(),
        )?;
        row(
            f,
            "fragmentation",
            format!("{:.3}", stats.fragmentation),
            String::new(),
        )?;
        row(f, "rounding waste", bytes(stats.waste_bytes), String::new())?;
        writeln!(f, "{THIN}")?;
        let count = |value: u64| value.to_string();
        row(
            f,
            "live allocations / free blocks",
            count(stats.live_allocations),
            count(stats.free_blocks),
        )?;
        row(
            f,
            "allocations / frees",
            count(stats.allocations),
            count(stats.frees),
        )?;
        row(
            f,
            "splits / merges",
            count(stats.splits),
            count(stats.merges),
        )?;
        row(
            f,
            "segments live / created",
            count(stats.segments),
            count(stats.segments_created),
        )?;
        row(
            f,
            "segments released",
            count(stats.segments_released),
            String::new(),
        )?;
        row(
            f,
            "out-of-memory errors / cache retries",
            count(stats.out_of_memory_errors),
            count(stats.retries_after_releasing_cache),
        )?;
        writeln!(f, "{RULE}")?;
        row(f, "largest labels", "current".into(), "peak".into())?;
        writeln!(f, "{THIN}")?;
        if self.top_labels.is_empty() {
            row(f, "(nothing allocated)", String::new(), String::new())?;
        }
        for usage in &self.top_labels {
            let mut label = usage.label.clone();
            if label.chars().count() > 35 {
                label = label.chars().take(34).collect::<String>() + "…";
            }
            row(
                f,
                &label,
                bytes(usage.allocated_bytes),
                bytes(usage.peak_allocated_bytes),
            )?;
        }
        writeln!(f, "{RULE}")
    }
}
