//! Helpers of the autograd tests beyond `plimsoll_kernels_wgsl::testing` (the device, the
//! comparison, the seeded RNG): allocator statistics and parameter leaves. Gradient checks use
//! the shared `testing::gpu()`; memory tests take a `testing::fresh_gpu()` whose statistics are
//! theirs alone.
#![allow(dead_code)]

use plimsoll_autograd::{Category, Gpu, Tensor, TensorOptions};

/// Bytes allocated in `category`, after submitting the open batch (blocks freed while it was
/// open are returned to the allocator at submission).
pub fn allocated(gpu: &Gpu, category: Category) -> u64 {
    gpu.flush("stats").unwrap();
    gpu.with_allocator(|a| a.stats().category(category).allocated_bytes)
}

/// Peak bytes of `category` since the last `reset_peaks`.
pub fn peak(gpu: &Gpu, category: Category) -> u64 {
    gpu.flush("stats").unwrap();
    gpu.with_allocator(|a| a.stats().category(category).peak_allocated_bytes)
}

/// All allocated bytes.
pub fn total_allocated(gpu: &Gpu) -> u64 {
    gpu.flush("stats").unwrap();
    gpu.with_allocator(|a| a.stats().allocated_bytes)
}

/// Resets the allocator's peaks.
pub fn reset_peaks(gpu: &Gpu) {
    gpu.flush("stats").unwrap();
    gpu.with_allocator(|a| a.reset_peaks());
}

/// A parameter leaf.
pub fn param(gpu: &Gpu, data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice_with(gpu, data, shape, TensorOptions::parameter("w")).unwrap()
}
