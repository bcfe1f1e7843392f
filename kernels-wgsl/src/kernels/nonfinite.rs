//! `nonfinite`: whether a range holds a NaN or an infinity, and the first such index, into two
//! `u32` flag words `[any, first_index]` (a [`DeviceBuffer`] of `u32` elements like any other).
//! Shader: `shaders/nonfinite.wgsl`; reference: [`crate::reference::nonfinite`].
//!
//! [`check`] resets the flags and checks one range; [`reset_flags`] + several [`accumulate`] calls
//! check many tensors (e.g. every gradient of a step) into one pair of words, which is then read
//! once with [`read_flags`]. [`first_nonfinite`] does all of it for one range and waits.

use std::time::Duration;

use plimsoll_allocator::Category;

use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::fill::fill_u32;
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_1d};
use crate::pipeline::{Kernel, kernel, shader_params, shader_source};
use crate::slice::DeviceSlice;

/// The `first_index` word when no element is non-finite.
pub const NO_INDEX: u32 = u32::MAX;

/// Number of `u32` flag words: `[any, first_index]`.
pub const FLAG_WORDS: u64 = 2;

/// The module: `shaders/nonfinite.wgsl` and the helpers it calls.
const WGSL: &str = shader_source!("nonfinite", "indexing");

/// The `check` entry point: bindings `x`, `flags`.
pub const KERNEL: Kernel = kernel!("nonfinite", "check", source: WGSL, [x, flags: "array<atomic<u32>>"], ELEMENTWISE_WORKGROUP);

shader_params! {
    /// The `Params` of `nonfinite.wgsl`.
    struct Params {
        n: u32,
        x_offset: u32,
        flags_offset: u32,
        _pad0: u32,
    }
}

/// Records `flags = [0, NO_INDEX]` (nothing found yet); `flags` holds [`FLAG_WORDS`] words.
pub fn reset_flags(gpu: &Gpu, flags: DeviceSlice<'_>) -> Result<()> {
    flags.expect_len("nonfinite", "flags", FLAG_WORDS)?;
    fill_u32(gpu, flags.slice(0, 1)?, 0)?;
    fill_u32(gpu, flags.slice(1, 1)?, NO_INDEX)
}

/// Records a check of `x` into flags that are *not* reset: `flags[0]` becomes 1 if any element
/// is NaN or ±inf, and `flags[1]` is lowered to the smallest such index (relative to the start
/// of `x`; meaningful per tensor only when several slices share the flags).
pub fn accumulate(gpu: &Gpu, flags: DeviceSlice<'_>, x: DeviceSlice<'_>) -> Result<()> {
    flags.expect_len("nonfinite", "flags", FLAG_WORDS)?;
    let params = Params {
        n: x.len() as u32,
        x_offset: x.index(),
        flags_offset: flags.index(),
        _pad0: 0,
    };
    launch_1d(gpu, &KERNEL, &[], &params, &[x, flags], x.len())
}

/// Records [`reset_flags`] then [`accumulate`]: afterwards `flags` is
/// `reference::nonfinite::flags(x)`.
pub fn check(gpu: &Gpu, flags: DeviceSlice<'_>, x: DeviceSlice<'_>) -> Result<()> {
    reset_flags(gpu, flags)?;
    accumulate(gpu, flags, x)
}

/// Reads the two flag words (submitting the open batch and waiting within `deadline`): the first
/// non-finite index, or `None` if the checked slices were all finite.
pub fn read_flags(gpu: &Gpu, flags: DeviceSlice<'_>, deadline: Duration) -> Result<Option<u64>> {
    flags.expect_len("nonfinite", "flags", FLAG_WORDS)?;
    let words: Vec<u32> = gpu.read(flags.buffer(), flags.offset(), FLAG_WORDS, deadline)?;
    Ok(match words.as_slice() {
        [any, first] if *any != 0 => Some(u64::from(*first)),
        _ => None,
    })
}

/// Checks `x` and waits for the answer: the first NaN or infinity's index (relative to the start
/// of `x`), or `None`. Uses a two-word [`Category::Temporary`] flags buffer.
pub fn first_nonfinite(gpu: &Gpu, x: DeviceSlice<'_>, deadline: Duration) -> Result<Option<u64>> {
    let flags = gpu.alloc_elements(FLAG_WORDS, Category::Temporary, "nonfinite flags")?;
    check(gpu, flags.whole(), x)?;
    read_flags(gpu, flags.whole(), deadline)
}
