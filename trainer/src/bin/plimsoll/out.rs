//! Standard output that survives its reader leaving.
//!
//! `println!` panics when standard output is a closed pipe (`plimsoll train digits | head -3`).
//! [`say`] writes a line instead; after the first failed write it writes nothing more and raises
//! the flag given to [`stop_on_close`], so a run stops at the next step boundary the way Ctrl-C
//! stops it (saving its checkpoint) rather than dying mid-step or training on unseen.

use std::fmt::Display;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

static CLOSED: AtomicBool = AtomicBool::new(false);
static STOP: Mutex<Option<Arc<AtomicBool>>> = Mutex::new(None);

/// Writes `text` and a newline to standard output, or nothing once the output has closed.
pub fn say(text: impl Display) {
    if CLOSED.load(Ordering::SeqCst) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
        CLOSED.store(true, Ordering::SeqCst);
        if let Ok(guard) = STOP.lock()
            && let Some(flag) = guard.as_ref()
        {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

/// Whether a write to standard output has failed (its reader went away).
pub fn closed() -> bool {
    CLOSED.load(Ordering::SeqCst)
}

/// Raises `flag` when standard output closes (at once if it already has).
pub fn stop_on_close(flag: Arc<AtomicBool>) {
    if closed() {
        flag.store(true, Ordering::SeqCst);
    }
    if let Ok(mut guard) = STOP.lock() {
        *guard = Some(flag);
    }
}
