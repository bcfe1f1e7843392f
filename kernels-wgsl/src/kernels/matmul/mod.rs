//! `matmul`: batched `C[b] = alpha · op(A[b]) · op(B[b])` (or `C[b] +=` that), row-major, `op`
//! the identity or a transpose per operand. In one place: the shaders (`matmul.wgsl`, its
//! generator `gen_matmul.py` and the operand accessors `matmul_io_*.wgsl`, beside this file),
//! the launchers (the 16-bit operands' in `half.rs`), the CPU [`reference`](mod@reference) and the
//! tests. Launcher and reference take the same [`MatmulDims`]; each operand starts at the start
//! of its slice (a [`DeviceSlice`] here, an `&[f32]` there).
//!
//! Two entry points ([`entry_point`] picks one): `main`, 16×16 outputs per invocation with `vec4`
//! loads, for operands whose stored rows and offsets are multiples of 4 elements; `main_scalar`,
//! 4×4 outputs per invocation, for everything else. Both clamp every load index into its operand
//! and guard every store, so with the extents checked here the shader could run without wgpu's
//! runtime checks ([`matmul_unchecked`]). Measured on lavapipe (`cargo xtask bench kernels`,
//! checked and unchecked runs interleaved) that gains only 1–3 % (1024³: 21.4 against 21.3
//! GFLOP/s; MLP step: 213 against 219 ms), so [`matmul`] keeps wgpu's checks on; re-measure on
//! a real GPU before switching.
//!
//! Where the adapter has cooperative matrices (tensor cores), `main`'s products with a 16-bit
//! operand run on `main_coop` instead (`coop`: [`MatmulPath`], [`Gpu::matmul_path`]).
//!
//! Besides the product, a launch can apply an epilogue to C in the same pass (a bias per column,
//! then ReLU: [`matmul_bias`]) or write the squares of C per block ([`matmul_squares`]); and a
//! thread can record the shapes a device's matmuls take ([`Gpu::record_matmuls`]).

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use crate::device::{Gpu, Shared};
use crate::error::{Error, Result};
use crate::kernels::check_loop_limit;
use crate::kernels::convert::F16Path;
use crate::pipeline::{Kernel, RuntimeChecks, kernels, shader_params};
use crate::recorder::Dispatch;
use crate::slice::DeviceSlice;

mod coop;
mod half;
pub mod reference;
mod split;
mod split_k;
#[cfg(test)]
mod coop_tests;
#[cfg(test)]
mod f16_tests;
#[cfg(test)]
pub(crate) mod tests;

pub(super) use half::f16_overrides;
pub(crate) use coop::is_coop;
pub use coop::{COOP, MatmulPath};
pub use half::{MAIN_F16, MAIN_SCALAR_F16, NATIVE, Operand, native_kernels};
pub use split_k::SPLIT_K_BELOW;
use split::{Block, launch};

/// Shape, layout and options of one batched matmul, mirroring the shader's `Params` (the
/// element offsets come from the slices).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulDims {
    /// Number of products in the batch (0 is allowed and does nothing).
    pub batch: usize,
    /// Rows of `op(A)` and of `C`.
    pub m: usize,
    /// Columns of `op(B)` and of `C`.
    pub n: usize,
    /// Inner dimension: columns of `op(A)`, rows of `op(B)`.
    pub k: usize,
    /// `true`: the stored A is `K×M` and is used transposed.
    pub trans_a: bool,
    /// `true`: the stored B is `N×K` and is used transposed.
    pub trans_b: bool,
    /// Elements between consecutive batches of A (0 = the same A for every batch).
    pub batch_stride_a: usize,
    /// Elements between consecutive batches of B (0 = the same B for every batch).
    pub batch_stride_b: usize,
    /// Elements between consecutive batches of C (normally `m * n`).
    pub batch_stride_c: usize,
    /// Scale applied to the product: `C = alpha · op(A)·op(B)` (1.0 for a plain matmul).
    pub alpha: f32,
    /// `true`: add into the existing C (`C += alpha · op(A)·op(B)`), e.g. gradient accumulation.
    pub accumulate: bool,
}

