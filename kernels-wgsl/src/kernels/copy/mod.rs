//! `copy` (contiguous) and `strided_copy` (N-d gather by strides, N <= 6: transpose, permute,
//! slicing). Both copy 4-byte words, so they serve f32 and u32 data. In one place: the shader
//! (`copy.wgsl`, beside this file), the launchers, the CPU [`reference`](mod@reference) and the tests.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::convert::Halves;
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_split, launch_units, same_len};
use crate::pipeline::{Kernel, kernels, shader_params};
use crate::slice::DeviceSlice;

/// The module: `copy.wgsl`, beside this file.
const WGSL: &str = include_str!("copy.wgsl");

/// Most dimensions `strided_copy` takes.
pub const MAX_RANK: usize = 6;

kernels! {
    "copy", source: WGSL, workgroup: ELEMENTWISE_WORKGROUP;
    /// The `copy` entry point.
    COPY = "copy" [src: "array<u32>", dst: "array<u32>"];
    /// The `copy_v4` entry point (four words per invocation).
    COPY_V4 = "copy_v4" [src_v4: "array<vec4<u32>>", dst_v4: "array<vec4<u32>>"];
    /// The `strided_copy` entry point.
    STRIDED_COPY = "strided_copy" [src: "array<u32>", dst: "array<u32>"];
    /// The `strided_copy_f16` entry point: [`strided_copy_f16`], bindings `src`, `dst` (words).
    STRIDED_COPY_F16 = "strided_copy_f16" [src: "array<u32>", dst: "array<u32>"];
    /// The `strided_copy_v4` entry point (four words per invocation).
    STRIDED_COPY_V4 = "strided_copy_v4" [src_v4: "array<vec4<u32>>", dst_v4: "array<vec4<u32>>"];
    /// The `strided_copy_rows_v4` entry point (a whole innermost run of vec4s per invocation).
    STRIDED_COPY_ROWS_V4 = "strided_copy_rows_v4" [
        src_v4: "array<vec4<u32>>",
        dst_v4: "array<vec4<u32>>",
    ];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    COPY,
    COPY_V4,
    STRIDED_COPY,
    STRIDED_COPY_F16,
    STRIDED_COPY_V4,
    STRIDED_COPY_ROWS_V4,
];

/// Longest innermost run (in vec4s) that `strided_copy_rows_v4` copies in one invocation.
const MAX_ROW_RUN: u32 = 64;

