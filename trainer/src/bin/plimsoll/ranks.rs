//! This process's place in a data-parallel run: rank 0 of 1, or (with the `mpi` feature, when
//! `mpirun` started it) one rank of an MPI job. Rank 0 writes the run's directory and the
//! output; the others print only their warnings and errors, prefixed with their rank.

use plimsoll_trainer::Result;
use plimsoll_trainer::collective::{Collective, SingleProcess};

#[cfg(feature = "mpi")]
use crate::out;

/// See the module docs.
pub struct Ranks {
    #[cfg(feature = "mpi")]
    mpi: Option<plimsoll_trainer::mpi::MpiCollective>,
}

impl Ranks {
    /// Joins the MPI job if `mpirun` started this process (and the `mpi` feature is built);
    /// otherwise rank 0 of 1.
    pub fn start() -> Result<Ranks> {
        #[cfg(feature = "mpi")]
        {
            let mpi = plimsoll_trainer::mpi::MpiCollective::start()?;
            if let Some(m) = &mpi {
                out::set_rank(m.rank());
            }
            Ok(Ranks { mpi })
        }
        #[cfg(not(feature = "mpi"))]
        match plimsoll_trainer::collective::launched_by_mpi() {
            Some(n) if n > 1 => Err(plimsoll_trainer::Error::invalid(
                "mpirun",
                format!(
                    "this process is one of {n} that an MPI launcher started, but this plimsoll \
                     was built without MPI, so each would train a model of its own; build it \
                     with `cargo build --release --features mpi` (needs libopenmpi-dev and \
                     libclang-dev)"
                ),
            )),
            _ => Ok(Ranks {}),
        }
    }

    /// A handle for the trainer.
    pub fn collective(&self) -> Box<dyn Collective> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            return Box::new(m.clone());
        }
        Box::new(SingleProcess)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.collective().rank()
    }

    /// How many processes train the model.
    pub fn ranks(&self) -> usize {
        self.collective().ranks()
    }

    /// After an error (already printed): when a rank stopped answering, ends the whole MPI job,
    /// the ranks that hang included; otherwise nothing.
    pub fn end_after_error(&self) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi
            && m.failed()
        {
            m.abort();
        }
    }
}
