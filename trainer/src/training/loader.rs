//! The data loader: each step's samples built in host memory ([`Data::gather`]) ahead of the
//! step, on a thread of its own, while the device computes the steps before.
//!
//! The thread walks the run's data order exactly as the trainer does (the same
//! [`EpochOrder`] for `(seed, epoch)`, the same effective batch, this rank's [`shard`]) from the
//! position it was started at, and sends each step's [`HostBatch`] through a bounded queue:
//! at most `depth` built batches wait (`--prefetch N`), so its host memory is at most `depth`
//! batches ([`Loader::host_bytes`]). The trainer takes the batch of the step it is at and checks
//! that it is the one the thread built; a step that is not the next one (a resumed run, a
//! changed batch) starts the thread again from there. The device upload stays on the training
//! thread, through the ordered path (kernels-wgsl's rule for freed bytes), one micro-batch at a
//! time as before: prefetching changes no device allocation, so the memory plan is unchanged.
//!
//! With `depth` 0, or for data that builds its batches only on the device
//! ([`Data::gather`] is `None`), the step gathers its own batch when it needs it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::{Duration, Instant};

use crate::collective::shard;
use crate::data::EpochOrder;
use crate::error::{Error, Result};
use crate::task::{Data, HostBatch};

/// A step's place in the data order: the epoch and the first sample of the step in it.
pub type Position = (u64, usize);

/// One step's batch, built by the thread.
struct Built {
    at: Position,
    /// This rank's samples of the step (indices into the training set).
    indices: Vec<usize>,
    batch: Result<Option<HostBatch>>,
}

/// A running loader thread.
struct Running {
    rx: Receiver<Built>,
    /// The position of the next batch the queue will hand out.
    next: Position,
    /// Asks the thread to stop (it also stops when the queue's receiver is dropped).
    stop: Arc<AtomicBool>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The loader of one run's training data (see the module's documentation).
pub struct Loader {
    data: Arc<dyn Data>,
    seed: u64,
    effective_batch: usize,
    rank: usize,
    ranks: usize,
    depth: usize,
    /// How long a step waits for the thread before it is an error.
    deadline: Duration,
    running: Option<Running>,
    /// Bytes of the largest batch seen, for [`Loader::host_bytes`].
    batch_bytes: u64,
    /// Batches taken from the thread's queue.
    from_queue: u64,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("depth", &self.depth)
            .field("running", &self.running.is_some())
            .finish()
    }
}

/// What [`Loader::take`] hands the step.
#[derive(Debug)]
pub struct Taken {
    /// This rank's samples of the step, built (`None`: the data builds on the device only).
    pub batch: Option<HostBatch>,
    /// How long the step waited for it: the whole gather without prefetching, the wait on the
    /// queue with it.
    pub wait: Duration,
}

impl Loader {
    /// A loader of `data` for batches of `effective_batch` over `ranks` ranks (this one
    /// `rank`), seeded with `seed`, keeping up to `depth` batches ready (0: none, the step
    /// gathers its own). A wait longer than `deadline` for the thread is an error.
    pub fn new(
        data: Arc<dyn Data>,
        seed: u64,
        effective_batch: usize,
        (rank, ranks): (usize, usize),
        depth: usize,
        deadline: Duration,
    ) -> Loader {
        Loader {
            data,
            seed,
            effective_batch: effective_batch.max(1),
            rank,
            ranks: ranks.max(1),
            depth,
            deadline,
            running: None,
            batch_bytes: 0,
            from_queue: 0,
        }
    }

    /// The batches kept ready.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Steps whose batch came from the thread's queue (the others were built by the step).
    pub fn prefetched_batches(&self) -> u64 {
        self.from_queue
    }

    /// Host bytes the loader's batches take at most: `depth` batches ready (one, built when
    /// needed, without prefetching), at the largest batch seen so far.
    pub fn host_bytes(&self) -> u64 {
        self.batch_bytes * self.depth.max(1) as u64
    }

