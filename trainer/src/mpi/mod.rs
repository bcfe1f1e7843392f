//! [`MpiCollective`]: the ranks of a data-parallel run over MPI (feature `mpi`; Open MPI or
//! any MPI the `mpi` crate builds against).
//!
//! # A deadline on every collective
//!
//! MPI calls block until every rank takes part, and a rank that died or hangs never does. So
//! every MPI call runs on one communication thread (MPI is initialised there, as
//! `MPI_THREAD_FUNNELED`), as non-blocking operations polled with `MPI_Test`; the caller waits
//! for the answer with a deadline. With each all-reduce every rank also sends the others a
//! stamp (the call's sequence number and the step), and while it waits it answers pings. Past
//! the deadline the caller pings the others for a moment: a rank whose stamp never came never
//! reached the call; one whose stamp came but that does not answer died or hangs in it. The
//! error names them ([`Error::RanksUnresponsive`]). After that the communication thread is
//! stuck with a request it cannot cancel: every later call fails at once, MPI is not
//! finalised (it would wait for the missing rank), and [`MpiCollective::abort`] ends the job.
//!
//! Launch with `mpirun -np N plimsoll train ...`; add `--enable-recovery` (Open MPI) so that
//! a rank that dies is reported by the others, as this module does, rather than having
//! `mpirun` kill them at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::collective::Collective;

mod comm;
use crate::error::{Error, Result, Unresponsive};
use comm::communicate;

/// How long starting MPI may take.
pub const INIT_DEADLINE: Duration = Duration::from_secs(60);

/// How long finalising MPI may take when the run ends.
pub const FINALIZE_DEADLINE: Duration = Duration::from_secs(30);

/// The last part of a collective call's deadline (at most this, at most a quarter of it), in
/// which the caller pings the others to learn which are dead or hung.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);

/// A rank's last step seen by this one: none yet.
pub(crate) const NEVER: u64 = u64::MAX;

/// The stamp each rank sends the others with an all-reduce: the call's sequence number (the
/// same on every rank) and the step.
pub(crate) type Stamp = [u64; 2];

pub(crate) enum Job {
    AllReduceF32 {
        values: Vec<f32>,
        stamp: Stamp,
        reply: mpsc::Sender<Vec<f32>>,
    },
    /// `values` holds one equal block per rank; each rank gets the sum of its block.
    ReduceScatterF32 {
        values: Vec<f32>,
        stamp: Stamp,
        reply: mpsc::Sender<Vec<f32>>,
    },
    /// Every rank's `values` (the same length on each), joined in rank order.
    AllGatherF32 {
        values: Vec<f32>,
        stamp: Stamp,
        reply: mpsc::Sender<Vec<f32>>,
    },
    AllReduceU64 {
        values: Vec<u64>,
        stamp: Stamp,
        reply: mpsc::Sender<Vec<u64>>,
    },
    AllReduceF64 {
        values: Vec<f64>,
        stamp: Stamp,
        reply: mpsc::Sender<Vec<f64>>,
    },
    /// Rank 0 receives `lengths[r]` bytes from each rank `r`; the others send theirs.
    Gather {
        bytes: Vec<u8>,
        lengths: Vec<u64>,
        reply: mpsc::Sender<Vec<Vec<u8>>>,
    },
    Finish {
        reply: mpsc::Sender<()>,
    },
}

/// What the communication thread and the callers share.
pub(crate) struct Watch {
    /// Per rank, the last stamp it was seen sending: the call's sequence number and its step
    /// ([`NEVER`] before the first).
    arrived: Vec<[AtomicU64; 2]>,
    /// Set by a caller past its deadline: ping every other rank.
    probe: AtomicBool,
    /// Per rank, whether it answered the ping.
    answered: Vec<AtomicBool>,
    /// Tells the communication thread to end the job (`MPI_Abort`).
    abort: AtomicBool,
}

impl Watch {
    fn new(ranks: usize) -> Watch {
        Watch {
            arrived: (0..ranks)
                .map(|_| [AtomicU64::new(NEVER), AtomicU64::new(NEVER)])
                .collect(),
            probe: AtomicBool::new(false),
            answered: (0..ranks).map(|_| AtomicBool::new(false)).collect(),
            abort: AtomicBool::new(false),
        }
    }

    /// The `i`-th part (0: call, 1: step) of rank `r`'s last stamp.
    fn seen(&self, r: usize, i: usize) -> Option<u64> {
        let s = self.arrived.get(r).map(|a| a[i].load(Ordering::SeqCst));
        s.filter(|&s| s != NEVER)
    }

