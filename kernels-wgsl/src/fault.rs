//! Fault injection, for `cargo xtask chaos`: make the k-th allocation, segment creation,
//! submission, read-back, host allocation or upload of a device fail (or lose the device there), to check that every
//! failure point of a training step ends in a recovery or a typed error with the model intact.
//!
//! The hooks count events only with the `fault-injection` cargo feature in a debug build: the
//! feature is off unless a crate asks for it (xtask does), and release builds leave the hooks
//! out whatever the features. Without them the hooks compile to nothing and `Gpu::arm_fault`
//! and its siblings do not exist. What each failure looks like is what the real one looks like:
//! - an allocation: [`crate::Error::OutOfMemory`] from the allocator, as when the budget is full;
//! - a segment creation: wgpu itself refuses the buffer (its error scope reports it) and the
//!   allocator handles that as it handles a device out of memory;
//! - a submission: [`crate::Error::Timeout`] waiting for room, with the batch left unsubmitted;
//! - a read-back: [`crate::Error::Timeout`] after the batch was submitted, as a stalled GPU gives;
//! - a host allocation: [`crate::Error::HostMemory`], as when the host refuses the memory;
//! - an upload ([`crate::Gpu::write`]): [`crate::Error::Validation`] from the write's error
//!   scope, as when wgpu refuses the write (its staging memory refused), nothing written.
//!
//! [`FaultAction::LoseDevice`] marks the device lost at that event instead (at a segment
//! creation the buffer is refused too, as a driver that loses the device over an allocation
//! does: the allocator reports out-of-memory and the next call finds the device lost).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// [`crate::Gpu::alloc`].
    Allocation,
    /// A new wgpu buffer for an allocator segment.
    Segment,
    /// A batch submission.
    Submission,
    /// [`crate::Gpu::read_bytes`] and the reads built on it.
    ReadBack,
    /// [`crate::Gpu::host_allocation`]: host memory a run keeps on purpose for the device (an
    /// offloaded optimizer's state, offloaded activations).
    HostAllocation,
    /// [`crate::Gpu::write`] and the uploads built on it (a batch's inputs, a parameter an
    /// offloaded optimizer updated, an offloaded activation coming back).
    Upload,
}

impl FaultPoint {
    /// Every point, in the order of `Gpu::fault_counts`.
    pub const ALL: [FaultPoint; 6] = [
        FaultPoint::Allocation,
        FaultPoint::Segment,
        FaultPoint::Submission,
        FaultPoint::ReadBack,
        FaultPoint::HostAllocation,
        FaultPoint::Upload,
    ];

    /// Position in [`FaultPoint::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name (`allocation`, `segment`, `submission`, `read-back`, `host allocation`,
    /// `upload`).
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::Allocation => "allocation",
            FaultPoint::Segment => "segment",
            FaultPoint::Submission => "submission",
            FaultPoint::ReadBack => "read-back",
            FaultPoint::HostAllocation => "host allocation",
            FaultPoint::Upload => "upload",
        }
    }
}

/// What happens at the armed event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// The operation fails the way it really can (see the module docs).
    Fail,
    /// The device is marked lost: this and every later call fails with
    /// [`crate::Error::DeviceLost`].
    LoseDevice,
}

/// Event counters and the armed fault of one device.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    counts: [AtomicU64; FaultPoint::ALL.len()],
    armed: Mutex<Option<(FaultPoint, u64, FaultAction)>>,
    /// The device's health, for the points that have no other way to it (segment creation).
    health: std::sync::OnceLock<std::sync::Arc<crate::device::Health>>,
}

impl Faults {
    /// Counters of the device whose health is `health`.
    pub(crate) fn new(health: std::sync::Arc<crate::device::Health>) -> Faults {
        let faults = Faults::default();
        let _ = faults.health.set(health);
        faults
    }

