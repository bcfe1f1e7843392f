//! `convert`: `f32` to IEEE binary16 packed two per `u32` word (element `2i` in the low half of
//! word `i`, the layout of a little-endian `[u16]`; an odd count leaves the last high half 0), and
//! back. Overflow becomes ±inf and NaN stays NaN, so the `nonfinite` check still sees them.
//! Shader: `shaders/convert.wgsl`; reference: [`crate::reference::convert`].

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::{ELEMENTWISE_WORKGROUP, check_range, grid_1d, segment_index};
use crate::pipeline::{Kernel, RuntimeChecks};
use crate::recorder::Dispatch;

/// The `f32_to_f16` entry point: bindings `src` (f32), `dst_words` (u32).
pub const F32_TO_F16: Kernel = Kernel {
    stem: "convert",
    wgsl: include_str!("../../shaders/convert.wgsl"),
    entry: "f32_to_f16",
    storage_bindings: 2,
    runtime_checks: RuntimeChecks::ON,
};

/// The `f16_to_f32` entry point: bindings `src_words` (u32), `dst` (f32).
pub const F16_TO_F32: Kernel = Kernel {
    entry: "f16_to_f32",
    ..F32_TO_F16
};

/// Mirrors `Params` in `convert.wgsl` (both entry points).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    src_offset: u32,
    dst_offset: u32,
    _pad0: u32,
}

/// Number of `u32` words holding `len` halves: `ceil(len / 2)`.
pub fn f16_words(len: u64) -> u64 {
    len.div_ceil(2)
}

#[allow(clippy::too_many_arguments)]
fn convert(
    gpu: &Gpu,
    kernel: &Kernel,
    dst: &DeviceBuffer,
    dst_offset: u64,
    dst_len: u64,
    src: &DeviceBuffer,
    src_offset: u64,
    src_len: u64,
    len: u64,
) -> Result<()> {
    check_range(kernel.entry, "dst", dst, dst_offset, dst_len)?;
    check_range(kernel.entry, "src", src, src_offset, src_len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        n: len as u32,
        src_offset: segment_index(src, src_offset),
        dst_offset: segment_index(dst, dst_offset),
        _pad0: 0,
    };
    gpu.dispatch(Dispatch {
        kernel,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[src, dst],
        // One invocation per u32 word.
        workgroups: grid_1d(gpu, f16_words(len), ELEMENTWISE_WORKGROUP)?,
    })
}

/// Records `words[words_offset ..+ ceil(len / 2)] = pack_f16(x[x_offset ..+ len])` (round to
/// nearest; |x| >= 65520 gives ±inf; NaN gives 0x7e00). Devices may flush f16 subnormals to 0.
pub fn f32_to_f16(
    gpu: &Gpu,
    words: &DeviceBuffer,
    words_offset: u64,
    x: &DeviceBuffer,
    x_offset: u64,
    len: u64,
) -> Result<()> {
    let kernel = &F32_TO_F16;
    convert(
        gpu,
        kernel,
        words,
        words_offset,
        f16_words(len),
        x,
        x_offset,
        len,
        len,
    )
}

/// Records `out[out_offset ..+ len] = unpack_f16(words[words_offset ..+ ceil(len / 2)], len)`
/// (exact for normal halves).
pub fn f16_to_f32(
    gpu: &Gpu,
    out: &DeviceBuffer,
    out_offset: u64,
    words: &DeviceBuffer,
    words_offset: u64,
    len: u64,
) -> Result<()> {
    let kernel = &F16_TO_F32;
    convert(
        gpu,
        kernel,
        out,
        out_offset,
        len,
        words,
        words_offset,
        f16_words(len),
        len,
    )
}
