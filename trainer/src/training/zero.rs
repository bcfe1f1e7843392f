//! ZeRO stages 1 and 2 on the data-parallel path (`--shard optimizer|gradients`).
//!
//! Each rank's optimizer ([`plimsoll_nn::ShardedAdamW`]) keeps the state of, and updates, one
//! contiguous part of the trained parameters flattened in order, cut at row boundaries
//! ([`RowShard`]). A step then goes:
//!
//! 1. Stage 1: the gradients are summed on every rank as without sharding
//!    ([`crate::step`]'s all-reduce). Stage 2: `reduce_scatter_gradients` instead, in
//!    buckets: each call gives every rank the sum of its own rows' gradients alone; the whole
//!    gradients are freed and the rows' sums go to the optimizer
//!    ([`Optimizer::set_row_gradients`]). The loss, the gradient norm and the finiteness check
//!    come from one small all-reduce of what each rank saw of its rows.
//! 2. Each rank updates its rows (the update is recorded and submitted all or nothing, as
//!    always).
//! 3. `all_gather_parameters`: each rank's updated rows, in buckets, to every rank.
//!
//! A bucket holds the same number of values from every rank's part (its `k`-th block, padded
//! with zeros where a part is shorter), so the calls are MPI's equal-block reduce-scatter and
//! all-gather, of at most [`BUCKET_BYTES`] each.
//!
//! A checkpoint of a sharded run holds the whole optimizer state: `gathered_state` collects
//! every rank's rows on rank 0 (each rank calls it at the same points of the run), which
//! assembles AdamW's tensors, so a sharded run resumes unsharded, on other ranks, or sharded
//! again (each rank keeps its rows of the whole state, [`Optimizer::load_host_state`]). A rank
//! alone cannot save the state after another failed: a sharded run that gives up points at its
//! last checkpoint.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use plimsoll_autograd::{Category, Tensor, TensorOptions, no_grad};
use plimsoll_nn::state::HostTensor;
use plimsoll_nn::{Optimizer, RowShard, zero_grad};

use crate::collective::{BUCKET_BYTES, Collective};
use crate::error::{Error, Result};
use crate::read_back::StepReadBack;
use crate::step::StepInputs;

/// Values of one rank's part in one bucket: each call moves at most [`BUCKET_BYTES`].
fn block_len(ranks: usize) -> usize {
    (BUCKET_BYTES / 4 / ranks.max(1)).max(1)
}

/// Every rank's part of the trained parameters, and those parameters in the parts' order.
struct Layout {
    /// Every rank's shard, in rank order.
    shards: Vec<RowShard>,
    /// The trained parameters, in the shard's order.
    tensors: Vec<Tensor>,
    /// Each one's first element among the flattened parameters.
    offsets: Vec<usize>,
}

impl Layout {
    /// The layout of `shard`'s ranks over `params` (each parameter the shard names, by name).
    fn new(params: &[(String, Tensor)], shard: &RowShard) -> Result<Layout> {
        let mut tensors = Vec::with_capacity(shard.parts().len());
        let mut offsets = Vec::with_capacity(shard.parts().len());
        let mut at = 0;
        for (name, shape, _) in shard.parts() {
            let Some((_, t)) = params.iter().find(|(n, _)| n == name) else {
                return Err(Error::invalid(
                    "--shard",
                    format!("the optimizer keeps rows of {name:?}, which the model lacks"),
                ));
            };
            if t.shape() != shape.as_slice() {
                return Err(Error::invalid(
                    "--shard",
                    format!(
                        "the optimizer's rows of {name:?} are of a {shape:?} tensor; the model's \
                         is {:?}",
                        t.shape()
                    ),
                ));
            }
            tensors.push(t.clone());
            offsets.push(at);
            at += t.numel();
        }
        let shapes: Vec<(String, Vec<usize>)> = shard
            .parts()
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone()))
            .collect();
        Ok(Layout {
            shards: RowShard::all(&shapes, shard.ranks()),
            tensors,
            offsets,
        })
    }

    /// The longest part.
    fn longest(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.flat().len())
            .max()
            .unwrap_or(0)
    }

    /// Rank `r`'s flat elements in bucket `k` of blocks of `block` values.
    fn block(&self, r: usize, k: usize, block: usize) -> Range<usize> {
        let flat = self.shards.get(r).map(RowShard::flat).unwrap_or(0..0);
        let start = (flat.start + k * block).min(flat.end);
        start..(start + block).min(flat.end)
    }

    /// The pieces of flat elements `range`: per tensor it touches, the tensor's index and its
    /// elements in the range.
    fn pieces(&self, range: &Range<usize>) -> Vec<(usize, Range<usize>)> {
        let mut out = Vec::new();
        for (i, (t, &o)) in self.tensors.iter().zip(&self.offsets).enumerate() {
            let (lo, hi) = (range.start.max(o), range.end.min(o + t.numel()));
            if lo < hi {
                out.push((i, lo - o..hi - o));
            }
        }
        out
    }
}

