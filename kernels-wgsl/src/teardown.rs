//! Tearing a device down.
//!
//! # Dropping anywhere, thread-local destructors included
//!
//! The teardown (waiting for the GPU, then dropping the wgpu device, queue, buffers, pipelines)
//! runs on a short-lived helper thread, which the dropping thread waits for (within the drop
//! deadline plus [`TEARDOWN_MARGIN`]). Reason: in a debug build wgpu-core tracks its "snatch" lock
//! in a thread-local (`SNATCH_LOCK_TRACE`, which owns a `Backtrace` and so has a destructor) that
//! every `device.poll`, `Queue::drop` and last `Buffer` drop touches. A `Gpu` kept in a
//! `thread_local!` whose slot was registered before the thread first used wgpu (e.g.
//! `OnceCell::get_or_init(Gpu::new)`) is destroyed *after* that thread-local, since thread-local
//! destructors run in reverse order of registration; wgpu then panics with "cannot access a
//! Thread Local Storage value during or after destruction", and a panic escaping a thread-local
//! destructor aborts the process. On the helper thread wgpu's thread-locals are alive. So the
//! dropping thread itself touches no wgpu object whose drop would reach wgpu-core: it only drops
//! clones of the device and queue that the helper still holds (a reference count).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use plimsoll_allocator::BufferAllocator;

use crate::device::Shared;
use crate::fence;
use crate::memory::WgpuSegments;
use crate::pipeline::PipelineCache;
use crate::recorder::Batch;

/// Devices this process leaked because their work outlived the drop deadline.
pub(crate) static LEAKED_DEVICES: AtomicUsize = AtomicUsize::new(0);

/// What the last leak was ([`crate::Gpu::last_leak`]). A library prints nothing: the program
/// says it, once, where it fits (the `plimsoll` command does unless its error already did).
pub(crate) static LAST_LEAK: Mutex<Option<String>> = Mutex::new(None);

fn note_leak(what: String) {
    if let Ok(mut last) = LAST_LEAK.lock() {
        *last = Some(what);
    }
}

/// How much longer than [`crate::Gpu::drop_deadline`] dropping the last [`crate::Gpu`] waits
/// for the teardown thread (see the module docs) before returning without it; the thread then
/// finishes alone.
pub const TEARDOWN_MARGIN: Duration = Duration::from_secs(1);

/// Everything of a device whose drop reaches wgpu-core, moved out of [`Shared`] when it drops and
/// dropped on the teardown thread.
struct Teardown {
    device: wgpu::Device,
    queue: wgpu::Queue,
    batch: Batch,
    memory: BufferAllocator<WgpuSegments>,
    /// Only held, to be dropped on the teardown thread.
    _pipelines: PipelineCache,
    drop_deadline: Duration,
    adapter: String,
    /// A planning device submitted nothing: there is nothing to wait for.
    planning: bool,
}

impl Teardown {
    /// Waits for the GPU within the drop deadline, then drops everything; past the deadline,
    /// leaks the device instead (policy in [`crate::fence`]).
    fn finish(mut self) {
        // Nobody can read the results of work that was never submitted.
        self.batch.discard();
        if self.planning || fence::drain(&self.device, self.drop_deadline) {
            return;
        }
        // wgpu's `Queue::drop` would wait for idle without a limit (vkQueueWaitIdle). A forgotten
        // clone keeps wgpu's queue and device alive for good, and with them the in-flight
        // submissions and every buffer they use, so the rest drops safely.
        std::mem::forget(self.device.clone());
        std::mem::forget(self.queue.clone());
        LEAKED_DEVICES.fetch_add(1, Ordering::SeqCst);
        let reserved_bytes = self.memory.stats().reserved_bytes;
        note_leak(format!(
            "GPU work on {} was still running {} ms after the last Gpu was dropped (its drop \
             deadline); the device, its queue and {} MiB of buffers were left to it instead of \
             blocking",
            self.adapter,
            self.drop_deadline.as_millis(),
            reserved_bytes >> 20
        ));
    }

    /// Leaks everything without touching wgpu (no thread could be started for the teardown).
    fn abandon(self) {
        LEAKED_DEVICES.fetch_add(1, Ordering::SeqCst);
        std::mem::forget(self);
    }
}

/// Sends its signal when dropped: the teardown thread's "done", dropped with the thread's
/// thread-locals.
struct SignalOnDrop(Option<mpsc::Sender<()>>);

impl Drop for SignalOnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

thread_local! {
    /// Set first thing on the teardown thread, so its destructor runs after every thread-local
    /// the teardown registers later (thread-local destructors run in reverse order).
    static DONE_ON_EXIT: std::cell::RefCell<SignalOnDrop> =
        const { std::cell::RefCell::new(SignalOnDrop(None)) };
}

