//! `copy` (contiguous) and `strided_copy` (N-d gather by strides, N <= 6: transpose, permute,
//! slicing). Both copy 4-byte words, so they serve f32 and u32 data. Shader: `shaders/copy.wgsl`;
//! reference: [`crate::reference::copy`].

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::convert::Halves;
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_1d, launch_split, same_len};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// Most dimensions `strided_copy` takes.
pub const MAX_RANK: usize = 6;

/// The `copy` entry point.
pub const COPY: Kernel =
    kernel!("copy", "copy", [src: "array<u32>", dst: "array<u32>"], ELEMENTWISE_WORKGROUP);

/// The `copy_v4` entry point (four words per invocation).
pub const COPY_V4: Kernel = kernel!(
    "copy",
    "copy_v4",
    [src_v4: "array<vec4<u32>>", dst_v4: "array<vec4<u32>>"],
    ELEMENTWISE_WORKGROUP
);

/// The `strided_copy` entry point.
pub const STRIDED_COPY: Kernel =
    kernel!("copy", "strided_copy", [src: "array<u32>", dst: "array<u32>"], ELEMENTWISE_WORKGROUP);

/// The `strided_copy_f16` entry point: [`strided_copy_f16`], bindings `src`, `dst` (words).
pub const STRIDED_COPY_F16: Kernel = kernel!(
    "copy",
    "strided_copy_f16",
    [src: "array<u32>", dst: "array<u32>"],
    ELEMENTWISE_WORKGROUP
);

/// The `strided_copy_v4` entry point (four words per invocation).
pub const STRIDED_COPY_V4: Kernel = kernel!(
    "copy",
    "strided_copy_v4",
    [src_v4: "array<vec4<u32>>", dst_v4: "array<vec4<u32>>"],
    ELEMENTWISE_WORKGROUP
);

/// The `strided_copy_rows_v4` entry point (a whole innermost run of vec4s per invocation).
pub const STRIDED_COPY_ROWS_V4: Kernel = kernel!(
    "copy",
    "strided_copy_rows_v4",
    [src_v4: "array<vec4<u32>>", dst_v4: "array<vec4<u32>>"],
    ELEMENTWISE_WORKGROUP
);

/// Longest innermost run (in vec4s) that `strided_copy_rows_v4` copies in one invocation.
const MAX_ROW_RUN: u32 = 64;

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
    let kernels = [&COPY_V4, &COPY];
    launch_split(gpu, kernels, &[], &[src, dst], len, |part| Params {
        len: part.count,
        src_offset: part.offset(src.index()),
        dst_offset: part.offset(dst.index()),
        ..Params::default()
    })
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
    let (len, reads) = gather_extent("strided_copy", shape, src_strides)?;
    dst.expect_len("strided_copy", "dst", len)?;
    if len == 0 {
        return Ok(());
    }
    src.expect_at_least("strided_copy", "src", reads)?;
    let (shape, strides) = canonical(shape, src_strides);
    let rank = shape.len();
    // Innermost dimension contiguous and whole vec4s, everything else 4-aligned: vec4s.
    let vec4 = shape[rank - 1].is_multiple_of(4)
        && strides[rank - 1] == 1
        && strides[..rank - 1].iter().all(|s| s.is_multiple_of(4))
        && src.index().is_multiple_of(4)
        && dst.index().is_multiple_of(4);
    // A run of 2 to MAX_ROW_RUN vec4s: one invocation per run (the index arithmetic once).
    let run4 = shape[rank - 1] / 4;
    let rows = vec4 && (2..=MAX_ROW_RUN).contains(&run4);
    let (kernel, unit) = match (vec4, rows) {
        (true, true) => (&STRIDED_COPY_ROWS_V4, 4),
        (true, false) => (&STRIDED_COPY_V4, 4),
        _ => (&STRIDED_COPY, 1),
    };
    let mut params = Params {
        rank: rank as u32,
        len: (len / unit) as u32,
        src_offset: src.index() / unit as u32,
        dst_offset: dst.index() / unit as u32,
        ..Params::default()
    };
    params.shape[..rank].copy_from_slice(&shape);
    params.src_strides[..rank].copy_from_slice(&strides);
    if vec4 {
        params.shape[rank - 1] /= 4;
        for s in &mut params.src_strides[..rank - 1] {
            *s /= 4;
        }
    }
    let invocations = if rows {
        len / 4 / u64::from(run4)
    } else {
        len / unit
    };
    params.len = invocations as u32;
    launch_1d(gpu, kernel, &[], &params, &[src, dst], invocations)
}