/// Elements `range` of `t`, flattened, as a view.
fn flat_view(t: &Tensor, range: &Range<usize>) -> Result<Tensor> {
    let _no_grad = no_grad();
    Ok(t.reshape(&[t.numel()])?
        .slice(0, range.start, range.len())?)
}

/// The values of flat elements `ranges` (joined in order) of `tensors` (zeros where a tensor
/// is `None`), gathered on the device and read back in one wait. On a planning device only the
/// gathered copy is made (and nothing returned): a plan's dry run counts its allocation, and a
/// large model's zeros would cost the host gigabytes per step.
fn read_ranges(
    layout: &Layout,
    tensors: &[Option<Tensor>],
    ranges: &[Range<usize>],
) -> Result<Vec<f32>> {
    let _no_grad = no_grad();
    let mut views = Vec::new();
    for range in ranges {
        for (i, elements) in layout.pieces(range) {
            if let Some(Some(t)) = tensors.get(i) {
                views.push(flat_view(t, &elements)?);
            }
        }
    }
    let planning = layout
        .tensors
        .first()
        .is_some_and(|t| t.gpu().is_planning());
    let read = match (views.as_slice(), planning) {
        ([], _) | ([_], true) => Vec::new(),
        ([one], false) => one.to_vec()?,
        (_, _) => {
            let refs: Vec<&Tensor> = views.iter().collect();
            let gathered = Tensor::concat(&refs, 0)?;
            match planning {
                true => return Ok(Vec::new()),
                false => gathered.to_vec()?,
            }
        }
    };
    if planning {
        return Ok(Vec::new());
    }
    drop(views);
    let mut read = read.into_iter();
    let mut out = Vec::with_capacity(ranges.iter().map(Range::len).sum());
    for range in ranges {
        for (i, elements) in layout.pieces(range) {
            match tensors.get(i).is_some_and(Option::is_some) {
                true => out.extend(read.by_ref().take(elements.len())),
                false => out.extend(std::iter::repeat_n(0.0, elements.len())),
            }
        }
    }
    Ok(out)
}

/// What the collective calls of a step moved and cost ([`crate::step`]'s accounting).
pub(crate) struct Traffic<'a> {
    /// Bytes this rank passed to the calls.
    pub bytes: &'a mut u64,
    /// Milliseconds inside the calls.
    pub ms: &'a mut f64,
}

impl Traffic<'_> {
    fn call<T>(&mut self, len: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
        *self.bytes += (len * 4) as u64;
        let start = Instant::now();
        let out = f();
        *self.ms += start.elapsed().as_secs_f64() * 1e3;
        out
    }
}

