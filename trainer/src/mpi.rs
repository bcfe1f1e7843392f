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

use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::traits::{Communicator, CommunicatorCollectives, Destination, Source};

use crate::collective::Collective;
use crate::error::{Error, Result, Unresponsive};

/// How long starting MPI may take.
pub const INIT_DEADLINE: Duration = Duration::from_secs(60);

/// How long finalising MPI may take when the run ends.
pub const FINALIZE_DEADLINE: Duration = Duration::from_secs(30);

/// The tag of the step numbers each rank sends the others with an all-reduce.
const ARRIVAL_TAG: i32 = 71;
/// The tag of [`Collective::gather`]'s messages.
const GATHER_TAG: i32 = 72;
/// The tags of the liveness probe after a missed deadline.
const PING_TAG: i32 = 73;
const PONG_TAG: i32 = 74;
/// Pings one call answers at most (each needs a buffer of its own).
const PING_SLOTS: usize = 64;
/// How long a caller past its deadline waits for the others to answer its ping.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);

/// A rank's last step seen by this one: none yet.
const NEVER: u64 = u64::MAX;

/// The stamp each rank sends the others with an all-reduce: the call's sequence number (the
/// same on every rank) and the step.
type Stamp = [u64; 2];

enum Job {
    AllReduceF32 {
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
struct Watch {
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
        match answer.recv_timeout(deadline) {
            Ok(value) => Ok(value),
            Err(e) => {
                inner.failed.store(true, Ordering::SeqCst);
                let watch = &inner.watch;
                let others: Vec<usize> = (0..inner.ranks).filter(|&r| r != inner.rank).collect();
                let reached = |r: usize| watch.seen(r, 0).is_some_and(|c| c >= call);
                // Ping those that reached the call: the ones that answer wait like this one.
                watch.probe.store(true, Ordering::SeqCst);
                let probing = Instant::now();
                while probing.elapsed() < PROBE_WAIT
                    && others.iter().any(|&r| reached(r) && !watch.answered(r))
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
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
        let len = values.len();
        let summed = self.submit(
            "the all-reduce of gradients",
            Some(step),
            deadline,
            |reply, stamp| Job::AllReduceF32 {
                values,
                stamp,
                reply,
            },
        )?;
        match summed.len() == len {
            true => Ok(summed),
            false => Err(Error::invalid(
                "mpi",
                format!("the all-reduce gave {} values for {len}", summed.len()),
            )),
        }
    }

    fn all_reduce_sum_f64(&self, values: Vec<f64>, deadline: Duration) -> Result<Vec<f64>> {
        let len = values.len();
        let summed = self.submit(
            "the all-reduce of the evaluation's sums",
            None,
            deadline,
            |reply, stamp| Job::AllReduceF64 {
                values,
                stamp,
                reply,
            },
        )?;
        match summed.len() == len {
            true => Ok(summed),
            false => Err(Error::invalid(
                "mpi",
                format!("the all-reduce gave {} values for {len}", summed.len()),
            )),
        }
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

type Started = std::result::Result<(usize, usize, Arc<Watch>), String>;

/// The communication thread: starts MPI, then runs jobs until [`Job::Finish`] (or forever, if
/// a job never completes, until the process exits).
fn communicate(ready: mpsc::Sender<Started>, jobs: mpsc::Receiver<Job>) {
    let Some((universe, _threading)) = mpi::initialize_with_threading(mpi::Threading::Funneled)
    else {
        let _ = ready.send(Err("MPI was already initialised in this process".into()));
        return;
    };
    let world = universe.world();
    let (rank, ranks) = (world.rank() as usize, world.size() as usize);
    let watch = Arc::new(Watch::new(ranks));
    if ready.send(Ok((rank, ranks, Arc::clone(&watch)))).is_err() {
        return;
    }
    let poll = |watch: &Watch| {
        if watch.abort.load(Ordering::SeqCst) {
            world.abort(1);
        }
        std::thread::sleep(Duration::from_micros(20));
    };
    while let Ok(job) = jobs.recv() {
        match job {
            Job::AllReduceF32 {
                values,
                stamp,
                reply,
            } => {
                let summed = all_reduce(&world, &values, stamp, &watch, || poll(&watch));
                let _ = reply.send(summed);
            }
            Job::AllReduceU64 {
                values,
                stamp,
                reply,
            } => {
                let summed = all_reduce(&world, &values, stamp, &watch, || poll(&watch));
                let _ = reply.send(summed);
            }
            Job::AllReduceF64 {
                values,
                stamp,
                reply,
            } => {
                let summed = all_reduce(&world, &values, stamp, &watch, || poll(&watch));
                let _ = reply.send(summed);
            }
            Job::Gather {
                bytes,
                lengths,
                reply,
            } => {
                let gathered = gather(&world, bytes, &lengths, || poll(&watch));
                let _ = reply.send(gathered);
            }
            Job::Finish { reply } => {
                drop(universe);
                let _ = reply.send(());
                return;
            }
        }
    }
    // The process is ending without `Finish` (its last handle dropped after a failure): leave
    // MPI as it is.
    std::mem::forget(universe);
}

/// The element-wise sum of `values` over every rank, polled until done. Each rank also sends
/// the others its `stamp` (what arrives is recorded in `watch`), answers their pings while it
/// waits, and pings them itself once a caller past its deadline asks ([`Watch::probe`]).
fn all_reduce<T: Equivalence + Default + Copy>(
    world: &mpi::topology::SimpleCommunicator,
    values: &[T],
    stamp: Stamp,
    watch: &Watch,
    mut poll: impl FnMut(),
) -> Vec<T> {
    let rank = world.rank() as usize;
    let ranks = watch.arrived.len();
    let mut out = vec![T::default(); values.len()];
    let mut stamps = vec![[NEVER; 2]; ranks];
    let mut ping_slots = vec![[0u64; 1]; PING_SLOTS];
    let mut pong_slots = vec![[0u64; 1]; ranks];
    let token = [stamp[0]];
    mpi::request::scope(|scope| {
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for (peer, slot) in stamps.iter_mut().enumerate() {
            if peer == rank {
                continue;
            }
            let process = world.process_at_rank(peer as i32);
            sends.push(process.immediate_send_with_tag(scope, &stamp[..], ARRIVAL_TAG));
            let recv = process.immediate_receive_into_with_tag(scope, &mut slot[..], ARRIVAL_TAG);
            recvs.push((peer, recv));
        }
        let mut reduce = Some(world.immediate_all_reduce_into(
            scope,
            values,
            &mut out[..],
            SystemOperation::sum(),
        ));
        // Pings from anyone, answered with a pong; a slot per ping.
        let mut ping_slots = ping_slots.iter_mut();
        let mut post_ping = || {
            ping_slots.next().map(|slot| {
                world
                    .any_process()
                    .immediate_receive_into_with_tag(scope, &mut slot[..], PING_TAG)
            })
        };
        let mut ping = post_ping();
        let mut pongs = Vec::new();
        let mut pong_slots = Some(pong_slots.iter_mut());
        let mut probes = Vec::new();
        loop {
            sends = sends.into_iter().filter_map(|r| r.test().err()).collect();
            recvs = recvs
                .into_iter()
                .filter_map(|(peer, r)| match r.test_with_data() {
                    Ok((_, data)) => {
                        if let (Some(a), [call, step]) = (watch.arrived.get(peer), data) {
                            a[1].store(*step, Ordering::SeqCst);
                            a[0].store(*call, Ordering::SeqCst);
                        }
                        None
                    }
                    Err(r) => Some((peer, r)),
                })
                .collect();
            if let Some(r) = reduce.take() {
                reduce = r.test().err();
            }
            if let Some(r) = ping.take() {
                match r.test() {
                    Ok(status) => {
                        let from = world.process_at_rank(status.source_rank());
                        pongs.push(from.immediate_send_with_tag(scope, &token[..], PONG_TAG));
                        ping = post_ping();
                    }
                    Err(r) => ping = Some(r),
                }
            }
            pongs = pongs.into_iter().filter_map(|r| r.test().err()).collect();
            if watch.probe.load(Ordering::SeqCst)
                && let Some(slots) = pong_slots.take()
            {
                for (peer, slot) in slots.enumerate().filter(|(p, _)| *p != rank) {
                    let process = world.process_at_rank(peer as i32);
                    sends.push(process.immediate_send_with_tag(scope, &token[..], PING_TAG));
                    let answer =
                        process.immediate_receive_into_with_tag(scope, &mut slot[..], PONG_TAG);
                    probes.push((peer, answer));
                }
            }
            probes = probes
                .into_iter()
                .filter_map(|(peer, r)| match r.test() {
                    Ok(_) => {
                        if let Some(a) = watch.answered.get(peer) {
                            a.store(true, Ordering::SeqCst);
                        }
                        None
                    }
                    Err(r) => Some((peer, r)),
                })
                .collect();
            let done = reduce.is_none() && recvs.is_empty() && probes.is_empty();
            if done && sends.is_empty() && pongs.is_empty() {
                break;
            }
            poll();
        }
        // No ping came: take back the receive posted for one.
        if let Some(r) = ping {
            r.cancel();
            let _ = r.wait();
        }
    });
    out
}

/// Rank 0 receives `lengths[r]` bytes from every rank `r`; the others send `bytes`.
fn gather(
    world: &mpi::topology::SimpleCommunicator,
    bytes: Vec<u8>,
    lengths: &[u64],
    mut poll: impl FnMut(),
) -> Vec<Vec<u8>> {
    let rank = world.rank() as usize;
    if rank != 0 {
        mpi::request::scope(|scope| {
            let mut send = Some(world.process_at_rank(0).immediate_send_with_tag(
                scope,
                &bytes[..],
                GATHER_TAG,
            ));
            while let Some(r) = send.take() {
                send = r.test().err();
                if send.is_some() {
                    poll();
                }
            }
        });
        return Vec::new();
    }
    let mut all: Vec<Vec<u8>> = lengths.iter().map(|&n| vec![0u8; n as usize]).collect();
    mpi::request::scope(|scope| {
        let mut recvs: Vec<_> = all
            .iter_mut()
            .enumerate()
            .skip(1)
            .map(|(peer, buf)| {
                world
                    .process_at_rank(peer as i32)
                    .immediate_receive_into_with_tag(scope, &mut buf[..], GATHER_TAG)
            })
            .collect();
        while !recvs.is_empty() {
            recvs = recvs.into_iter().filter_map(|r| r.test().err()).collect();
            if !recvs.is_empty() {
                poll();
            }
        }
    });
    if let Some(first) = all.first_mut() {
        *first = bytes;
    }
    all
}