/// [`strided_copy`] over 16-bit elements (the bits as they are, on either 16-bit path): `shape`,
/// `src_strides` and the runs count halves; `dst` must start at an even half (one invocation
/// writes each word whole). Errors: those of [`strided_copy`], and [`Error::InvalidArgument`]
/// when `dst` starts in the high half of a word.
pub fn strided_copy_f16(
    gpu: &Gpu,
    dst: Halves<'_>,
    src: Halves<'_>,
    shape: &[u32],
    src_strides: &[u32],
) -> Result<()> {
    let invalid = |message: String| Error::InvalidArgument {
        op: "strided_copy_f16",
        message,
    };
    let (len, reads) = gather_extent("strided_copy_f16", shape, src_strides)?;
    if dst.len() != len {
        return Err(invalid(format!(
            "dst: {} halves given, {len} needed",
            dst.len()
        )));
    }
    if !dst.index().is_multiple_of(2) {
        return Err(invalid(format!(
            "dst {:?} starts in the high half of a word; give one that starts at an even element",
            dst.words()
        )));
    }
    if len == 0 {
        return Ok(());
    }
    if src.len() < reads {
        return Err(invalid(format!(
            "src: {} halves given, at least {reads} read",
            src.len()
        )));
    }
    let (shape, strides) = canonical(shape, src_strides);
    let rank = shape.len();
    let mut params = Params {
        rank: rank as u32,
        len: len as u32,
        src_offset: src.index(),
        dst_offset: dst.index(),
        ..Params::default()
    };
    params.shape[..rank].copy_from_slice(&shape);
    params.src_strides[..rank].copy_from_slice(&strides);
    let buffers = [src.words(), dst.words()];
    launch_1d(
        gpu,
        &STRIDED_COPY_F16,
        &[],
        &params,
        &buffers,
        len.div_ceil(2),
    )
}

/// A gather's element count and how many source elements it reads (the highest index read plus
/// one; 0 when it is empty), or [`Error::InvalidArgument`] when `shape` and `src_strides` differ
/// in rank or pass [`MAX_RANK`].
fn gather_extent(op: &'static str, shape: &[u32], src_strides: &[u32]) -> Result<(u64, u64)> {
    if shape.len() != src_strides.len() || shape.len() > MAX_RANK {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "shape {shape:?} and strides {src_strides:?} must have the same rank <= \
                 {MAX_RANK}"
            ),
        });
    }
    let len: u64 = shape.iter().map(|&s| u64::from(s)).product();
    if len == 0 {
        return Ok((0, 0));
    }
    let span: u64 = shape
        .iter()
        .zip(src_strides)
        .map(|(&n, &s)| u64::from(n - 1) * u64::from(s))
        .sum();
    Ok((len, span + 1))
}

/// The same gather with fewer dimensions: extents of 1 dropped, and each dimension merged into
/// the one outside it where that one's stride is its stride times its extent (the two then walk
/// the source as one). At least one dimension remains. `shape` has no zero extent.
fn canonical(shape: &[u32], strides: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let mut out_shape: Vec<u32> = Vec::with_capacity(shape.len());
    let mut out_strides: Vec<u32> = Vec::with_capacity(shape.len());
    for (&n, &s) in shape.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        match (out_shape.last_mut(), out_strides.last()) {
            (Some(prev_n), Some(&prev_s)) if u64::from(prev_s) == u64::from(s) * u64::from(n) => {
                *prev_n *= n;
                if let Some(last) = out_strides.last_mut() {
                    *last = s;
                }
            }
            _ => {
                out_shape.push(n);
                out_strides.push(s);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        out_strides.push(1);
    }
    (out_shape, out_strides)
}
