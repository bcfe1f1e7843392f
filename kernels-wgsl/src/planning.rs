//! A planning device ([`Gpu::planning_twin`]): the same adapter, limits, alignment and allocator
//! policy as a real device, over stand-in segments, with no GPU work at all. Every allocation and
//! free of a training step happens exactly as on the real device (same sizes, same offsets, same
//! segments, same out-of-memory errors under the same budget), so running the step on the twin
//! yields its allocation trace and peaks in the time the host takes to walk the graph. Kernels
//! are validated (their arguments) but not compiled or dispatched, uploads are dropped, and every
//! read-back returns zeros: code that runs on a twin must not let those values decide an
//! allocation (a training step's allocations depend on shapes only).

use std::sync::Arc;

use crate::device::{Gpu, Health, Parts, Shared};
use crate::fence::Deadlines;

impl Gpu {
    /// A planning device twin of this one with `budget_bytes` as its budget (see the module
    /// docs). It shares the wgpu device (nothing is ever submitted on it) and has its own,
    /// empty allocator; dropping it waits for nothing.
    pub fn planning_twin(&self, budget_bytes: u64) -> Gpu {
        let real = &*self.shared;
        let shared = Shared::assemble(Parts {
            device: real.device.clone(),
            queue: real.queue.clone(),
            summary: real.summary.clone(),
            limits: real.limits.clone(),
            health: Arc::new(Health::default()),
            block_alignment: real.block_alignment,
            max_block_bytes: real.max_block_bytes,
            budget: budget_bytes,
            small_segment_bytes: Some(real.memory().config().small_segment_bytes),
            deadlines: Deadlines::new(
                real.deadlines.default_deadline(),
                real.deadlines.drop_deadline(),
            ),
            max_in_flight: real.max_in_flight,
            planning: true,
            wanted: Arc::clone(&real.wanted),
            options: real.options.clone(),
        });
        let packed = real.f16_packed.load(std::sync::atomic::Ordering::Relaxed);
        shared
            .f16_packed
            .store(packed, std::sync::atomic::Ordering::Relaxed);
        let coop_off = real.coop_off.load(std::sync::atomic::Ordering::Relaxed);
        shared
            .coop_off
            .store(coop_off, std::sync::atomic::Ordering::Relaxed);
        let split_k_below = real
            .split_k_below
            .load(std::sync::atomic::Ordering::Relaxed);
        shared
            .split_k_below
            .store(split_k_below, std::sync::atomic::Ordering::Relaxed);
        Gpu {
            shared: Arc::new(shared),
        }
    }

    /// Whether this is a planning device ([`Gpu::planning_twin`]).
    pub fn is_planning(&self) -> bool {
        self.shared.planning
    }
}
