//! `copy` (contiguous) and `strided_copy` (N-d gather by strides, N <= 6: transpose, permute,
//! slicing). Both copy 4-byte words, so they serve f32 and u32 data. Shader: `shaders/copy.wgsl`;
//! reference: [`crate::reference::copy`].

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, check_range, grid_1d, segment_index};
use crate::pipeline::{Kernel, RuntimeChecks};
use crate::recorder::Dispatch;

/// Most dimensions `strided_copy` takes.
pub const MAX_RANK: usize = 6;

/// The `copy` entry point.
pub const COPY: Kernel = Kernel {
    stem: "copy",
    wgsl: include_str!("../../shaders/copy.wgsl"),
    entry: "copy",
    storage_bindings: 2,
    runtime_checks: RuntimeChecks::ON,
};

/// The `strided_copy` entry point.
pub const STRIDED_COPY: Kernel = Kernel {
    entry: "strided_copy",
    ..COPY
};

/// Mirrors `Params` in `copy.wgsl` (shared by both entry points).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rank: u32,
    len: u32,
    src_offset: u32,
    dst_offset: u32,
    shape: [u32; 8],
    src_strides: [u32; 8],
}

/// Records `dst[dst_offset + i] = src[src_offset + i]` for `i < len`. `src` and `dst` may be the
/// same buffer if the ranges do not overlap.
pub fn copy(
    gpu: &Gpu,
    src: &DeviceBuffer,
    src_offset: u64,
    dst: &DeviceBuffer,
    dst_offset: u64,
    len: u64,
) -> Result<()> {
    check_range("copy", "src", src, src_offset, len)?;
    check_range("copy", "dst", dst, dst_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let params = Params {
        len: len as u32,
        src_offset: segment_index(src, src_offset),
        dst_offset: segment_index(dst, dst_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel: &COPY,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[src, dst],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}

/// Records the gather `dst[dst_offset + i] = src[src_offset + Σ_d coord_d(i) * src_strides[d]]`,
/// `coord(i)` being `i` unravelled row-major over `shape`; writes `shape.iter().product()`
/// elements. Transposing a row-major (R, C) matrix: `shape = [C, R]`, `src_strides = [1, C]`.
pub fn strided_copy(
    gpu: &Gpu,
    src: &DeviceBuffer,
    src_offset: u64,
    shape: &[u32],
    src_strides: &[u32],
    dst: &DeviceBuffer,
    dst_offset: u64,
) -> Result<()> {
    let invalid = |message: String| Error::InvalidArgument {
        op: "strided_copy",
        message,
    };
    if shape.len() != src_strides.len() || shape.len() > MAX_RANK {
        return Err(invalid(format!(
            "shape {shape:?} and strides {src_strides:?} must have the same rank <= {MAX_RANK}"
        )));
    }
    let len: u64 = shape.iter().map(|&s| u64::from(s)).product();
    check_range("strided_copy", "dst", dst, dst_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    // Highest source element read, relative to src_offset.
    let span: u64 = shape
        .iter()
        .zip(src_strides)
        .map(|(&n, &s)| u64::from(n - 1) * u64::from(s))
        .sum();
    check_range("strided_copy", "src", src, src_offset, span + 1)?;
    let mut params = Params {
        rank: shape.len() as u32,
        len: len as u32,
        src_offset: segment_index(src, src_offset),
        dst_offset: segment_index(dst, dst_offset),
        ..Params::default()
    };
    params.shape[..shape.len()].copy_from_slice(shape);
    params.src_strides[..shape.len()].copy_from_slice(src_strides);
    gpu.dispatch(Dispatch {
        kernel: &STRIDED_COPY,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[src, dst],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}
