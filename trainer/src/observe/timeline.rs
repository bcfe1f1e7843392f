//! The memory timeline: the allocator's trace of chosen steps ([`TrainConfig::memory_timeline`]),
//! written into the run directory as
//! - `memory_timeline.json`: the events, compactly ([`Timeline::data`]);
//! - `memory_timeline.html`: a self-contained page (no network, no external script) that stacks
//!   live bytes by category or label over events or time, with reserved bytes, the budget, step
//!   and phase boundaries, out-of-memory events and recoveries;
//! - `memory_snapshot.pickle`: the same trace in the snapshot format PyTorch's memory_viz reads
//!   (`segments` with their blocks at the end, `device_traces` with `alloc`, `free_requested`,
//!   `free_completed`, `segment_alloc`, `segment_free` and `oom` actions). Each allocation's
//!   label and category stand where PyTorch puts a stack frame.
//!
//! [`TrainConfig::memory_timeline`]: crate::TrainConfig::memory_timeline

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use plimsoll_allocator::{Category, Phase, Snapshot, Trace, TraceEventKind, format_bytes};
use serde::Serialize;
use serde_json::json;

use crate::error::{Error, Result};
use crate::observe::hooks::{HookContext, StepHook};

/// The events, as JSON.
pub const TIMELINE_JSON: &str = "memory_timeline.json";
/// The page.
pub const TIMELINE_HTML: &str = "memory_timeline.html";
/// The memory_viz snapshot.
pub const SNAPSHOT_PICKLE: &str = "memory_snapshot.pickle";
/// Most events a timeline keeps (older ones are dropped first, and the page says how many).
pub const MAX_EVENTS: usize = 1_000_000;

/// The chart code both pages embed.
pub(crate) const CHARTS_JS: &str = include_str!("../../assets/charts.js");
/// The pages' style sheet.
pub(crate) const STYLE_CSS: &str = include_str!("../../assets/style.css");
const TIMELINE_TEMPLATE: &str = include_str!("../../assets/timeline.html");

/// Steps `first..=last` (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StepSpan {
    /// The first step recorded.
    pub first: u64,
    /// The last step recorded.
    pub last: u64,
}

/// "step 3" for one step, "steps 1-3" for several.
impl std::fmt::Display for StepSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.first == self.last {
            true => write!(f, "step {}", self.first),
            false => write!(f, "steps {}-{}", self.first, self.last),
        }
    }
}

impl StepSpan {
    /// Parses `N` (step N alone) or `A-B` (steps A to B).
    ///
    /// # Errors
    /// [`Error::Invalid`] for anything else, a step 0, or `A > B`.
    pub fn parse(text: &str) -> Result<StepSpan> {
        let bad = |why: &str| {
            Error::invalid(
                "--memory-timeline",
                format!("{text:?}: {why}; give a step (3) or a range of steps (1-3), or off"),
            )
        };
        let (a, b) = text.split_once('-').unwrap_or((text, text));
        let first: u64 = a.trim().parse().map_err(|_| bad("not a step number"))?;
        let last: u64 = b.trim().parse().map_err(|_| bad("not a step number"))?;
        if first == 0 {
            return Err(bad("steps count from 1"));
        }
        if first > last {
            return Err(bad("the range ends before it begins"));
        }
        Ok(StepSpan { first, last })
    }

    /// Whether `step` is in the span.
    pub fn contains(&self, step: u64) -> bool {
        (self.first..=self.last).contains(&step)
    }
}

/// Host bytes a run keeps on purpose, beside the device memory a timeline records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostBytes {
    /// The loader's batches built ahead, at most so far.
    pub loader: u64,
    /// An offloaded optimizer's state ([`crate::Offload::OptimizerState`]).
    pub optimizer_state: u64,
    /// Offloaded segment inputs, at most in a step, as planned ([`crate::Offload::Activations`]).
    pub activations: u64,
    /// Streamed parameters and their gradients ([`crate::Offload::Parameters`]).
    pub parameters: u64,
}

/// A recorded timeline: the allocator before, its events, and the allocator after.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// What the pages call it (the run).
    pub title: String,
    /// The steps recorded (the last may be cut short by an error or a stop).
    pub span: StepSpan,
    /// The budget on reserved bytes, if any.
    pub budget_bytes: Option<u64>,
    /// The allocator when recording began.
    pub start: Snapshot,
    /// The events.
    pub trace: Trace,
    /// The allocator when recording ended.
    pub end: Snapshot,
    /// What the run kept in host memory.
    pub host: HostBytes,
}