impl MatmulDims {
    /// A dense, non-transposed, non-accumulating batched matmul: contiguous batches
    /// (`batch_stride_a = m*k`, `batch_stride_b = k*n`, `batch_stride_c = m*n`), `alpha = 1`.
    pub fn dense(batch: usize, m: usize, n: usize, k: usize) -> Self {
        Self {
            batch,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            batch_stride_a: m * k,
            batch_stride_b: k * n,
            batch_stride_c: m * n,
            alpha: 1.0,
            accumulate: false,
        }
    }

    /// Element index of logical `op(A)[i][l]` for batch `bi` (stored `m×k`, or `k×m` transposed).
    pub(crate) fn a_index(&self, bi: usize, i: usize, l: usize) -> usize {
        stored_index(
            bi * self.batch_stride_a,
            self.trans_a,
            (i, l),
            (self.k, self.m),
        )
    }

    /// Element index of logical `op(B)[l][j]` for batch `bi` (stored `k×n`, or `n×k` transposed).
    pub(crate) fn b_index(&self, bi: usize, l: usize, j: usize) -> usize {
        stored_index(
            bi * self.batch_stride_b,
            self.trans_b,
            (l, j),
            (self.n, self.k),
        )
    }

    /// Element index of `C[i][j]` for batch `bi`.
    pub(crate) fn c_index(&self, bi: usize, i: usize, j: usize) -> usize {
        bi * self.batch_stride_c + i * self.n + j
    }

    /// Number of elements an output slice must hold: one past the last element of C written.
    pub fn c_len(&self) -> usize {
        if self.batch == 0 || self.m == 0 || self.n == 0 {
            return 0;
        }
        self.c_index(self.batch - 1, self.m - 1, self.n - 1) + 1
    }
}

/// Index of logical element `(row, col)` of a row-major operand stored from `base`, rows of
/// `widths.0` elements, or transposed (stored `(col, row)`) with rows of `widths.1`.
fn stored_index(
    base: usize,
    trans: bool,
    (row, col): (usize, usize),
    widths: (usize, usize),
) -> usize {
    if trans {
        base + col * widths.1 + row
    } else {
        base + row * widths.0 + col
    }
}

/// The f32 module: the body (`matmul.wgsl`, which loads and stores its operands through
/// accessors: `lda4`, `stc`, ...) and the f32 accessors of `matmul_io_{a,b,c}.wgsl`.
const WGSL_F32: &str = concat!(
    include_str!("matmul.wgsl"),
    include_str!("matmul_epilogue.wgsl"),
    include_str!("matmul_io_a.wgsl"),
    include_str!("matmul_io_b.wgsl"),
    include_str!("matmul_io_c.wgsl")
);

kernels! {
    "matmul", source: WGSL_F32, workgroup: 64;
    /// The fast entry point (`vec4` loads; preconditions in [`entry_point`]).
    MAIN = "main" [
        a_v4: "array<vec4<f32>>",
        b_v4: "array<vec4<f32>>",
        c_v4: "array<vec4<f32>>",
        bias,
    ];
    /// The any-shape entry point.
    MAIN_SCALAR = "main_scalar" [a, b, c, bias];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    MAIN,
    MAIN_SCALAR,
    MAIN_F16,
    MAIN_SCALAR_F16,
    COOP[0],
    COOP[1],
    COOP[2],
    COOP[3],
    COOP[4],
    COOP[5],
    NATIVE[1][0],
    NATIVE[1][1],
    NATIVE[2][0],
    NATIVE[2][1],
    NATIVE[3][0],
    NATIVE[3][1],
    NATIVE[4][0],
    NATIVE[4][1],
    NATIVE[5][0],
    NATIVE[5][1],
    NATIVE[6][0],
    NATIVE[6][1],
    NATIVE[7][0],
    NATIVE[7][1],
];

