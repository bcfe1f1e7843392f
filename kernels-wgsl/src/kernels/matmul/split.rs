//! A matmul in pieces under a bound on one submission's GPU time ([`Gpu::pieces_within_bound`]):
//! whole products of the batch, then blocks of C of whole tiles. Each piece runs the entry
//! point the whole would, so the values do not depend on the pieces.

use super::{Dims64, Extra, MatmulDims, MatmulEntry, Operand, TILE_MAIN, launch_entry, launch_one, split_k, squares_len};
use crate::device::Gpu;
use crate::error::Result;
use crate::pipeline::Kernel;
use crate::slice::DeviceSlice;

/// [`launch_one`], in pieces when the device bounds one submission's GPU time and the whole
/// product would pass it ([`Gpu::pieces_within_bound`]): whole products of the batch first,
/// then blocks of C (rows, then columns). Every piece runs the entry point the
/// whole would, and each element of C is summed by one invocation over the same `k` either
/// way, so the values do not depend on the pieces (nor do the squares of C, each written by the
/// invocation that stores its block). Products with a 16-bit operand go out in blocks of C over
/// the whole batch ([`in_blocks`]). A product with a short C and a long k may first be split
/// along k ([`split_k`]).
pub(super) fn launch(
    gpu: &Gpu,
    dims: &MatmulDims,
    operands: [Operand<'_>; 3],
    kernels: [Kernel; 2],
    forced: Option<MatmulEntry>,
    extra: Extra<'_>,
) -> Result<()> {
    if let Some(slices) = split_k::slices(gpu, dims, operands, (&kernels, forced, &extra)) {
        // Every part on the whole product's entry point (`main`, which `slices` requires): the
        // squares' layout is the entry point's, and a slice of k may be below `main`'s size.
        let main = Some(MatmulEntry::Main);
        let whole = |dims: &MatmulDims, operands: [Operand<'_>; 3], extra: Extra<'_>| {
            launch_whole_k(gpu, dims, operands, kernels, main, extra)
        };
        return split_k::launch_sliced(gpu, dims, operands, extra, slices, whole);
    }
    launch_whole_k(gpu, dims, operands, kernels, forced, extra)
}

/// [`launch`] without splitting k.
fn launch_whole_k(
    gpu: &Gpu,
    dims: &MatmulDims,
    operands: [Operand<'_>; 3],
    kernels: [Kernel; 2],
    forced: Option<MatmulEntry>,
    extra: Extra<'_>,
) -> Result<()> {
    let whole = |dims: &MatmulDims, operands: [Operand<'_>; 3]| {
        launch_one(gpu, dims, operands, (kernels, forced, extra), None)
    };
    let d = Dims64::new(dims);
    if d.batch == 0 || d.m == 0 || d.n == 0 {
        return whole(dims, operands);
    }
    let [eo, ea, eb] = operands.map(|o| o.element_bytes());
    let work = crate::recorder::Work {
        flops: 2 * d.batch * d.m * d.n * d.k,
        bytes: d.batch * (ea * d.m * d.k + eb * d.k * d.n + eo * d.m * d.n),
    };
    if operands.iter().any(|o| o.is_f16()) {
        // 16-bit operands (whose slices are words of two halves) are not cut: blocks of C
        // over the whole batch.
        return in_blocks(gpu, dims, operands, (kernels, forced, extra), work);
    }
    let row_blocks = d.m.div_ceil(TILE_MAIN);
    let col_blocks = d.n.div_ceil(TILE_MAIN);
    let pieces = gpu.pieces_within_bound(&kernels[0], d.batch * row_blocks * col_blocks, work);
    if pieces <= 1 {
        return whole(dims, operands);
    }
    let entry = forced.unwrap_or_else(|| launch_entry(dims, operands));
    let forced = Some(entry);
    let [out, lhs, rhs] = operands.map(|o| o.words());
    // The squares of one product's blocks (each invocation writes its own block's, at its
    // place: the pieces write what the whole would).
    let squares_each = squares_len(&MatmulDims { batch: 1, ..*dims }, entry);
    // Products `b0..` of the batch (`dims.batch` of them), a block of C in each.
    let piece = |dims: &MatmulDims, b0: u64, block: Option<Block>| -> Result<()> {
        let operands = [
            tail(out, b0 * d.stride_c)?,
            tail(lhs, b0 * d.stride_a)?,
            tail(rhs, b0 * d.stride_b)?,
        ];
        let extra = match extra {
            Extra::Squares(sq) => {
                let at = b0 * squares_each;
                Extra::Squares(sq.slice(at, sq.len().saturating_sub(at))?)
            }
            other => other,
        };
        launch_one(gpu, dims, operands, (kernels, forced, extra), block)
    };
    if pieces <= d.batch {
        // Whole products, `per` of them at a time.
        let per = d.batch.div_ceil(pieces);
        let mut b0 = 0;
        while b0 < d.batch {
            let batch = per.min(d.batch - b0);
            piece(&MatmulDims { batch: batch as usize, ..*dims }, b0, None)?;
            b0 += batch;
        }
        return Ok(());
    }
    // One product at a time, in blocks of rows, then of columns (whole tiles of either entry
    // point).
    let one = MatmulDims { batch: 1, ..*dims };
    for b0 in 0..d.batch {
        for block in blocks(&d, pieces.div_ceil(d.batch)) {
            piece(&one, b0, Some(block))?;
        }
    }
    Ok(())
}

/// [`launch`] in blocks of C (rows, then columns, whole tiles), each over the whole batch.
fn in_blocks(
    gpu: &Gpu,
    dims: &MatmulDims,
    operands: [Operand<'_>; 3],
    (kernels, forced, extra): ([Kernel; 2], Option<MatmulEntry>, Extra<'_>),
    work: crate::recorder::Work,
) -> Result<()> {
    let d = Dims64::new(dims);
    let tiles = d.m.div_ceil(TILE_MAIN) * d.n.div_ceil(TILE_MAIN);
    let pieces = gpu.pieces_within_bound(&kernels[0], tiles, work);
    let forced = Some(forced.unwrap_or_else(|| launch_entry(dims, operands)));
    if pieces <= 1 {
        return launch_one(gpu, dims, operands, (kernels, forced, extra), None);
    }
    for block in blocks(&d, pieces) {
        launch_one(gpu, dims, operands, (kernels, forced, extra), Some(block))?;
    }
    Ok(())
}

/// At least `pieces` blocks of C (fewer where C has fewer tiles), in rows, then columns, of
/// whole [`TILE_MAIN`] tiles, in order.
fn blocks(d: &Dims64, pieces: u64) -> Vec<Block> {
    let row_blocks = d.m.div_ceil(TILE_MAIN);
    let col_blocks = d.n.div_ceil(TILE_MAIN);
    let row_pieces = pieces.min(row_blocks).max(1);
    let col_pieces = pieces.div_ceil(row_pieces).min(col_blocks).max(1);
    let rows = row_blocks.div_ceil(row_pieces) * TILE_MAIN;
    let cols = col_blocks.div_ceil(col_pieces) * TILE_MAIN;
    let mut out = Vec::new();
    for r0 in (0..d.m).step_by(rows as usize) {
        for c0 in (0..d.n).step_by(cols as usize) {
            out.push(Block {
                rows: (r0, rows.min(d.m - r0)),
                cols: (c0, cols.min(d.n - c0)),
            });
        }
    }
    out
}

/// A block of C: `(first, count)` of its rows and of its columns, each first a multiple of
/// [`TILE_MAIN`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Block {
    pub(super) rows: (u64, u64),
    pub(super) cols: (u64, u64),
}

/// A sub-slice of `s` from `at` elements in to its end.
fn tail(s: DeviceSlice<'_>, at: u64) -> Result<Operand<'_>> {
    Ok(Operand::from(s.slice(at, s.len().saturating_sub(at))?))
}