/// Stage 2: every rank's gradients summed, each rank keeping only its rows' sums, which go to
/// `optimizer` ([`Optimizer::set_row_gradients`]) once the whole gradients are freed. Returns
/// the summed loss as a one-element tensor, whether any rank asked to stop, and the step's
/// read-back (loss, global gradient norm, finiteness, the first parameter whose gradient is
/// not finite), from one all-reduce of each rank's share after the buckets. Nothing here
/// touches a parameter or the optimizer's state.
pub(crate) fn reduce_scatter_gradients(
    inputs: &StepInputs<'_>,
    collective: &dyn Collective,
    loss_sum: Option<Tensor>,
    optimizer: &mut dyn Optimizer,
    traffic: &mut Traffic<'_>,
) -> Result<(Tensor, bool, StepReadBack)> {
    let _no_grad = no_grad();
    let Some(shard) = optimizer.row_shard().cloned() else {
        return Err(Error::invalid(
            "--shard gradients",
            "the optimizer keeps whole tensors",
        ));
    };
    let deadline = inputs.gpu.default_deadline();
    let layout = Layout::new(inputs.params, &shard)?;
    let (ranks, me) = (shard.ranks(), shard.rank());
    let grads: Vec<Option<Tensor>> = layout.tensors.iter().map(Tensor::grad).collect();
    // The loss first: its read waits for this rank's backward, the buckets' then do not.
    let own_loss = match &loss_sum {
        Some(l) => l.to_vec()?.first().copied().unwrap_or(f32::NAN),
        None => 0.0,
    };
    drop(loss_sum);
    let block = block_len(ranks);
    let mine = shard.flat();
    if inputs.gpu.is_planning() {
        return planned_reduce_scatter(inputs, &layout, &shard, grads, optimizer);
    }
    let mut own: Vec<f32> = Vec::with_capacity(mine.len());
    for k in 0..layout.longest().div_ceil(block) {
        let b = block.min(layout.longest() - k * block);
        let ranges: Vec<Range<usize>> = (0..ranks).map(|r| layout.block(r, k, block)).collect();
        let read = read_ranges(&layout, &grads, &ranges)?;
        let mut values = Vec::with_capacity(ranks * b);
        let mut at = 0;
        for range in &ranges {
            values.extend_from_slice(read.get(at..at + range.len()).unwrap_or(&[]));
            values.resize(values.len() + b - range.len(), 0.0);
            at += range.len();
        }
        let len = values.len();
        let summed = traffic.call(len, || {
            collective.reduce_scatter_sum(values, inputs.step, deadline)
        })?;
        let own_len = layout.block(me, k, block).len();
        own.extend_from_slice(summed.get(..own_len).unwrap_or(&[]));
    }
    if own.len() != mine.len() {
        return Err(Error::invalid(
            "reduce-scatter",
            format!(
                "{} summed values came back for this rank's {} elements",
                own.len(),
                mine.len()
            ),
        ));
    }
    // Per parameter: who has a gradient, the squares and non-finite values of this rank's rows.
    let n = layout.tensors.len();
    let mut shares = vec![0.0f32; 2 + 3 * n];
    shares[0] = own_loss;
    shares[1] = f32::from(u8::from(inputs.stop));
    for (i, g) in grads.iter().enumerate() {
        shares[2 + i] = f32::from(u8::from(g.is_some()));
    }
    // This rank's rows of each parameter, within `own`.
    let own_rows: Vec<(usize, &[f32])> = layout
        .pieces(&mine)
        .into_iter()
        .map(|(i, elements)| {
            let start = layout.offsets[i] + elements.start - mine.start;
            (i, own.get(start..start + elements.len()).unwrap_or(&[]))
        })
        .collect();
    for &(i, part) in &own_rows {
        let squares: f64 = part.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        shares[2 + n + i] = squares as f32;
        shares[2 + 2 * n + i] = f32::from(u8::from(part.iter().any(|x| !x.is_finite())));
    }
    let len = shares.len();
    let summed = traffic.call(len, || {
        collective.all_reduce_sum(shares, inputs.step, deadline)
    })?;
    if summed.len() != len {
        return Err(Error::invalid("all-reduce", "a short reply came back"));
    }
    let loss = summed[0];
    let stop = summed[1] > 0.0;
    let have: Vec<bool> = summed[2..2 + n].iter().map(|&h| h > 0.0).collect();
    let squares: f64 = summed[2 + n..2 + 2 * n].iter().map(|&s| f64::from(s)).sum();
    let first_bad = summed[2 + 2 * n..].iter().position(|&b| b > 0.0);
    let read = StepReadBack {
        loss,
        nonfinite: first_bad.is_some() || !loss.is_finite() || !squares.is_finite(),
        first_nonfinite: first_bad.and_then(|i| shard.parts().get(i).map(|p| p.0.clone())),
        grad_norm: squares.sqrt() as f32,
    };
    // The whole gradients go; this rank's rows' sums come in their place.
    drop(grads);
    zero_grad(inputs.params);
    let mut rows = BTreeMap::new();
    for (i, part) in own_rows {
        let (name, _, _) = &shard.parts()[i];
        let (Some(shape), true) = (shard.row_shape(name), have[i]) else {
            continue;
        };
        let label = format!("row gradients.{name}");
        let options = TensorOptions {
            category: Category::Gradient,
            label: &label,
            requires_grad: false,
        };
        rows.insert(
            name.clone(),
            Tensor::from_slice_with(inputs.gpu, part, &shape, options)?,
        );
    }
    optimizer.set_row_gradients(rows)?;
    let loss = Tensor::from_slice(inputs.gpu, &[loss], &[1])?;
    Ok((loss, stop, read))
}

