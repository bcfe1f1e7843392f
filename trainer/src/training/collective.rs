//! Data-parallel training: how the processes of one run agree.
//!
//! Every process (rank) holds the whole model and takes its [`shard`] of each step's batch. After
//! its backward, each rank's gradients (already scaled by its share of the *whole* batch, see
//! [`crate::step`]) are summed across ranks by [`Collective::all_reduce_sum`], so every rank
//! makes the update one process makes on the whole batch. The sum goes through the host (the
//! step reads back anyway) in buckets of at most [`BUCKET_BYTES`], so host memory does not grow
//! with the model.
//!
//! A [`Collective`] has a deadline on every call, like every GPU wait: a rank that died or hangs
//! becomes [`crate::Error::RanksUnresponsive`] on the others, naming the ranks and the step.
//! One process is [`SingleProcess`] (nothing to agree on); with the `mpi` feature,
//! `crate::mpi::MpiCollective` runs over MPI.

use std::time::Duration;

use crate::error::Result;

/// Largest bucket of gradients summed in one call: 16 MiB of f32.
pub const BUCKET_BYTES: usize = 16 << 20;

/// The processes of a data-parallel run. Every call is collective: every rank makes the same
/// calls in the same order.
pub trait Collective: Send {
    /// This process's rank, `0..ranks()`; rank 0 writes the run's files.
    fn rank(&self) -> usize;

    /// How many processes train the model.
    fn ranks(&self) -> usize;

    /// The element-wise sum of `values` over every rank (each passes the same length), within
    /// `deadline`; `step` names the step in errors. Past the deadline:
    /// [`crate::Error::RanksUnresponsive`] naming the ranks that never reached this call.
    fn all_reduce_sum(&self, values: Vec<f32>, step: u64, deadline: Duration) -> Result<Vec<f32>>;

    /// The element-wise sum of `values` over every rank, cut into [`Collective::ranks`] equal
    /// blocks: this rank gets block [`Collective::rank`] (`values.len() / ranks()` values). Every
    /// rank passes the same length, a multiple of the ranks. Deadline and errors as
    /// [`Collective::all_reduce_sum`].
    fn reduce_scatter_sum(
        &self,
        values: Vec<f32>,
        step: u64,
        deadline: Duration,
    ) -> Result<Vec<f32>>;

    /// Every rank's `values` (the same length on each) joined in rank order, on every rank.
    /// Deadline and errors as [`Collective::all_reduce_sum`].
    fn all_gather(&self, values: Vec<f32>, step: u64, deadline: Duration) -> Result<Vec<f32>>;

    /// [`Collective::all_reduce_sum`] in f64 (an evaluation's sums), outside any step.
    fn all_reduce_sum_f64(&self, values: Vec<f64>, deadline: Duration) -> Result<Vec<f64>>;

    /// Returns once every rank made this call, within `deadline`; `what` names the wait in
    /// errors.
    fn wait_for_all(&self, what: &str, deadline: Duration) -> Result<()>;

    /// Every rank's `bytes`, in rank order, on rank 0 (an empty list on the others), within
    /// `deadline`.
    fn gather(&self, bytes: Vec<u8>, deadline: Duration) -> Result<Vec<Vec<u8>>>;
}

/// One process: sums and gathers are the values themselves.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn ranks(&self) -> usize {
        1
    }

    fn all_reduce_sum(&self, values: Vec<f32>, _: u64, _: Duration) -> Result<Vec<f32>> {
        Ok(values)
    }

    fn reduce_scatter_sum(&self, values: Vec<f32>, _: u64, _: Duration) -> Result<Vec<f32>> {
        Ok(values)
    }

    fn all_gather(&self, values: Vec<f32>, _: u64, _: Duration) -> Result<Vec<f32>> {
        Ok(values)
    }

    fn all_reduce_sum_f64(&self, values: Vec<f64>, _: Duration) -> Result<Vec<f64>> {
        Ok(values)
    }

    fn wait_for_all(&self, _: &str, _: Duration) -> Result<()> {
        Ok(())
    }

    fn gather(&self, bytes: Vec<u8>, _: Duration) -> Result<Vec<Vec<u8>>> {
        Ok(vec![bytes])
    }
}

/// Rank `rank` of `ranks` on a planning device: every call answers at once with values of the
/// length the real call gives (sums and gathers of zeros), so a plan's dry run of a sharded
/// step allocates exactly as the run's step does, and sends nothing.
#[derive(Debug, Clone, Copy)]
pub struct Planning {
    /// The rank planned for.
    pub rank: usize,
    /// How many ranks the run has.
    pub ranks: usize,
}

