//! Helpers of the kernel test binaries beyond `plimsoll_kernels_wgsl::testing` (the device,
//! `assert_close`, the seeded RNG, the deadline): `Guarded` / `upload_u32_at` (tensors at an
//! offset inside guard elements) and the loop-limit checks (a test with nothing to check on this
//! adapter is reported skipped).
#![allow(dead_code)]

use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, assert_close, skip};
use plimsoll_kernels_wgsl::{Category, DeviceBuffer, DeviceSlice, Gpu};

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
    pub fn check(&self, gpu: &Gpu, name: &str, want: &[f32], atol: f64, rtol: f64) -> Vec<f32> {
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

/// The adapter's loop limit, or `None` after reporting `test` (its function name) as skipped
/// ([`skip`]): on an adapter without the limit there is nothing to refuse (its launches run
/// unrestricted; the `*_at_the_loop_limit_*` tests still run them).
pub fn loop_limit_or_skip(gpu: &Gpu, test: &str) -> Option<u64> {
    let limit = gpu.loop_iteration_limit();
    if limit.is_none() {
        let why = format!(
            "adapter {} has no loop limit; nothing to refuse",
            gpu.adapter()
        );
        skip(test, &why);
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
