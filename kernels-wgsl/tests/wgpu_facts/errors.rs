//! §1 and §2: what a failed submit, an unscoped error and an oversized buffer do.

use std::time::Instant;

use crate::{DEADLINE, ErrorLog, raw_device, read_back, storage_buffer, validation_error};

/// Pitfall 5: a submit that fails validation still returns an index, and waiting on that index
/// is `WrongSubmissionIndex` at once, not a hang; the device stays usable.
#[test]
fn failed_submit_returns_an_index_that_waits_as_wrong_submission_index() {
    let log = ErrorLog::default();
    let raw = raw_device(wgpu::Features::empty(), Some(&log));
    let (gone, seen) = (
        storage_buffer(&raw.device, "destroyed", 16),
        storage_buffer(&raw.device, "seen", 16),
    );
    gone.destroy();
    let (index, error) = validation_error(&raw.device, || {
        let mut enc = raw.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&gone, 0, &seen, 0, 16);
        raw.queue.submit([enc.finish()])
    });
    assert!(
        matches!(error, Some(wgpu::Error::Validation { .. })),
        "{error:?}"
    );
    let start = Instant::now();
    let waited = raw.device.poll(wgpu::PollType::Wait {
        submission_index: Some(index),
        timeout: Some(DEADLINE),
    });
    assert!(
        matches!(waited, Err(wgpu::PollError::WrongSubmissionIndex(..))),
        "{waited:?}"
    );
    assert!(start.elapsed() < DEADLINE / 2, "the wait returned at once");
    raw.queue.write_buffer(&seen, 0, &[7u8; 16]);
    assert_eq!(read_back(&raw, &seen, 0, 16), vec![7u8; 16]);
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
}

/// Pitfall 6: with no uncaptured-error handler, an error outside every scope panics (hence the
/// handler `Gpu` always installs).
#[test]
fn error_outside_any_scope_panics_without_a_handler() {
    let raw = raw_device(wgpu::Features::empty(), None);
    let too_big = raw.device.limits().max_buffer_size + 256;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        storage_buffer(&raw.device, "too big", too_big)
    }));
    let payload = outcome.expect_err("wgpu should have panicked");
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(message.contains("wgpu error"), "{message}");
}

/// Pitfall 6: error scopes belong to the thread that pushed them. An error raised on another
/// thread skips this thread's scope and goes to the uncaptured handler; the same error raised on
/// this thread is caught.
#[test]
fn error_scopes_are_per_thread() {
    let log = ErrorLog::default();
    let raw = raw_device(wgpu::Features::empty(), Some(&log));
    let too_big = raw.device.limits().max_buffer_size + 256;
    let (_, caught) = validation_error(&raw.device, || {
        std::thread::scope(|s| {
            s.spawn(|| storage_buffer(&raw.device, "other thread", too_big));
        });
    });
    assert!(caught.is_none(), "{caught:?}");
    assert_eq!(log.lock().unwrap().len(), 1, "{:?}", log.lock().unwrap());
    let (_, caught) = validation_error(&raw.device, || {
        storage_buffer(&raw.device, "this thread", too_big)
    });
    assert!(caught.is_some());
    assert_eq!(log.lock().unwrap().len(), 1);
}

/// Pitfall 7: a buffer over `max_buffer_size` is a Validation error, not OutOfMemory, and the
/// message names the maximum buffer size (what `memory.rs`'s simulated device cap relies on).
#[test]
fn buffer_over_max_buffer_size_is_a_validation_error_not_out_of_memory() {
    let log = ErrorLog::default();
    let raw = raw_device(wgpu::Features::empty(), Some(&log));
    let too_big = raw.device.limits().max_buffer_size + 256;
    let oom = raw.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = raw.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let _buffer = storage_buffer(&raw.device, "too big", too_big);
    let v = pollster::block_on(validation.pop());
    let o = pollster::block_on(oom.pop());
    assert!(o.is_none(), "{o:?}");
    let Some(wgpu::Error::Validation { description, .. }) = v else {
        panic!("expected a Validation error, got {v:?}");
    };
    assert!(description.contains("maximum buffer size"), "{description}");
    assert!(log.lock().unwrap().is_empty());
}
