//! The loop: the [`Trainer`](trainer::Trainer) and its steps ([`step`]: micro-batches,
//! out-of-memory recovery, the update as a transaction), the memory plan ([`plan`]) and the
//! budget that follows the device (`budget`), when to evaluate (`schedule`) and how
//! (`evaluate`), the f16 loss scaler ([`scaler`]), how the ranks of a data-parallel
//! run agree ([`collective`]) and divide the optimizer state ([`zero`]), the thread that builds batches ahead of the step ([`loader`]), and the step's one read-back
//! ([`read_back`]).

mod attempt;
mod budget;
pub mod collective;
mod evaluate;
pub mod loader;
mod placement;
pub mod plan;
pub mod read_back;
pub mod recovery;
pub mod scaler;
pub(crate) mod schedule;
pub mod step;
pub mod trainer;
pub mod zero;