shader_params! {
    /// The `Params` of `copy.wgsl` (shared by both entry points).
    struct Params {
        rank: u32,
        len: u32,
        src_offset: u32,
        dst_offset: u32,
        /// The strided entry points: the first invocation's index of the range this dispatch
        /// runs, up to `len` (a launch in ranges under a submission bound).
        start: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
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
    launch_units(gpu, kernel, &[], &[src, dst], invocations, |s, e| {
        (params.range(s as u32, e as u32), e - s)
    })
}

impl Params {
    /// These `Params` for the invocations `start..end` of a strided launch.
    fn range(mut self, start: u32, end: u32) -> Params {
        self.start = start;
        self.len = end;
        self
    }
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
    // Pairs of halves, one word each: ranges start on a word.
    launch_units(gpu, &STRIDED_COPY_F16, &[], &buffers, len.div_ceil(2), |s, e| {
        (params.range(2 * s as u32, (2 * e).min(len) as u32), e - s)
    })
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

/// CPU reference for `copy` (contiguous) and `strided_copy` (an N-d gather by strides).
/// Generic over the element: the kernel tests copy `f32`, the gradient checks `f64`.
pub mod reference {
    /// `dst[dst_offset + i] = src[src_offset + i]` for `i` in `0..len`.
    ///
    /// # Panics
    /// If a range is out of bounds (a test bug).
    pub fn copy<T: Copy>(src: &[T], src_offset: usize, dst: &mut [T], dst_offset: usize, len: usize) {
        dst[dst_offset..dst_offset + len].copy_from_slice(&src[src_offset..src_offset + len]);
    }

    /// `dst[dst_offset + i] = src[src_offset + Σ_d coord_d(i) * src_strides[d]]`, where `coord(i)`
    /// unravels `i` row-major over `shape`; writes `shape.iter().product()` elements.
    /// Example: transposing a row-major (R, C) matrix is `shape = [C, R]`, `src_strides = [1, C]`.
    ///
    /// # Panics
    /// If `shape` and `src_strides` differ in length or an index is out of bounds (a test bug).
    pub fn strided_copy<T: Copy>(
        src: &[T],
        src_offset: usize,
        shape: &[usize],
        src_strides: &[usize],
        dst: &mut [T],
        dst_offset: usize,
    ) {
        assert_eq!(shape.len(), src_strides.len(), "one stride per dimension");
        let len: usize = shape.iter().product();
        for i in 0..len {
            let mut rem = i;
            let mut at = src_offset;
            for d in (0..shape.len()).rev() {
                at += (rem % shape[d]) * src_strides[d];
                rem /= shape[d];
            }
            dst[dst_offset + i] = src[at];
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::Result;
    use crate::testing::{DEADLINE, assert_exact, gpu, gpu_and_rng, Rng};
    use crate::{Category, Error};

    #[test]
    pub(crate) fn matches_reference() -> Result<()> {
        let (gpu, mut rng) = gpu_and_rng(21);
        // (src, dst) offsets: odd (the scalar kernel), then multiples of 4 (vec4s and a tail).
        for (src_at, dst_at) in [(5, 2), (4, 8)] {
            for len in [1usize, 255, 257, 1000, 1003, 70_001] {
                let src = rng.vec_f32(len + src_at, -3.0, 3.0);
                let dst0 = rng.vec_f32(len + dst_at + 5, -3.0, 3.0);
                let src_gpu = gpu.upload(&src, Category::Temporary, "copy src")?;
                let dst_gpu = gpu.upload(&dst0, Category::Temporary, "copy dst")?;
                let (src_s, dst_s) = (
                    src_gpu.slice(src_at as u64, len as u64)?,
                    dst_gpu.slice(dst_at as u64, len as u64)?,
                );
                super::copy(&gpu, dst_s, src_s)?;
                let got: Vec<f32> = gpu.read_all(&dst_gpu, DEADLINE)?;
                let mut want = dst0.clone();
                super::reference::copy(&src, src_at, &mut want, dst_at, len);
                assert_exact(&format!("copy len {len} at {src_at} -> {dst_at}"), &got, &want);
            }
        }
        Ok(())
    }

    #[test]
    fn strided_copy_matches_reference() -> Result<()> {
        let (gpu, mut rng) = gpu_and_rng(31);
        // (shape of the source, permutation of its axes)
        let cases: [(&[usize], &[usize]); 10] = [
            (&[37, 53], &[1, 0]),     // transpose
            (&[3, 5, 7], &[2, 0, 1]), // permute
            (&[2, 3, 4, 5], &[3, 1, 2, 0]),
            (&[2, 3, 1, 5, 3, 2], &[5, 4, 3, 2, 1, 0]), // 6-d reversal
            (&[301], &[0]),
            // Attention's (B, T, 3, H, D) -> (3, B, H, T, D): the innermost D stays contiguous
            // (vec4s when aligned).
            (&[2, 6, 3, 4, 8], &[2, 0, 3, 1, 4]),
            (&[5, 12], &[0, 1]), // the identity: merged into one contiguous run
            (&[4, 1, 3, 8], &[2, 1, 0, 3]), // an extent of 1, and a merge of the last two
            // Runs of one vec4 (one invocation each), and of 65 (past the longest run per
            // invocation): strided_copy_v4 where aligned; runs of 2 to 64 take the rows variant.
            (&[3, 7, 4], &[1, 0, 2]),
            (&[2, 3, 260], &[1, 0, 2]),
        ];
        for ((shape, perm), (src_offset, dst_at)) in cases
            .into_iter()
            .flat_map(|case| [(case, (3, 1)), (case, (4, 4))])
        {
            let len: usize = shape.iter().product();
            let src = rng.vec_f32(len + src_offset, -3.0, 3.0);
            // Row-major strides of the source, then permuted: a gather that realises the permutation.
            let mut strides = vec![1usize; shape.len()];
            for d in (0..shape.len().saturating_sub(1)).rev() {
                strides[d] = strides[d + 1] * shape[d + 1];
            }
            let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let out_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
            let src_gpu = gpu
                .upload(&src, Category::Activation, "strided src")
                ?;
            let dst_gpu = gpu
                .alloc_elements((len + dst_at) as u64, Category::Activation, "strided dst")
                ?;
            crate::kernels::fill::fill(&gpu, dst_gpu.whole(), -7.0)?;
            let to_u32 = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<_>>();
            super::strided_copy(
                &gpu,
                dst_gpu.slice(dst_at as u64, len as u64)?,
                src_gpu.slice(src_offset as u64, len as u64)?,
                &to_u32(&out_shape),
                &to_u32(&out_strides),
            )
            ?;
            let got: Vec<f32> = gpu.read_all(&dst_gpu, DEADLINE)?;
            let mut want = vec![-7.0; len + dst_at];
            super::reference::strided_copy(
                &src,
                src_offset,
                &out_shape,
                &out_strides,
                &mut want,
                dst_at,
            );
            assert_exact(&format!("strided_copy {shape:?} perm {perm:?}"), &got, &want);
        }
        Ok(())
    }

    #[test]
    fn copy_within_one_segment_and_bad_ranges() -> Result<()> {
        let gpu = gpu();
        let data: Vec<f32> = (0..100).map(|i| i as f32 + 0.5).collect();
        let a = gpu.upload(&data, Category::Temporary, "a")?;
        let b = gpu.alloc_elements(100, Category::Temporary, "b")?;
        assert_eq!(
            a.placement().0,
            b.placement().0,
            "small buffers share a segment"
        );
        super::copy(&gpu, b.slice(0, 100)?, a.slice(0, 100)?)?;
        // Same buffer, disjoint ranges.
        super::copy(&gpu, b.slice(50, 50)?, b.slice(0, 50)?)?;
        let got: Vec<f32> = gpu.read_all(&b, DEADLINE)?;
        let mut want = data.clone();
        want.copy_within(0..50, 50);
        assert_exact("copy same segment", &got, &want);
        // Source elements 1..101 of a 100-element buffer: refused when the slice is made.
        let err = a.slice(1, 100).expect_err("must be refused");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        // Source and destination of different lengths: refused by the launcher.
        let err = super::copy(&gpu, b.whole(), a.slice(1, 99)?).expect_err("must be refused");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        // A gather whose last read (9*10 + 10*1 = element 100) lies past the source's 100 elements,
        // into a destination of the right length (110).
        let c = gpu.alloc_elements(110, Category::Temporary, "c")?;
        let err =
            super::strided_copy(&gpu, c.whole(), a.whole(), &[10, 11], &[10, 1]).expect_err("must be refused");
        assert!(
            matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("src"),
            "{err}"
        );
        // A destination of the wrong length for the shape.
        let err =
            super::strided_copy(&gpu, b.whole(), a.whole(), &[10, 11], &[10, 1]).expect_err("must be refused");
        assert!(
            matches!(err, Error::InvalidArgument { .. })
                && err.to_string().contains("dst: 100 elements given")
                && err.to_string().contains("110 needed"),
            "{err}"
        );
        Ok(())
    }

    /// `copy::strided_copy_f16` moves the bits of a permuted run of halves (a 3-D transpose from an
    /// odd source offset), keeping the halves around the destination, on both paths.
    #[test]
    fn f16_strided_copy_permutes_the_bits() -> Result<()> {
        use crate::kernels::convert::Halves;
        use crate::kernels::convert::reference::round_to_f16;
        use crate::testing::{f16_devices, read_halves, sentinel_halves, upload_halves};
        let (d0, d1, d2) = (3usize, 5usize, 7usize);
        let len = d0 * d1 * d2;
        let mut rng = Rng::new(0xC0);
        let mut x = round_to_f16(&rng.vec_f32(len, -100.0, 100.0));
        x[0] = f32::NAN;
        x[1] = f32::NEG_INFINITY;
        // out[i][j][k] = x[k][i][j]: shape (d1, d2, d0) over x of (d0, d1, d2).
        let shape = [d1 as u32, d2 as u32, d0 as u32];
        let strides = [d2 as u32, 1, (d1 * d2) as u32];
        for (_, gpu) in f16_devices() {
            let (off_src, off_dst) = (3, 2);
            let src_gpu = upload_halves(&gpu, &x, off_src)?;
            let dst_gpu = sentinel_halves(&gpu, off_dst, len, "dst")?;
            let src = Halves::of(&src_gpu, off_src as u64, len as u64)?;
            let dst = Halves::of(&dst_gpu, off_dst as u64, len as u64)?;
            super::strided_copy_f16(&gpu, dst, src, &shape, &strides)?;
            let (got, kept) = read_halves(&gpu, &dst_gpu, off_dst, len)?;
            let want: Vec<f32> = (0..len)
                .map(|i| {
                    let (a, b, c) = (i / (d2 * d0), (i / d0) % d2, i % d0);
                    x[a * d2 + b + c * d1 * d2]
                })
                .collect();
            let name = format!("{:?} strided_copy_f16", gpu.f16_path());
            assert!(kept, "{name}: a half outside the destination changed");
            assert_exact(&name, &got, &want);
            let odd = Halves::of(&dst_gpu, 1, len as u64)?;
            let err = super::strided_copy_f16(&gpu, odd, src, &shape, &strides).expect_err("must be refused");
            assert!(err.to_string().contains("even element"), "{err}");
        }
        Ok(())
    }
}
