//! Helpers shared by the GPU test binaries: `gpu()`, `assert_close`, a seeded RNG, a deadline,
//! and `Guarded` / `upload_u32_at` (tensors at an offset inside guard elements).
#![allow(dead_code)]

use std::time::Duration;

use plimsoll_kernels_wgsl::{Category, DeviceBuffer, DeviceSlice, Gpu, GpuOptions};

/// Deadline for waits and read-backs in tests: generous for lavapipe on two busy cores.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Opens the default adapter (or `PLIMSOLL_ADAPTER`). Fails the test, never skips it, when there
/// is none; the error says how to install lavapipe.
pub fn gpu() -> Gpu {
    gpu_with(GpuOptions::from_env())
}

/// Opens an adapter with `options` (e.g. a small memory budget); fails like [`gpu`].
pub fn gpu_with(options: GpuOptions) -> Gpu {
    match Gpu::with_options(options) {
        Ok(gpu) => gpu,
        Err(e) => panic!(
            "GPU tests need an adapter: {e}\n(on a machine without a GPU: \
             apt-get install mesa-vulkan-drivers libvulkan1)"
        ),
    }
}

/// Asserts `|got - want| <= atol + rtol * |want|` elementwise; prints the first mismatch, its
/// index and the number of mismatches. NaNs must match NaNs.
#[track_caller]
pub fn assert_close(name: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(
        got.len(),
        want.len(),
        "{name}: length {} != {}",
        got.len(),
        want.len()
    );
    let bad = |g: f32, w: f32| {
        if w.is_nan() || g.is_nan() {
            !(w.is_nan() && g.is_nan())
        } else if w.is_infinite() {
            g != w
        } else {
            (g - w).abs() > atol + rtol * w.abs()
        }
    };
    let mismatches = got.iter().zip(want).filter(|(g, w)| bad(**g, **w)).count();
    if let Some(i) = got.iter().zip(want).position(|(g, w)| bad(*g, *w)) {
        panic!(
            "{name}: {mismatches} of {} elements differ; first at index {i}: got {}, want {} \
             (atol {atol}, rtol {rtol})",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// A small seeded generator (SplitMix64): reproducible inputs without extra dependencies.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn f32_in(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// `len` values uniform in `[lo, hi)`.
    pub fn vec_f32(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| self.f32_in(lo, hi)).collect()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Random elements kept after each guarded range.
const GUARD_AFTER: usize = 5;

/// A tensor at a non-zero element offset inside a larger buffer whose other elements are random
/// guards: a kernel that ignores the offset, or writes outside its range, is caught.
pub struct Guarded {
    pub buffer: DeviceBuffer,
    /// Element offset of the tensor.
    pub offset: usize,
    /// The whole buffer as uploaded.
    pub initial: Vec<f32>,
    len: usize,
}

impl Guarded {
    /// `data` at element `offset` of a buffer with random guards before and after it.
    pub fn upload(gpu: &Gpu, rng: &mut Rng, data: &[f32], offset: usize, label: &str) -> Self {
        let mut initial = rng.vec_f32(offset + data.len() + GUARD_AFTER, -9.0, 9.0);
        initial[offset..offset + data.len()].copy_from_slice(data);
        let buffer = gpu.upload(&initial, Category::Temporary, label).unwrap();
        Guarded {
            buffer,
            offset,
            initial,
            len: data.len(),
        }
    }

    /// `len` random elements at `offset` (an output the kernel must overwrite entirely).
    pub fn random(gpu: &Gpu, rng: &mut Rng, len: usize, offset: usize, label: &str) -> Self {
        let data = rng.vec_f32(len, -9.0, 9.0);
        Self::upload(gpu, rng, &data, offset, label)
    }

    /// The element offset of the tensor.
    pub fn at(&self) -> u64 {
        self.offset as u64
    }

    /// The tensor as launchers take it: its elements (at the non-zero offset) of the buffer.
    pub fn slice(&self) -> DeviceSlice<'_> {
        self.buffer.slice(self.at(), self.len as u64).unwrap()
    }

    /// Reads the buffer back; asserts the range is within `atol + rtol*|want|` of `want` and
    /// every guard is unchanged (exactly). Returns the range.
    #[track_caller]
    pub fn check(&self, gpu: &Gpu, name: &str, want: &[f32], atol: f32, rtol: f32) -> Vec<f32> {
        let all: Vec<f32> = gpu.read_all(&self.buffer, DEADLINE).unwrap();
        let range = self.offset..self.offset + self.len;
        assert_close(name, &all[range.clone()], want, atol, rtol);
        let mut guards = all.clone();
        guards[range.clone()].copy_from_slice(&self.initial[range.clone()]);
        assert_close(
            &format!("{name} (guards)"),
            &guards,
            &self.initial,
            0.0,
            0.0,
        );
        all[range].to_vec()
    }
}

/// Uploads u32 `data` (ids, targets) at element `offset` after `offset` junk words.
pub fn upload_u32_at(gpu: &Gpu, data: &[u32], offset: usize, label: &str) -> DeviceBuffer {
    let mut words = vec![0xFFFF_FFFFu32; offset];
    words.extend_from_slice(data);
    gpu.upload(&words, Category::Temporary, label).unwrap()
}

/// The adapter's loop limit, or `None` after saying on stderr that `test` has nothing to refuse
/// there (its launches run unrestricted; the `*_at_the_loop_limit_*` tests still run them).
pub fn loop_limit_or_note(gpu: &Gpu, test: &str) -> Option<u64> {
    let limit = gpu.loop_iteration_limit();
    if limit.is_none() {
        eprintln!(
            "{test}: adapter {} has no loop limit; nothing to refuse",
            gpu.adapter()
        );
    }
    limit
}

/// Asserts that `result` is `Err(LoopLimit)` whose hint names `what <= largest`.
#[track_caller]
pub fn assert_loop_limit<T: std::fmt::Debug>(
    result: plimsoll_kernels_wgsl::Result<T>,
    what: &str,
    largest: u64,
) {
    let err = result.unwrap_err();
    assert!(
        matches!(err, plimsoll_kernels_wgsl::Error::LoopLimit { .. }),
        "want LoopLimit, got {err}"
    );
    let hint = format!("{what} <= {largest}");
    assert!(err.to_string().contains(&hint), "{err} (want {hint:?})");
}
