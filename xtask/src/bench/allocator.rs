//! The allocator suite: allocate+free pair latency against `offset-allocator`, and a synthetic
//! training trace that measures reserved-over-allocated overhead and fragmentation at the peak.
//!
//! Everything is seeded (splitmix64, written here) so two runs replay the same actions; both
//! allocators see exactly the same sequence of sizes and frees.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Instant;

use anyhow::{Context, Result};
use plimsoll_allocator::{
    Allocation, AllocatorConfig, BufferAllocator, Category, Request, SegmentId, SegmentSource,
};

use super::Report;

/// `offset-allocator` counts in u32 units; one unit is this many bytes (the plimsoll granule).
const UNIT_BYTES: u64 = 256;
const MIN_BYTES: u64 = 256;
const MAX_BYTES: u64 = 4 << 20;
/// Pairs per timed batch, and timed batches per live count (the median batch is reported).
const PAIRS_PER_BATCH: usize = 1_000;
const BATCHES: usize = 101;

/// Runs the allocator suite.
pub fn run() -> Result<Report> {
    let mut report = Report::new("allocator");
    println!("allocator: allocate+free pairs, sizes log-uniform {MIN_BYTES} B..4 MiB");
    for live in [1_000, 10_000, 100_000] {
        let actions = PairActions::new(live, 0x5eed_0000 + live as u64);
        let (plimsoll, memory) = pairs_plimsoll(&actions)?;
        let offset = pairs_offset_allocator(&actions)?;
        let tag = format!("{}k_live", live / 1000);
        report.push(format!("alloc_free_pair_{tag}/plimsoll"), plimsoll, "ns");
        report.push(
            format!("alloc_free_pair_{tag}/offset_allocator"),
            offset,
            "ns",
        );
        report.push(
            format!("alloc_free_pair_{tag}/ratio_plimsoll_over_offset"),
            plimsoll / offset,
            "ratio",
        );
        report.push(
            format!("alloc_free_pair_{tag}/plimsoll_waste_over_allocated_at_end"),
            memory.waste_over_allocated,
            "ratio",
        );
        report.push(
            format!("alloc_free_pair_{tag}/plimsoll_reserved_over_requested_at_end"),
            memory.reserved_over_requested,
            "ratio",
        );
    }
    println!("allocator: synthetic training trace (MLP, 100 steps, varying batch)");
    let trace = training_trace(100, 0x7ace);
    let plimsoll = trace_plimsoll(&trace)?;
    let offset = trace_offset_allocator(&trace)?;
    for (name, figures) in [("plimsoll", plimsoll), ("offset_allocator", offset)] {
        report.push(
            format!("trace_peak_allocated/{name}"),
            figures.peak_allocated as f64 / (1 << 20) as f64,
            "MiB",
        );
        report.push(
            format!("trace_peak_reserved/{name}"),
            figures.peak_reserved as f64 / (1 << 20) as f64,
            "MiB",
        );
        report.push(
            format!("trace_peak_reserved_over_peak_allocated/{name}"),
            figures.peak_reserved as f64 / figures.peak_allocated as f64,
            "ratio",
        );
        report.push(
            format!("trace_fragmentation_at_peak/{name}"),
            figures.fragmentation_at_peak,
            "ratio",
        );
    }
    Ok(report)
}

/// splitmix64: tiny, seeded, good enough to draw sizes.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Log-uniform in [low, high].
    fn log_uniform(&mut self, low: u64, high: u64) -> u64 {
        let (low_ln, high_ln) = ((low as f64).ln(), (high as f64).ln());
        ((low_ln + self.unit() * (high_ln - low_ln)).exp() as u64).clamp(low, high)
    }
}

/// The same action list for both allocators: `live` initial blocks, then pairs of
/// (allocate `size`, free the live block at `pick % live`).
struct PairActions {
    initial: Vec<u64>,
    pairs: Vec<(u64, usize)>,
}

impl PairActions {
    fn new(live: usize, seed: u64) -> Self {
        let mut rng = Rng(seed);
        let initial = (0..live)
            .map(|_| rng.log_uniform(MIN_BYTES, MAX_BYTES))
            .collect();
        let pairs = (0..PAIRS_PER_BATCH * (BATCHES + 10))
            .map(|_| {
                (
                    rng.log_uniform(MIN_BYTES, MAX_BYTES),
                    rng.next_u64() as usize,
                )
            })
            .collect();
        Self { initial, pairs }
    }
}

/// A segment source with no device and no bookkeeping, so only the allocator is timed.
struct NullSource;

impl SegmentSource for NullSource {
    type Segment = ();
    type Error = Infallible;
    fn create_segment(&mut self, _id: SegmentId, _size_bytes: u64) -> Result<(), Infallible> {
        Ok(())
    }
    fn release_segment(&mut self, _id: SegmentId, _segment: ()) {}
}

fn request(size_bytes: u64, category: Category, label: &str) -> Request<'_> {
    Request {
        size_bytes,
        alignment: 256,
        category,
        label,
    }
}