/// The least work (`2·batch·m·n·k`) a product takes `main` for: below it `main_scalar` does.
/// `main`'s first dispatch costs lavapipe 0.9–1.7 s of JIT per layout (`cargo xtask bench
/// kernels` with `MESA_SHADER_CACHE_DISABLE=true`, `pipeline_cold/matmul::main`), against about
/// 0.09 s for `main_scalar`; below this size `main` saves at most about 0.8 ms a product
/// (`matmul/small`: 10.9 against 5.2 GFLOP/s at 128³ is 0.4 ms; the same rates at 2²³ FLOP
/// give 0.8 ms), so a small model such as digits would need thousands of steps to earn its
/// compile time back.
pub const MAIN_MIN_FLOPS: u64 = 1 << 23;

/// Outputs per workgroup along each of M and N: `main` (8×8 invocations × 16×16 outputs).
const TILE_MAIN: u64 = 128;
/// Outputs per workgroup along each of M and N: `main_scalar` (8×8 invocations × 4×4 outputs).
const TILE_SCALAR: u64 = 32;

shader_params! {
    /// The `Params` of `matmul.wgsl` (64 bytes; all offsets and strides in elements).
    struct Params {
        m: u32,
        n: u32,
        k: u32,
        batch: u32,
        stride_a: u32,
        stride_b: u32,
        stride_c: u32,
        offset_a: u32,
        offset_b: u32,
        offset_c: u32,
        /// Bit 0: accumulate (`C += ..`); bits 1 and 2: `trans_a` and `trans_b` for
        /// `main_scalar` (`main` takes them as override constants, one pipeline per layout);
        /// bits 3 and 4: the epilogue's bias and ReLU, on both.
        flags: u32,
        alpha: f32,
        offset_bias: u32,
        /// The first row of C this dispatch computes (a piece of a product split under a bound
        /// on one submission's GPU time; 0 otherwise).
        row_start: u32,
        /// The first column of C it computes (as `row_start`).
        col_start: u32,
        _pad2: u32,
    }
}

/// The `Params` declaration, for the 16-bit modules' kernels (`half`).
pub(super) const MATMUL_PARAMS_WGSL: &str = PARAMS_WGSL;

/// What a launch does besides the product: an epilogue with its bias, or the squares of C.
#[derive(Clone, Copy)]
pub(super) enum Extra<'a> {
    None,
    Bias(DeviceSlice<'a>, Epilogue),
    Squares(DeviceSlice<'a>),
}

/// Which entry point of `matmul.wgsl` a launch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulEntry {
    /// `main`: `vec4` loads, 16×16 outputs per invocation, 128×128 per workgroup.
    Main,
    /// `main_scalar`: scalar loads, 4×4 outputs per invocation, 32×32 per workgroup.
    MainScalar,
}

/// The entry point for `dims`: [`MatmulEntry::Main`] when every `vec4` it loads is a whole,
/// aligned group of 4 elements and every 4-column store stays inside its row, i.e.
/// - A's stored row length (`k`, or `m` with `trans_a`) and B's (`n`, or `k` with `trans_b`)
///   are multiples of 4;
/// - `n` (C's row length) is a multiple of 4: `main` stores 4 columns at a time, guarded by the
///   first column only;
/// - when `batch > 1`, the batch strides of A, B and C are multiples of 4 elements (the
///   launcher also needs the slices' segment indices to be, see [`DeviceSlice::index`]: `main`
///   reads A and B and writes C as `vec4`s);
/// - the product is at least [`MAIN_MIN_FLOPS`].
///
/// Otherwise [`MatmulEntry::MainScalar`].
pub fn entry_point(dims: &MatmulDims) -> MatmulEntry {
    let flops = [dims.batch, dims.m, dims.n, dims.k]
        .iter()
        .try_fold(2u64, |acc, &x| acc.checked_mul(x as u64))
        .unwrap_or(u64::MAX);
    if main_fits(dims) && flops >= MAIN_MIN_FLOPS {
        MatmulEntry::Main
    } else {
        MatmulEntry::MainScalar
    }
}

/// Whether `main`'s alignment preconditions hold for `dims` (every condition of
/// [`entry_point`] but the size).
fn main_fits(dims: &MatmulDims) -> bool {
    let a_row = if dims.trans_a { dims.m } else { dims.k };
    let b_row = if dims.trans_b { dims.k } else { dims.n };
    let strides = if dims.batch > 1 {
        [
            dims.batch_stride_a,
            dims.batch_stride_b,
            dims.batch_stride_c,
        ]
    } else {
        [0, 0, 0]
    };
    [a_row, b_row, dims.n]
        .into_iter()
        .chain(strides)
        .all(|x| x.is_multiple_of(4))
}

