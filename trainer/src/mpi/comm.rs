//! The communication thread of [`super::MpiCollective`]: it starts MPI, then runs each job as
//! non-blocking MPI operations polled until done (see the parent module's docs).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::traits::{Communicator, CommunicatorCollectives, Destination, Source};

use super::{Job, NEVER, Stamp, Watch};

/// The tag of the step numbers each rank sends the others with an all-reduce.
const ARRIVAL_TAG: i32 = 71;
/// The tag of [`crate::collective::Collective::gather`]'s messages.
const GATHER_TAG: i32 = 72;
/// The tags of the liveness probe after a missed deadline.
const PING_TAG: i32 = 73;
const PONG_TAG: i32 = 74;
/// Pings one call answers at most (each needs a buffer of its own).
const PING_SLOTS: usize = 64;

pub(super) type Started = std::result::Result<(usize, usize, Arc<Watch>), String>;

/// The communication thread: starts MPI, then runs jobs until [`Job::Finish`] (or forever, if
/// a job never completes, until the process exits).
pub(super) fn communicate(ready: mpsc::Sender<Started>, jobs: mpsc::Receiver<Job>) {
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
            Job::ReduceScatterF32 {
                values,
                stamp,
                reply,
            } => {
                let kind = Kind::ReduceScatter;
                let part = collective(&world, kind, &values, stamp, &watch, || poll(&watch));
                let _ = reply.send(part);
            }
            Job::AllGatherF32 {
                values,
                stamp,
                reply,
            } => {
                let kind = Kind::AllGather;
                let all = collective(&world, kind, &values, stamp, &watch, || poll(&watch));
                let _ = reply.send(all);
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

/// Which collective operation [`collective`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Every rank gets the element-wise sum.
    AllReduce,
    /// The element-wise sum cut into as many equal blocks as ranks: each rank gets its block.
    ReduceScatter,
    /// Every rank's values joined in rank order, on every rank.
    AllGather,
}

/// The element-wise sum of `values` over every rank ([`collective`]).
fn all_reduce<T: Equivalence + Default + Copy>(
    world: &mpi::topology::SimpleCommunicator,
    values: &[T],
    stamp: Stamp,
    watch: &Watch,
    poll: impl FnMut(),
) -> Vec<T> {
    collective(world, Kind::AllReduce, values, stamp, watch, poll)
}

/// The collective `kind` of `values` over every rank, polled until done (a reduce-scatter's
/// length is a multiple of the ranks: the caller checks). Each rank also sends the others its
/// `stamp` (what arrives is recorded in `watch`), answers their pings while it waits, and pings
/// them itself once a caller past its deadline asks ([`Watch::probe`]).
fn collective<T: Equivalence + Default + Copy>(
    world: &mpi::topology::SimpleCommunicator,
    kind: Kind,
    values: &[T],
    stamp: Stamp,
    watch: &Watch,
    mut poll: impl FnMut(),
) -> Vec<T> {
    let rank = world.rank() as usize;
    let ranks = watch.arrived.len();
    let len = match kind {
        Kind::AllReduce => values.len(),
        Kind::ReduceScatter => values.len() / ranks.max(1),
        Kind::AllGather => values.len() * ranks,
    };
    let mut out = vec![T::default(); len];
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
        let mut reduce = Some(match kind {
            Kind::AllReduce => {
                world.immediate_all_reduce_into(scope, values, &mut out[..], SystemOperation::sum())
            }
            Kind::ReduceScatter => world.immediate_reduce_scatter_block_into(
                scope,
                values,
                &mut out[..],
                SystemOperation::sum(),
            ),
            Kind::AllGather => world.immediate_all_gather_into(scope, values, &mut out[..]),
        });
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
            // Not waiting for the answers to this rank's own pings: a call that completed while
            // it probed must not wait for peers that have moved on to the next call.
            if reduce.is_none() && recvs.is_empty() && sends.is_empty() && pongs.is_empty() {
                break;
            }
            poll();
        }
        // Take back the receives no message came for: the ping, and answers to this rank's pings.
        for r in ping.into_iter().chain(probes.into_iter().map(|(_, r)| r)) {
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