impl Collective for Planning {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn all_reduce_sum(&self, values: Vec<f32>, _: u64, _: Duration) -> Result<Vec<f32>> {
        Ok(values)
    }

    fn reduce_scatter_sum(&self, values: Vec<f32>, _: u64, _: Duration) -> Result<Vec<f32>> {
        check_blocks(values.len(), self.ranks)?;
        Ok(vec![0.0; values.len() / self.ranks.max(1)])
    }

    fn all_gather(&self, values: Vec<f32>, _: u64, _: Duration) -> Result<Vec<f32>> {
        Ok(vec![0.0; values.len() * self.ranks])
    }

    fn all_reduce_sum_f64(&self, values: Vec<f64>, _: Duration) -> Result<Vec<f64>> {
        Ok(values)
    }

    fn wait_for_all(&self, _: &str, _: Duration) -> Result<()> {
        Ok(())
    }

    /// The other ranks' bytes are not known: an error.
    fn gather(&self, bytes: Vec<u8>, _: Duration) -> Result<Vec<Vec<u8>>> {
        drop(bytes);
        Err(crate::error::Error::invalid(
            "gather",
            "a plan's stand-in for the other ranks has nothing of theirs to gather",
        ))
    }
}

/// Errors unless `len` values cut into `ranks` equal blocks (a reduce-scatter's input).
pub fn check_blocks(len: usize, ranks: usize) -> Result<()> {
    if ranks == 0 || !len.is_multiple_of(ranks) {
        return Err(crate::error::Error::invalid(
            "reduce-scatter",
            format!("{len} values do not cut into {ranks} equal blocks"),
        ));
    }
    Ok(())
}

/// The number of processes an MPI launcher (`mpirun`, `srun`) started, from the environment
/// variables Open MPI, MPICH and PMI set (`Some(1)` when launched alone by one of them); `None`
/// for a process started directly. Needs no MPI library: a build without the `mpi` feature
/// uses it to refuse to run as N unrelated copies.
pub fn launched_by_mpi() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .map(|n| n.trim().parse().unwrap_or(1))
        .or_else(|| std::env::var_os("PMIX_RANK").map(|_| 1))
}

/// Rank `rank`'s part of `batch` among `ranks`: contiguous, the first `len % ranks` ranks one
/// sample more (63 samples on 2 ranks: 32 and 31). A rank may get none (a batch smaller than
/// the ranks); its gradients then count as zeros.
pub fn shard<T>(batch: &[T], rank: usize, ranks: usize) -> &[T] {
    let ranks = ranks.max(1);
    let (base, extra) = (batch.len() / ranks, batch.len() % ranks);
    let start = rank * base + rank.min(extra);
    let len = base + usize::from(rank < extra);
    batch
        .get(start.min(batch.len())..(start + len).min(batch.len()))
        .unwrap_or(&[])
}

/// The largest shard any rank gets of a batch of `batch` samples (what each rank's memory plan
/// must fit).
pub fn largest_shard(batch: usize, ranks: usize) -> usize {
    batch.div_ceil(ranks.max(1))
}

pub use plimsoll_nn::optim::buckets;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_batch_in_order_without_overlap() {
        for len in 0..20 {
            let batch: Vec<usize> = (0..len).collect();
            for ranks in 1..6 {
                let joined: Vec<usize> = (0..ranks)
                    .flat_map(|r| shard(&batch, r, ranks).to_vec())
                    .collect();
                assert_eq!(joined, batch, "len {len} ranks {ranks}");
                let sizes: Vec<usize> = (0..ranks).map(|r| shard(&batch, r, ranks).len()).collect();
                let (min, max) = (sizes.iter().min(), sizes.iter().max());
                assert!(max.zip(min).is_none_or(|(a, b)| a - b <= 1), "{sizes:?}");
                assert_eq!(max.copied(), Some(largest_shard(len, ranks)));
            }
        }
        assert_eq!(shard(&[0; 63], 0, 2).len(), 32);
        assert_eq!(shard(&[0; 63], 1, 2).len(), 31);
    }

    #[test]
    fn buckets_keep_order_and_size() {
        let sizes = [3, 4, 10, 1, 1, 2];
        let b = buckets(&sizes, 5);
        assert_eq!(b, vec![0..1, 1..2, 2..3, 3..6]);
        let flat: Vec<usize> = b.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(flat, (0..sizes.len()).collect::<Vec<_>>());
        assert!(buckets(&[], 5).is_empty());
        assert_eq!(buckets(&[1, 1, 1], 100), vec![0..3]);
    }
}
