//! Fences and deadlines. Every submission gets a [`Fence`]; [`Gpu::wait`] takes a deadline and
//! returns [`Error::Timeout`] (with the ring of recent submissions) when it passes.
//!
//! All device polling goes through `poll_device`, the only call of `wgpu::Device::poll` in the
//! workspace: it contains the panic `poll` raises on device loss (`catch_unwind`) and maps wgpu's
//! results. Waits are cut into slices of at most [`WAIT_SLICE`], so a waiting thread never holds
//! wgpu's device lock for long (docs/wgpu.md pitfall 4) and notices device loss between slices.
//!
//! # Deadlines everywhere, including submit and drop
//!
//! Two wgpu calls block without a limit of their own, and both are put under a deadline here:
//!
//! - **`queue.submit`** blocks in the driver while earlier work runs (lavapipe's `vkQueueSubmit`
//!   waits for the previous submission, docs/wgpu.md pitfall 2). Policy: at most
//!   [`Gpu::max_submissions_in_flight`] submissions are in flight (default 1 on a CPU adapter,
//!   2 on a GPU; [`crate::GpuOptions::max_submissions_in_flight`]). Before a submit, the oldest
//!   in-flight submission is waited for, in slices, *with the batch lock released* and within the
//!   caller's deadline; past it the submit does not happen, the batch stays open, and the caller
//!   gets [`Error::Timeout`] naming the submission that was still running. So the driver's submit
//!   only ever queues behind work that has finished (CPU) or behind one batch (GPU).
//! - **Dropping the last [`Gpu`]** waits for the queue to go idle (`Queue::drop` →
//!   `vkQueueWaitIdle`, pitfall 3). Policy: the device's drop discards any unsubmitted batch and
//!   waits for the GPU within [`Gpu::drop_deadline`]; past it, the wgpu device and queue are leaked
//!   (`std::mem::forget` of a clone of each, which keeps wgpu's queue, its in-flight submissions
//!   and every buffer they use alive forever) and one warning line goes to stderr. Leak, never hang.
//!
//! Where the deadline comes from: calls that take one ([`Gpu::wait`], [`Gpu::synchronize`],
//! [`Gpu::flush_within`], the read-backs) use theirs for everything they wait on, the submit
//! included; calls that take none ([`Gpu::flush`], the auto-flush in [`Gpu::dispatch`], the flush
//! before an upload in [`Gpu::write`]) use [`Gpu::default_deadline`] ([`DEFAULT_DEADLINE`] unless
//! set with [`crate::GpuOptions::default_deadline`] or [`Gpu::set_default_deadline`]).
//!
//! Cost of the bound (CPU/GPU overlap): recording never waits, so the CPU can always record the
//! next batch while the GPU runs the current one; but a flush that finds the limit reached waits
//! for the oldest batch. With 1 in flight (lavapipe) the CPU is at most one batch ahead of the GPU,
//! and the GPU idles between the end of a batch and the next submit (lavapipe would serialize the
//! submits anyway). With 2 (GPUs) the next batch is already queued when one finishes, so the GPU
//! does not idle, and the CPU is at most two batches ahead. A flush that must wait holds no lock
//! while waiting, so other threads may keep recording.
//!
//! # A completed fence does not mean its callbacks have run
//!
//! wgpu runs map and work-done callbacks on whichever thread's `device.poll` or `queue.submit`
//! retired the submission, after that call has released wgpu's locks (`UserClosures::fire` in
//! wgpu-core). So when two threads share a device, thread A's wait can report A's submission
//! complete (the fence value is reached and there is nothing left for A's poll to collect) while
//! thread B still holds A's callbacks, not yet run. Measured with 16 reader threads on lavapipe:
//! the callback ran on another thread 0.2 to 10 ms after A's wait returned. Hence:
//!
//! - The fence bookkeeping (`completed`, the in-flight list, the ring's "done") means "the GPU
//!   finished", which a successful wait does establish; the work-done callback only raises the
//!   same counter, and nothing waits for that callback itself.
//! - Anything that needs a callback's *effect* (the read-backs need their staging buffer mapped)
//!   waits for the callback's own flag, a `CallbackSlot`, after the fence: polling through the
//!   one poll function (which runs callbacks nobody has collected yet) and sleeping on the slot's
//!   condition variable in slices of at most [`CALLBACK_SLICE`], until the callback has run or
//!   the caller's deadline passes ([`Error::Timeout`] naming the submission, never a hang).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::device::{Gpu, Shared};
use crate::error::{Error, RecentSubmissions, Result, SubmissionRecord};

