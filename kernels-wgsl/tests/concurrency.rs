//! One `Gpu` used from several threads at once, and a `Gpu` dropped where little of the thread is
//! left (a thread-local destructor).
//!
//! - Concurrent read-backs: wgpu runs map and work-done callbacks on whichever thread's
//!   `device.poll` / `queue.submit` retired the submission, *after* that call released wgpu's
//!   locks. So another thread's own wait can already see its fence as done while the callback
//!   that maps its staging buffer has not run yet. Every read must still return its own data.
//! - Thread-local destructors: in a debug build wgpu-core keeps a thread-local (its snatch-lock
//!   trace) that `device.poll`, `Queue::drop` and the last drop of a buffer touch; once it is
//!   destroyed, wgpu panics there, and a panic in a thread-local destructor aborts the process.
//!   Dropping the last `Gpu` (or buffer) from a thread-local destructor must not abort.
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::OnceCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use plimsoll_kernels_wgsl::kernels::fill::fill;
use plimsoll_kernels_wgsl::{Category, DeviceBuffer, Gpu};

use plimsoll_kernels_wgsl::testing::{DEADLINE, fresh_gpu};

/// Threads reading back at once.
const THREADS: usize = 16;
/// Read-backs per thread.
const READS: usize = 100;

fn pattern(thread: usize, read: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((thread as u32) << 24) ^ ((read as u32) << 12) ^ (i as u32))
        .collect()
}

/// N threads × M read-backs of distinct buffers from one `Gpu` (clones share the device); each
/// read must return its own buffer's data, never `Error::Map` ("map callback did not run").
#[test]
fn concurrent_read_backs_from_one_gpu_each_get_their_own_data() {
    let gpu = fresh_gpu();
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let stop = Arc::new(AtomicBool::new(false));
    // A monitor thread that keeps polling (as `recent_submissions` does) retires submissions and
    // runs their callbacks at any moment, like a second reader does.
    let monitor = {
        let gpu = gpu.clone();
        let barrier = Arc::clone(&barrier);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            barrier.wait();
            let mut polls = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let _ = gpu.recent_submissions();
                polls += 1;
            }
            polls
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let gpu = gpu.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                for r in 0..READS {
                    let want = pattern(t, r, 64 + 16 * ((t + r) % 7));
                    let label = format!("thread {t} read {r}");
                    let buffer = gpu.upload(&want, Category::Activation, &label).unwrap();
                    let got: Vec<u32> = gpu
                        .read_all(&buffer, DEADLINE)
                        .unwrap_or_else(|e| panic!("{label}: {e}"));
                    assert_eq!(got, want, "{label}: wrong data");
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for (t, worker) in workers.into_iter().enumerate() {
        if let Err(panic) = worker.join() {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("thread {t}: {message}"));
        }
    }
    stop.store(true, Ordering::SeqCst);
    let polls = monitor.join().unwrap();
    println!("monitor polled {polls} times");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Reads on one thread while another flushes and waits on its fences (the pattern of a trainer
/// reading a loss while a second thread drives the optimizer).
#[test]
fn reads_race_with_flush_and_wait_on_another_thread() {
    let gpu = fresh_gpu();
    let data: Vec<u32> = (0..256).collect();
    let buffer = Arc::new(gpu.upload(&data, Category::Parameter, "shared").unwrap());
    let barrier = Arc::new(Barrier::new(2));
    let waiter = {
        let gpu = gpu.clone();
        let barrier = Arc::clone(&barrier);
        let buffer = Arc::clone(&buffer);
        std::thread::spawn(move || {
            barrier.wait();
            for i in 0..READS {
                gpu.write(&buffer, (i % 256) as u64, &[(i % 256) as u32])
                    .unwrap();
                let fence = gpu.flush("waiter").unwrap();
                gpu.wait(&fence, DEADLINE).unwrap();
                assert!(gpu.is_done(&fence).unwrap());
            }
        })
    };
    barrier.wait();
    for r in 0..READS {
        let other = gpu
            .upload(&pattern(9, r, 128), Category::Activation, "reader")
            .unwrap();
        let got: Vec<u32> = gpu.read_all(&other, DEADLINE).unwrap();
        assert_eq!(got, pattern(9, r, 128), "read {r}");
    }
    waiter.join().unwrap();
    gpu.synchronize(DEADLINE).unwrap();
}

thread_local! {
    /// Registered at its first access, before the thread first uses wgpu (the autograd tests'
    /// pattern): destroyed after wgpu-core's own thread-locals.
    static FIRST_GPU: OnceCell<Gpu> = const { OnceCell::new() };
    static FIRST_BUFFER: OnceCell<DeviceBuffer> = const { OnceCell::new() };
}

/// Set in the child process that runs one thread-local scenario (see [`in_child_process`]).
const CHILD_ENV: &str = "PLIMSOLL_TLS_DROP_CHILD";

/// Runs `test` (this binary's test of that name) again in a child process with `CHILD_ENV` set,
/// so an abort fails this test with its output instead of killing the whole test binary.
/// Returns `true` in the child, which then runs the scenario.
fn in_child_process(test: &str) -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "child process for {test} failed ({}):\n{text}",
        out.status
    );
    false
}