/// Interns labels for the compact form.
#[derive(Default)]
struct Labels {
    ids: HashMap<String, usize>,
    names: Vec<String>,
}

impl Labels {
    fn id(&mut self, label: Option<&str>) -> i64 {
        let Some(label) = label else { return -1 };
        if let Some(&id) = self.ids.get(label) {
            return id as i64;
        }
        let id = self.names.len();
        self.names.push(label.to_string());
        self.ids.insert(label.to_string(), id);
        id as i64
    }
}

fn kind_code(kind: TraceEventKind) -> u8 {
    match kind {
        TraceEventKind::Allocate => 0,
        TraceEventKind::Free => 1,
        TraceEventKind::SegmentCreate => 2,
        TraceEventKind::SegmentRelease => 3,
        TraceEventKind::OutOfMemory => 4,
        TraceEventKind::Phase => 5,
        TraceEventKind::Mark => 6,
    }
}

impl Timeline {
    /// Events dropped from the front because the trace was full.
    pub fn dropped_events(&self) -> u64 {
        self.trace.recorded - self.trace.events.len() as u64
    }

    /// One line about the timeline: steps, events, peaks.
    pub fn summary(&self) -> String {
        let dropped = match self.dropped_events() {
            0 => String::new(),
            n => format!(" (the first {n} dropped: the trace keeps {MAX_EVENTS})"),
        };
        let h = &self.host;
        let mut host = vec![format!("the loader's batches {}", format_bytes(h.loader))];
        if h.optimizer_state > 0 {
            host.push(format!(
                "the optimizer's state {}",
                format_bytes(h.optimizer_state)
            ));
        }
        if h.activations > 0 {
            let at_most = format_bytes(h.activations);
            host.push(format!("checkpointed segments' inputs {at_most} at most"));
        }
        if h.parameters > 0 {
            let streamed = format_bytes(h.parameters);
            host.push(format!("streamed parameters and gradients {streamed}"));
        }
        format!(
            "{}: {}, {} events{dropped}; peak allocated {}, peak reserved {}{}; host memory: {}",
            self.title,
            self.span,
            self.trace.events.len(),
            format_bytes(self.end.stats.peak_allocated_bytes),
            format_bytes(self.end.stats.peak_reserved_bytes),
            self.budget_bytes
                .map(|b| format!(", budget {}", format_bytes(b)))
                .unwrap_or_default(),
            host.join(", ")
        )
    }

    /// The compact form the pages draw: `events` are `[time_us, kind, bytes, category, label,
    /// step, phase]` (kind: 0 allocate, 1 free, 2 segment created, 3 segment released, 4 out of
    /// memory, 5 phase, 6 note; -1 where a field does not apply), `initial` the live blocks
    /// (`[label, category, bytes]`) and reserved bytes when recording began.
    pub fn data(&self) -> serde_json::Value {
        let mut labels = Labels::default();
        let live: Vec<_> = self
            .start
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| !b.free)
            .map(|b| {
                json!([
                    labels.id(b.label.as_deref()),
                    b.category.map_or(Category::Other.index(), Category::index),
                    b.size_bytes
                ])
            })
            .collect();
        let events: Vec<_> = self
            .trace
            .events
            .iter()
            .map(|e| {
                json!([
                    e.time_ns / 1000,
                    kind_code(e.kind),
                    e.size_bytes,
                    e.category.map_or(-1, |c| c.index() as i64),
                    labels.id(e.label.as_deref()),
                    e.step,
                    e.phase.index()
                ])
            })
            .collect();
        json!({
            "title": self.title,
            "summary": self.summary(),
            "span": self.span,
            "budget": self.budget_bytes,
            "dropped": self.dropped_events(),
            "categories": Category::ALL.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "phases": Phase::ALL.iter().map(|p| p.name()).collect::<Vec<_>>(),
            "labels": labels.names,
            "initial": { "live": live, "reserved": self.start.stats.reserved_bytes },
            "host": self.host,
            "events": events,
        })
    }

    /// The self-contained page.
    pub fn html(&self) -> String {
        self.page(&self.data())
    }

    /// The page around `data` (this timeline's [`Timeline::data`]).
    fn page(&self, data: &serde_json::Value) -> String {
        TIMELINE_TEMPLATE
            .replace("{{STYLE}}", STYLE_CSS)
            .replace("{{CHARTS}}", CHARTS_JS)
            .replace("{{TITLE}}", &html_escape(&self.title))
            .replace("{{DATA}}", &script_json(data))
    }

    /// Writes the three files into `dir` (JSON, page, pickle); returns their paths. When an
    /// earlier part of a resumed run left its timeline there, the names take `-part<N>`
    /// ([`crate::run_dir::unused_names`]): each part's timeline is kept.
    ///
    /// # Errors
    /// [`Error::Io`] when a file cannot be written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let pickle = crate::memory_viz::snapshot_pickle(self)?;
        let data = self.data();
        let paths =
            crate::run_dir::unused_names(dir, &[TIMELINE_JSON, TIMELINE_HTML, SNAPSHOT_PICKLE]);
        let files: [Vec<u8>; 3] = [
            data.to_string().into_bytes(),
            self.page(&data).into_bytes(),
            pickle,
        ];
        let mut written = Vec::new();
        for (path, bytes) in paths.into_iter().zip(files) {
            std::fs::write(&path, bytes).map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            written.push(path);
        }
        Ok(written)
    }
}

