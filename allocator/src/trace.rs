//! Optional bounded recording of allocator events.

use std::collections::VecDeque;
use std::time::Instant;

use serde::Serialize;

use crate::{AllocationId, Category, Phase, SegmentId};

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceEventKind {
    /// A block was handed out.
    Allocate,
    /// A block was given back.
    Free,
    /// A segment was created.
    SegmentCreate,
    /// A segment was released.
    SegmentRelease,
    /// An allocation failed with out-of-memory.
    OutOfMemory,
    /// A phase began ([`crate::BufferAllocator::set_phase`]); the event's `step` and `phase` say
    /// which, its label is the phase's name.
    Phase,
    /// A note from the allocator's user ([`crate::BufferAllocator::mark`]), e.g. a recovery from
    /// out-of-memory; the label is the note.
    Mark,
}

/// One recorded event.
#[derive(Clone, Debug, Serialize)]
pub struct TraceEvent {
    /// Position of the event in the allocator's history (counts events dropped from the front).
    pub event: u64,
    /// What happened.
    pub kind: TraceEventKind,
    /// The allocation's sequence number (allocate and free only).
    pub allocation: Option<AllocationId>,
    /// The segment concerned (none for out-of-memory).
    pub segment: Option<SegmentId>,
    /// The block's offset in its segment (0 for segment events).
    pub offset: u64,
    /// The block's, segment's or request's size.
    pub size_bytes: u64,
    /// The allocation's category (allocate, free, out-of-memory).
    pub category: Option<Category>,
    /// The allocation's label (allocate, free, out-of-memory), the phase's name, or the note.
    pub label: Option<String>,
    /// Nanoseconds since recording was turned on (stamped by the trace).
    pub time_ns: u64,
    /// The step set with the last phase (stamped by the trace).
    pub step: u64,
    /// The phase the event happened in (stamped by the trace).
    pub phase: Phase,
}

/// The most recent events, at most `capacity` of them (0, the default, records nothing).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Trace {
    /// Most events kept; older ones are dropped first.
    pub capacity: usize,
    /// Events recorded so far, including dropped ones.
    pub recorded: u64,
    /// The kept events, oldest first; `events.len() <= capacity`.
    pub events: VecDeque<TraceEvent>,
    /// When recording was turned on (`time_ns` counts from here).
    #[serde(skip)]
    started: Option<Instant>,
    /// The step and phase stamped on the next events.
    #[serde(skip)]
    context: (u64, Phase),
}

impl Trace {
    /// Whether recording is on.
    pub fn is_enabled(&self) -> bool {
        self.capacity > 0
    }

    /// The trace as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub(crate) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
        if capacity > 0 && self.started.is_none() {
            self.started = Some(Instant::now());
        }
        while self.events.len() > capacity {
            self.events.pop_front();
        }
    }

    /// Records an event; `make` runs only when recording is on, so a disabled trace costs one
    /// branch. The trace stamps `time_ns`, `step` and `phase` (what `make` puts there is ignored).
    #[inline]
    pub(crate) fn record(&mut self, make: impl FnOnce(u64) -> TraceEvent) {
        if self.capacity > 0 {
            self.push(make(self.recorded));
        }
    }

    /// Sets the step and phase stamped on the events that follow.
    pub(crate) fn set_context(&mut self, step: u64, phase: Phase) {
        self.context = (step, phase);
    }

    #[inline(never)]
    fn push(&mut self, mut event: TraceEvent) {
        event.time_ns = self.started.map_or(0, |t| {
            u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
        });
        (event.step, event.phase) = self.context;
        if self.events.len() == self.capacity {
            self.events.pop_front();
        }
        self.recorded += 1;
        self.events.push_back(event);
    }
}