/// A spawned thread keeps a `Gpu` (and buffers) in thread-locals registered before its first
/// wgpu call, and exits: their destructors drop the device. Before the fix this aborted the
/// process ("fatal runtime error: thread local panicked on drop", SIGABRT): wgpu-core's debug
/// snatch-lock trace, itself a thread-local, was already destroyed.
fn drop_in_thread_local_destructor(work: fn(&Gpu, &DeviceBuffer)) {
    std::thread::spawn(move || {
        let gpu = FIRST_GPU.with(|g| g.get_or_init(fresh_gpu).clone());
        let buffer = gpu
            .upload(&[1.0f32; 64], Category::Parameter, "tls weights")
            .unwrap();
        let got: Vec<f32> = gpu.read_all(&buffer, DEADLINE).unwrap();
        assert_eq!(got, vec![1.0; 64]);
        work(&gpu, &buffer);
        assert!(FIRST_BUFFER.with(|b| b.set(buffer).is_ok()));
        // The thread exits: FIRST_BUFFER, then FIRST_GPU drop in its thread-local destructors.
    })
    .join()
    .expect("the thread holding a Gpu in a thread-local exited cleanly");
}

#[test]
fn gpu_dropped_in_a_thread_local_destructor_does_not_abort() {
    if in_child_process("gpu_dropped_in_a_thread_local_destructor_does_not_abort") {
        drop_in_thread_local_destructor(|_, _| {});
    }
}

/// The same with an unsubmitted dispatch (the drop discards it) and submitted work still in
/// flight (the drop waits for it).
#[test]
fn gpu_with_work_dropped_in_a_thread_local_destructor_does_not_abort() {
    if in_child_process("gpu_with_work_dropped_in_a_thread_local_destructor_does_not_abort") {
        drop_in_thread_local_destructor(|gpu, buffer| {
            fill(gpu, buffer.slice(0, 64).unwrap(), 2.0).unwrap();
            gpu.flush("in flight at the drop").unwrap();
            fill(gpu, buffer.slice(0, 64).unwrap(), 3.0).unwrap();
        });
    }
}

/// A buffer in a thread-local as the last owner of its device (the `Gpu` handle dropped first):
/// its destructor tears the device down, and must not drop the last handle of a wgpu buffer.
#[test]
fn buffer_owning_the_last_gpu_reference_dropped_in_a_thread_local_destructor() {
    if in_child_process("buffer_owning_the_last_gpu_reference_dropped_in_a_thread_local_destructor")
    {
        std::thread::spawn(|| {
            FIRST_BUFFER.with(|_| {});
            let gpu = fresh_gpu();
            let buffer = gpu
                .upload(&[5u32; 32], Category::Activation, "last owner")
                .unwrap();
            let got: Vec<u32> = gpu.read_all(&buffer, DEADLINE).unwrap();
            assert_eq!(got, vec![5; 32]);
            drop(gpu);
            assert!(FIRST_BUFFER.with(|b| b.set(buffer).is_ok()));
        })
        .join()
        .expect("the thread holding a buffer in a thread-local exited cleanly");
    }
}
