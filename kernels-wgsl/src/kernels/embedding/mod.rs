//! `embedding`: [`gather`] rows of a `[vocab, dim]` table by `u32` ids, and the backward
//! [`scatter_add`] into a `[vocab, dim]` table gradient. In one place: the shader
//! (`embedding.wgsl`, beside this file), the launchers, the CPU [`reference`](mod@reference) and
//! the tests.
//!
//! Ids live on the device and are not validated on the host (that would need a read-back): an id
//! `>= vocab` gathers a row of NaN and contributes nothing to the backward; the NaN reaches the
//! loss, which the trainer's read-back refuses. [`scatter_add`] is deterministic (no float
//! atomics): a counting sort of the tokens by id, then one invocation per table element sums
//! its row's tokens in ascending order. It costs `2 * vocab * tokens` compares and
//! `tokens * dim` additions.

use plimsoll_allocator::Category;

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{
    ELEMENTWISE_WORKGROUP, check_loop_limit, launch_1d, launch_units, loop_passes,
};
use crate::pipeline::{Kernel, kernel, shader_params, shader_source};
use crate::slice::DeviceSlice;
use const_format::concatcp;

pub mod reference;
#[cfg(test)]
pub(crate) mod tests;

/// The module: `embedding.wgsl` and the helpers it calls.
const WGSL: &str = concatcp!(include_str!("embedding.wgsl"), shader_source!("indexing"));

/// The `gather` entry point.
pub const GATHER: Kernel = kernel!("embedding", "gather", source: WGSL, [table, ids: "array<u32>", out], ELEMENTWISE_WORKGROUP);

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    GATHER,
    ID_COUNTS,
    ID_STARTS,
    ID_LISTS,
    SCATTER_ROWS,
];

/// The bindings of [`scatter_add`]'s four entry points.
macro_rules! sort_kernel {
    ($entry:literal) => {
        kernel!(
            "embedding",
            $entry,
            source: WGSL,
            [dy, ids: "array<u32>", dtable, order: "array<u32>"],
            ELEMENTWISE_WORKGROUP
        )
    };
}

/// The `id_counts` entry point: tokens per row.
pub const ID_COUNTS: Kernel = sort_kernel!("id_counts");
/// The `id_starts` entry point: the rows' starts in the sorted list.
pub const ID_STARTS: Kernel = sort_kernel!("id_starts");
/// The `id_lists` entry point: each row's tokens, ascending.
pub const ID_LISTS: Kernel = sort_kernel!("id_lists");
/// The `scatter_rows` entry point: each table element's sum over its row's tokens.
pub const SCATTER_ROWS: Kernel = sort_kernel!("scatter_rows");

/// Loop passes one invocation of [`scatter_add`]'s kernels runs for `n` tokens (or rows, in
/// the sort's prefix sum): one unrolled loop ([`crate::kernels::loop_passes`]; see "Loop limit
/// on lavapipe" in [`crate::kernels`]). [`scatter_add`] refuses more tokens or rows than the
/// adapter's limit with [`Error::LoopLimit`] (on lavapipe: up to 524_215). [`gather`] has no
/// loop.
pub const fn loop_iterations(tokens: u64) -> u64 {
    loop_passes(tokens)
}

shader_params! {
    /// The `Params` of `embedding.wgsl` (shared by both entry points).
    struct Params {
        tokens: u32,
        dim: u32,
        vocab: u32,
        src_offset: u32,
        ids_offset: u32,
        dst_offset: u32,
        order_offset: u32,
        first: u32,
        total: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// Rows `first .. first + rows` of a table of `total` rows: the part of it one tensor holds (a
/// table past one binding is kept in parts, [`TablePart::whole`] otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TablePart {
    /// The part's first row in the whole table.
    pub first: u64,
    /// Rows in the part.
    pub rows: u64,
    /// Rows in the whole table.
    pub total: u64,
}

impl TablePart {
    /// The whole table of `rows` rows.
    pub fn whole(rows: u64) -> TablePart {
        TablePart {
            first: 0,
            rows,
            total: rows,
        }
    }

    /// Checks that the part lies inside its table and the figures fit the shader's `u32`.
    fn check(&self, op: &'static str) -> Result<()> {
        let fits = self
            .first
            .checked_add(self.rows)
            .is_some_and(|end| end <= self.total && self.total < u64::from(u32::MAX));
        if fits {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op,
            message: format!(
                "part of rows {} .. {} + {} of a table of {} rows: it must lie inside the table, \
                 which must have fewer than 2^32 - 1 rows",
                self.first, self.first, self.rows, self.total
            ),
        })
    }
}

/// `a * b`, or an error naming `op` and `what` when it overflows.
fn product(op: &'static str, what: &str, a: u64, b: u64) -> Result<u64> {
    a.checked_mul(b).ok_or_else(|| Error::InvalidArgument {
        op,
        message: format!("{what} = {a} * {b} overflows u64"),
    })
}

