//! Bounded submissions: a GPU that also drives a display cannot composite while a compute
//! submission runs, and past about 2 s Windows' watchdog (TDR) resets it and the device is lost.
//! With a bound set ([`Gpu::set_max_submission`]), the recorder estimates the GPU time of each
//! dispatch from the work its launcher declares ([`Work`]: FLOPs and bytes) and the adapter's
//! rates, and submits the open batch before a dispatch that would take its estimate past
//! [`HEADROOM`] of the bound; a launcher whose one dispatch would pass it splits it
//! ([`Gpu::pieces_within_bound`]): matmuls by products of the batch and blocks of C (whole
//! 128 x 128 tiles; each element still summed by one invocation, so the values are the same),
//! same-shape elementwise ops by ranges (a matmul with a 16-bit operand in blocks of C over its
//! whole batch). Not split: broadcasting elementwise ops and the row kernels (softmax, layer
//! norm, attention, the loss), which go out in a submission of their own when long. Work
//! inside [`Gpu::atomically`] is never submitted early (it must run all or not at all), so an
//! update's dispatches are not bounded.
//!
//! The rates start from the adapter's type ([`RateModel::for_adapter`]) and are kept up to date
//! from the device's own completion times: each submission's work-done callback notes when it
//! finished, its GPU time is the span from its submit (or the previous submission's end, when
//! later) to then, and the ratio of measured to estimated time of a submission of at least
//! [`CALIBRATION_MIN`] moves a correction factor of each kernel in it, kept per kernel and
//! arithmetic intensity (`work_class`: kernels differ, and so do a matmul's shapes). An
//! estimate found short is corrected at once, one found long a quarter of the way, so the
//! estimates err long: batches smaller, never larger. A late callback (nobody polled) only
//! lengthens the measured span, which errs the same way.
//!
//! The default bound follows the deadline: [`DEADLINE_SHARE`] of [`Gpu::default_deadline`] on
//! every adapter, so a run whose submissions each keep their bound never meets the deadline but
//! for a stall, however slow the device (a CPU adapter, an integrated GPU, a busy shared card);
//! at most [`DEFAULT_MAX_SUBMISSION`] on adapters that may drive a display (every type but a CPU
//! one: wgpu does not say which do). A bound set with [`Gpu::set_max_submission`] stays as set.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::device::Gpu;
use crate::recorder::Work;

/// The bound on adapters that may drive a display (see the module docs).
pub const DEFAULT_MAX_SUBMISSION: Duration = Duration::from_millis(100);

/// The share of the deadline the default bound is: a wait covers the submissions ahead of it
/// in the queue (at most a few), each within the bound.
pub const DEADLINE_SHARE: f64 = 0.125;

/// The share of the bound a batch is filled to: estimates err (a kernel's speed varies with its
/// shape and with what else runs), and the bound is a promise.
pub const HEADROOM: f64 = 0.75;

/// Submissions estimated shorter than this do not move the correction (fixed costs dominate).
pub const CALIBRATION_MIN: Duration = Duration::from_millis(2);

/// How an adapter's GPU time is estimated: `(dispatch_ns + max(flops / flops_per_ns, bytes /
/// bytes_per_ns)) * correction`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateModel {
    /// Floating-point operations per nanosecond (GFLOP/s).
    pub flops_per_ns: f64,
    /// Bytes moved per nanosecond (GB/s).
    pub bytes_per_ns: f64,
    /// Fixed cost of one dispatch, in ns.
    pub dispatch_ns: f64,
    /// Measured over estimated time, learned from completed submissions (1 at first): the
    /// largest of the kernels' own corrections, which a kernel not seen yet takes.
    pub correction: f64,
}

impl RateModel {
    /// Starting rates for an adapter of this type, low rather than high (a low rate means
    /// smaller batches): a CPU adapter (lavapipe) 2 GFLOP/s and 1 GB/s, an integrated GPU
    /// 500 GFLOP/s and 30 GB/s, a discrete one 5 TFLOP/s and 300 GB/s.
    pub fn for_adapter(device_type: wgpu::DeviceType) -> RateModel {
        let (flops_per_ns, bytes_per_ns, dispatch_ns) = match device_type {
            wgpu::DeviceType::Cpu => (2.0, 1.0, 20_000.0),
            wgpu::DeviceType::DiscreteGpu => (5_000.0, 300.0, 5_000.0),
            _ => (500.0, 30.0, 10_000.0),
        };
        RateModel {
            flops_per_ns,
            bytes_per_ns,
            dispatch_ns,
            correction: 1.0,
        }
    }

    /// The estimated GPU time of a dispatch doing `work`, in ns.
    pub fn estimate_ns(&self, work: Work) -> u64 {
        let compute = work.flops as f64 / self.flops_per_ns;
        let memory = work.bytes as f64 / self.bytes_per_ns;
        ((self.dispatch_ns + compute.max(memory)) * self.correction) as u64
    }
}

