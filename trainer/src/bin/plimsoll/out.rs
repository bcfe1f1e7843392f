//! Output that survives its reader leaving.
//!
//! `println!` panics when standard output is a closed pipe (`plimsoll train digits | head -3`),
//! and `eprintln!` when standard error is. [`say`] writes a line to standard output instead;
//! after the first failed write it writes nothing more, and the run goes on (training and
//! checkpointing do not depend on anyone reading). [`warn`] writes to standard error and
//! ignores a failure.

use std::fmt::Display;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// This process's rank in a data-parallel run: rank 0 prints; the others print only warnings
/// and errors, prefixed with `rank N: `.
static RANK: AtomicUsize = AtomicUsize::new(0);

/// Sets this process's rank (see [`RANK`]).
#[cfg(feature = "mpi")]
pub fn set_rank(rank: usize) {
    RANK.store(rank, Ordering::SeqCst);
}

/// Writes `text` and a newline to standard output, flushed, or nothing once the output has
/// closed.
pub fn say(text: impl Display) {
    if CLOSED.load(Ordering::SeqCst) || RANK.load(Ordering::SeqCst) != 0 {
        return;
    }
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
        CLOSED.store(true, Ordering::SeqCst);
    }
}

/// Writes `text` and a newline to standard error; a failure is ignored.
pub fn warn(text: impl Display) {
    // One write per line: standard error is unbuffered, and under mpirun the ranks' lines
    // would otherwise interleave in pieces.
    let line = match RANK.load(Ordering::SeqCst) {
        0 => format!("{text}\n"),
        rank => format!("rank {rank}: {text}\n"),
    };
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(line.as_bytes()).and_then(|()| err.flush());
}

static ERROR_SHOWN: AtomicBool = AtomicBool::new(false);

/// Prints `error: <error>` on standard error once: the first call prints, later ones (the
/// command's own at exit) do nothing. A run prints its error before it drops the device, whose
/// teardown may wait for stalled GPU work.
pub fn error(error: impl Display) {
    if !ERROR_SHOWN.swap(true, Ordering::SeqCst) {
        warn(format_args!("error: {error}"));
    }
}