/// The last field of [`Shared`]: when it drops, every other field has dropped, so it lets the
/// teardown thread go and waits for it to finish, at most `limit`.
///
/// "Finish" means the thread has *exited*, not only sent `done`. After its Rust thread-locals a
/// thread still runs C-level per-thread destructors (`pthread_key` ones, which Mesa and LLVM
/// register) and glibc's per-thread cleanup. A process that returned from `main` meanwhile ran
/// the libraries' exit handlers and global destructors alongside them: `double free or
/// corruption (fasttop)` in the teardown thread at exit, caught once in 92 runs of a dev
/// build. So after `done` the gate waits until the thread is gone (its `/proc` task entry, a
/// bounded poll) and joins it.
#[derive(Default)]
pub(crate) struct TeardownGate {
    go: Option<mpsc::Sender<()>>,
    /// In a mutex only to make `Shared` `Sync` (a `Receiver` is not); used only when dropping.
    done: Mutex<Option<mpsc::Receiver<()>>>,
    /// The teardown thread, joined once it has exited.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Its `/proc/<pid>/task/<tid>` entry (Linux), which disappears when it has exited; the
    /// thread writes it first thing.
    task: Arc<Mutex<Option<std::path::PathBuf>>>,
    limit: Duration,
}

/// How often the gate looks whether the teardown thread has exited.
const EXIT_POLL: Duration = Duration::from_millis(1);

impl Drop for TeardownGate {
    fn drop(&mut self) {
        let start = Instant::now();
        // Dropping the sender is the signal (the thread's `recv` returns).
        drop(self.go.take());
        let done = self
            .done
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(done) = done else {
            return;
        };
        // `Ok` when it finished, `Disconnected` if it died, `Timeout`: it finishes alone.
        if let Err(mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(self.limit) {
            return;
        }
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let exited = match task {
            Some(task) => loop {
                if !task.exists() {
                    break true;
                }
                if start.elapsed() >= self.limit {
                    break false;
                }
                std::thread::sleep(EXIT_POLL);
            },
            // No `/proc` (not Linux): the thread has sent `done`; what is left of it is its
            // exit, which the join waits for.
            None => true,
        };
        if let (true, Some(thread)) = (exited, thread) {
            let _ = thread.join();
        }
    }
}

/// This thread's `/proc/<pid>/task/<tid>` entry, where `/proc` exists.
fn own_task_entry() -> Option<std::path::PathBuf> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    Some(std::path::Path::new("/proc").join(link))
}

impl Drop for Shared {
    fn drop(&mut self) {
        let drop_deadline = self.deadlines.drop_deadline();
        // Move out whatever reaches wgpu-core when dropped; what stays (clones of the device and
        // queue, an empty allocator and batch) drops here as mere reference counts.
        let empty_memory = BufferAllocator::new(
            WgpuSegments::new(self.device.clone(), Arc::clone(&self.faults)),
            self.memory().config().clone(),
        );
        let empty_batch = Batch::new(&self.limits);
        let teardown = Teardown {
            device: self.device.clone(),
            queue: self.queue.clone(),
            batch: std::mem::replace(
                self.batch.get_mut().unwrap_or_else(|p| p.into_inner()),
                empty_batch,
            ),
            memory: std::mem::replace(
                self.memory.get_mut().unwrap_or_else(|p| p.into_inner()),
                empty_memory,
            ),
            _pipelines: std::mem::take(&mut self.pipelines),
            drop_deadline,
            adapter: self.summary.name.clone(),
            planning: self.planning,
        };
        let slot = Arc::new(Mutex::new(Some(teardown)));
        let (go, go_rx) = mpsc::channel::<()>();
        let (done_tx, done) = mpsc::channel::<()>();
        let for_thread = Arc::clone(&slot);
        let task = Arc::new(Mutex::new(None));
        let task_for_thread = Arc::clone(&task);
        // `spawn` itself may panic where std's own thread-locals are gone; contain it.
        let spawned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::thread::Builder::new()
                .name("plimsoll gpu teardown".to_string())
                .spawn(move || {
                    if let Ok(mut slot) = task_for_thread.lock() {
                        *slot = own_task_entry();
                    }
                    // "Done" is sent by a thread-local registered before any other in this
                    // thread, so it drops last: after wgpu's own thread-locals, whose
                    // destructors would otherwise still run while the process goes on (and
                    // perhaps exits) past a `done` sent from here.
                    let mut done_tx = Some(done_tx);
                    let _ = DONE_ON_EXIT.try_with(|slot| {
                        if let Ok(mut slot) = slot.try_borrow_mut() {
                            slot.0 = done_tx.take();
                        }
                    });
                    // Wait until the rest of `Shared` has dropped (the gate's sender is gone).
                    let _ = go_rx.recv();
                    let teardown = for_thread.lock().ok().and_then(|mut t| t.take());
                    if let Some(teardown) = teardown {
                        teardown.finish();
                    }
                    // Only if the thread-local could not take it.
                    if let Some(tx) = done_tx {
                        let _ = tx.send(());
                    }
                })
        }));
        match spawned {
            Ok(Ok(thread)) => {
                self.teardown = TeardownGate {
                    go: Some(go),
                    done: Mutex::new(Some(done)),
                    thread: Mutex::new(Some(thread)),
                    task,
                    limit: drop_deadline.saturating_add(TEARDOWN_MARGIN),
                };
            }
            _ => {
                let teardown = slot.lock().ok().and_then(|mut t| t.take());
                if let Some(teardown) = teardown {
                    teardown.abandon();
                    note_leak(format!(
                        "no thread could be started to tear down the device on {}; it was left \
                         as it was",
                        self.summary.name
                    ));
                }
            }
        }
    }
}
