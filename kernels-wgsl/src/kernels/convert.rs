//! `convert`: `f32` to IEEE binary16 packed two per `u32` word (element `2i` in the low half of
//! word `i`, the layout of a little-endian `[u16]`; an odd count leaves the last high half 0), and
//! back. Overflow becomes ±inf and NaN stays NaN, so the `nonfinite` check still sees them.
//! Shader: `shaders/convert.wgsl`; reference: [`crate::reference::convert`].

use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_1d};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// The `f32_to_f16` entry point: bindings `src` (f32), `dst_words` (u32).
pub const F32_TO_F16: Kernel =
    kernel!("convert", "f32_to_f16", [src, dst_words: "array<u32>"], ELEMENTWISE_WORKGROUP);

/// The `f16_to_f32` entry point: bindings `src_words` (u32), `dst` (f32).
pub const F16_TO_F32: Kernel =
    kernel!("convert", "f16_to_f32", [src_words: "array<u32>", dst], ELEMENTWISE_WORKGROUP);

shader_params! {
    /// The `Params` of `convert.wgsl` (both entry points).
    struct Params {
        n: u32,
        src_offset: u32,
        dst_offset: u32,
        _pad0: u32,
    }
}

/// Number of `u32` words holding `len` halves: `ceil(len / 2)`.
pub fn f16_words(len: u64) -> u64 {
    len.div_ceil(2)
}

/// Records `kernel` over `len` halves: one invocation per u32 word.
fn convert(
    gpu: &Gpu,
    kernel: &Kernel,
    dst: DeviceSlice<'_>,
    src: DeviceSlice<'_>,
    len: u64,
) -> Result<()> {
    let params = Params {
        n: len as u32,
        src_offset: src.index(),
        dst_offset: dst.index(),
        _pad0: 0,
    };
    launch_1d(gpu, kernel, &[], &params, &[src, dst], f16_words(len))
}

/// Records `words = pack_f16(x)`: `words` holds `ceil(x.len() / 2)` u32 words (round to
/// nearest; |x| >= 65520 gives ±inf; NaN gives 0x7e00). Devices may flush f16 subnormals to 0.
pub fn f32_to_f16(gpu: &Gpu, words: DeviceSlice<'_>, x: DeviceSlice<'_>) -> Result<()> {
    let len = x.len();
    words.expect_len("f32_to_f16", "words", f16_words(len))?;
    convert(gpu, &F32_TO_F16, words, x, len)
}

/// Records `out = unpack_f16(words, out.len())`: `words` holds `ceil(out.len() / 2)` u32 words
/// (exact for normal halves).
pub fn f16_to_f32(gpu: &Gpu, out: DeviceSlice<'_>, words: DeviceSlice<'_>) -> Result<()> {
    let len = out.len();
    words.expect_len("f16_to_f32", "words", f16_words(len))?;
    convert(gpu, &F16_TO_F32, out, words, len)
}