/// Loop passes one invocation of `entry` runs for `dims` (see "Loop limit on lavapipe" in
/// [`crate::kernels`]): its k loop, `k / 4 + 1` on [`MatmulEntry::Main`] (4 k-steps per pass)
/// except `trans_a && !trans_b` and on [`MatmulEntry::MainScalar`], `k + 1` (one k-step per
/// pass), plus 3 for the loops of `main`'s other transpose branches should the compiler keep
/// them. The launchers refuse more than the adapter's limit with [`Error::LoopLimit`] (on
/// lavapipe: `k <= 65_534` on `main_scalar`, 65_531 on `main` with `trans_a` only, 262_127 on
/// the other `main` variants).
pub fn loop_iterations(entry: MatmulEntry, trans_a: bool, trans_b: bool, k: u64) -> u64 {
    match entry {
        MatmulEntry::Main if trans_a && !trans_b => k + 1 + 3,
        MatmulEntry::Main => k / 4 + 1 + 3,
        MatmulEntry::MainScalar => k + 1,
    }
}

/// Records the batched matmul `dims` describes (module docs): for `b < batch`,
/// `C[b] = alpha · op(A[b]) · op(B[b])`, or `C[b] += ..` with `dims.accumulate`, where batch `b`
/// of A starts at element `b · batch_stride_a` of `lhs` (likewise B in `rhs`, C in `out`), and a batch stride of 0 broadcasts that operand. Shapes: stored A is `m×k` (`k×m`
/// with `trans_a`), stored B `k×n` (`n×k` with `trans_b`), C `m×n`. With `accumulate` off, C's old
/// contents do not affect it (`main` loads them and discards them; NaN included). Nothing is recorded when `batch`, `m` or `n` is 0; `k = 0` gives
/// `C = 0` (or leaves C as it is when accumulating).
///
/// Each operand is an [`Operand`]: f32 elements (a [`DeviceSlice`]) or 16-bit ones (a
/// [`crate::kernels::convert::Halves`]), in any mix; products and sums are f32 and a 16-bit C
/// is rounded once, after the epilogue (see `half`).
///
/// `out` may share a segment (or be the same buffer) as `lhs` or `rhs` only if they do not
/// overlap (and, for 16-bit operands, share no word).
///
/// # Errors
/// [`Error::InvalidArgument`] if an operand's extent (`(batch − 1) · stride + rows · cols`) does
/// not fit its slice, a figure does not fit the shader's `u32`, C's batches
/// overlap (`batch > 1` with `batch_stride_c < m · n`), C overlaps an operand, or the grid exceeds
/// the device's workgroup limit; otherwise what [`Gpu::dispatch`] returns.
pub fn matmul<'a>(
    gpu: &Gpu,
    dims: &MatmulDims,
    out: impl Into<Operand<'a>>,
    lhs: impl Into<Operand<'a>>,
    rhs: impl Into<Operand<'a>>,
) -> Result<()> {
    launch(
        gpu,
        dims,
        [out.into(), lhs.into(), rhs.into()],
        [MAIN, MAIN_SCALAR],
        None,
        Extra::None,
    )
}

/// [`matmul`] on the entry point `entry` whatever the product's size (for benchmarks and tests
/// that compare the two). Errors: those of [`matmul`], and [`Error::InvalidArgument`] when
/// `entry` is [`MatmulEntry::Main`] and `dims` or the slices miss its alignment (see
/// [`entry_point`]).
pub fn matmul_on<'a>(
    gpu: &Gpu,
    entry: MatmulEntry,
    dims: &MatmulDims,
    out: impl Into<Operand<'a>>,
    lhs: impl Into<Operand<'a>>,
    rhs: impl Into<Operand<'a>>,
) -> Result<()> {
    launch(
        gpu,
        dims,
        [out.into(), lhs.into(), rhs.into()],
        [MAIN, MAIN_SCALAR],
        Some(entry),
        Extra::None,
    )
}

