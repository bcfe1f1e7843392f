//! Kernel profiles of chosen steps ([`crate::TrainConfig::profile_steps`]): each step between
//! `begin_profile` and `end_profile` (see `plimsoll_kernels_wgsl::profile`), then
//! - a kernel table: per kernel stem, calls, total and mean time, share of the step, GFLOP/s
//!   and GB/s from the launchers' own work figures ([`KernelTable`]);
//! - `profile.json` in the run directory: the table, the steps' times and the overhead;
//! - `trace.json`: a Chrome trace (Perfetto and chrome://tracing open it) with a GPU track (one
//!   slice per dispatch) and a CPU track (each step, and record, submit, wait, read-back).
//!
//! The overhead is measured, not assumed: the profiled steps' mean time against the mean of the
//! run's unprofiled steps after step 1, reported at the end of the run.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use plimsoll_kernels_wgsl::{Profile, ProfileMode};
use serde::Serialize;
use serde_json::json;

use crate::error::{Error, Result};
use crate::observe::hooks::{HookContext, StepHook};

/// The kernel table and the steps it covers.
pub const PROFILE_JSON: &str = "profile.json";
/// The Chrome trace.
pub const TRACE_JSON: &str = "trace.json";

/// One step's profile.
#[derive(Debug, Clone)]
pub struct ProfiledStep {
    /// The step.
    pub step: u64,
    /// Its wall time, as its [`crate::StepReport::step_ms`] says.
    pub step_ms: f64,
    /// The profile's wall time, from its start to the end of the wait for its last kernel:
    /// every kernel it timed ran inside it (the step's own time may end before the GPU
    /// finishes its last work).
    pub window_ms: f64,
    /// When its profile began, from the first profiled step's.
    pub offset: Duration,
    /// The profile.
    pub profile: Profile,
}

/// One row of the kernel table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelRow {
    /// The kernel's stem.
    pub stem: String,
    /// Dispatches.
    pub calls: u64,
    /// Total time, ms.
    pub total_ms: f64,
    /// Mean time per dispatch, µs.
    pub mean_us: f64,
    /// Total over the profiled steps' wall time.
    pub share: f64,
    /// GFLOP/s over its total time, where the kernel counts floating-point work.
    pub gflops: Option<f64>,
    /// GB/s over its total time.
    pub gbytes_per_s: Option<f64>,
}

/// Time per kernel over the profiled steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelTable {
    /// How the dispatches were timed.
    pub mode: ProfileMode,
    /// The steps profiled.
    pub steps: Vec<u64>,
    /// Their wall time, ms.
    pub steps_ms: f64,
    /// The sum of every dispatch's time, ms.
    pub kernels_ms: f64,
    /// The time the device was running kernels, ms: per step the union of its dispatches'
    /// intervals (overlapping dispatches count once), summed over the steps.
    pub device_busy_ms: f64,
    /// The host's time, ms: per step its wall time less the CPU's waits on the device during
    /// it (the `wait` spans): recording, bind groups, submission, read-backs' copies and the
    /// autograd's own work, summed over the steps.
    pub host_ms: f64,
    /// Dispatches not timed.
    pub untimed_dispatches: u64,
    /// Rows, longest total first.
    pub rows: Vec<KernelRow>,
    /// The longest GPU time of one submission of the profiled steps (first kernel's start to
    /// last kernel's end), ms.
    pub longest_submission_ms: Option<f64>,
    /// Submissions of the profiled steps.
    pub submissions: u64,
}