    /// Counts one event at `point` as [`Faults::hit`] does, and marks the device lost when that
    /// is the action: `true` when the caller must fail the event.
    #[cfg_attr(
        not(all(feature = "fault-injection", debug_assertions)),
        allow(dead_code)
    )]
    pub(crate) fn hit_or_lose(&self, point: FaultPoint) -> bool {
        match self.hit(point) {
            Some(FaultAction::LoseDevice) => {
                if let Some(h) = self.health.get() {
                    let at = point.name();
                    h.mark_lost(format!("{} at a {at} event", crate::device::INJECTED));
                }
                true
            }
            Some(FaultAction::Fail) => true,
            None => false,
        }
    }

    /// Counts one event at `point`; returns the action if it is the armed one (which is then
    /// disarmed: a fault fires once).
    #[cfg_attr(
        not(all(feature = "fault-injection", debug_assertions)),
        allow(dead_code)
    )]
    pub(crate) fn hit(&self, point: FaultPoint) -> Option<FaultAction> {
        let n = self.counts[point.index()].fetch_add(1, Ordering::SeqCst);
        let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
        match *armed {
            Some((p, k, action)) if p == point && k == n => {
                *armed = None;
                Some(action)
            }
            _ => None,
        }
    }

    #[cfg_attr(
        not(all(feature = "fault-injection", debug_assertions)),
        allow(dead_code)
    )]
    pub(crate) fn arm(&self, point: FaultPoint, index: u64, action: FaultAction) {
        *self.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some((point, index, action));
    }

    #[cfg_attr(
        not(all(feature = "fault-injection", debug_assertions)),
        allow(dead_code)
    )]
    pub(crate) fn disarm(&self) -> bool {
        self.armed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .is_some()
    }

    #[cfg_attr(
        not(all(feature = "fault-injection", debug_assertions)),
        allow(dead_code)
    )]
    pub(crate) fn counts(&self) -> [u64; FaultPoint::ALL.len()] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::SeqCst))
    }

    #[cfg_attr(
        not(all(feature = "fault-injection", debug_assertions)),
        allow(dead_code)
    )]
    pub(crate) fn reset(&self) {
        for c in &self.counts {
            c.store(0, Ordering::SeqCst);
        }
    }
}

/// Counts an event at `point` on the device behind `shared`: `Ok(false)` to go on, `Ok(true)`
/// when the caller must fail it (the way that operation really fails), or the device marked
/// lost and [`crate::Error::DeviceLost`].
#[cfg(all(feature = "fault-injection", debug_assertions))]
pub(crate) fn fires(shared: &crate::device::Shared, point: FaultPoint) -> crate::Result<bool> {
    match shared.faults.hit(point) {
        Some(FaultAction::Fail) => Ok(true),
        Some(FaultAction::LoseDevice) => {
            let at = point.name();
            shared
                .health
                .mark_lost(format!("{} at a {at} event", crate::device::INJECTED));
            shared.health.check().map(|()| false)
        }
        None => Ok(false),
    }
}

/// The timeout an injected stall gives, named after `fence` (the submission waited on).
#[cfg(all(feature = "fault-injection", debug_assertions))]
pub(crate) fn timeout(
    shared: &crate::device::Shared,
    fence: &crate::fence::Fence,
    deadline: std::time::Duration,
) -> crate::Error {
    crate::Error::Timeout {
        label: format!("{} (injected fault)", fence.label()),
        serial: fence.serial(),
        deadline_ms: deadline.as_millis() as u64,
        recent: shared.fences.recent(),
    }
}

#[cfg(all(feature = "fault-injection", debug_assertions))]
impl crate::Gpu {
    /// Arms a fault: the `index`-th event at `point` (0-based, counted since the last
    /// [`Gpu::reset_fault_counts`](crate::Gpu::reset_fault_counts)) does `action`. One fault
    /// at a time; arming replaces the previous one.
    pub fn arm_fault(&self, point: FaultPoint, index: u64, action: FaultAction) {
        self.shared.faults.arm(point, index, action);
    }

    /// Disarms the armed fault; `true` if one was armed and had not fired.
    pub fn disarm_fault(&self) -> bool {
        self.shared.faults.disarm()
    }

    /// Events at each point since the last reset, in [`FaultPoint::ALL`] order.
    pub fn fault_counts(&self) -> [u64; FaultPoint::ALL.len()] {
        self.shared.faults.counts()
    }

    /// Sets every event count to zero.
    pub fn reset_fault_counts(&self) {
        self.shared.faults.reset();
    }

    /// Clears a loss that an injected [`FaultAction::LoseDevice`] caused (the wgpu device was
    /// never lost), so a fault campaign goes on with this device and its compiled pipelines
    /// instead of compiling them again on a fresh one. The batch recorded and not submitted is
    /// dropped, as a lost device's would be. `false`, and nothing changed, when the device is
    /// not lost or was lost for real.
    pub fn revive_after_injected_loss(&self) -> bool {
        if !self.shared.health.lost_by_injected_fault() {
            return false;
        }
        self.shared.batch().discard();
        self.shared.health.clear_injected_loss();
        true
    }
}