/// [`matmul`] with a shader module created without wgpu's runtime checks (bounds checks, loop
/// bounding). Sound because the shader clamps every load and guards every store, its loops end
/// after `k` steps, and [`matmul`]'s validation (shared) keeps every operand inside its buffer.
/// For the benchmark's comparison; same arguments, results and errors as [`matmul`].
pub fn matmul_unchecked(
    gpu: &Gpu,
    dims: &MatmulDims,
    out: DeviceSlice<'_>,
    lhs: DeviceSlice<'_>,
    rhs: DeviceSlice<'_>,
) -> Result<()> {
    let unchecked = |kernel: Kernel| Kernel {
        runtime_checks: RuntimeChecks::OFF_AUDITED,
        ..kernel
    };
    let kernels = [unchecked(MAIN), unchecked(MAIN_SCALAR)];
    let operands = [out.into(), lhs.into(), rhs.into()];
    launch(gpu, dims, operands, kernels, None, Extra::None)
}

/// What a matmul does to each element of C after the product ([`matmul_bias`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// Nothing: C is the product.
    None,
    /// `C[.., i, j] += bias[j]`.
    Bias,
    /// `C[.., i, j] = max(C[.., i, j] + bias[j], 0)`: a linear layer and its ReLU.
    BiasRelu,
}

/// [`matmul`], then `epilogue` on every element of C in the same pass: `C[b][i][j] =
/// op(alpha · op(A)·op(B)[i][j] + bias[j])` with `op` the identity or ReLU, one pass over C
/// instead of three. With `alpha` 1 the same values as a plain matmul followed by a bias add
/// and a ReLU (the same additions in the same order); with another `alpha` a driver that fuses
/// the multiply and the bias add into one FMA may round the last bit differently. `bias` holds
/// `n` elements.
///
/// # Errors
/// Those of [`matmul`], and [`Error::InvalidArgument`] when `bias` does not hold `n` elements,
/// overlaps C, or `dims.accumulate` is set (an epilogue applies to a fresh product only).
pub fn matmul_bias<'a>(
    gpu: &Gpu,
    dims: &MatmulDims,
    epilogue: Epilogue,
    out: impl Into<Operand<'a>>,
    lhs: impl Into<Operand<'a>>,
    rhs: impl Into<Operand<'a>>,
    bias: DeviceSlice<'_>,
) -> Result<()> {
    let (out, lhs, rhs) = (out.into(), lhs.into(), rhs.into());
    if epilogue == Epilogue::None {
        return matmul(gpu, dims, out, lhs, rhs);
    }
    let invalid = |message: String| Error::InvalidArgument {
        op: "matmul_bias",
        message,
    };
    bias.expect_len("matmul_bias", "bias", dims.n as u64)?;
    if dims.accumulate {
        return Err(invalid(
            "an epilogue applies to a fresh product: accumulate must be off".to_string(),
        ));
    }
    if out.words().overlaps(&bias) {
        return Err(invalid(format!(
            "out (C) {out:?} overlaps the bias {bias:?}; write the product to a separate buffer"
        )));
    }
    let kernels = [MAIN, MAIN_SCALAR];
    launch(
        gpu,
        dims,
        [out, lhs, rhs],
        kernels,
        None,
        Extra::Bias(bias, epilogue),
    )
}

