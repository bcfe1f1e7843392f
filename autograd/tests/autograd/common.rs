//! Shared helpers: one `Gpu` for the gradient checks, fresh ones for memory statistics.
#![allow(dead_code)]

use std::sync::OnceLock;

use plimsoll_autograd::{Category, Gpu, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::GpuOptions;

/// A fresh device (memory tests read its allocator statistics). Fails, never skips, without one.
pub fn fresh_gpu() -> Gpu {
    match Gpu::with_options(GpuOptions::from_env()) {
        Ok(gpu) => gpu,
        Err(e) => panic!(
            "GPU tests need an adapter: {e}\n(on a machine without a GPU: \
             apt-get install mesa-vulkan-drivers libvulkan1)"
        ),
    }
}

/// The device shared by every test that does not read statistics: one process-wide `Gpu`, so the
/// tests also exercise concurrent recording and read-backs from several threads.
pub fn gpu() -> Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(fresh_gpu).clone()
}

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

/// SplitMix64 values in `[lo, hi)`.
pub fn values(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            lo + (hi - lo) * ((z >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// `|got - want| <= atol + rtol |want|` elementwise, first mismatch printed.
#[track_caller]
pub fn assert_close(name: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (f64::from(g) - w).abs() <= atol + rtol * w.abs();
        assert!(
            ok,
            "{name}: index {i}: got {g}, want {w} (atol {atol}, rtol {rtol})\ngot  {got:?}\nwant {want:?}"
        );
    }
}
