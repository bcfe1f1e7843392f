//! The host's memory: checked before a run allocates what a flag asked for, so a request too
//! large for the machine is [`Error::HostMemory`] with the figures, never an abort in the
//! allocator (`memory allocation of 25600000000 bytes failed`) or the kernel's OOM killer.

use crate::error::{Error, Result};

/// Bytes the host can still give, from `MemAvailable` in `/proc/meminfo` (Linux); `None` where
/// that is unknown (then nothing is refused up front).
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `count` elements of `element_bytes` each, or [`Error::HostMemory`] when the product
/// overflows or passes what the host has available. `what` names the request for the message.
pub fn check(what: &str, count: u64, element_bytes: u64) -> Result<u64> {
    let needed = count.checked_mul(element_bytes);
    let available = available_bytes();
    match (needed, available) {
        (Some(n), Some(a)) if n <= a => Ok(n),
        (Some(n), None) => Ok(n),
        (needed, available) => Err(Error::HostMemory {
            what: what.to_string(),
            needed_bytes: needed,
            available_bytes: available,
        }),
    }
}

/// The share of the host's available memory a run may hold by default
/// ([`crate::TrainConfig::host_memory_budget`]): the rest stays for everything else, so the
/// machine never swaps itself to a standstill.
pub const HOST_SHARE: f64 = 0.8;

/// The run's host budget: `asked`, else [`HOST_SHARE`] of what is available now (`None` where
/// that is unknown: nothing is refused up front).
pub fn budget(asked: Option<u64>) -> Option<u64> {
    asked.or_else(|| available_bytes().map(|a| (a as f64 * HOST_SHARE) as u64))
}

/// `a * b` as `u64`, saturating (a size that overflows is then refused by [`check`]).
pub fn product(a: usize, b: usize) -> u64 {
    (a as u64).saturating_mul(b as u64)
}