/// [`reduce_scatter_gradients`] on a planning device: its allocations alone, in the same
/// order (each bucket's gathered copy, the whole gradients freed, the rows' gradients made),
/// with no values and no call.
fn planned_reduce_scatter(
    inputs: &StepInputs<'_>,
    layout: &Layout,
    shard: &RowShard,
    grads: Vec<Option<Tensor>>,
    optimizer: &mut dyn Optimizer,
) -> Result<(Tensor, bool, StepReadBack)> {
    let (ranks, block) = (shard.ranks(), block_len(shard.ranks()));
    for k in 0..layout.longest().div_ceil(block) {
        let ranges: Vec<Range<usize>> = (0..ranks).map(|r| layout.block(r, k, block)).collect();
        read_ranges(layout, &grads, &ranges)?;
    }
    let have: Vec<bool> = grads.iter().map(Option::is_some).collect();
    drop(grads);
    zero_grad(inputs.params);
    let mut rows = BTreeMap::new();
    for (i, _) in layout.pieces(&shard.flat()) {
        let (name, _, _) = &shard.parts()[i];
        let (Some(shape), true) = (shard.row_shape(name), have[i]) else {
            continue;
        };
        let label = format!("row gradients.{name}");
        rows.insert(
            name.clone(),
            Tensor::empty(inputs.gpu, &shape, Category::Gradient, &label)?,
        );
    }
    optimizer.set_row_gradients(rows)?;
    let loss = Tensor::from_slice(inputs.gpu, &[0.0], &[1])?;
    let read = StepReadBack {
        loss: 0.0,
        nonfinite: false,
        first_nonfinite: None,
        grad_norm: 0.0,
    };
    Ok((loss, false, read))
}

/// After the update: each rank's updated rows to every rank, in buckets (one read-back and
/// one all-gather each), written into the parameters the others updated.
pub(crate) fn all_gather_parameters(
    inputs: &StepInputs<'_>,
    collective: &dyn Collective,
    shard: &RowShard,
    traffic: &mut Traffic<'_>,
) -> Result<()> {
    let _no_grad = no_grad();
    let deadline = inputs.gpu.default_deadline();
    let layout = Layout::new(inputs.params, shard)?;
    let (ranks, me) = (shard.ranks(), shard.rank());
    let tensors: Vec<Option<Tensor>> = layout.tensors.iter().cloned().map(Some).collect();
    let block = block_len(ranks);
    for k in 0..layout.longest().div_ceil(block) {
        let b = block.min(layout.longest() - k * block);
        let own = layout.block(me, k, block);
        let mut values = read_ranges(&layout, &tensors, std::slice::from_ref(&own))?;
        if inputs.gpu.is_planning() {
            continue; // the gathered copy was all a dry run needs
        }
        values.resize(b, 0.0);
        let gathered = traffic.call(b, || collective.all_gather(values, inputs.step, deadline))?;
        if gathered.len() != ranks * b {
            return Err(Error::invalid(
                "all-gather",
                format!(
                    "{} values came back for {ranks} blocks of {b}",
                    gathered.len()
                ),
            ));
        }
        for r in (0..ranks).filter(|&r| r != me) {
            let range = layout.block(r, k, block);
            let mut at = r * b;
            for (i, elements) in layout.pieces(&range) {
                let part = gathered.get(at..at + elements.len()).unwrap_or(&[]);
                at += elements.len();
                if let Some(t) = layout.tensors.get(i) {
                    flat_view(t, &elements)?.write_from_slice(part)?;
                }
            }
        }
    }
    // The weights changed: f16 copies made of them since the update are stale.
    plimsoll_autograd::forget_weight_copies();
    Ok(())
}