/// Longest single `device.poll` call while waiting.
pub const WAIT_SLICE: Duration = Duration::from_millis(20);
/// Longest sleep, between polls, while waiting for a callback that another thread has collected
/// but not run yet (see the module docs); the callback's own signal ends it sooner.
pub const CALLBACK_SLICE: Duration = Duration::from_millis(2);
/// How many submissions the ring remembers.
pub const RING_CAPACITY: usize = 16;
/// Deadline of the calls that take none (see the module docs).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);
/// How long dropping the last [`Gpu`] waits for the GPU before leaking it (see the module docs).
pub const DEFAULT_DROP_DEADLINE: Duration = Duration::from_secs(10);

/// The deadlines of a device, settable through any clone of its [`Gpu`]. Stored in nanoseconds.
#[derive(Debug)]
pub(crate) struct Deadlines {
    default_ns: AtomicU64,
    drop_ns: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Deadlines {
    pub(crate) fn new(default: Duration, drop: Duration) -> Self {
        Deadlines {
            default_ns: AtomicU64::new(nanos(default)),
            drop_ns: AtomicU64::new(nanos(drop)),
        }
    }

    pub(crate) fn default_deadline(&self) -> Duration {
        Duration::from_nanos(self.default_ns.load(Ordering::SeqCst))
    }

    pub(crate) fn drop_deadline(&self) -> Duration {
        Duration::from_nanos(self.drop_ns.load(Ordering::SeqCst))
    }
}

/// One submission (or, for a flush with nothing recorded, the latest one before it).
/// Completing a fence implies every earlier fence of the same [`Gpu`] completed (queue order).
#[derive(Debug, Clone)]
pub struct Fence {
    serial: u64,
    index: Option<wgpu::SubmissionIndex>,
    label: Arc<str>,
}

impl Fence {
    /// Monotonically increasing per [`Gpu`], starting at 1; 0 means "nothing was ever submitted".
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// The label of the submission.
    pub fn label(&self) -> &str {
        &self.label
    }

    pub(crate) fn new(serial: u64, index: Option<wgpu::SubmissionIndex>, label: &str) -> Self {
        Fence {
            serial,
            index,
            label: Arc::from(label),
        }
    }
}

#[derive(Debug)]
struct RingEntry {
    serial: u64,
    label: String,
    dispatches: u32,
    submitted_at: Instant,
}

/// Fence bookkeeping shared by the device.
#[derive(Debug, Default)]
pub(crate) struct FenceState {
    /// Highest serial known complete; written by work-done callbacks and successful waits.
    completed: Arc<AtomicU64>,
    ring: Mutex<VecDeque<RingEntry>>,
    last: Mutex<Option<Fence>>,
    /// Submitted fences not yet known complete, oldest first (pruned against `completed`).
    in_flight: Mutex<VecDeque<Fence>>,
}

impl FenceState {
    /// A counter the submission's work-done callback can raise.
    pub(crate) fn completed_handle(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.completed)
    }

    pub(crate) fn record(&self, fence: &Fence, dispatches: u32) {
        if let Ok(mut ring) = self.ring.lock() {
            if ring.len() == RING_CAPACITY {
                ring.pop_front();
            }
            ring.push_back(RingEntry {
                serial: fence.serial,
                label: fence.label.to_string(),
                dispatches,
                submitted_at: Instant::now(),
            });
        }
        if let Ok(mut last) = self.last.lock() {
            *last = Some(fence.clone());
        }
        if let Ok(mut in_flight) = self.in_flight.lock() {
            in_flight.push_back(fence.clone());
        }
    }

