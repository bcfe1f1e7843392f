//! What watches the run without taking part in it: the step hooks (`hooks`: the memory timeline
//! ([`timeline`], [`memory_viz`]), the kernel profile ([`profiling`]) and the leak check
//! ([`leak`])), the per-step metrics ([`metrics`]), the run's report page ([`report`]) and the
//! host memory each step reports ([`host_memory`]).

pub(crate) mod hooks;
pub mod host_memory;
pub mod leak;
pub mod memory_viz;
pub mod metrics;
pub mod profiling;
pub mod report;
pub mod timeline;
