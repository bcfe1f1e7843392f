//! Plimsoll's GPU layer: one [`Gpu`] (adapter, device, queue) with device memory sub-allocated
//! through `plimsoll-allocator` into [`DeviceBuffer`]s, batched recording of WGSL compute kernels
//! ([`Gpu::dispatch`], [`Gpu::flush`]), [`Fence`]s whose waits always have a deadline, fenced
//! read-backs, and a CPU reference for every kernel. It speaks in buffers, element offsets and
//! explicit sizes; it knows nothing of tensors or gradients (that is `plimsoll-autograd`).
//!
//! Promises: no GPU wait without a deadline ([`Error::Timeout`] names what was running); running
//! out of the memory budget is [`Error::OutOfMemory`]; wgpu validation errors are
//! [`Error::Validation`]; device loss is [`Error::DeviceLost`] from then on; nothing panics because
//! of wgpu. Host uploads never overtake recorded GPU work (see [`recorder`]).
//!
//! Map: [`device`] (adapter choice, `Gpu`), [`memory`] (segments, budget), [`buffer`]
//! (`DeviceBuffer`, upload, read-back), [`fence`] (fences, the one poll function), [`recorder`]
//! (batches, params arena), [`pipeline`] (cache, binding convention), [`slice`](mod@slice)
//! ([`DeviceSlice`], what every launcher takes), [`kernels`] (launchers and how to add one),
//! each family's CPU oracle (`kernels::<stem>::reference`), [`random`] (SplitMix64, the workspace's one
//! host generator), [`testing`] (what every crate's tests share).

pub mod buffer;
pub mod compile;
pub mod device;
pub mod error;
pub mod fault;
pub mod fence;
pub mod kernels;
pub mod memory;
pub mod pacing;
pub mod pipeline;
pub mod planning;
pub mod profile;
pub mod random;
pub mod recorder;
pub mod slice;
pub mod teardown;
pub mod testing;

pub use buffer::{DeviceBuffer, Evict, PendingRead};
pub use device::{AdapterSummary, Gpu, GpuOptions};
pub use error::{Error, RecentSubmissions, Result, SubmissionRecord};
pub use fence::Fence;
pub use memory::DeviceMemory;
pub use pacing::{PacingStats, RateModel};
pub use pipeline::{Compiled, Kernel, WantedPipeline};
pub use plimsoll_allocator::Category;
pub use profile::{CpuSpan, KernelTiming, Profile, ProfileMode};
pub use recorder::{Dispatch, Work};
pub use slice::DeviceSlice;