    /// The oldest in-flight fence when `max_in_flight` or more are in flight: the one that must
    /// finish before another submit. `None`: a submit may go ahead.
    pub(crate) fn blocking_submit(&self, max_in_flight: usize) -> Option<Fence> {
        let done = self.completed.load(Ordering::SeqCst);
        let mut in_flight = self.in_flight.lock().ok()?;
        while in_flight.front().is_some_and(|f| f.serial <= done) {
            in_flight.pop_front();
        }
        (in_flight.len() >= max_in_flight.max(1))
            .then(|| in_flight.front().cloned())
            .flatten()
    }

    /// The latest submitted fence, or a completed "serial 0" fence.
    pub(crate) fn last(&self) -> Fence {
        self.last
            .lock()
            .ok()
            .and_then(|l| l.clone())
            .unwrap_or_else(|| Fence::new(0, None, "nothing submitted"))
    }

    fn is_done(&self, serial: u64) -> bool {
        self.completed.load(Ordering::SeqCst) >= serial
    }

    pub(crate) fn recent(&self) -> RecentSubmissions {
        let now = Instant::now();
        let done = self.completed.load(Ordering::SeqCst);
        let ring = match self.ring.lock() {
            Ok(r) => r,
            Err(_) => return RecentSubmissions::default(),
        };
        RecentSubmissions(
            ring.iter()
                .map(|e| SubmissionRecord {
                    serial: e.serial,
                    label: e.label.clone(),
                    dispatches: e.dispatches,
                    age_ms: now.duration_since(e.submitted_at).as_millis() as u64,
                    done: e.serial <= done,
                })
                .collect(),
        )
    }
}

/// A value a wgpu callback delivers (e.g. a map result), with a condition variable so a waiting
/// thread wakes as soon as the callback has run, on whatever thread ran it.
#[derive(Debug)]
pub(crate) struct CallbackSlot<T> {
    value: Mutex<Option<T>>,
    ready: Condvar,
}

