//! SIGINT and SIGTERM as a request to stop, shared by the commands that run for long
//! (`train`, `sample`).
//!
//! The first signal raises a stop flag that the command reads between two units of work (a
//! training step, a sampled token), so that it ends cleanly: the run saved, the text printed
//! so far flushed. A second signal while stopping exits at once with the same code. The exit
//! codes are the shell's for a process a signal ended: 130 for SIGINT, 143 for SIGTERM.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

/// SIGINT and SIGTERM raise `stop` and record which arrived; a second one while `stop` is
/// raised exits at once with that signal's code (a run's last checkpoint on disk stays intact:
/// saves are atomic; printed text was flushed as it was written).
pub fn watch(stop: Arc<AtomicBool>) -> Result<Received> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let which = Arc::new(AtomicUsize::new(0));
    for (signal, code) in [(SIGINT, SIGINT_EXIT), (SIGTERM, SIGTERM_EXIT)] {
        let failed = |e: std::io::Error| Error::invalid("signal handler", e.to_string());
        // Registered first, so it sees `stop` as it was before this signal.
        signal_hook::flag::register_conditional_shutdown(
            signal,
            i32::from(code),
            Arc::clone(&stop),
        )
        .map_err(failed)?;
        signal_hook::flag::register_usize(signal, Arc::clone(&which), usize::from(code))
            .map_err(failed)?;
        signal_hook::flag::register(signal, Arc::clone(&stop)).map_err(failed)?;
    }
    Ok(Received(which))
}