impl KernelTable {
    /// The table of `steps`.
    pub fn of(steps: &[ProfiledStep]) -> Option<KernelTable> {
        let mode = steps.first()?.profile.mode;
        let mut by_stem: BTreeMap<&str, (u64, u64, u64, u64)> = BTreeMap::new();
        for s in steps {
            for k in &s.profile.kernels {
                let e = by_stem.entry(k.stem).or_default();
                e.0 += 1;
                e.1 += k.end_ns.saturating_sub(k.start_ns);
                e.2 += k.flops;
                e.3 += k.bytes;
            }
        }
        let steps_ms: f64 = steps.iter().map(|s| s.step_ms).sum();
        let mut rows: Vec<KernelRow> = by_stem
            .into_iter()
            .map(|(stem, (calls, ns, flops, bytes))| {
                let seconds = ns as f64 / 1e9;
                let rate = |work: u64| (work > 0 && ns > 0).then(|| work as f64 / seconds / 1e9);
                KernelRow {
                    stem: stem.to_string(),
                    calls,
                    total_ms: ns as f64 / 1e6,
                    mean_us: ns as f64 / 1e3 / calls.max(1) as f64,
                    share: ns as f64 / 1e6 / steps_ms.max(1e-9),
                    gflops: rate(flops),
                    gbytes_per_s: rate(bytes),
                }
            })
            .collect();
        rows.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        Some(KernelTable {
            mode,
            steps: steps.iter().map(|s| s.step).collect(),
            steps_ms,
            kernels_ms: rows.iter().map(|r| r.total_ms).sum(),
            device_busy_ms: steps.iter().map(|s| busy_ns(&s.profile) as f64 / 1e6).sum(),
            host_ms: steps
                .iter()
                .map(|s| {
                    let until = (s.step_ms * 1e6) as u64;
                    (s.step_ms - waits_ns(&s.profile, until) as f64 / 1e6).max(0.0)
                })
                .sum(),
            untimed_dispatches: steps.iter().map(|s| s.profile.untimed_dispatches).sum(),
            rows,
            longest_submission_ms: steps
                .iter()
                .filter_map(|s| s.profile.longest_submission())
                .map(|(_, ns)| ns as f64 / 1e6)
                .max_by(f64::total_cmp),
            submissions: steps
                .iter()
                .map(|s| {
                    let serials: std::collections::BTreeSet<u64> =
                        s.profile.kernels.iter().map(|k| k.submission).collect();
                    serials.len() as u64
                })
                .sum(),
        })
    }

    /// The table as text, longest first (at most `limit` rows).
    pub fn render(&self, limit: usize) -> String {
        let mut out = format!(
            "{:<22} {:>7} {:>10} {:>10} {:>7} {:>9} {:>8}\n",
            "kernel", "calls", "total ms", "mean us", "share", "GFLOP/s", "GB/s"
        );
        for r in self.rows.iter().take(limit) {
            let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
            out.push_str(&format!(
                "{:<22} {:>7} {:>10.2} {:>10.1} {:>6.1}% {:>9} {:>8}\n",
                r.stem,
                r.calls,
                r.total_ms,
                r.mean_us,
                100.0 * r.share,
                opt(r.gflops),
                opt(r.gbytes_per_s)
            ));
        }
        if self.rows.len() > limit {
            out.push_str(&format!(
                "({} more kernels in profile.json)\n",
                self.rows.len() - limit
            ));
        }
        out.push_str(&format!(
            "kernels total {:.1} ms = {:.0}% of the {} profiled step(s)' {:.1} ms ({})",
            self.kernels_ms,
            100.0 * self.kernels_ms / self.steps_ms.max(1e-9),
            self.steps.len(),
            self.steps_ms,
            self.mode.describe()
        ));
        if self.untimed_dispatches > 0 {
            out.push_str(&format!(
                "; {} dispatches not timed",
                self.untimed_dispatches
            ));
        }
        let per_step = |ms: f64| ms / self.steps.len().max(1) as f64;
        let share = |ms: f64| 100.0 * ms / self.steps_ms.max(1e-9);
        out.push_str(&format!(
            "\nper step: {:.2} ms; the device busy {:.2} ms ({:.0}%), the host outside its \
             waits {:.2} ms ({:.0}%)",
            per_step(self.steps_ms),
            per_step(self.device_busy_ms),
            share(self.device_busy_ms),
            per_step(self.host_ms),
            share(self.host_ms)
        ));
        out
    }
}

/// The time `profile`'s dispatches kept the device busy, ns: the union of their intervals.
pub fn busy_ns(profile: &Profile) -> u64 {
    union_ns(profile.kernels.iter().map(|k| (k.start_ns, k.end_ns)))
}

/// The CPU's time waiting on the device in `profile` before `until_ns` (the step's end), ns:
/// the union of its `wait` spans (a read-back's wait for its fence is one; the rest of a
/// read-back, its copy, submission and unpacking, is the host's work), cut at `until_ns`.
pub fn waits_ns(profile: &Profile, until_ns: u64) -> u64 {
    let waits = profile.cpu.iter().filter(|s| s.name == "wait");
    union_ns(waits.map(|s| (s.start_ns.min(until_ns), s.end_ns.min(until_ns))))
}

/// The length of the union of the intervals `[start, end)`, ns.
fn union_ns(spans: impl Iterator<Item = (u64, u64)>) -> u64 {
    let mut spans: Vec<(u64, u64)> = spans.map(|(s, e)| (s, e.max(s))).collect();
    spans.sort_unstable();
    let (mut covered, mut reached) = (0, 0);
    for (start, end) in spans {
        covered += end.saturating_sub(start.max(reached));
        reached = reached.max(end);
    }
    covered
}