    /// The batch of the step at `at` whose samples (this rank's) are `indices`.
    pub fn take(&mut self, at: Position, indices: &[usize]) -> Result<Taken> {
        let start = Instant::now();
        let batch = match self.depth {
            0 => self.data.gather(indices)?,
            _ => self.take_queued(at, indices)?,
        };
        if let Some(b) = &batch {
            self.batch_bytes = self.batch_bytes.max(b.bytes());
        }
        Ok(Taken {
            batch,
            wait: start.elapsed(),
        })
    }

    fn take_queued(&mut self, at: Position, indices: &[usize]) -> Result<Option<HostBatch>> {
        if self.running.as_ref().is_none_or(|r| r.next != at) {
            self.running = Some(self.start(at));
        }
        let Some(running) = self.running.as_ref() else {
            return self.data.gather(indices);
        };
        let built = match running.rx.recv_timeout(self.deadline) {
            Ok(built) => built,
            Err(RecvTimeoutError::Timeout) => {
                self.running = None;
                return Err(Error::invalid(
                    "data loader",
                    format!(
                        "built no batch in {:.1} s (the step at sample {} of epoch {}); the \
                         data is read too slowly (a slow disk or network file system?): copy it \
                         to a local disk, or give --deadline-ms a larger value",
                        self.deadline.as_secs_f64(),
                        at.1,
                        at.0
                    ),
                ));
            }
            Err(RecvTimeoutError::Disconnected) => {
                // The thread ended (it only does after an error it sent): build here.
                self.running = None;
                return self.data.gather(indices);
            }
        };
        if built.at != at || built.indices != indices {
            // Not this step's batch (never expected): start again from here.
            self.running = None;
            return self.data.gather(indices);
        }
        let next = self.next_position(at);
        if let Some(running) = self.running.as_mut() {
            running.next = next;
        }
        self.from_queue += 1;
        if built.batch.is_err() {
            self.running = None;
        }
        built.batch
    }

    /// The position after the step at `at`.
    fn next_position(&self, at: Position) -> Position {
        let len = self.data.len();
        let step = self.effective_batch.min(len.saturating_sub(at.1));
        match at.1 + step >= len {
            true => (at.0 + 1, 0),
            false => (at.0, at.1 + step),
        }
    }

    /// A thread that builds the batches of the steps from `at` on.
    fn start(&self, at: Position) -> Running {
        let depth = self.depth.max(1);
        // The thread holds one batch while the queue holds the rest.
        let (tx, rx) = sync_channel(depth - 1);
        let stop = Arc::new(AtomicBool::new(false));
        let job = Job {
            data: Arc::clone(&self.data),
            seed: self.seed,
            effective_batch: self.effective_batch,
            rank: self.rank,
            ranks: self.ranks,
            stop: Arc::clone(&stop),
        };
        // A thread that cannot be started leaves the step to gather its own batches.
        let spawned = std::thread::Builder::new()
            .name("plimsoll-loader".into())
            .spawn(move || job.run(at, &tx));
        if spawned.is_err() {
            let (_, rx) = sync_channel(0);
            return Running { rx, next: at, stop };
        }
        Running { rx, next: at, stop }
    }
}

/// What the thread needs.
struct Job {
    data: Arc<dyn Data>,
    seed: u64,
    effective_batch: usize,
    rank: usize,
    ranks: usize,
    stop: Arc<AtomicBool>,
}

impl Job {
    fn run(self, mut at: Position, tx: &SyncSender<Built>) {
        let len = self.data.len();
        let mut order: Option<(u64, EpochOrder)> = None;
        while !self.stop.load(Ordering::SeqCst) {
            let (epoch, first) = at;
            if order.as_ref().is_none_or(|(e, _)| *e != epoch) {
                order = Some((epoch, EpochOrder::new(len, self.seed, epoch)));
            }
            let Some((_, current)) = &order else { return };
            let all = current.range(first, self.effective_batch);
            if all.is_empty() {
                return;
            }
            let indices = shard(&all, self.rank, self.ranks).to_vec();
            let batch = self.data.gather(&indices);
            let failed = batch.is_err();
            if tx.send(Built { at, indices, batch }).is_err() || failed {
                return;
            }
            at = match first + all.len() >= len {
                true => (epoch + 1, 0),
                false => (epoch, first + all.len()),
            };
        }
    }
}
