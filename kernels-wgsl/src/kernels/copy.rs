//! `copy` (contiguous) and `strided_copy` (N-d gather by strides, N <= 6: transpose, permute,
//! slicing). Both copy 4-byte words, so they serve f32 and u32 data. Shader: `shaders/copy.wgsl`;
//! reference: [`crate::reference::copy`].

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_1d, same_len};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// Most dimensions `strided_copy` takes.
pub const MAX_RANK: usize = 6;

/// The `copy` entry point.
pub const COPY: Kernel =
    kernel!("copy", "copy", [src: "array<u32>", dst: "array<u32>"], ELEMENTWISE_WORKGROUP);

/// The `strided_copy` entry point.
pub const STRIDED_COPY: Kernel =
    kernel!("copy", "strided_copy", [src: "array<u32>", dst: "array<u32>"], ELEMENTWISE_WORKGROUP);

shader_params! {
    /// The `Params` of `copy.wgsl` (shared by both entry points).
    struct Params {
        rank: u32,
        len: u32,
        src_offset: u32,
        dst_offset: u32,
        shape: [u32; 8] = "array<vec4<u32>, 2>",
        src_strides: [u32; 8] = "array<vec4<u32>, 2>",
    }
}

/// Records `dst[i] = src[i]` for every element (the lengths must match). `src` and `dst` may lie
/// in the same buffer if they do not overlap.
pub fn copy(gpu: &Gpu, dst: DeviceSlice<'_>, src: DeviceSlice<'_>) -> Result<()> {
    let len = same_len("copy", &[("dst", dst), ("src", src)])?;
    let params = Params {
        len: len as u32,
        src_offset: src.index(),
        dst_offset: dst.index(),
        ..Params::default()
    };
    launch_1d(gpu, &COPY, &[], &params, &[src, dst], len)
}

/// Records the gather `dst[i] = src[Σ_d coord_d(i) * src_strides[d]]`, `coord(i)` being `i`
/// unravelled row-major over `shape`; `dst` holds `shape.iter().product()` elements and `src`
/// at least the highest element read plus one. Transposing a row-major (R, C) matrix:
/// `shape = [C, R]`, `src_strides = [1, C]`.
pub fn strided_copy(
    gpu: &Gpu,
    dst: DeviceSlice<'_>,
    src: DeviceSlice<'_>,
    shape: &[u32],
    src_strides: &[u32],
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
    dst.expect_len("strided_copy", "dst", len)?;
    if len == 0 {
        return Ok(());
    }
    // Highest source element read, relative to the start of `src`.
    let span: u64 = shape
        .iter()
        .zip(src_strides)
        .map(|(&n, &s)| u64::from(n - 1) * u64::from(s))
        .sum();
    src.expect_at_least("strided_copy", "src", span + 1)?;
    let mut params = Params {
        rank: shape.len() as u32,
        len: len as u32,
        src_offset: src.index(),
        dst_offset: dst.index(),
        ..Params::default()
    };
    params.shape[..shape.len()].copy_from_slice(shape);
    params.src_strides[..shape.len()].copy_from_slice(src_strides);
    launch_1d(gpu, &STRIDED_COPY, &[], &params, &[src, dst], len)
}