/// What the pacing has seen (see [`Gpu::pacing`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacingStats {
    /// The bound (`None`: off).
    pub bound: Option<Duration>,
    /// The rates in use.
    pub model: RateModel,
    /// Submissions made early because the next dispatch would have passed the bound.
    pub early_submissions: u64,
    /// The longest GPU time measured for one submission (from completion times).
    pub longest_measured: Duration,
}

/// A device's pacing state (in `Shared`, behind an `Arc` for the work-done callbacks).
#[derive(Debug)]
pub(crate) struct Pacing {
    /// The bound in ns; 0: none.
    bound_ns: AtomicU64,
    /// The most the default bound may be (a display's), in ns; 0: no bound at all (a planning
    /// device, which runs nothing).
    default_cap_ns: u64,
    /// Whether the bound was set by hand ([`Gpu::set_max_submission`]) and no longer follows
    /// the deadline.
    set_by_hand: std::sync::atomic::AtomicBool,
    early: AtomicU64,
    state: Mutex<PaceState>,
}

#[derive(Debug)]
struct PaceState {
    model: RateModel,
    /// Each kernel's correction, by stem and [`work_class`] (see the module docs).
    kernels: std::collections::HashMap<WorkKey, f64>,
    /// Submitted and not yet completed: serial, submit time, estimated ns, its kernels.
    pending: VecDeque<(u64, Instant, u64, Vec<WorkKey>)>,
    last_completion: Option<Instant>,
    longest_measured: Duration,
}

/// Callbacks closer than this to the previous one ran in one group (wgpu runs every finished
/// submission's callback inside one `submit` or `poll`): their measured spans say nothing.
pub const CALLBACK_GROUP: Duration = Duration::from_micros(200);

