//! `embedding`: [`gather`] rows of a `[vocab, dim]` table by `u32` ids, and the backward
//! [`scatter_add`] into a `[vocab, dim]` table gradient. Shader: `shaders/embedding.wgsl`;
//! reference: [`crate::reference::embedding`].
//!
//! Ids live on the device and are not validated on the host (that would need a read-back): an id
//! `>= vocab` gathers a row of NaN and contributes nothing to the backward; the `nonfinite` check
//! reports it. [`scatter_add`] is deterministic (one invocation per table element sums the
//! matching tokens in ascending order, no float atomics) and costs `vocab * dim * tokens`
//! compares: fine for the vocabularies here.

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{
    ELEMENTWISE_WORKGROUP, check_loop_limit, check_range, grid_1d, loop_passes, segment_index,
};
use crate::pipeline::Kernel;
use crate::recorder::Dispatch;

/// The `gather` entry point.
pub const GATHER: Kernel = Kernel {
    stem: "embedding",
    wgsl: include_str!("../../shaders/embedding.wgsl"),
    entry: "gather",
    storage_bindings: 3,
    runtime_checks: crate::pipeline::RuntimeChecks::ON,
};

/// The `scatter_add` entry point.
pub const SCATTER_ADD: Kernel = Kernel {
    entry: "scatter_add",
    ..GATHER
};

/// Loop passes one invocation of [`scatter_add`] runs for `tokens` ids: one unrolled loop
/// ([`crate::kernels::loop_passes`]; see "Loop limit on lavapipe" in [`crate::kernels`]).
/// [`scatter_add`] refuses more than the adapter's limit with [`Error::LoopLimit`] (on
/// lavapipe: `tokens <= 524_215`). [`gather`] has no loop.
pub const fn loop_iterations(tokens: u64) -> u64 {
    loop_passes(tokens)
}

/// Mirrors `Params` in `embedding.wgsl` (shared by both entry points).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
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

/// The buffers of [`gather`], each from its element offset.
#[derive(Debug, Clone, Copy)]
pub struct GatherBuffers<'a> {
    /// `[vocab, dim]` f32 table.
    pub table: &'a DeviceBuffer,
    /// Element offset of `table`.
    pub table_offset: u64,
    /// `[tokens]` u32 ids.
    pub ids: &'a DeviceBuffer,
    /// Element offset of `ids`.
    pub ids_offset: u64,
    /// `[tokens, dim]` f32 output, written.
    pub out: &'a DeviceBuffer,
    /// Element offset of `out`.
    pub out_offset: u64,
}

/// The buffers of [`scatter_add`], each from its element offset.
#[derive(Debug, Clone, Copy)]
pub struct ScatterAddBuffers<'a> {
    /// `[tokens, dim]` f32 gradient of the gathered rows.
    pub dy: &'a DeviceBuffer,
    /// Element offset of `dy`.
    pub dy_offset: u64,
    /// `[tokens]` u32 ids.
    pub ids: &'a DeviceBuffer,
    /// Element offset of `ids`.
    pub ids_offset: u64,
    /// `[vocab, dim]` f32 gradient of the table, written (=), 0 where no id refers.
    pub dtable: &'a DeviceBuffer,
    /// Element offset of `dtable`.
    pub dtable_offset: u64,
}

/// `a * b`, or an error naming `op` and `what` when it overflows.
fn product(op: &'static str, what: &str, a: u64, b: u64) -> Result<u64> {
    a.checked_mul(b).ok_or_else(|| Error::InvalidArgument {
        op,
        message: format!("{what} = {a} * {b} overflows u64"),
    })
}

/// Records `out[t, j] = table[ids[t], j]` for `t < tokens`, `j < dim`; NaN for an id `>= vocab`.
pub fn gather(gpu: &Gpu, b: &GatherBuffers<'_>, tokens: u64, vocab: u64, dim: u64) -> Result<()> {
    let op = "embedding::gather";
    let table_len = product(op, "vocab * dim", vocab, dim)?;
    let out_len = product(op, "tokens * dim", tokens, dim)?;
    check_range(op, "table", b.table, b.table_offset, table_len)?;
    check_range(op, "ids", b.ids, b.ids_offset, tokens)?;
    check_range(op, "out", b.out, b.out_offset, out_len)?;
    if out_len == 0 {
        return Ok(());
    }
    let params = Params {
        tokens: tokens as u32,
        dim: dim as u32,
        // dim > 0 here, so vocab <= table_len: every size fits in u32 like the bound ranges.
        vocab: vocab as u32,
        src_offset: segment_index(b.table, b.table_offset),
        ids_offset: segment_index(b.ids, b.ids_offset),
        dst_offset: segment_index(b.out, b.out_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel: &GATHER,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[b.table, b.ids, b.out],
        workgroups: grid_1d(gpu, out_len, ELEMENTWISE_WORKGROUP)?,
    })
}

/// Records `dtable[v, j] = sum_{t < tokens, ids[t] == v} dy[t, j]` for every `v < vocab`,
/// `j < dim` (written, 0 for rows no id refers to).
pub fn scatter_add(
    gpu: &Gpu,
    b: &ScatterAddBuffers<'_>,
    tokens: u64,
    vocab: u64,
    dim: u64,
) -> Result<()> {
    let op = "embedding::scatter_add";
    let table_len = product(op, "vocab * dim", vocab, dim)?;
    let dy_len = product(op, "tokens * dim", tokens, dim)?;
    if table_len > 0 {
        check_loop_limit(gpu, op, "tokens", tokens, loop_iterations)?;
    }
    check_range(op, "dy", b.dy, b.dy_offset, dy_len)?;
    check_range(op, "ids", b.ids, b.ids_offset, tokens)?;
    check_range(op, "dtable", b.dtable, b.dtable_offset, table_len)?;
    if table_len == 0 {
        return Ok(());
    }
    let params = Params {
        // dim > 0 here, so tokens <= dy_len: every size fits in u32 like the bound ranges.
        tokens: tokens as u32,
        dim: dim as u32,
        vocab: vocab as u32,
        src_offset: segment_index(b.dy, b.dy_offset),
        ids_offset: segment_index(b.ids, b.ids_offset),
        dst_offset: segment_index(b.dtable, b.dtable_offset),
        ..Params::default()
    };
    gpu.dispatch(Dispatch {
        kernel: &SCATTER_ADD,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[b.dy, b.ids, b.dtable],
        workgroups: grid_1d(gpu, table_len, ELEMENTWISE_WORKGROUP)?,
    })
}
