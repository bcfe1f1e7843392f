//! SIGINT and SIGTERM as a request to stop, shared by the commands that run for long
//! (`train`, `sample`).
//!
//! The first signal raises a stop flag that the command reads between two units of work (a
//! training step, a sampled token), so that it ends cleanly: the run saved, the text printed
//! so far flushed. A second signal while stopping exits at once with the same code, unless it
//! came within half a second of the first (`timeout` and process-group kills send one twice). The exit
//! codes are the shell's for a process a signal ended: 130 for SIGINT, 143 for SIGTERM.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use plimsoll_trainer::{Error, Result};

/// The exit code after SIGINT (Ctrl-C).
pub const SIGINT_EXIT: u8 = 130;
/// The exit code after SIGTERM.
pub const SIGTERM_EXIT: u8 = 143;

/// Which signal arrived, if any: what [`watch`] returns.
#[derive(Clone)]
pub struct Received(Arc<AtomicUsize>);

impl Received {
    /// The exit code of the last signal received: [`SIGINT_EXIT`], [`SIGTERM_EXIT`], or `None`
    /// before any.
    pub fn code(&self) -> Option<u8> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            c if c == usize::from(SIGTERM_EXIT) => Some(SIGTERM_EXIT),
            _ => Some(SIGINT_EXIT),
        }
    }

    /// The exit code to end with: that of the signal received, or 130 (an interrupt) when
    /// the stop came from elsewhere.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code().unwrap_or(SIGINT_EXIT))
    }

    /// The signal for a message: `SIGTERM`, or `interrupted (Ctrl-C)`.
    pub fn name(&self) -> &'static str {
        match self.code() {
            Some(SIGTERM_EXIT) => "SIGTERM",
            _ => "interrupted (Ctrl-C)",
        }
    }
}

/// Signals this close to the first count as the first: `timeout`, a process-group kill or a
/// job scheduler can deliver the same signal twice within microseconds, and that must still
/// end the run cleanly. A second Ctrl-C pressed by a person comes later than this.
pub const SAME_SIGNAL_WITHIN: Duration = Duration::from_millis(500);

/// SIGINT and SIGTERM raise `stop` and record which arrived. Another one at least
/// [`SAME_SIGNAL_WITHIN`] after the first exits at once with that signal's code (a run's last
/// checkpoint on disk stays intact: saves are atomic; printed text was flushed as it was
/// written); one sooner is taken as the same request.
#[allow(unsafe_code)]
pub fn watch(stop: Arc<AtomicBool>) -> Result<Received> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let which = Arc::new(AtomicUsize::new(0));
    // Nanoseconds after `base` at which the first signal arrived, plus one; 0 before any.
    let first = Arc::new(AtomicU64::new(0));
    let base = Instant::now();
    let within = u64::try_from(SAME_SIGNAL_WITHIN.as_nanos()).unwrap_or(u64::MAX);
    for (signal, code) in [(SIGINT, SIGINT_EXIT), (SIGTERM, SIGTERM_EXIT)] {
        let (stop, which, first) = (Arc::clone(&stop), Arc::clone(&which), Arc::clone(&first));
        let handler = move || {
            let now = u64::try_from(base.elapsed().as_nanos())
                .unwrap_or(u64::MAX - 1)
                .saturating_add(1);
            if let Err(then) = first.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst)
                && now.saturating_sub(then) >= within
            {
                signal_hook::low_level::exit(i32::from(code));
            }
            which.store(usize::from(code), Ordering::SeqCst);
            stop.store(true, Ordering::SeqCst);
        };
        // SAFETY: the handler only reads the monotonic clock (`clock_gettime`, which POSIX
        // lists as async-signal-safe), touches atomics, and calls `_exit` through
        // `signal_hook::low_level::exit`; it neither allocates nor locks.
        unsafe { signal_hook::low_level::register(signal, handler) }
            .map_err(|e| Error::invalid("signal handler", e.to_string()))?;
    }
    Ok(Received(which))
}