impl<T> CallbackSlot<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(CallbackSlot {
            value: Mutex::new(None),
            ready: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Option<T>> {
        // Only `set` and `take` hold the lock, and neither can leave the value half-written.
        self.value.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called by the callback: stores `value` and wakes the waiters.
    pub(crate) fn set(&self, value: T) {
        *self.lock() = Some(value);
        self.ready.notify_all();
    }

    fn take(&self) -> Option<T> {
        self.lock().take()
    }

    /// Sleeps until the value is set or `timeout` passes (no lost wake-up: checked under the
    /// lock), and takes it if it is there.
    fn take_within(&self, timeout: Duration) -> Option<T> {
        let guard = self.lock();
        let (mut guard, _) = self
            .ready
            .wait_timeout_while(guard, timeout, |v| v.is_none())
            .unwrap_or_else(|p| p.into_inner());
        guard.take()
    }
}

/// After `fence` completed, waits until the callback behind `slot` has run (see the module docs)
/// and returns its value, or [`Error::Timeout`] naming `fence` once `deadline`, measured from
/// `start`, has passed. Polls without blocking (runs callbacks nobody has collected yet) and
/// sleeps on the slot in slices of at most [`CALLBACK_SLICE`]; holds no lock while polling, so
/// the callback can run on this thread or any other.
pub(crate) fn wait_callback<T>(
    shared: &Shared,
    fence: &Fence,
    slot: &CallbackSlot<T>,
    start: Instant,
    deadline: Duration,
) -> Result<T> {
    loop {
        if let Some(value) = slot.take() {
            return Ok(value);
        }
        poll_device(shared, None, Duration::ZERO)?;
        let remaining = deadline.saturating_sub(start.elapsed());
        if let Some(value) = slot.take_within(remaining.min(CALLBACK_SLICE)) {
            return Ok(value);
        }
        if start.elapsed() >= deadline {
            return Err(Error::Timeout {
                label: fence.label.to_string(),
                serial: fence.serial,
                deadline_ms: deadline.as_millis() as u64,
                recent: shared.fences.recent(),
            });
        }
    }
}

/// What one poll found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PollOutcome {
    /// The submission waited for (or the whole queue) is complete.
    Done,
    /// Not yet (timeout of this slice, or a non-blocking poll).
    Pending,
}

/// The raw result of one `device.poll`: `Err(())` when it panicked (device loss).
type RawPoll = std::result::Result<
    std::result::Result<wgpu::PollStatus, wgpu::PollError>,
    Box<dyn std::any::Any + Send>,
>;

/// THE call of `device.poll` (nowhere else in the workspace). `timeout` zero with no index is a
/// non-blocking poll (runs callbacks); otherwise a wait of at most `timeout`.
fn poll_raw(
    device: &wgpu::Device,
    index: Option<&wgpu::SubmissionIndex>,
    timeout: Duration,
) -> RawPoll {
    let poll_type = match (index, timeout.is_zero()) {
        (None, true) => wgpu::PollType::Poll,
        _ => wgpu::PollType::Wait {
            submission_index: index.cloned(),
            timeout: Some(timeout),
        },
    };
    // `poll` panics (not Err) when the hal reports device loss while waiting.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| device.poll(poll_type)))
}

/// One poll with the health checks around it. `timeout` zero with no index is a non-blocking
/// poll (runs callbacks).
pub(crate) fn poll_device(
    shared: &Shared,
    index: Option<&wgpu::SubmissionIndex>,
    timeout: Duration,
) -> Result<PollOutcome> {
    shared.health.check()?;
    let result = poll_raw(&shared.device, index, timeout);
    let outcome = match result {
        Ok(Ok(wgpu::PollStatus::QueueEmpty | wgpu::PollStatus::WaitSucceeded)) => PollOutcome::Done,
        Ok(Ok(wgpu::PollStatus::Poll)) | Ok(Err(wgpu::PollError::Timeout)) => PollOutcome::Pending,
        Ok(Err(wgpu::PollError::WrongSubmissionIndex(requested, last_ok))) => {
            shared.health.check()?;
            return Err(Error::Rejected {
                serial: 0,
                label: String::new(),
                message: format!("submission index {requested} never succeeded (last {last_ok})"),
            });
        }
        Err(_) => {
            shared.health.mark_lost("device.poll panicked".to_string());
            return shared.health.check().map(|()| PollOutcome::Pending);
        }
    };
    shared.health.check()?;
    Ok(outcome)
}

/// Waits until the whole queue is idle, in slices, for at most `deadline`. Used by the device's
/// drop, so it ignores the health flag and reports only whether idleness was confirmed: `false`
/// past the deadline, or when wgpu could not say (a poll that panicked or refused).
pub(crate) fn drain(device: &wgpu::Device, deadline: Duration) -> bool {
    let start = Instant::now();
    loop {
        let slice = deadline.saturating_sub(start.elapsed()).min(WAIT_SLICE);
        match poll_raw(device, None, slice.max(Duration::from_nanos(1))) {
            Ok(Ok(wgpu::PollStatus::QueueEmpty | wgpu::PollStatus::WaitSucceeded)) => return true,
            Ok(Ok(wgpu::PollStatus::Poll) | Err(wgpu::PollError::Timeout)) => {}
            Ok(Err(wgpu::PollError::WrongSubmissionIndex(..))) | Err(_) => return false,
        }
        if start.elapsed() >= deadline {
            return false;
        }
    }
}

/// Waits until `fence` completes or `deadline`, measured from `start`, passes (see [`Gpu::wait`]);
/// a timeout reports the whole `deadline`. Completion means the GPU finished: the submission's
/// callbacks may still be about to run on another thread (use [`wait_callback`] for those).
pub(crate) fn wait_fence(
    shared: &Shared,
    fence: &Fence,
    start: Instant,
    deadline: Duration,
) -> Result<()> {
    let fences = &shared.fences;
    if fences.is_done(fence.serial) {
        return shared.health.check();
    }
    let Some(index) = fence.index.as_ref() else {
        return shared.health.check();
    };
    loop {
        let remaining = deadline.saturating_sub(start.elapsed());
        let slice = remaining.min(WAIT_SLICE);
        match poll_device(shared, Some(index), slice) {
            Ok(PollOutcome::Done) => {
                fences.completed.fetch_max(fence.serial, Ordering::SeqCst);
                return Ok(());
            }
            Ok(PollOutcome::Pending) => {}
            Err(Error::Rejected { message, .. }) => {
                return Err(Error::Rejected {
                    serial: fence.serial,
                    label: fence.label.to_string(),
                    message,
                });
            }
            Err(e) => return Err(e),
        }
        if fences.is_done(fence.serial) {
            return Ok(());
        }
        if start.elapsed() >= deadline {
            return Err(Error::Timeout {
                label: fence.label.to_string(),
                serial: fence.serial,
                deadline_ms: deadline.as_millis() as u64,
                recent: fences.recent(),
            });
        }
    }
}

impl Gpu {
    /// Waits until `fence` completes or `deadline` (measured from now) passes. `Duration::ZERO`
    /// only checks. Past the deadline: [`Error::Timeout`] naming the fence and listing the recent
    /// submissions; the work keeps running and a later wait may succeed.
    ///
    /// Completion is the GPU's: with several threads on one device, a raw wgpu callback of the
    /// submission may still be running on another thread (see the module docs); this crate's
    /// read-backs wait for their own callbacks.
    pub fn wait(&self, fence: &Fence, deadline: Duration) -> Result<()> {
        let start = Instant::now();
        wait_fence(&self.shared, fence, start, deadline)?;
        crate::profile::cpu_span(&self.shared, "wait", fence.label(), start);
        Ok(())
    }

    /// Whether `fence` has completed, without blocking (runs pending callbacks).
    pub fn is_done(&self, fence: &Fence) -> Result<bool> {
        if self.shared.fences.is_done(fence.serial) || fence.index.is_none() {
            return self.check_alive().map(|()| true);
        }
        poll_device(&self.shared, None, Duration::ZERO)?;
        Ok(self.shared.fences.is_done(fence.serial))
    }

    /// Submits the open batch and waits for everything submitted so far; `deadline` covers both
    /// the submit (see the module docs) and the wait.
    pub fn synchronize(&self, deadline: Duration) -> Result<()> {
        let start = Instant::now();
        let fence = self.flush_within("synchronize", deadline)?;
        wait_fence(&self.shared, &fence, start, deadline)
    }

    /// The deadline of calls that take none ([`Gpu::flush`], auto-flush, flush before upload).
    pub fn default_deadline(&self) -> Duration {
        self.shared.deadlines.default_deadline()
    }

    /// Sets [`Gpu::default_deadline`] for every clone of this `Gpu`.
    pub fn set_default_deadline(&self, deadline: Duration) {
        self.shared
            .deadlines
            .default_ns
            .store(nanos(deadline), Ordering::SeqCst);
        // The default bound on one submission follows it (see `crate::pacing`).
        self.shared.pacing.follow_deadline(deadline);
    }

    /// How long dropping the last clone of this `Gpu` waits for the GPU before leaking the device
    /// instead of blocking (see the module docs).
    pub fn drop_deadline(&self) -> Duration {
        self.shared.deadlines.drop_deadline()
    }

    /// Sets [`Gpu::drop_deadline`] for every clone of this `Gpu`.
    pub fn set_drop_deadline(&self, deadline: Duration) {
        self.shared
            .deadlines
            .drop_ns
            .store(nanos(deadline), Ordering::SeqCst);
    }

    /// At most this many submissions are in flight; a submit past it first waits for the oldest.
    pub fn max_submissions_in_flight(&self) -> usize {
        self.shared.max_in_flight
    }

    /// The last [`RING_CAPACITY`] submissions, oldest first, with whether each is done.
    pub fn recent_submissions(&self) -> RecentSubmissions {
        // Run callbacks first so the "done" column is fresh; a lost device still reports history.
        let _ = poll_device(&self.shared, None, Duration::ZERO);
        self.shared.fences.recent()
    }
}
