//! Where the process's host memory goes, step by step: the Rust heap counted by
//! [`CountingAllocator`] (Plimsoll's own allocations and wgpu's, not the driver's, which
//! allocates through C's `malloc`) and the resident set the kernel reports.
//!
//! A program opts in by installing the allocator (the `plimsoll` command and `cargo xtask` do):
//!
//! ```
//! #[global_allocator]
//! static HEAP: plimsoll_trainer::host_memory::CountingAllocator =
//!     plimsoll_trainer::host_memory::CountingAllocator;
//! # fn main() {
//! let before = plimsoll_trainer::host_memory::heap().expect("installed above");
//! let kept = vec![0u8; 1 << 20];
//! let after = plimsoll_trainer::host_memory::heap().expect("installed above");
//! assert!(after.live_bytes >= before.live_bytes + (1 << 20));
//! # drop(kept);
//! # }
//! ```
//!
//! Each [`crate::StepReport`] then carries the counts after the step ([`HeapCounts`]), and
//! `cargo xtask soak` judges a run by them: after warm-up, the live bytes between steps and the
//! heap's high-water mark must not rise.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;

/// The system allocator, counting live bytes, their high-water mark and allocation calls.
/// Every call goes to [`System`] unchanged; the counts cost a few relaxed atomic operations.
pub struct CountingAllocator;

/// Set by the first allocation through [`CountingAllocator`]: the counts mean something.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Bytes allocated and not yet freed.
static LIVE: AtomicU64 = AtomicU64::new(0);
/// The most `LIVE` has been since the process started (or [`reset_peak`]).
static PEAK: AtomicU64 = AtomicU64::new(0);
/// Allocation calls (`alloc`, `alloc_zeroed`, and a `realloc` that grows) since the start.
static CALLS: AtomicU64 = AtomicU64::new(0);
/// Bytes those calls asked for since the start (a growing `realloc`, what it added).
static ALLOCATED: AtomicU64 = AtomicU64::new(0);

fn grew(bytes: u64) {
    ALLOCATED.fetch_add(bytes, Ordering::Relaxed);
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn counted(bytes: u64) {
    INSTALLED.store(true, Ordering::Relaxed);
    CALLS.fetch_add(1, Ordering::Relaxed);
    grew(bytes);
}

// SAFETY: every call is forwarded to `System` with the caller's arguments; the counters are
// arithmetic beside it and never touch the memory.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `System::alloc`, with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            counted(layout.size() as u64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `System::alloc_zeroed`, with the caller's layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            counted(layout.size() as u64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `System::realloc`, with the caller's arguments.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            let (old, new) = (layout.size() as u64, new_size as u64);
            if new >= old {
                CALLS.fetch_add(1, Ordering::Relaxed);
                grew(new - old);
            } else {
                LIVE.fetch_sub(old - new, Ordering::Relaxed);
            }
        }
        p
    }
}

/// The Rust heap's counts at one moment ([`heap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HeapCounts {
    /// Bytes allocated and not yet freed.
    pub live_bytes: u64,
    /// The most bytes live at once since the process started (or [`reset_peak`]).
    pub peak_bytes: u64,
    /// Allocation calls since the process started: the difference between two reports is the
    /// allocations made between them.
    pub allocations: u64,
    /// Bytes allocated since the process started (freed or not).
    pub allocated_bytes: u64,
}

/// The counts now, or `None` when this process did not install [`CountingAllocator`].
pub fn heap() -> Option<HeapCounts> {
    INSTALLED.load(Ordering::Relaxed).then(|| HeapCounts {
        live_bytes: LIVE.load(Ordering::Relaxed),
        peak_bytes: PEAK.load(Ordering::Relaxed),
        allocations: CALLS.load(Ordering::Relaxed),
        allocated_bytes: ALLOCATED.load(Ordering::Relaxed),
    })
}

/// Starts the high-water mark again from the bytes live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The process's resident set in bytes (`VmRSS` of Linux's `/proc/self/status`); `None` where
/// that is not known.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