    fn answered(&self, r: usize) -> bool {
        self.answered
            .get(r)
            .is_some_and(|a| a.load(Ordering::SeqCst))
    }
}

struct Inner {
    rank: usize,
    ranks: usize,
    jobs: Mutex<mpsc::Sender<Job>>,
    watch: Arc<Watch>,
    /// Collective calls made so far (every rank makes the same calls in the same order).
    calls: AtomicU64,
    /// Set by the first call that missed its deadline.
    failed: AtomicBool,
}

/// This process's place in an MPI job; cheap to clone. See the module docs.
#[derive(Clone)]
pub struct MpiCollective {
    inner: Arc<Inner>,
}

impl MpiCollective {
    /// Starts MPI on a communication thread when the process was launched by MPI
    /// ([`crate::collective::launched_by_mpi`]); `None` otherwise.
    pub fn start() -> Result<Option<MpiCollective>> {
        if crate::collective::launched_by_mpi().is_none() {
            return Ok(None);
        }
        let (ready_tx, ready_rx) = mpsc::channel();
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("plimsoll mpi".into())
            .spawn(move || communicate(ready_tx, jobs_rx))
            .map_err(|e| Error::invalid("mpi", format!("no thread for MPI: {e}")))?;
        let (rank, ranks, watch) = match ready_rx.recv_timeout(INIT_DEADLINE) {
            Ok(Ok(started)) => started,
            Ok(Err(message)) => return Err(Error::invalid("mpi", message)),
            Err(_) => {
                return Err(Error::invalid(
                    "mpi",
                    format!(
                        "MPI did not start within {} s (is every rank launched by the same \
                         mpirun?)",
                        INIT_DEADLINE.as_secs()
                    ),
                ));
            }
        };
        Ok(Some(MpiCollective {
            inner: Arc::new(Inner {
                rank,
                ranks,
                jobs: Mutex::new(jobs_tx),
                watch,
                calls: AtomicU64::new(0),
                failed: AtomicBool::new(false),
            }),
        }))
    }