/// Records `out[t, j] = table[ids[t], j]` for every `t` of the u32 `ids` and `j < dim`, from the
/// `[vocab, dim]` f32 `table` into the `[tokens, dim]` f32 `out`; NaN for an id `>= vocab`.
pub fn gather(
    gpu: &Gpu,
    out: DeviceSlice<'_>,
    table: DeviceSlice<'_>,
    ids: DeviceSlice<'_>,
    vocab: u64,
    dim: u64,
) -> Result<()> {
    gather_part(gpu, out, table, ids, TablePart::whole(vocab), dim)
}

/// [`gather`] from one `part` of a table (`table` holds its `[part.rows, dim]` rows): writes the
/// rows of `out` whose ids fall in the part, leaves the others as they are, and (the part at
/// row 0) NaN for an id `>= part.total`. Launched once per part, every row of `out` is written.
pub fn gather_part(
    gpu: &Gpu,
    out: DeviceSlice<'_>,
    table: DeviceSlice<'_>,
    ids: DeviceSlice<'_>,
    part: TablePart,
    dim: u64,
) -> Result<()> {
    let op = "embedding::gather";
    part.check(op)?;
    let vocab = part.rows;
    let tokens = ids.len();
    table.expect_len(op, "table", product(op, "vocab * dim", vocab, dim)?)?;
    let out_len = product(op, "tokens * dim", tokens, dim)?;
    out.expect_len(op, "out", out_len)?;
    let params = |first: u32, count: u32| Params {
        tokens: count,
        dim: dim as u32,
        // dim > 0 when anything runs, so vocab <= the table's length: it fits in u32.
        vocab: vocab as u32,
        src_offset: table.index(),
        ids_offset: ids.index() + first,
        dst_offset: out.index() + first * dim as u32,
        first: part.first as u32,
        total: part.total as u32,
        ..Params::default()
    };
    let buffers = [table, ids, out];
    if out_len == 0 {
        return Ok(());
    }
    // In blocks of tokens under a submission bound (the same values whatever the blocks).
    launch_units(gpu, &GATHER, &[], &buffers, tokens, |s, e| {
        (params(s as u32, (e - s) as u32), (e - s) * dim)
    })
}

/// Records `dtable[v, j] = sum_{t, ids[t] == v} dy[t, j]` for every `v < vocab`, `j < dim`, from
/// the `[tokens, dim]` f32 `dy` and the `[tokens]` u32 `ids` into the `[vocab, dim]` f32
/// `dtable` (written, 0 for rows no id refers to), each sum in ascending `t`. Four dispatches
/// (see `embedding.wgsl`) over a `vocab + 1 + tokens` u32 scratch buffer
/// ([`Category::Temporary`], freed on return; the GPU runs the recorded work in order).
pub fn scatter_add(
    gpu: &Gpu,
    dtable: DeviceSlice<'_>,
    dy: DeviceSlice<'_>,
    ids: DeviceSlice<'_>,
    vocab: u64,
    dim: u64,
) -> Result<()> {
    scatter_add_part(gpu, dtable, dy, ids, TablePart::whole(vocab), dim)
}

/// [`scatter_add`] into the gradient of one `part` of a table (`dtable` holds its
/// `[part.rows, dim]` rows): the sums of the tokens whose ids fall in the part.
pub fn scatter_add_part(
    gpu: &Gpu,
    dtable: DeviceSlice<'_>,
    dy: DeviceSlice<'_>,
    ids: DeviceSlice<'_>,
    part: TablePart,
    dim: u64,
) -> Result<()> {
    let op = "embedding::scatter_add";
    part.check(op)?;
    let vocab = part.rows;
    let tokens = ids.len();
    let table_len = product(op, "vocab * dim", vocab, dim)?;
    if table_len > 0 {
        check_loop_limit(gpu, op, "tokens", tokens, loop_iterations)?;
        check_loop_limit(gpu, op, "vocab", vocab, loop_iterations)?;
    }
    dy.expect_len(op, "dy", product(op, "tokens * dim", tokens, dim)?)?;
    dtable.expect_len(op, "dtable", table_len)?;
    if table_len == 0 {
        return Ok(());
    }
    // table_len > 0, so vocab and (dy's length) tokens fit in u32 and so does their sum + 1.
    let order_len = vocab + 1 + tokens;
    let order = gpu.alloc_elements(order_len, Category::Temporary, "embedding sort")?;
    let order = order.whole();
    let params = Params {
        tokens: tokens as u32,
        dim: dim as u32,
        vocab: vocab as u32,
        src_offset: dy.index(),
        ids_offset: ids.index(),
        dst_offset: dtable.index(),
        order_offset: order.index(),
        first: part.first as u32,
        total: part.total as u32,
        ..Params::default()
    };
    let buffers = [dy, ids, dtable, order];
    launch_1d(gpu, &ID_COUNTS, &[], &params, &buffers, vocab)?;
    launch_1d(gpu, &ID_STARTS, &[], &params, &buffers, 1)?;
    launch_1d(gpu, &ID_LISTS, &[], &params, &buffers, vocab)?;
    launch_1d(gpu, &SCATTER_ROWS, &[], &params, &buffers, table_len)
}