/// The Chrome trace of `steps` (JSON object format; times in µs).
pub fn chrome_trace(steps: &[ProfiledStep]) -> serde_json::Value {
    let us = |ns: u64, offset: Duration| (ns as f64 + offset.as_nanos() as f64) / 1e3;
    let mut events = vec![
        json!({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "plimsoll"}}),
        json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "GPU"}}),
        json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "CPU"}}),
    ];
    for s in steps {
        events.push(json!({
            "name": format!("step {}", s.step), "cat": "step", "ph": "X", "pid": 1, "tid": 2,
            "ts": us(0, s.offset), "dur": s.step_ms * 1e3,
        }));
        for k in &s.profile.kernels {
            events.push(json!({
                "name": k.stem, "cat": "kernel", "ph": "X", "pid": 1, "tid": 1,
                "ts": us(k.start_ns, s.offset),
                "dur": k.end_ns.saturating_sub(k.start_ns) as f64 / 1e3,
                "args": {"submission": k.submission, "flops": k.flops, "bytes": k.bytes, "step": s.step},
            }));
        }
        for c in &s.profile.cpu {
            events.push(json!({
                "name": c.name, "cat": "cpu", "ph": "X", "pid": 1, "tid": 2,
                "ts": us(c.start_ns, s.offset),
                "dur": c.end_ns.saturating_sub(c.start_ns) as f64 / 1e3,
                "args": {"label": c.label, "step": s.step},
            }));
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

/// Profiling in progress and done.
#[derive(Debug, Default)]
pub(crate) struct Profiling {
    /// The profiled step in progress: its step and when its profile began.
    current: Option<(u64, Instant)>,
    first_began: Option<Instant>,
    pub(crate) steps: Vec<ProfiledStep>,
    /// Wall times of the steps not profiled, ms (step 1 left out: it compiles pipelines and
    /// creates the optimizer's state).
    unprofiled_ms: Mean,
    written: bool,
}

/// A running mean (a long run keeps two numbers, not every step's time).
#[derive(Debug, Default)]
struct Mean {
    sum: f64,
    count: u64,
}

impl Mean {
    fn add(&mut self, value: f64) {
        self.sum += value;
        self.count += 1;
    }

    fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

impl StepHook for Profiling {
    /// Starts the profile of `step` when it is one to profile.
    fn before_step(&mut self, cx: &mut HookContext<'_>, step: u64) {
        let Some(span) = cx.config.profile_steps else {
            return;
        };
        if !span.contains(step) || cx.gpu.is_profiling() {
            return;
        }
        match cx.gpu.begin_profile(None) {
            Ok(_) => {
                let now = Instant::now();
                self.first_began.get_or_insert(now);
                self.current = Some((step, now));
            }
            Err(e) => cx.note(format!("warning: step {step} not profiled: {e}")),
        }
    }

    /// Ends the profile of `step`, which took `step_ms`, or counts it as unprofiled.
    fn after_step(&mut self, cx: &mut HookContext<'_>, step: u64, step_ms: f64) {
        let Some((profiled, began)) = self.current.take() else {
            if step > 1 {
                self.unprofiled_ms.add(step_ms);
            }
            return;
        };
        let deadline = cx.gpu.default_deadline();
        match cx.gpu.end_profile(deadline) {
            Ok(profile) => {
                let first = self.first_began.unwrap_or(began);
                self.steps.push(ProfiledStep {
                    step: profiled,
                    step_ms,
                    window_ms: began.elapsed().as_secs_f64() * 1e3,
                    offset: began.saturating_duration_since(first),
                    profile,
                });
            }
            Err(e) => cx.note(format!(
                "warning: the profile of step {profiled} was lost: {e}"
            )),
        }
    }

    /// Stops a profile still running without keeping it.
    fn step_failed(&mut self, cx: &mut HookContext<'_>) {
        if self.current.take().is_some() {
            let _ = cx.gpu.end_profile(Duration::ZERO);
        }
    }

    /// Writes `profile.json` and `trace.json` (with a checkpoint directory) and notes the kernel
    /// table and the measured overhead; once per run, at its end (or when a step gives up).
    fn finish(&mut self, cx: &mut HookContext<'_>, _step: u64) {
        if self.written {
            return;
        }
        let Some(table) = KernelTable::of(&self.steps) else {
            if let Some(span) = cx.config.profile_steps {
                self.written = true;
                let last = cx.steps_done;
                cx.note(format!(
                    "no kernel profile: --profile-steps {}-{} names no step this run finished \
                     (its last step is {last})",
                    span.first, span.last
                ));
            }
            return;
        };
        self.written = true;
        let profiled_ms = table.steps_ms / table.steps.len().max(1) as f64;
        let overhead = match self.unprofiled_ms.mean() {
            Some(plain) => format!(
                "profiling overhead: profiled steps took {profiled_ms:.1} ms on average, the {} \
                 unprofiled steps after step 1 {plain:.1} ms ({:+.0}%)",
                self.unprofiled_ms.count,
                100.0 * (profiled_ms / plain.max(1e-9) - 1.0)
            ),
            None => format!(
                "profiling overhead: not measured (no unprofiled step after step 1 to compare; \
                 profiled steps took {profiled_ms:.1} ms on average)"
            ),
        };
        let mut lines = vec![format!("kernel profile of steps {:?}:", table.steps)];
        lines.extend(table.render(15).lines().map(str::to_string));
        lines.push(overhead.clone());
        if let Some(longest) = table.longest_submission_ms {
            let bound = match cx.gpu.max_submission() {
                Some(b) => format!("--max-submission-ms {}", b.as_secs_f64() * 1e3),
                None => "no bound: --max-submission-ms off".to_string(),
            };
            let pacing = cx.gpu.pacing();
            lines.push(format!(
                "longest submission: {longest:.2} ms of GPU time ({} submissions; {bound}; \
                 {} submitted early for it; estimates learned x{:.2} of the adapter's starting \
                 rates)",
                table.submissions, pacing.early_submissions, pacing.model.correction
            ));
        }
        if let Some(dir) = cx.config.checkpoint_dir.as_deref() {
            let record = json!({"table": table, "overhead": overhead,
                "unprofiled_step_ms": self.unprofiled_ms.mean()});
            // An earlier part of a resumed run keeps its profile: this one takes `-part<N>`.
            let paths = crate::run_dir::unused_names(dir, &[PROFILE_JSON, TRACE_JSON]);
            let (profile, trace) = (&paths[0], &paths[1]);
            let written =
                write(profile, &record).and_then(|()| write(trace, &chrome_trace(&self.steps)));
            lines.push(match written {
                Ok(()) => format!(
                    "wrote {} and {} (open it in Perfetto or chrome://tracing)",
                    profile.display(),
                    trace.display()
                ),
                Err(e) => format!("warning: the profile was not saved: {e}"),
            });
        }
        for line in lines {
            cx.note(line);
        }
    }
}

fn write(path: &Path, value: &serde_json::Value) -> Result<()> {
    std::fs::write(path, value.to_string()).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use plimsoll_kernels_wgsl::{CpuSpan, KernelTiming, Profile, ProfileMode};

    use super::{busy_ns, waits_ns};

    fn profile(kernels: &[(u64, u64)], cpu: &[(&'static str, u64, u64)]) -> Profile {
        Profile {
            mode: ProfileMode::InsidePasses,
            kernels: kernels
                .iter()
                .map(|&(start_ns, end_ns)| KernelTiming {
                    stem: "k",
                    start_ns,
                    end_ns,
                    flops: 0,
                    bytes: 0,
                    submission: 0,
                })
                .collect(),
            cpu: cpu
                .iter()
                .map(|&(name, start_ns, end_ns)| CpuSpan {
                    name,
                    label: String::new(),
                    start_ns,
                    end_ns,
                })
                .collect(),
            untimed_dispatches: 0,
            wall_ns: 0,
        }
    }

    /// Against a naive count: every ns covered by at least one dispatch, once.
    #[test]
    fn busy_time_counts_overlapping_dispatches_once() {
        let kernels = [(10, 20), (15, 30), (40, 45), (0, 5), (41, 44), (50, 50)];
        let naive = (0..100u64)
            .filter(|&t| kernels.iter().any(|&(s, e)| s <= t && t < e))
            .count() as u64;
        assert_eq!(busy_ns(&profile(&kernels, &[])), naive);
        assert_eq!(naive, 5 + 20 + 5);
    }

    /// Only the `wait` spans count, overlapping ones once, cut at the step's end: a read-back's
    /// own work (its submission inside it) is the host's.
    #[test]
    fn waits_are_the_wait_spans_once_within_the_step() {
        let cpu = [
            ("record", 0, 50),
            ("read-back", 50, 85),
            ("submit", 52, 55),
            ("wait", 55, 80),
            ("wait", 60, 70),
            ("submit", 85, 90),
            ("wait", 90, 95),
            ("wait", 98, 120),
        ];
        assert_eq!(waits_ns(&profile(&[], &cpu), 100), 25 + 5 + 2);
    }
}
