//! A [`Timeline`] in the snapshot format of PyTorch's memory_viz
//! (`torch.cuda.memory._snapshot()` pickled; <https://pytorch.org/memory_viz> opens it). Segments
//! get made-up addresses (segment id + 1, shifted left by 32 bits), so every block and event has
//! a distinct address, as on a real device.

use serde::Serialize;

use plimsoll_allocator::{SegmentId, TraceEventKind};

use crate::error::{Error, Result};
use crate::timeline::Timeline;

#[derive(Serialize)]
struct Frame {
    filename: String,
    line: i64,
    name: String,
}

#[derive(Serialize)]
struct Block {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<Frame>,
}

#[derive(Serialize)]
struct Segment {
    device: i64,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: i64,
    segment_type: &'static str,
    segment_pool_id: (i64, i64),
    is_expandable: bool,
    frames: Vec<Frame>,
    blocks: Vec<Block>,
}

#[derive(Serialize)]
struct TraceEntry {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: i64,
    time_us: u64,
    frames: Vec<Frame>,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_free: Option<u64>,
}

#[derive(Serialize)]
struct AllocatorSettings {
    budget_bytes: Option<u64>,
    source: &'static str,
}

#[derive(Serialize)]
struct Snapshot {
    segments: Vec<Segment>,
    device_traces: Vec<Vec<TraceEntry>>,
    categories: Vec<&'static str>,
    allocator_settings: AllocatorSettings,
}

/// The made-up device address of segment `id`.
pub fn segment_address(id: SegmentId) -> u64 {
    (u64::from(id.0) + 1) << 32
}

/// Where PyTorch records a stack: here the allocation's label and category.
fn frames(label: Option<&str>, category: Option<&'static str>) -> Vec<Frame> {
    match label {
        Some(label) => vec![Frame {
            filename: label.to_string(),
            line: 0,
            name: category.unwrap_or("other").to_string(),
        }],
        None => Vec::new(),
    }
}

/// The memory_viz snapshot of `timeline`, pickled (protocol 3).
///
/// # Errors
/// [`Error::Invalid`] if serde-pickle refuses a value (it should not).
pub fn snapshot_pickle(timeline: &Timeline) -> Result<Vec<u8>> {
    let segments = timeline
        .end
        .segments
        .iter()
        .map(|s| {
            let base = segment_address(s.id);
            let blocks: Vec<Block> = s
                .blocks
                .iter()
                .map(|b| Block {
                    address: base + b.offset,
                    size: b.size_bytes,
                    requested_size: b.size_bytes,
                    state: if b.free {
                        "inactive"
                    } else {
                        "active_allocated"
                    },
                    frames: frames(b.label.as_deref(), b.category.map(|c| c.name())),
                })
                .collect();
            let allocated: u64 = s
                .blocks
                .iter()
                .filter(|b| !b.free)
                .map(|b| b.size_bytes)
                .sum();
            Segment {
                device: 0,
                address: base,
                total_size: s.size_bytes,
                allocated_size: allocated,
                active_size: allocated,
                requested_size: allocated,
                stream: 0,
                segment_type: if s.shared { "small" } else { "large" },
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: Vec::new(),
                blocks,
            }
        })
        .collect();
    let mut reserved = timeline.start.stats.reserved_bytes;
    let mut trace = Vec::new();
    for e in &timeline.trace.events {
        let category = e.category.map(|c| c.name());
        let addr = e.segment.map_or(0, segment_address) + e.offset;
        let entry = |action| TraceEntry {
            action,
            addr,
            size: e.size_bytes,
            stream: 0,
            time_us: e.time_ns / 1000,
            frames: frames(e.label.as_deref(), category),
            category,
            device_free: None,
        };
        match e.kind {
            TraceEventKind::Allocate => trace.push(entry("alloc")),
            TraceEventKind::Free => {
                trace.push(entry("free_requested"));
                trace.push(entry("free_completed"));
            }
            TraceEventKind::SegmentCreate => {
                reserved += e.size_bytes;
                trace.push(entry("segment_alloc"));
            }
            TraceEventKind::SegmentRelease => {
                reserved = reserved.saturating_sub(e.size_bytes);
                trace.push(entry("segment_free"));
            }
            TraceEventKind::OutOfMemory => trace.push(TraceEntry {
                addr: 0,
                device_free: Some(
                    timeline
                        .budget_bytes
                        .map_or(0, |b| b.saturating_sub(reserved)),
                ),
                ..entry("oom")
            }),
            TraceEventKind::Phase | TraceEventKind::Mark => {}
        }
    }
    let snapshot = Snapshot {
        segments,
        device_traces: vec![trace],
        categories: plimsoll_allocator::Category::ALL
            .iter()
            .map(|c| c.name())
            .collect(),
        allocator_settings: AllocatorSettings {
            budget_bytes: timeline.budget_bytes,
            source: "plimsoll caching allocator",
        },
    };
    serde_pickle::to_vec(&snapshot, serde_pickle::SerOptions::new())
        .map_err(|e| Error::invalid("memory_snapshot.pickle", e.to_string()))
}