/// The entry point a launch of `dims` on these slices takes ([`entry_point`], demoted to
/// `main_scalar` when an operand does not start on a multiple of 4 elements).
pub fn launch_entry(dims: &MatmulDims, [out, lhs, rhs]: [Operand<'_>; 3]) -> MatmulEntry {
    if [lhs, rhs, out].iter().all(|s| s.index().is_multiple_of(4)) {
        entry_point(dims)
    } else {
        MatmulEntry::MainScalar
    }
}

/// How many partial sums [`matmul_squares`] writes for `dims` on `entry`: one per block of
/// outputs one invocation stores (16×16 on `main`, 4×4 on `main_scalar`), per batch.
pub fn squares_len(dims: &MatmulDims, entry: MatmulEntry) -> u64 {
    let size = match entry {
        MatmulEntry::Main => 16,
        MatmulEntry::MainScalar => 4,
    };
    let blocks = |x: usize| (x as u64).div_ceil(size);
    dims.batch as u64 * blocks(dims.m) * blocks(dims.n)
}

/// [`matmul`] that also writes, into `squares`, the sums of the squares of what it stored in C
/// (after `accumulate`: the values C then holds), one per block of outputs an invocation stores
/// ([`squares_len`] of [`launch_entry`]); their sum is C's squared norm. For a gradient's norm
/// with no pass over the gradient. Errors: those of [`matmul`], and [`Error::InvalidArgument`]
/// when `squares` does not hold that many elements or overlaps C, A or B.
pub fn matmul_squares<'a>(
    gpu: &Gpu,
    dims: &MatmulDims,
    out: impl Into<Operand<'a>>,
    lhs: impl Into<Operand<'a>>,
    rhs: impl Into<Operand<'a>>,
    squares: DeviceSlice<'_>,
) -> Result<()> {
    let (out, lhs, rhs) = (out.into(), lhs.into(), rhs.into());
    let len = squares_len(dims, launch_entry(dims, [out, lhs, rhs]));
    squares.expect_len("matmul_squares", "squares", len)?;
    for (name, operand) in [("out (C)", out), ("lhs (A)", lhs), ("rhs (B)", rhs)] {
        if operand.words().overlaps(&squares) {
            return Err(Error::InvalidArgument {
                op: "matmul_squares",
                message: format!("{name} {operand:?} overlaps the squares {squares:?}"),
            });
        }
    }
    let kernels = [MAIN, MAIN_SCALAR];
    launch(
        gpu,
        dims,
        [out, lhs, rhs],
        kernels,
        None,
        Extra::Squares(squares),
    )
}

