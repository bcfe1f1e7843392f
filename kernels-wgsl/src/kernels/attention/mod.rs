//! `attention`: causal scaled-dot-product attention that never stores the `T x T` scores or
//! probabilities (the FlashAttention algorithm). The family in one place: its shader
//! (`attention.wgsl`, beside this file: the algorithm and the layout), its launchers, its CPU
//! [`reference`](mod@reference) and its kernel tests.
//!
//! What it keeps for backward is `O(BH x T)`: the log-sum-exp of each query row (`lse`); the
//! backward recomputes the probabilities from it, tile by tile. Head dimensions up to
//! [`MAX_HEAD_DIM`].

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::check_loop_limit;
use crate::kernels::convert::Halves;
use crate::pipeline::{Kernel, kernels, shader_params};
use crate::recorder::{Dispatch, Work};
use crate::slice::DeviceSlice;

/// The largest head dimension (the shader's private rows and tiles hold this many).
pub const MAX_HEAD_DIM: u64 = 128;
/// Rows (queries, or keys in `dkdv`) of a workgroup, one invocation each.
const ROWS: u64 = 64;
/// Keys (or queries) per tile in workgroup memory.
const TILE: u64 = 16;

const WGSL: &str = const_format::concatcp!(
    include_str!("attention.wgsl"),
    include_str!("attention_io.wgsl"),
    crate::pipeline::shader_source!("counter_hash")
);

/// The module whose q, k, v (and o, read by the backward) are packed f16.
const WGSL_F16: &str = const_format::concatcp!(
    include_str!("attention.wgsl"),
    include_str!("attention_io_f16.wgsl"),
    crate::pipeline::shader_source!("counter_hash", "f16_bits")
);

// A binding keeps its number in every entry point (WGSL lets a number carry another name in an
// entry point that does not use the first): q, k, v, then o or dk, lse, d_o, delta, dq or dv.

kernels! {
    "attention", source: WGSL, workgroup: ROWS as u32;
    /// Forward: `o` and `lse` from `q`, `k`, `v`.
    FORWARD = "attention_forward" [q, k, v, o, lse];
    /// Backward, one invocation per query row: `dq`, and `delta = rowsum(dO * O)` for `dkdv`.
    BACKWARD_DQ = "attention_backward_dq" [q, k, v, o, lse, d_o, delta, dq];
    /// Backward, one invocation per key row: `dk` and `dv` (after [`BACKWARD_DQ`] wrote `delta`).
    BACKWARD_DKDV = "attention_backward_dkdv" [q, k, v, dk, lse, d_o, delta, dv];
}

kernels! {
    "attention_f16", source: WGSL_F16, workgroup: ROWS as u32;
    /// [`FORWARD`] reading f16 `q`, `k`, `v` (`o` and `lse` f32).
    FORWARD_F16 = "attention_forward" [
        q_h: "array<u32>",
        k_h: "array<u32>",
        v_h: "array<u32>",
        o,
        lse,
    ];
    /// [`BACKWARD_DQ`] reading f16 `q`, `k`, `v`, `o`.
    BACKWARD_DQ_F16 = "attention_backward_dq" [
        q_h: "array<u32>",
        k_h: "array<u32>",
        v_h: "array<u32>",
        o_h: "array<u32>",
        lse,
        d_o,
        delta,
        dq,
    ];
    /// [`BACKWARD_DKDV`] reading f16 `q`, `k`, `v`.
    BACKWARD_DKDV_F16 = "attention_backward_dkdv" [
        q_h: "array<u32>",
        k_h: "array<u32>",
        v_h: "array<u32>",
        dk,
        lse,
        d_o,
        delta,
        dv,
    ];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    FORWARD,
    BACKWARD_DQ,
    BACKWARD_DKDV,
    FORWARD_F16,
    BACKWARD_DQ_F16,
    BACKWARD_DKDV_F16,
];

