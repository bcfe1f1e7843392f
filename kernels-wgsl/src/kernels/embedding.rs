//! `embedding`: [`gather`] rows of a `[vocab, dim]` table by `u32` ids, and the backward
//! [`scatter_add`] into a `[vocab, dim]` table gradient. Shader: `shaders/embedding.wgsl`;
//! reference: [`crate::reference::embedding`].
//!
//! Ids live on the device and are not validated on the host (that would need a read-back): an id
//! `>= vocab` gathers a row of NaN and contributes nothing to the backward; the NaN reaches the
//! loss, which the trainer's read-back refuses. [`scatter_add`] is deterministic (one invocation per table element sums the
//! matching tokens in ascending order, no float atomics) and costs `vocab * dim * tokens`
//! compares: fine for the vocabularies here.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, check_loop_limit, launch_1d, loop_passes};
use crate::pipeline::{Kernel, kernel, shader_params};
use crate::slice::DeviceSlice;

/// The `gather` entry point.
pub const GATHER: Kernel =
    kernel!("embedding", "gather", [table, ids: "array<u32>", out], ELEMENTWISE_WORKGROUP);

/// The `scatter_add` entry point.
pub const SCATTER_ADD: Kernel =
    kernel!("embedding", "scatter_add", [dy, ids: "array<u32>", dtable], ELEMENTWISE_WORKGROUP);

/// Loop passes one invocation of [`scatter_add`] runs for `tokens` ids: one unrolled loop
/// ([`crate::kernels::loop_passes`]; see "Loop limit on lavapipe" in [`crate::kernels`]).
/// [`scatter_add`] refuses more than the adapter's limit with [`Error::LoopLimit`] (on
/// lavapipe: `tokens <= 524_215`). [`gather`] has no loop.
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
        _pad0: u32,
        _pad1: u32,
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
    let op = "embedding::gather";
    let tokens = ids.len();
    table.expect_len(op, "table", product(op, "vocab * dim", vocab, dim)?)?;
    let out_len = product(op, "tokens * dim", tokens, dim)?;
    out.expect_len(op, "out", out_len)?;
    let params = Params {
        tokens: tokens as u32,
        dim: dim as u32,
        // dim > 0 when anything runs, so vocab <= the table's length: it fits in u32.
        vocab: vocab as u32,
        src_offset: table.index(),
        ids_offset: ids.index(),
        dst_offset: out.index(),
        ..Params::default()
    };
    let buffers = [table, ids, out];
    launch_1d(gpu, &GATHER, &[], &params, &buffers, out_len)
}

/// Records `dtable[v, j] = sum_{t, ids[t] == v} dy[t, j]` for every `v < vocab`, `j < dim`, from
/// the `[tokens, dim]` f32 `dy` and the `[tokens]` u32 `ids` into the `[vocab, dim]` f32
/// `dtable` (written, 0 for rows no id refers to).
pub fn scatter_add(
    gpu: &Gpu,
    dtable: DeviceSlice<'_>,
    dy: DeviceSlice<'_>,
    ids: DeviceSlice<'_>,
    vocab: u64,
    dim: u64,
) -> Result<()> {
    let op = "embedding::scatter_add";
    let tokens = ids.len();
    let table_len = product(op, "vocab * dim", vocab, dim)?;
    if table_len > 0 {
        check_loop_limit(gpu, op, "tokens", tokens, loop_iterations)?;
    }
    dy.expect_len(op, "dy", product(op, "tokens * dim", tokens, dim)?)?;
    dtable.expect_len(op, "dtable", table_len)?;
    let params = Params {
        // dim > 0 when anything runs, so tokens <= dy's length: it fits in u32.
        tokens: tokens as u32,
        dim: dim as u32,
        vocab: vocab as u32,
        src_offset: dy.index(),
        ids_offset: ids.index(),
        dst_offset: dtable.index(),
        ..Params::default()
    };
    let buffers = [dy, ids, dtable];
    launch_1d(gpu, &SCATTER_ADD, &[], &params, &buffers, table_len)
}