/// A kernel and the class of its work: what a correction is kept for.
pub(crate) type WorkKey = (&'static str, u8);

/// The class of `work` by arithmetic intensity: `log2(1 + flops / bytes)`, 0 to 15.
pub(crate) fn work_class(work: Work) -> u8 {
    let intensity = work.flops as f64 / work.bytes.max(1) as f64;
    (1.0 + intensity).log2().clamp(0.0, 15.0) as u8
}

impl PaceState {
    fn estimate_ns(&self, key: WorkKey, work: Work) -> u64 {
        let correction = self.kernels.get(&key).copied();
        let model = RateModel {
            correction: correction.unwrap_or(self.model.correction),
            ..self.model
        };
        model.estimate_ns(work)
    }
}

impl Pacing {
    /// Pacing for an adapter of `device_type` whose waits have `deadline`; none on a planning
    /// device.
    pub(crate) fn new(device_type: wgpu::DeviceType, planning: bool, deadline: Duration) -> Pacing {
        let default_cap_ns = match (planning, device_type) {
            (true, _) => 0,
            (false, wgpu::DeviceType::Cpu) => u64::MAX,
            (false, _) => DEFAULT_MAX_SUBMISSION.as_nanos() as u64,
        };
        let pacing = Pacing {
            bound_ns: AtomicU64::new(0),
            default_cap_ns,
            set_by_hand: std::sync::atomic::AtomicBool::new(false),
            early: AtomicU64::new(0),
            state: Mutex::new(PaceState {
                model: RateModel::for_adapter(device_type),
                kernels: Default::default(),
                pending: VecDeque::new(),
                last_completion: None,
                longest_measured: Duration::ZERO,
            }),
        };
        pacing.follow_deadline(deadline);
        pacing
    }

    /// The default bound for waits of `deadline` ([`DEADLINE_SHARE`] of it, at most the
    /// display's), unless the bound was set by hand.
    pub(crate) fn follow_deadline(&self, deadline: Duration) {
        if self.set_by_hand.load(Ordering::Relaxed) || self.default_cap_ns == 0 {
            return;
        }
        let share = (deadline.as_nanos() as f64 * DEADLINE_SHARE) as u64;
        self.bound_ns
            .store(share.clamp(1, self.default_cap_ns), Ordering::Relaxed);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PaceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bound in ns, if any.
    pub(crate) fn bound_ns(&self) -> Option<u64> {
        match self.bound_ns.load(Ordering::Relaxed) {
            0 => None,
            b => Some(b),
        }
    }

    /// What a batch's estimate is held to: [`HEADROOM`] of the bound.
    pub(crate) fn target_ns(&self) -> Option<u64> {
        self.bound_ns()
            .map(|b| ((b as f64 * HEADROOM) as u64).max(1))
    }

    /// The estimated GPU time of a dispatch of kernel `stem` doing `work`.
    pub(crate) fn estimate_ns(&self, stem: &'static str, work: Work) -> u64 {
        self.state().estimate_ns((stem, work_class(work)), work)
    }

    pub(crate) fn note_early_submission(&self) {
        self.early.fetch_add(1, Ordering::Relaxed);
    }

    /// Submission `serial` of the kernels `stems`, estimated at `estimated_ns`, went out now.
    pub(crate) fn submitted(&self, serial: u64, estimated_ns: u64, stems: Vec<WorkKey>) {
        let mut s = self.state();
        if s.pending.len() >= 64 {
            s.pending.pop_front();
        }
        s.pending
            .push_back((serial, Instant::now(), estimated_ns, stems));
    }

    /// Submission `serial` finished (its work-done callback ran) now.
    pub(crate) fn completed(&self, serial: u64) {
        let now = Instant::now();
        let mut s = self.state();
        while let Some((first, submitted_at, estimated, stems)) = s.pending.pop_front() {
            if first > serial {
                s.pending
                    .push_front((first, submitted_at, estimated, stems));
                break;
            }
            if first != serial {
                continue;
            }
            let began = match s.last_completion {
                Some(prev) if prev > submitted_at => prev,
                _ => submitted_at,
            };
            let measured = now.saturating_duration_since(began);
            s.longest_measured = s.longest_measured.max(measured);
            // The first callback of a group measured the whole group (which errs long); the
            // others measured nothing and must not lower a correction.
            let grouped = s
                .last_completion
                .is_some_and(|prev| now.saturating_duration_since(prev) < CALLBACK_GROUP);
            if estimated >= CALIBRATION_MIN.as_nanos() as u64 && !grouped {
                let ratio = (measured.as_nanos() as f64 / estimated as f64).clamp(1e-3, 1e3);
                // Each estimate already includes its kernel's correction: at once to the one
                // that would have been right when short, a quarter of the way when long.
                let fallback = s.model.correction;
                for stem in stems {
                    let c = s.kernels.entry(stem).or_insert(fallback);
                    let right = (*c * ratio).clamp(1e-3, 1e3);
                    *c = if right > *c {
                        right
                    } else {
                        *c + 0.25 * (right - *c)
                    };
                }
                s.model.correction = s.kernels.values().copied().fold(1e-3, f64::max);
            }
        }
        s.last_completion = Some(now);
    }

    pub(crate) fn stats(&self) -> PacingStats {
        let s = self.state();
        PacingStats {
            bound: self.bound_ns().map(Duration::from_nanos),
            model: s.model,
            early_submissions: self.early.load(Ordering::Relaxed),
            longest_measured: s.longest_measured,
        }
    }

    /// Whether the bound was set by hand (and no longer follows the deadline).
    pub(crate) fn is_set_by_hand(&self) -> bool {
        self.set_by_hand.load(Ordering::Relaxed)
    }

    fn set_bound(&self, bound: Option<Duration>) {
        self.set_by_hand.store(true, Ordering::Relaxed);
        let ns = bound.map_or(0, |b| b.as_nanos().clamp(1, u128::from(u64::MAX)) as u64);
        self.bound_ns.store(ns, Ordering::Relaxed);
    }

    fn reset_longest(&self) {
        self.state().longest_measured = Duration::ZERO;
    }
}

impl Gpu {
    /// Bounds the estimated GPU time of one submission (`None`: no bound); see the module docs.
    pub fn set_max_submission(&self, bound: Option<Duration>) {
        self.shared.pacing.set_bound(bound);
    }

    /// The bound on one submission's estimated GPU time, if any.
    pub fn max_submission(&self) -> Option<Duration> {
        self.shared.pacing.bound_ns().map(Duration::from_nanos)
    }

    /// The estimated GPU time of a dispatch of `kernel` doing `work` on this device now.
    pub fn estimate(&self, kernel: &crate::Kernel, work: Work) -> Duration {
        Duration::from_nanos(self.shared.pacing.estimate_ns(kernel.stem, work))
    }

    /// In how many pieces a launcher should split a dispatch of `kernel` in `units` equal parts
    /// (rows, ranges) doing `work` in all, so that each piece's estimate stays within the bound:
    /// 1 without a bound, inside [`Gpu::atomically`] (nothing may be submitted early there) or
    /// when the whole fits; at most `units`.
    pub fn pieces_within_bound(&self, kernel: &crate::Kernel, units: u64, work: Work) -> u64 {
        let Some(bound) = self.shared.pacing.target_ns() else {
            return 1;
        };
        if units <= 1 || self.shared.batch().hold {
            return 1;
        }
        let whole = self.shared.pacing.estimate_ns(kernel.stem, work);
        if whole <= bound {
            return 1;
        }
        // Each piece pays the fixed cost of a dispatch again; the share of the rest shrinks.
        let fixed = self.shared.pacing.estimate_ns(kernel.stem, Work::default());
        let room = bound.saturating_sub(fixed).max(1);
        whole.saturating_sub(fixed).div_ceil(room).clamp(1, units)
    }

    /// What the pacing has seen: the bound, the rates, early submissions, the longest
    /// submission measured.
    pub fn pacing(&self) -> PacingStats {
        self.shared.pacing.stats()
    }

    /// Starts measuring the longest submission afresh (e.g. for the steps being profiled).
    pub fn reset_longest_submission(&self) {
        self.shared.pacing.reset_longest();
    }
}