/// JSON safe inside a `<script>` element (no `</script>` can end it early).
pub(crate) fn script_json(value: &serde_json::Value) -> String {
    value.to_string().replace("</", "<\\/")
}

/// `text` with HTML's special characters escaped.
pub(crate) fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The recording in progress.
#[derive(Debug, Default)]
pub(crate) struct Recording {
    /// The allocator when recording began, and the first step recorded.
    started: Option<(Snapshot, u64)>,
    /// The last timeline finished.
    pub(crate) finished: Option<Timeline>,
    /// Whether the run already said it recorded none.
    reported_missing: bool,
}

impl StepHook for Recording {
    /// Starts recording when the configured span begins at `step`.
    fn before_step(&mut self, cx: &mut HookContext<'_>, step: u64) {
        let Some(span) = cx.config.memory_timeline else {
            return;
        };
        if self.started.is_some() || !span.contains(step) {
            return;
        }
        let start = cx.gpu.with_allocator(|a| {
            a.set_trace_capacity(0);
            a.set_trace_capacity(MAX_EVENTS);
            a.snapshot()
        });
        self.started = Some((start, step));
    }

    /// Ends the recording when the span is over (after the step's evaluation: it is drawn too).
    fn after_evaluation(&mut self, cx: &mut HookContext<'_>, step: u64) {
        if cx
            .config
            .memory_timeline
            .is_some_and(|span| step >= span.last)
        {
            self.finish_recording(cx, step);
        }
    }

    fn finish(&mut self, cx: &mut HookContext<'_>, step: u64) {
        self.finish_recording(cx, step);
    }
}

impl Recording {
    /// Ends a recording in progress (at the end of a run, or when a step gave up at `step`) and
    /// writes it into the checkpoint directory, if there is one; a file that cannot be written
    /// is a note, not an error. Returns the timeline, also kept in `finished`.
    pub(crate) fn finish_recording(
        &mut self,
        cx: &mut HookContext<'_>,
        step: u64,
    ) -> Option<&Timeline> {
        let Some((start, first)) = self.started.take() else {
            if let Some(span) = cx.config.memory_timeline
                && self.finished.is_none()
                && !self.reported_missing
                && step < span.first
            {
                self.reported_missing = true;
                cx.note(format!(
                    "no memory timeline: the run stopped at step {step}, before step {} of \
                     --memory-timeline {}-{}",
                    span.first, span.first, span.last
                ));
            }
            return None;
        };
        let (trace, end, budget) = cx.gpu.with_allocator(|a| {
            let trace = a.trace().clone();
            a.set_trace_capacity(0);
            (trace, a.snapshot(), a.budget_bytes())
        });
        let title = cx
            .config
            .checkpoint_dir
            .as_deref()
            .and_then(Path::file_name)
            .map_or_else(|| "run".to_string(), |n| n.to_string_lossy().into_owned());
        let timeline = Timeline {
            title,
            span: StepSpan {
                first,
                last: step.max(first),
            },
            budget_bytes: (budget != u64::MAX).then_some(budget),
            start,
            trace,
            end,
            host: cx.host,
        };
        if let Some(dir) = cx.config.checkpoint_dir.as_deref() {
            match timeline.write(dir) {
                Ok(paths) => cx.note(format!(
                    "memory timeline of {}: {}",
                    timeline.span,
                    paths.get(1).unwrap_or(&dir.join(TIMELINE_HTML)).display()
                )),
                Err(e) => cx.note(format!("warning: the memory timeline was not saved: {e}")),
            }
        }
        self.finished = Some(timeline);
        self.finished.as_ref()
    }
}