/// An input of the attention kernels: f32 elements, or packed f16 halves (the `_f16` kernels,
/// which widen each value as they load it: no f32 copy of the tensor is made).
#[derive(Debug, Clone, Copy)]
pub enum Operand<'a> {
    /// f32 elements.
    F32(DeviceSlice<'a>),
    /// Packed f16 halves.
    F16(Halves<'a>),
}

impl<'a> Operand<'a> {
    /// What is bound: the slice, or the words the halves are in.
    fn binding(&self) -> DeviceSlice<'a> {
        match self {
            Operand::F32(s) => *s,
            Operand::F16(h) => h.words(),
        }
    }

    /// The shader's index of the first value (elements, or halves).
    fn index(&self) -> u32 {
        match self {
            Operand::F32(s) => s.index(),
            Operand::F16(h) => h.index(),
        }
    }

    /// Values held.
    fn len(&self) -> u64 {
        match self {
            Operand::F32(s) => s.len(),
            Operand::F16(h) => h.len(),
        }
    }

    fn is_f16(&self) -> bool {
        matches!(self, Operand::F16(_))
    }
}

shader_params! {
    /// The `Params` of `attention.wgsl` (offsets in elements of each binding's segment).
    struct Params {
        heads_batch: u32,
        time: u32,
        head_dim: u32,
        scale: f32,
        q_offset: u32,
        k_offset: u32,
        v_offset: u32,
        o_offset: u32,
        lse_offset: u32,
        do_offset: u32,
        delta_offset: u32,
        dq_offset: u32,
        dk_offset: u32,
        dv_offset: u32,
        dropout: f32,
        drop_scale: f32,
        seed_lo: u32,
        seed_hi: u32,
        group: u32,
        member: u32,
        head_start: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

impl Params {
    /// These `Params` for a dispatch whose first query head is `head` of the launch (a
    /// multiple of the group): every offset advanced to that head, the dropout mask's head
    /// index counted from it.
    fn at_head(self, head: u32, dims: &AttentionDims) -> Params {
        let per_head = (dims.time * dims.head_dim) as u32;
        let (q_rows, kv_rows) = (head * per_head, head / dims.group.max(1) as u32 * per_head);
        let stats = head * dims.time as u32;
        Params {
            head_start: head,
            q_offset: self.q_offset + q_rows,
            o_offset: self.o_offset + q_rows,
            do_offset: self.do_offset + q_rows,
            dq_offset: self.dq_offset + q_rows,
            k_offset: self.k_offset + kv_rows,
            v_offset: self.v_offset + kv_rows,
            dk_offset: self.dk_offset + kv_rows,
            dv_offset: self.dv_offset + kv_rows,
            lse_offset: self.lse_offset + stats,
            delta_offset: self.delta_offset + stats,
            ..self
        }
    }
}

/// The shape of an attention launch: `heads_batch` independent heads (batch x heads) of `time`
/// rows of `head_dim` features; scores are `scale * q.k`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionDims {
    /// Batch times query heads.
    pub heads_batch: u64,
    /// Query heads per key/value head (grouped-query attention; 1: multi-head). `k`, `v`,
    /// `dk`, `dv` hold `heads_batch / group` heads, and query head `h` reads head `h / group`.
    pub group: u64,
    /// Sequence length.
    pub time: u64,
    /// Features per head (at most [`MAX_HEAD_DIM`]).
    pub head_dim: u64,
    /// The scores' scale (`1 / sqrt(head_dim)` in a transformer).
    pub scale: f32,
    /// Dropout on the probabilities, in `[0, 1)` (0: none).
    pub dropout: f32,
    /// The dropout mask's seed: the mask is [`crate::kernels::dropout`]'s over the `[BH, T, T]`
    /// probabilities with this seed.
    pub seed: u64,
}

impl AttentionDims {
    /// Elements of a `[BH, T, D]` tensor.
    fn rows_len(&self) -> u64 {
        self.heads_batch * self.time * self.head_dim
    }

    /// Elements of a `[BH / G, T, D]` key or value tensor.
    fn kv_len(&self) -> u64 {
        self.rows_len() / self.group.max(1)
    }

    /// Elements of a `[BH, T]` tensor.
    fn stats_len(&self) -> u64 {
        self.heads_batch * self.time
    }
}

/// Worst-case loop passes of one invocation of any of the three entry points at `time` rows
/// and head dimension `head_dim` (each entry point's loops summed; see the module docs of
/// `kernels` on lavapipe's loop limit). Rows are padded to a multiple of 8 and the inner loops
/// take 8 elements a pass. Grouped-query heads loop no more (one `dkdv` dispatch per member).
pub const fn loop_iterations(time: u64, head_dim: u64) -> u64 {
    let dp = head_dim.div_ceil(8) * 8;
    let inner = dp / 8 + 1;
    let tiles = time.div_ceil(TILE);
    let load = (TILE * dp).div_ceil(ROWS) + 1;
    // The forward's tile (scores, rescale, accumulate) is the costliest of the three.
    let per_tile = load + 2 * (TILE + 1 + TILE * inner) + inner;
    (dp + 1) + (tiles + 1) + tiles * per_tile + (head_dim + 1)
}

/// The checks every launcher makes: the head dimension, the loop limit, the grid, and the
/// length of each `[BH, T, D]` slice (`rows`) and `[BH, T]` slice (`stats`).
fn check(
    gpu: &Gpu,
    op: &'static str,
    dims: &AttentionDims,
    rows: &[(&str, Operand<'_>)],
    kv: &[(&str, Operand<'_>)],
    stats: &[(&str, DeviceSlice<'_>)],
) -> Result<[u32; 3]> {
    if dims.group == 0 || !dims.heads_batch.is_multiple_of(dims.group) {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "{} heads (batch x query heads) cannot share key/value heads in groups of {} \
                 (the group must divide the query heads; 1 for multi-head attention)",
                dims.heads_batch, dims.group
            ),
        });
    }
    if !(0.0..1.0).contains(&dims.dropout) {
        return Err(Error::InvalidArgument {
            op,
            message: format!("dropout {} outside [0, 1)", dims.dropout),
        });
    }
    if dims.head_dim == 0 || dims.head_dim > MAX_HEAD_DIM {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "head dimension {} outside 1..={MAX_HEAD_DIM} (use more heads of fewer \
                 features)",
                dims.head_dim
            ),
        });
    }
    check_loop_limit(gpu, op, "time", dims.time, |t| {
        loop_iterations(t, dims.head_dim)
    })?;
    let max = u64::from(gpu.limits().max_compute_workgroups_per_dimension);
    let groups = [dims.time.div_ceil(ROWS), dims.heads_batch];
    if groups.iter().any(|&g| g > max) || dims.rows_len() > u64::from(u32::MAX) {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "{} heads of {} rows need {groups:?} workgroups (at most {max} each way) and \
                 {} elements (at most 2^32 - 1); split the batch",
                dims.heads_batch,
                dims.time,
                dims.rows_len()
            ),
        });
    }
    for (names, want) in [(rows, dims.rows_len()), (kv, dims.kv_len())] {
        for (name, operand) in names {
            if operand.len() != want {
                return Err(Error::InvalidArgument {
                    op,
                    message: format!("{name} holds {} values, not {want}", operand.len()),
                });
            }
        }
    }
    for (name, slice) in stats {
        slice.expect_len(op, name, dims.stats_len())?;
    }
    Ok([groups[0] as u32, groups[1] as u32, 1])
}