/// A sharded run's whole optimizer state, for a checkpoint: every rank sends its rows
/// ([`Optimizer::state`]) to rank 0, which assembles AdamW's tensors (`exp_avg.<parameter>`,
/// whole shapes); `None` on the other ranks. Every rank calls it at the same point, within
/// `deadline`.
pub(crate) fn gathered_state(
    optimizer: &dyn Optimizer,
    collective: &dyn Collective,
    deadline: Duration,
) -> Result<Option<Vec<(String, HostTensor)>>> {
    let Some(shard) = optimizer.row_shard() else {
        return Err(Error::invalid(
            "checkpoint",
            "the optimizer keeps whole tensors",
        ));
    };
    let mut names = Vec::new();
    let mut bytes = Vec::new();
    for (name, t) in optimizer.state() {
        let values = match t.gpu().is_planning() {
            true => vec![0.0; t.numel()],
            false => t.to_vec_within(deadline)?,
        };
        names.push((name, values.len()));
        bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    }
    // A header (the entries and their lengths, as JSON) before the values.
    let header = serde_json::to_vec(&names)
        .map_err(|e| Error::invalid("checkpoint", format!("the state's names: {e}")))?;
    let mut message = (header.len() as u64).to_le_bytes().to_vec();
    message.extend(header);
    message.extend(bytes);
    let all = collective.gather(message, deadline)?;
    if collective.rank() != 0 {
        return Ok(None);
    }
    let shapes: Vec<(String, Vec<usize>)> = shard
        .parts()
        .iter()
        .map(|(n, s, _)| (n.clone(), s.clone()))
        .collect();
    let mut whole: BTreeMap<String, (Vec<usize>, Vec<f32>, usize)> = BTreeMap::new();
    for (r, message) in all.iter().enumerate() {
        let theirs = RowShard::new(&shapes, r, collective.ranks());
        place_rows(message, &theirs, &mut whole)
            .map_err(|e| Error::invalid("checkpoint", format!("rank {r}'s state: {e}")))?;
    }
    let mut out = Vec::with_capacity(whole.len());
    for (name, (shape, data, rows)) in whole {
        let want = shape.first().copied().unwrap_or(1);
        if rows != want {
            return Err(Error::invalid(
                "checkpoint",
                format!("the ranks sent {rows} of {name}'s {want} rows"),
            ));
        }
        out.push((name, HostTensor::new(shape, data)));
    }
    Ok(Some(out))
}

/// One rank's message of [`gathered_state`] (its rows are `shard`'s) placed into `whole`
/// (per entry: the whole shape, the values, the rows placed so far).
fn place_rows(
    message: &[u8],
    shard: &RowShard,
    whole: &mut BTreeMap<String, (Vec<usize>, Vec<f32>, usize)>,
) -> std::result::Result<(), String> {
    let len_bytes: [u8; 8] = message
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or("shorter than its header")?;
    let header_len = usize::try_from(u64::from_le_bytes(len_bytes)).map_err(|e| e.to_string())?;
    let header = message.get(8..8 + header_len).ok_or("header cut short")?;
    let names: Vec<(String, usize)> = serde_json::from_slice(header).map_err(|e| e.to_string())?;
    let mut values = message
        .get(8 + header_len..)
        .unwrap_or(&[])
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    for (full, len) in names {
        let (_, param) = full
            .split_once('.')
            .ok_or("an entry not <kind>.<parameter>")?;
        let (_, shape, rows) = shard
            .parts()
            .iter()
            .find(|(n, _, _)| n == param)
            .ok_or_else(|| format!("{full}: no such parameter"))?;
        let numel: usize = shape.iter().product();
        let row_len = numel / shape.first().copied().unwrap_or(1).max(1);
        if len != rows.len() * row_len {
            return Err(format!("{full}: {len} values for rows {rows:?}"));
        }
        let entry = whole
            .entry(full.clone())
            .or_insert_with(|| (shape.clone(), vec![0.0; numel], 0));
        let target = entry
            .1
            .get_mut(rows.start * row_len..rows.end * row_len)
            .ok_or_else(|| format!("{full}: rows {rows:?} outside the tensor"))?;
        for slot in target {
            *slot = values.next().ok_or("values cut short")?;
        }
        entry.2 += rows.len();
    }
    Ok(())
}
