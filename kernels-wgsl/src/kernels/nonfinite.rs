//! `nonfinite`: whether a range holds a NaN or an infinity, and the first such index, into two
//! `u32` flag words `[any, first_index]` (a [`DeviceBuffer`] of `u32` elements like any other).
//! Shader: `shaders/nonfinite.wgsl`; reference: [`crate::reference::nonfinite`].
//!
//! [`check`] resets the flags and checks one range; [`reset_flags`] + several [`accumulate`] calls
//! check many tensors (e.g. every gradient of a step) into one pair of words, which is then read
//! once with [`read_flags`]. [`first_nonfinite`] does all of it for one range and waits.

use std::time::Duration;

use plimsoll_allocator::Category;

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::fill::fill_u32;
use crate::kernels::{ELEMENTWISE_WORKGROUP, check_range, grid_1d, segment_index};
use crate::pipeline::{Kernel, RuntimeChecks};
use crate::recorder::Dispatch;
pub use crate::reference::nonfinite::NO_INDEX;

/// Number of `u32` flag words: `[any, first_index]`.
pub const FLAG_WORDS: u64 = 2;

/// The `check` entry point: bindings `x`, `flags`.
pub const KERNEL: Kernel = Kernel {
    stem: "nonfinite",
    wgsl: include_str!("../../shaders/nonfinite.wgsl"),
    entry: "check",
    storage_bindings: 2,
    runtime_checks: RuntimeChecks::ON,
};

/// Mirrors `Params` in `nonfinite.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    x_offset: u32,
    flags_offset: u32,
    _pad0: u32,
}

/// Records `flags[flags_offset ..+ 2] = [0, NO_INDEX]` (nothing found yet).
pub fn reset_flags(gpu: &Gpu, flags: &DeviceBuffer, flags_offset: u64) -> Result<()> {
    check_range("nonfinite", "flags", flags, flags_offset, FLAG_WORDS)?;
    fill_u32(gpu, flags, flags_offset, 1, 0)?;
    fill_u32(gpu, flags, flags_offset + 1, 1, NO_INDEX)
}

/// Records a check of `x[x_offset ..+ len]` into flags that are *not* reset: `flags[0]` becomes 1
/// if any element is NaN or ±inf, and `flags[1]` is lowered to the smallest such index (relative
/// to `x_offset`; meaningful per tensor only when several ranges share the flags).
pub fn accumulate(
    gpu: &Gpu,
    flags: &DeviceBuffer,
    flags_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
) -> Result<()> {
    check_range("nonfinite", "flags", flags, flags_offset, FLAG_WORDS)?;
    check_range("nonfinite", "x", x, x_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        n: len as u32,
        x_offset: segment_index(x, x_offset),
        flags_offset: segment_index(flags, flags_offset),
        _pad0: 0,
    };
    gpu.dispatch(Dispatch {
        kernel: &KERNEL,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[x, flags],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}

/// Records [`reset_flags`] then [`accumulate`]: afterwards `flags[flags_offset ..+ 2]` is
/// `reference::nonfinite::flags(x[x_offset ..+ len])`.
pub fn check(
    gpu: &Gpu,
    flags: &DeviceBuffer,
    flags_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
) -> Result<()> {
    check_range("nonfinite", "x", x, x_offset, len)?;
    reset_flags(gpu, flags, flags_offset)?;
    accumulate(gpu, flags, flags_offset, x, x_offset, len)
}

/// Reads the two flag words (submitting the open batch and waiting within `deadline`): the first
/// non-finite index, or `None` if the checked ranges were all finite.
pub fn read_flags(
    gpu: &Gpu,
    flags: &DeviceBuffer,
    flags_offset: u64,
    deadline: Duration,
) -> Result<Option<u64>> {
    check_range("nonfinite", "flags", flags, flags_offset, FLAG_WORDS)?;
    let words: Vec<u32> = gpu.read(flags, flags_offset, FLAG_WORDS, deadline)?;
    Ok(match words.as_slice() {
        [any, first] if *any != 0 => Some(u64::from(*first)),
        _ => None,
    })
}

/// Checks `x[x_offset ..+ len]` and waits for the answer: the first NaN or infinity's index
/// (relative to `x_offset`), or `None`. Uses a two-word [`Category::Temporary`] flags buffer.
pub fn first_nonfinite(
    gpu: &Gpu,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
    deadline: Duration,
) -> Result<Option<u64>> {
    let flags = gpu.alloc_elements(FLAG_WORDS, Category::Temporary, "nonfinite flags")?;
    check(gpu, &flags, 0, x, x_offset, len)?;
    read_flags(gpu, &flags, 0, deadline)
}