/// Floating-point work of the forward: two `T x T / 2 x D` products per head, as a multiply-add
/// each (the backward does about 2.5 times this).
fn forward_flops(dims: &AttentionDims) -> u64 {
    2 * dims.heads_batch * dims.time * (dims.time + 1) * dims.head_dim
}

/// Records `kernel` over `workgroups` (`[query or key blocks, heads]`). Under a bound on one
/// submission's GPU time ([`Gpu::set_max_submission`]) a launch too long for it goes out in
/// blocks of whole heads: of whole groups of query heads (`heads_per_y` 1: the grid's `y` is
/// the query head), or of key/value heads (`heads_per_y` the group: `y` is the key/value head);
/// the same values and dropout mask whatever the blocks.
fn launch(
    gpu: &Gpu,
    kernel: &Kernel,
    (params, dims): (&Params, &AttentionDims),
    buffers: &[DeviceSlice<'_>],
    (workgroups, heads_per_y): ([u32; 3], u32),
    flops: u64,
) -> Result<()> {
    if workgroups[0] == 0 || workgroups[1] == 0 {
        return Ok(());
    }
    let whole = Work {
        flops,
        ..Work::of_slices(buffers)
    };
    // A block of query heads starts on a group (its key/value head is then whole).
    let period = if heads_per_y == 1 { dims.group } else { 1 };
    let units = [u64::from(workgroups[1]), period];
    for (first, count, work) in crate::kernels::blocks_within_bound(gpu, kernel, units, whole) {
        let block = params.at_head(first as u32 * heads_per_y, dims);
        gpu.dispatch(Dispatch {
            kernel,
            overrides: &[],
            params: bytemuck::bytes_of(&block),
            buffers,
            also_uses: &[],
            workgroups: [workgroups[0], count as u32, 1],
            work,
        })?;
    }
    Ok(())
}

/// The shape and the offsets of the forward's slices (`[q, k, v, o, lse]`) as `Params`.
fn forward_params(
    dims: &AttentionDims,
    [q, k, v]: [Operand<'_>; 3],
    [o, lse]: [u32; 2],
) -> Params {
    Params {
        heads_batch: dims.heads_batch as u32,
        time: dims.time as u32,
        head_dim: dims.head_dim as u32,
        scale: dims.scale,
        dropout: dims.dropout,
        drop_scale: 1.0 / (1.0 - dims.dropout),
        seed_lo: dims.seed as u32,
        seed_hi: (dims.seed >> 32) as u32,
        group: dims.group as u32,
        q_offset: q.index(),
        k_offset: k.index(),
        v_offset: v.index(),
        o_offset: o,
        lse_offset: lse,
        ..Params::default()
    }
}

/// Records the forward: `o = softmax(scale * q kᵀ, causal) v` (`[BH, T, D]`) and `lse`, the
/// log-sum-exp of each row of scaled scores (`[BH, T]`, what the backward needs).
pub fn forward(
    gpu: &Gpu,
    dims: &AttentionDims,
    outputs: [DeviceSlice<'_>; 2],
    [q, k, v]: [DeviceSlice<'_>; 3],
) -> Result<()> {
    forward_of(gpu, dims, outputs, [q, k, v].map(Operand::F32))
}

/// [`forward`] of f16 `q`, `k`, `v` (packed halves, widened as they are loaded; `o` and `lse`
/// f32).
pub fn forward_f16(
    gpu: &Gpu,
    dims: &AttentionDims,
    outputs: [DeviceSlice<'_>; 2],
    [q, k, v]: [Halves<'_>; 3],
) -> Result<()> {
    forward_of(gpu, dims, outputs, [q, k, v].map(Operand::F16))
}

/// [`forward`] of inputs in one storage (all f32 or all f16).
fn forward_of(
    gpu: &Gpu,
    dims: &AttentionDims,
    [o, lse]: [DeviceSlice<'_>; 2],
    [q, k, v]: [Operand<'_>; 3],
) -> Result<()> {
    let op = FORWARD.entry;
    let grid = check(
        gpu,
        op,
        dims,
        &[("q", q), ("o", Operand::F32(o))],
        &[("k", k), ("v", v)],
        &[("lse", lse)],
    )?;
    let params = forward_params(dims, [q, k, v], [o.index(), lse.index()]);
    let kernel = if q.is_f16() { &FORWARD_F16 } else { &FORWARD };
    let buffers = [q.binding(), k.binding(), v.binding(), o, lse];
    launch(
        gpu,
        kernel,
        (&params, dims),
        &buffers,
        (grid, 1),
        forward_flops(dims),
    )
}

/// Records the backward: `dq`, `dk`, `dv` (`[BH, T, D]`) from the forward's inputs, its
/// output `o` and `lse`, and the output's gradient `d_o`; `delta` (`[BH, T]`) is scratch
/// (`rowsum(d_o * o)`).
pub fn backward(
    gpu: &Gpu,
    dims: &AttentionDims,
    outputs: [DeviceSlice<'_>; 4],
    [q, k, v, o, lse, d_o]: [DeviceSlice<'_>; 6],
) -> Result<()> {
    let inputs = [q, k, v, o].map(Operand::F32);
    backward_of(gpu, dims, outputs, inputs, [lse, d_o])
}

/// [`backward`] with f16 `q`, `k`, `v` and `o` (packed halves, widened as they are loaded;
/// `lse`, `d_o` and the gradients f32).
pub fn backward_f16(
    gpu: &Gpu,
    dims: &AttentionDims,
    outputs: [DeviceSlice<'_>; 4],
    [q, k, v, o]: [Halves<'_>; 4],
    [lse, d_o]: [DeviceSlice<'_>; 2],
) -> Result<()> {
    let inputs = [q, k, v, o].map(Operand::F16);
    backward_of(gpu, dims, outputs, inputs, [lse, d_o])
}

/// [`backward`] of inputs in one storage (all f32 or all f16).
fn backward_of(
    gpu: &Gpu,
    dims: &AttentionDims,
    [dq, dk, dv, delta]: [DeviceSlice<'_>; 4],
    [q, k, v, o]: [Operand<'_>; 4],
    [lse, d_o]: [DeviceSlice<'_>; 2],
) -> Result<()> {
    let op = BACKWARD_DQ.entry;
    let f32s = Operand::F32;
    let grid = check(
        gpu,
        op,
        dims,
        &[("q", q), ("o", o), ("d_o", f32s(d_o)), ("dq", f32s(dq))],
        &[("k", k), ("v", v), ("dk", f32s(dk)), ("dv", f32s(dv))],
        &[("lse", lse), ("delta", delta)],
    )?;
    let params = Params {
        do_offset: d_o.index(),
        delta_offset: delta.index(),
        dq_offset: dq.index(),
        dk_offset: dk.index(),
        dv_offset: dv.index(),
        ..forward_params(dims, [q, k, v], [o.index(), lse.index()])
    };
    let (dq_kernel, dkdv_kernel) = match q.is_f16() {
        true => (&BACKWARD_DQ_F16, &BACKWARD_DKDV_F16),
        false => (&BACKWARD_DQ, &BACKWARD_DKDV),
    };
    let [q, k, v, o] = [q, k, v, o].map(|x| x.binding());
    let flops = forward_flops(dims);
    launch(
        gpu,
        dq_kernel,
        (&params, dims),
        &[q, k, v, o, lse, d_o, delta, dq],
        (grid, 1),
        flops,
    )?;
    // One dispatch per member of a group: the first writes dk and dv, the others add (in
    // order: the recorder keeps a batch's dispatches in sequence).
    let kv_grid = [grid[0], (dims.heads_batch / dims.group) as u32, 1];
    for member in 0..dims.group as u32 {
        launch(
            gpu,
            dkdv_kernel,
            (&Params { member, ..params }, dims),
            &[q, k, v, dk, lse, d_o, delta, dv],
            (kv_grid, dims.group as u32),
            flops * 3 / 2 / dims.group,
        )?;
    }
    Ok(())
}

pub mod reference;
#[cfg(test)]
pub(crate) mod tests;
