//! Dropping the last `Gpu` returns only once its teardown thread has *exited*. A thread that has
//! sent "done" still runs C-level per-thread destructors and glibc's thread cleanup; a process
//! that went on to exit meanwhile aborted with `double free or corruption` in that thread.
//!
//! A test binary of its own: no other test's device may be tearing down at the same time.
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::testing::{fresh_gpu, skip};

/// The name the teardown thread gets, as Linux keeps it (15 bytes).
const THREAD_NAME: &str = "plimsoll gpu te";

/// This process's threads with that name, from `/proc/self/task/*/comm`; `None` without
/// `/proc`.
fn teardown_threads() -> Option<usize> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    Some(
        tasks
            .filter_map(Result::ok)
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .filter(|name| name.trim_end() == THREAD_NAME)
            .count(),
    )
}

#[test]
fn dropping_the_last_gpu_returns_after_its_teardown_thread_has_exited() {
    if teardown_threads().is_none() {
        let test = "dropping_the_last_gpu_returns_after_its_teardown_thread_has_exited";
        skip(
            test,
            "no /proc/self/task here: its threads cannot be counted",
        );
        return;
    }
    for round in 0..100 {
        let gpu = fresh_gpu();
        // Some work, so the teardown has a device, a queue and buffers to drop.
        let buffer = gpu
            .upload(&[1.0f32; 1024], Category::Temporary, "teardown test")
            .unwrap();
        let back: Vec<f32> = gpu.read_all(&buffer, gpu.default_deadline()).unwrap();
        assert_eq!(back.len(), 1024);
        drop(buffer);
        drop(gpu);
        assert_eq!(
            teardown_threads(),
            Some(0),
            "round {round}: a teardown thread outlived the drop of the last Gpu"
        );
    }
}