    /// Ends the whole job now (`MPI_Abort`, exit status 1), every rank with it: after a
    /// rank stopped answering, once this rank has said why and saved what it could. Waits a
    /// moment for it; returns only if the communication thread is gone.
    pub fn abort(&self) {
        self.inner.watch.abort.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(2));
    }

    /// Whether a call missed its deadline (the job cannot go on).
    pub fn failed(&self) -> bool {
        self.inner.failed.load(Ordering::SeqCst)
    }

    fn submit<T>(
        &self,
        what: &str,
        step: Option<u64>,
        deadline: Duration,
        job: impl FnOnce(mpsc::Sender<T>, Stamp) -> Job,
    ) -> Result<T> {
        let inner = &self.inner;
        let call = inner.calls.fetch_add(1, Ordering::SeqCst);
        let stamp = [call, step.unwrap_or(0)];
        if self.failed() {
            return Err(Error::invalid(
                "mpi",
                format!(
                    "{what}: an earlier collective call missed its deadline; the job cannot go on"
                ),
            ));
        }
        let (reply, answer) = mpsc::channel();
        let sent = inner
            .jobs
            .lock()
            .map_err(|_| Error::invalid("mpi", "the MPI thread's queue is poisoned"))?
            .send(job(reply, stamp));
        if sent.is_err() {
            inner.failed.store(true, Ordering::SeqCst);
            return Err(Error::invalid(
                "mpi",
                format!("{what}: the MPI thread is gone"),
            ));
        }
        // The last part of the deadline (at most PROBE_WAIT) is for pinging the others, so
        // the error names who is dead or hung and still comes within the deadline.
        let probe = PROBE_WAIT.min(deadline / 4);
        let first = answer.recv_timeout(deadline.saturating_sub(probe));
        let watch = &inner.watch;
        let others: Vec<usize> = (0..inner.ranks).filter(|&r| r != inner.rank).collect();
        let reached = |r: usize| watch.seen(r, 0).is_some_and(|c| c >= call);
        let outcome = match first {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Ping those that reached the call: the ones that answer wait like this one.
                watch.probe.store(true, Ordering::SeqCst);
                let probing = Instant::now();
                loop {
                    match answer.try_recv() {
                        Ok(value) => break Ok(value),
                        Err(mpsc::TryRecvError::Disconnected) => {
                            break Err(mpsc::RecvTimeoutError::Disconnected);
                        }
                        Err(mpsc::TryRecvError::Empty) if probing.elapsed() >= probe => {
                            break Err(mpsc::RecvTimeoutError::Timeout);
                        }
                        Err(mpsc::TryRecvError::Empty) => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
            }
            other => other,
        };
        match outcome {
            Ok(value) => {
                // Late but in time: later calls need no pings.
                watch.probe.store(false, Ordering::SeqCst);
                Ok(value)
            }
            Err(e) => {
                inner.failed.store(true, Ordering::SeqCst);
                let step = step.unwrap_or(0);
                let missing = others.iter().copied().filter(|&r| !reached(r)).collect();
                let silent = others
                    .iter()
                    .copied()
                    .filter(|&r| reached(r) && !watch.answered(r))
                    .collect();
                let last_seen = (0..inner.ranks)
                    .map(|r| watch.seen(r, 1).filter(|&s| s > 0))
                    .collect();
                Err(Error::RanksUnresponsive(Box::new(Unresponsive {
                    what: what.to_string(),
                    step,
                    rank: inner.rank,
                    missing,
                    silent,
                    last_seen,
                    deadline_ms: deadline.as_millis() as u64,
                    thread_gone: matches!(e, mpsc::RecvTimeoutError::Disconnected),
                    saved: None,
                })))
            }
        }
    }
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.inner.rank
    }

    fn ranks(&self) -> usize {
        self.inner.ranks
    }

    fn all_reduce_sum(&self, values: Vec<f32>, step: u64, deadline: Duration) -> Result<Vec<f32>> {
        // The communication thread answers with as many values as it was given.
        self.submit(
            "the all-reduce of gradients",
            Some(step),
            deadline,
            |reply, stamp| Job::AllReduceF32 {
                values,
                stamp,
                reply,
            },
        )
    }

    fn reduce_scatter_sum(
        &self,
        values: Vec<f32>,
        step: u64,
        deadline: Duration,
    ) -> Result<Vec<f32>> {
        crate::collective::check_blocks(values.len(), self.inner.ranks)?;
        self.submit(
            "the reduce-scatter of gradients",
            Some(step),
            deadline,
            |reply, stamp| Job::ReduceScatterF32 {
                values,
                stamp,
                reply,
            },
        )
    }

    fn all_gather(&self, values: Vec<f32>, step: u64, deadline: Duration) -> Result<Vec<f32>> {
        self.submit(
            "the all-gather of updated parameters",
            Some(step),
            deadline,
            |reply, stamp| Job::AllGatherF32 {
                values,
                stamp,
                reply,
            },
        )
    }

    fn all_reduce_sum_f64(&self, values: Vec<f64>, deadline: Duration) -> Result<Vec<f64>> {
        // The communication thread answers with as many values as it was given.
        self.submit(
            "the all-reduce of the evaluation's sums",
            None,
            deadline,
            |reply, stamp| Job::AllReduceF64 {
                values,
                stamp,
                reply,
            },
        )
    }

    fn wait_for_all(&self, what: &str, deadline: Duration) -> Result<()> {
        self.submit(what, None, deadline, |reply, stamp| Job::AllReduceU64 {
            values: vec![0],
            stamp,
            reply,
        })
        .map(|_| ())
    }

    fn gather(&self, bytes: Vec<u8>, deadline: Duration) -> Result<Vec<Vec<u8>>> {
        let start = Instant::now();
        let mut lengths = vec![0u64; self.inner.ranks];
        if let Some(l) = lengths.get_mut(self.inner.rank) {
            *l = bytes.len() as u64;
        }
        let lengths = self.submit(
            "gathering the ranks' lengths",
            None,
            deadline,
            |reply, stamp| Job::AllReduceU64 {
                values: lengths,
                stamp,
                reply,
            },
        )?;
        let left = deadline.saturating_sub(start.elapsed());
        self.submit("gathering every rank's summary", None, left, |reply, _| {
            Job::Gather {
                bytes,
                lengths,
                reply,
            }
        })
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.failed.load(Ordering::SeqCst) {
            // Finalising would wait for the rank that stopped answering.
            return;
        }
        let (reply, done) = mpsc::channel();
        let sent = self
            .jobs
            .lock()
            .map(|jobs| jobs.send(Job::Finish { reply }).is_ok())
            .unwrap_or(false);
        if sent && done.recv_timeout(FINALIZE_DEADLINE).is_err() {
            eprintln!(
                "plimsoll: rank {}: MPI did not finalise within {} s; exiting without it",
                self.rank,
                FINALIZE_DEADLINE.as_secs()
            );
        }
    }
}