/// Validates, picks the entry point (or takes `forced`) and records the dispatch. `kernels` =
/// `[main, main_scalar]` for f32 operands (with any 16-bit operand, the device's 16-bit module
/// instead); `extra`'s operand (binding 4) is checked by its public launcher. `block`: only
/// that block of C, else all of it.
fn launch_one(
    gpu: &Gpu,
    dims: &MatmulDims,
    [out, lhs, rhs]: [Operand<'_>; 3],
    (kernels, forced, extra): ([Kernel; 2], Option<MatmulEntry>, Extra<'_>),
    block: Option<Block>,
) -> Result<()> {
    let invalid = |message: String| Error::InvalidArgument {
        op: "matmul",
        message,
    };
    let d = Dims64::new(dims);
    let Block {
        rows: (row_start, row_count),
        cols: (col_start, col_count),
    } = block.unwrap_or(Block {
        rows: (0, d.m),
        cols: (0, d.n),
    });
    if d.batch == 0 || d.m == 0 || d.n == 0 {
        return Ok(());
    }
    let half = [out, lhs, rhs].map(|o| o.is_f16());
    if half.contains(&true) && kernels[0].runtime_checks != MAIN.runtime_checks {
        return Err(invalid(
            "16-bit operands run with wgpu's runtime checks on".to_string(),
        ));
    }
    let to_u32 = |what: &str, x: u64| {
        u32::try_from(x).map_err(|_| invalid(format!("{what} = {x} does not fit in u32")))
    };
    // Sizes fit u32, so products of two of them fit u64.
    let (m, n, k, batch) = (
        to_u32("m", d.m)?,
        to_u32("n", d.n)?,
        to_u32("k", d.k)?,
        to_u32("batch", d.batch)?,
    );
    // Before the range checks: the entry point depends only on `dims` and the segment offsets.
    let segments_aligned = [lhs, rhs, out].iter().all(|s| s.index().is_multiple_of(4));
    let entry = match forced {
        // The one rule, which squares_len relies on too.
        None => launch_entry(dims, [out, lhs, rhs]),
        Some(MatmulEntry::MainScalar) => MatmulEntry::MainScalar,
        Some(MatmulEntry::Main) if segments_aligned && main_fits(dims) => MatmulEntry::Main,
        Some(MatmulEntry::Main) => {
            return Err(invalid(format!(
                "main needs rows, strides and operand offsets that are multiples of 4 \
                 elements; {dims:?} with offsets a {}, b {}, c {} has not (use main_scalar)",
                lhs.index(),
                rhs.index(),
                out.index()
            )));
        }
    };
    check_loop_limit(gpu, "matmul", "k", d.k, |k| {
        loop_iterations(entry, dims.trans_a, dims.trans_b, k)
    })?;
    let (a_rows, a_cols) = if dims.trans_a { (d.k, d.m) } else { (d.m, d.k) };
    let (b_rows, b_cols) = if dims.trans_b { (d.n, d.k) } else { (d.k, d.n) };
    // (name, slice, batch stride, elements per batch)
    let operands = [
        ("lhs (A)", lhs, d.stride_a, a_rows * a_cols),
        ("rhs (B)", rhs, d.stride_b, b_rows * b_cols),
        ("out (C)", out, d.stride_c, d.m * d.n),
    ];
    for (name, slice, stride, elements) in operands {
        let extent = (d.batch - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(elements))
            .ok_or_else(|| invalid(format!("{name}: extent overflows u64 ({dims:?})")))?;
        slice.expect_at_least("matmul", name, extent)?;
    }
    if d.batch > 1 && d.stride_c < d.m * d.n {
        return Err(invalid(format!(
            "out (C): batch stride {} < m*n = {}: the {} output matrices would overlap",
            d.stride_c,
            d.m * d.n,
            d.batch
        )));
    }
    for (name, operand) in [("lhs (A)", lhs), ("rhs (B)", rhs)] {
        if out.overlaps(&operand) {
            return Err(invalid(format!(
                "out (C) {out:?} overlaps {name} {operand:?} in the same segment (or shares a \
                 word with it); write the product to a separate buffer"
            )));
        }
    }
    // Every index the shader forms is below a slice's end (in segment elements).
    for (name, slice) in [("lhs (A)", lhs), ("rhs (B)", rhs), ("out (C)", out)] {
        to_u32(name, u64::from(slice.index()) + slice.len())?;
    }
    let (bias, epilogue_flags) = match extra {
        Extra::None => (out.words(), 0),
        Extra::Bias(bias, Epilogue::None) => (bias, 0),
        Extra::Bias(bias, Epilogue::Bias) => (bias, 8),
        Extra::Bias(bias, Epilogue::BiasRelu) => (bias, 8 | 16),
        Extra::Squares(squares) => (squares, 32),
    };
    to_u32("bias", u64::from(bias.index()) + bias.len())?;
    let params = Params {
        m,
        n,
        k,
        batch,
        stride_a: to_u32("batch_stride_a", d.stride_a)?,
        stride_b: to_u32("batch_stride_b", d.stride_b)?,
        stride_c: to_u32("batch_stride_c", d.stride_c)?,
        offset_a: lhs.index(),
        offset_b: rhs.index(),
        offset_c: out.index(),
        flags: u32::from(dims.accumulate)
            | u32::from(dims.trans_a) << 1
            | u32::from(dims.trans_b) << 2
            | epilogue_flags,
        alpha: dims.alpha,
        offset_bias: bias.index(),
        row_start: to_u32("row_start", row_start)?,
        col_start: to_u32("col_start", col_start)?,
        ..Params::default()
    };
    let kernels = match (half.contains(&true), gpu.f16_path()) {
        (false, _) => kernels,
        (true, F16Path::Native) => native_kernels(half[1], half[2], half[0]),
        (true, F16Path::Packed) => [MAIN_F16, MAIN_SCALAR_F16],
    };
    // Where the device has them, products with a 16-bit A or B on `main` run on cooperative
    // matrices instead (`coop`): the same blocks of C and Params; an f32 operand is rounded to
    // f16 there, as autocast does.
    let coop = coop::coop_kernel(gpu, entry, half);
    let (kernel, tile) = match (entry, &coop) {
        (_, Some(coop)) => (coop, TILE_MAIN),
        (MatmulEntry::Main, None) => (&kernels[0], TILE_MAIN),
        (MatmulEntry::MainScalar, None) => (&kernels[1], TILE_SCALAR),
    };
    let max = u64::from(gpu.limits().max_compute_workgroups_per_dimension);
    let workgroups = [col_count.div_ceil(tile), row_count.div_ceil(tile), d.batch];
    if workgroups.iter().any(|&w| w > max) {
        return Err(invalid(format!(
            "grid {workgroups:?} (n/{tile}, m/{tile}, batch) exceeds the device's {max} \
             workgroups per dimension; split the batch or the matrix"
        )));
    }
    let flag = |on: bool| if on { 1.0 } else { 0.0 };
    let [c16, a16, b16] = half.map(flag);
    let overrides = [
        ("TRANS_A", flag(dims.trans_a)),
        ("TRANS_B", flag(dims.trans_b)),
        ("A_F16", a16),
        ("B_F16", b16),
        ("C_F16", c16),
    ];
    // The packed 16-bit module takes the widths as override constants; a native one is built
    // for its widths.
    let packed = kernel.stem == MAIN_F16.stem;
    let overrides: &[(&str, f64)] = match (entry, packed) {
        (MatmulEntry::Main, false) => &overrides[..2],
        (MatmulEntry::Main, true) => &overrides,
        (MatmulEntry::MainScalar, false) => &[],
        (MatmulEntry::MainScalar, true) => &overrides[2..],
    };
    note_launch(gpu, dims);
    gpu.dispatch(Dispatch {
        kernel,
        overrides,
        params: bytemuck::bytes_of(&params),
        buffers: &[lhs.words(), rhs.words(), out.words(), bias],
        also_uses: &[],
        workgroups: workgroups.map(|w| w as u32),
        // This dispatch's block of C (all of it unless split).
        work: crate::recorder::Work {
            flops: 2 * d.batch * row_count * col_count * d.k,
            bytes: d.batch
                * (lhs.element_bytes() * row_count * d.k
                    + rhs.element_bytes() * d.k * col_count
                    + out.element_bytes() * row_count * col_count),
        },
    })
}

thread_local! {
    /// This thread's record of matmul shapes ([`Gpu::record_matmuls`]): the device it records
    /// and the shapes launched on it so far.
    static RECORD: RefCell<Option<(Weak<Shared>, Vec<MatmulDims>)>> = const { RefCell::new(None) };
}

impl Gpu {
    /// Starts recording the shape of every matmul this thread launches on this device from now
    /// on (each launch that passes validation, on either entry point), dropping any earlier
    /// record of this thread. For measurements such as `cargo xtask bench train`'s step
    /// efficiency, which times a step's matmuls alone.
    pub fn record_matmuls(&self) {
        RECORD.with_borrow_mut(|r| *r = Some((Arc::downgrade(&self.shared), Vec::new())));
    }

    /// Stops recording and returns the shapes launched since [`Gpu::record_matmuls`], in launch
    /// order (empty if this thread never called it on this device).
    pub fn take_matmuls(&self) -> Vec<MatmulDims> {
        RECORD.with_borrow_mut(|r| match r.take() {
            Some((device, shapes)) if device.as_ptr() == Arc::as_ptr(&self.shared) => shapes,
            other => {
                *r = other;
                Vec::new()
            }
        })
    }
}

/// Adds `dims` to this thread's record if it records `gpu`.
fn note_launch(gpu: &Gpu, dims: &MatmulDims) {
    RECORD.with_borrow_mut(|r| {
        if let Some((device, shapes)) = r
            && device.as_ptr() == Arc::as_ptr(&gpu.shared)
        {
            shapes.push(*dims);
        }
    });
}

/// The `usize` figures of [`MatmulDims`] as `u64` (usize is at most 64 bits on every target
/// wgpu supports), so products are checked in one width.
struct Dims64 {
    batch: u64,
    m: u64,
    n: u64,
    k: u64,
    stride_a: u64,
    stride_b: u64,
    stride_c: u64,
}

impl Dims64 {
    fn new(d: &MatmulDims) -> Self {
        let w = |x: usize| x as u64;
        Self {
            batch: w(d.batch),
            m: w(d.m),
            n: w(d.n),
            k: w(d.k),
            stride_a: w(d.batch_stride_a),
            stride_b: w(d.batch_stride_b),
            stride_c: w(d.batch_stride_c),
        }
    }
}