/// Median ns per pair over timed batches, after ten warm-up batches.
fn median_ns_per_pair(
    mut batch: impl FnMut(&[(u64, usize)]) -> Result<()>,
    pairs: &[(u64, usize)],
) -> Result<f64> {
    let mut samples = Vec::with_capacity(BATCHES);
    for (index, chunk) in pairs.chunks(PAIRS_PER_BATCH).enumerate() {
        let start = Instant::now();
        batch(chunk)?;
        let ns = start.elapsed().as_nanos() as f64 / chunk.len() as f64;
        if index >= 10 {
            samples.push(ns);
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Memory figures of plimsoll at the end of the pair run: internal waste (remainders kept and
/// rounding) over allocated bytes, and reserved over requested bytes (every overhead together).
struct PairMemory {
    waste_over_allocated: f64,
    reserved_over_requested: f64,
}

fn pairs_plimsoll(actions: &PairActions) -> Result<(f64, PairMemory)> {
    let config = AllocatorConfig {
        max_segment_bytes: 64 << 20,
        ..AllocatorConfig::default()
    };
    let mut allocator = BufferAllocator::new(NullSource, config);
    let mut live: Vec<Allocation> = Vec::with_capacity(actions.initial.len() + 1);
    for &size in &actions.initial {
        live.push(allocator.allocate(request(size, Category::Activation, "bench"))?);
    }
    let ns = median_ns_per_pair(
        |chunk| {
            for &(size, pick) in chunk {
                live.push(allocator.allocate(request(size, Category::Activation, "bench"))?);
                let victim = live.swap_remove(pick % live.len());
                allocator.free(victim)?;
            }
            Ok(())
        },
        &actions.pairs,
    )?;
    let stats = allocator.stats();
    let memory = PairMemory {
        waste_over_allocated: stats.waste_bytes as f64 / stats.allocated_bytes as f64,
        reserved_over_requested: stats.reserved_bytes as f64 / stats.requested_bytes as f64,
    };
    Ok((ns, memory))
}

fn pairs_offset_allocator(actions: &PairActions) -> Result<f64> {
    let mut allocator: offset_allocator::Allocator =
        offset_allocator::Allocator::with_max_allocs(u32::MAX / 2, 1 << 21);
    let mut live = Vec::with_capacity(actions.initial.len() + 1);
    let units = |size: u64| size.div_ceil(UNIT_BYTES) as u32;
    for &size in &actions.initial {
        live.push(
            allocator
                .allocate(units(size))
                .context("offset-allocator region too small")?,
        );
    }
    median_ns_per_pair(
        |chunk| {
            for &(size, pick) in chunk {
                live.push(
                    allocator
                        .allocate(units(size))
                        .context("offset-allocator region too small")?,
                );
                let victim = live.swap_remove(pick % live.len());
                allocator.free(victim);
            }
            Ok(())
        },
        &actions.pairs,
    )
}

/// One step of the synthetic trace.
#[derive(Clone, Debug)]
enum TraceAction {
    Allocate {
        key: usize,
        size_bytes: u64,
        category: Category,
        label: String,
    },
    Free {
        key: usize,
    },
}

/// An MLP's training: parameters and Adam state once; then per step, forward allocates the input
/// and each layer's activation, backward walks the layers in reverse, allocating the gradient
/// flowing in (temporary) and the weight gradient, freeing the activation and the previous
/// temporary; the optimizer step frees the gradients (set to none). Batch varies per step.
fn training_trace(steps: usize, seed: u64) -> Vec<TraceAction> {
    const WIDTHS: [u64; 8] = [784, 2048, 2048, 1024, 1024, 512, 512, 10];
    let mut rng = Rng(seed);
    let mut actions = Vec::new();
    let mut next_key = 0;
    let mut allocate =
        |actions: &mut Vec<TraceAction>, size_bytes: u64, category: Category, label: String| {
            next_key += 1;
            actions.push(TraceAction::Allocate {
                key: next_key,
                size_bytes,
                category,
                label,
            });
            next_key
        };
    for (layer, pair) in WIDTHS.windows(2).enumerate() {
        let weight_bytes = pair[0] * pair[1] * 4;
        allocate(
            &mut actions,
            weight_bytes,
            Category::Parameter,
            format!("linear{layer}.weight"),
        );
        allocate(
            &mut actions,
            pair[1] * 4,
            Category::Parameter,
            format!("linear{layer}.bias"),
        );
        for moment in ["m", "v"] {
            allocate(
                &mut actions,
                weight_bytes,
                Category::OptimizerState,
                format!("adam.{moment}.linear{layer}"),
            );
        }
    }
    for _ in 0..steps {
        let batch = 32 + rng.next_u64() % 225; // 32..=256
        let input = allocate(
            &mut actions,
            batch * WIDTHS[0] * 4,
            Category::Input,
            "batch".into(),
        );
        let mut activations = vec![input];
        for (layer, width) in WIDTHS[1..].iter().enumerate() {
            let key = allocate(
                &mut actions,
                batch * width * 4,
                Category::Activation,
                format!("linear{layer}.forward"),
            );
            activations.push(key);
        }
        let mut gradients = Vec::new();
        let mut incoming: Option<usize> = None;
        for layer in (0..WIDTHS.len() - 1).rev() {
            let grad_in = allocate(
                &mut actions,
                batch * WIDTHS[layer] * 4,
                Category::Temporary,
                format!("linear{layer}.backward"),
            );
            let weight_grad = WIDTHS[layer] * WIDTHS[layer + 1] * 4;
            gradients.push(allocate(
                &mut actions,
                weight_grad,
                Category::Gradient,
                format!("linear{layer}.weight.grad"),
            ));
            gradients.push(allocate(
                &mut actions,
                WIDTHS[layer + 1] * 4,
                Category::Gradient,
                format!("linear{layer}.bias.grad"),
            ));
            if let Some(key) = activations.pop() {
                actions.push(TraceAction::Free { key });
            }
            if let Some(key) = incoming.replace(grad_in) {
                actions.push(TraceAction::Free { key });
            }
        }
        for key in activations.into_iter().chain(incoming).chain(gradients) {
            actions.push(TraceAction::Free { key });
        }
    }
    actions
}

/// Peaks of one replay of the trace.
struct TraceFigures {
    peak_allocated: u64,
    peak_reserved: u64,
    fragmentation_at_peak: f64,
}

fn trace_plimsoll(trace: &[TraceAction]) -> Result<TraceFigures> {
    let mut allocator = BufferAllocator::new(NullSource, AllocatorConfig::default());
    let mut live: BTreeMap<usize, Allocation> = BTreeMap::new();
    let mut fragmentation_at_peak = 0.0;
    let mut peak = 0;
    for action in trace {
        match action {
            TraceAction::Allocate {
                key,
                size_bytes,
                category,
                label,
            } => {
                live.insert(
                    *key,
                    allocator.allocate(request(*size_bytes, *category, label))?,
                );
                if allocator.stats().allocated_bytes > peak {
                    peak = allocator.stats().allocated_bytes;
                    fragmentation_at_peak = allocator.fragmentation();
                }
            }
            TraceAction::Free { key } => {
                if let Some(allocation) = live.remove(key) {
                    allocator.free(allocation)?;
                }
            }
        }
    }
    println!("{}", allocator.summary());
    let stats = allocator.stats();
    Ok(TraceFigures {
        peak_allocated: stats.peak_allocated_bytes,
        peak_reserved: stats.peak_reserved_bytes,
        fragmentation_at_peak,
    })
}

fn trace_offset_allocator(trace: &[TraceAction]) -> Result<TraceFigures> {
    let mut allocator: offset_allocator::Allocator =
        offset_allocator::Allocator::with_max_allocs(u32::MAX / 2, 1 << 20);
    // key -> (offset, units, handle)
    let mut live: BTreeMap<usize, (u64, u64, offset_allocator::Allocation)> = BTreeMap::new();
    let (mut allocated, mut peak_allocated, mut high_water, mut fragmentation_at_peak) =
        (0u64, 0u64, 0u64, 0.0);
    for action in trace {
        match action {
            TraceAction::Allocate {
                key, size_bytes, ..
            } => {
                let units = size_bytes.div_ceil(UNIT_BYTES);
                let handle = allocator
                    .allocate(units as u32)
                    .context("offset-allocator region too small")?;
                let offset = u64::from(handle.offset);
                live.insert(*key, (offset, units, handle));
                allocated += units;
                high_water = high_water.max(offset + units);
                if allocated > peak_allocated {
                    peak_allocated = allocated;
                    fragmentation_at_peak = fragmentation_below(&live, high_water);
                }
            }
            TraceAction::Free { key } => {
                if let Some((_, units, handle)) = live.remove(key) {
                    allocated -= units;
                    allocator.free(handle);
                }
            }
        }
    }
    Ok(TraceFigures {
        peak_allocated: peak_allocated * UNIT_BYTES,
        peak_reserved: high_water * UNIT_BYTES,
        fragmentation_at_peak,
    })
}

/// `1 - largest gap / total gaps` below the high-water mark ("reserved" for one fixed region).
fn fragmentation_below(
    live: &BTreeMap<usize, (u64, u64, offset_allocator::Allocation)>,
    high_water: u64,
) -> f64 {
    let mut intervals: Vec<(u64, u64)> = live
        .values()
        .map(|&(offset, units, _)| (offset, units))
        .collect();
    intervals.sort_unstable();
    let (mut cursor, mut free, mut largest) = (0, 0, 0);
    for (offset, units) in intervals.into_iter().chain([(high_water, 0)]) {
        let gap = offset.saturating_sub(cursor);
        free += gap;
        largest = largest.max(gap);
        cursor = cursor.max(offset + units);
    }
    if free == 0 {
        0.0
    } else {
        1.0 - largest as f64 / free as f64
    }
}
