//! [`adamw_steps`]: one AdamW step of many tensors in a few `adamw_multi` dispatches instead of
//! one launch per tensor (PyTorch's multi-tensor `foreach` path does the same for CUDA).
//!
//! Tensors live in separate segments, and a dispatch binds whole segments, so a dispatch binds
//! up to [`crate::kernels::MULTI_SLOTS`] of them, each once ([`crate::kernels::slots`]), and a chunk table
//! (uploaded once per call) says where each chunk of each tensor lies: its operands' slots and
//! vec4 offsets, its length and its decay factor. A tensor's elements past its last whole vec4, and
//! a tensor whose operands do not all start on a multiple of 4 elements, go through
//! [`super::adamw_step`]; so does every tensor on a device with fewer storage bindings per stage
//! than the kernel needs, or when two tensors' operands overlap (one dispatch would race where
//! launches in turn do not). Every element gets the same operations as `adamw` gives it.
//! [`adamw_steps`] records this on a GPU, one launch per tensor on the CPU
//! ([`TensorLaunches::chosen`]).

use crate::device::Gpu;
use crate::error::Result;
use crate::kernels::slots::{MultiSlots, TensorLaunches, binds_all};
use crate::kernels::{blocks_within_bound, grid_1d};
use crate::recorder::{Dispatch, Work};
use crate::slice::DeviceSlice;
use crate::Category;

use super::{ADAMW_MULTI, AdamWParams, AdamWStep, adamw_step};

/// Vec4s per chunk: one workgroup's share (8 per invocation).
const CHUNK_VEC4S: u64 = 2048;

/// Words per chunk in the table (`optimizer.wgsl`'s `adamw_multi`).
const CHUNK_WORDS: usize = 8;

/// One tensor of a multi-tensor AdamW step ([`adamw_steps`]): its four operands, all of one
/// length, and whether the step's weight decay applies to it.
#[derive(Clone, Copy, Debug)]
pub struct AdamWTensor<'a> {
    /// The parameter, updated in place.
    pub param: DeviceSlice<'a>,
    /// Its gradient (read).
    pub grad: DeviceSlice<'a>,
    /// The first moment, updated in place.
    pub exp_avg: DeviceSlice<'a>,
    /// The second moment, updated in place.
    pub exp_avg_sq: DeviceSlice<'a>,
    /// Whether `step.config.weight_decay` applies (else the tensor is not decayed).
    pub decays: bool,
}

impl<'a> AdamWTensor<'a> {
    fn operands(&self) -> [DeviceSlice<'a>; 4] {
        [self.param, self.grad, self.exp_avg, self.exp_avg_sq]
    }

    /// The same four operands' elements `start..start + len`.
    fn part(&self, start: u64, len: u64) -> Result<[DeviceSlice<'a>; 4]> {
        Ok([
            self.param.slice(start, len)?,
            self.grad.slice(start, len)?,
            self.exp_avg.slice(start, len)?,
            self.exp_avg_sq.slice(start, len)?,
        ])
    }
}

/// Records one AdamW step of every tensor of `tensors` (as [`super::adamw_step`] does to each,
/// with `step`'s weight decay where [`AdamWTensor::decays`], none elsewhere), in the launches
/// [`TensorLaunches::chosen`] picks for the device.
pub fn adamw_steps(gpu: &Gpu, step: &AdamWStep, tensors: &[AdamWTensor<'_>]) -> Result<()> {
    adamw_steps_in(gpu, TensorLaunches::chosen(gpu, &ADAMW_MULTI), step, tensors)
}

/// [`adamw_steps`] in `launches`: [`TensorLaunches::Multi`] records a few dispatches (see the
/// module docs), on a device that cannot bind them too one launch per tensor. Errors: step 0,
/// operands of different lengths (naming the tensor), a refused allocation or upload of the
/// chunk table (nothing recorded), or the launches' own.
pub fn adamw_steps_in(
    gpu: &Gpu,
    launches: TensorLaunches,
    step: &AdamWStep,
    tensors: &[AdamWTensor<'_>],
) -> Result<()> {
    let op = "optimizer::adamw_steps";
    super::check_step(op, step)?;
    if let Some(control) = step.control {
        control.expect_len(op, "control", super::CONTROL_WORDS)?;
    }
    for (i, t) in tensors.iter().enumerate() {
        let names = [
            (format!("tensor {i}: param"), t.param),
            (format!("tensor {i}: grad"), t.grad),
            (format!("tensor {i}: exp_avg"), t.exp_avg),
            (format!("tensor {i}: exp_avg_sq"), t.exp_avg_sq),
        ];
        for (name, slice) in &names {
            slice.expect_len(op, name, t.param.len())?;
        }
    }
    let one_by_one = |parts: &[([DeviceSlice<'_>; 4], bool)]| -> Result<()> {
        for ([param, grad, exp_avg, exp_avg_sq], decays) in parts {
            adamw_step(gpu, &for_tensor(step, *decays), *param, *grad, *exp_avg, *exp_avg_sq)?;
        }
        Ok(())
    };
    let multi = launches == TensorLaunches::Multi && binds_all(gpu, &ADAMW_MULTI);
    if !multi || overlapping(tensors) {
        let whole: Vec<_> = tensors.iter().map(|t| (t.operands(), t.decays)).collect();
        return one_by_one(&whole);
    }
    let plan = Plan::of(step, tensors)?;
    if !plan.table.is_empty() {
        let table = gpu.upload(&plan.table, Category::Temporary, "adamw chunk table")?;
        // The decay factor comes from each chunk.
        let scalars = AdamWParams::scalars_of(step);
        for group in &plan.groups {
            let mut buffers = group.slots.bindings();
            buffers.push(table.whole());
            // Not read unless the step is controlled: the table stands in.
            buffers.push(step.control.unwrap_or(table.whole()));
            let uses: Vec<DeviceSlice<'_>> = tensors[group.tensors.clone()]
                .iter()
                .flat_map(AdamWTensor::operands)
                .collect();
            let whole = Work {
                flops: 0,
                bytes: group.vec4s * 4 * 4 * 4,
            };
            let blocks = blocks_within_bound(gpu, &ADAMW_MULTI, [group.chunks, 1], whole);
            for (first, count, work) in blocks {
                let params = AdamWParams {
                    n: count as u32,
                    first_chunk: (group.first_chunk + first) as u32,
                    param_offset: table.whole().index(),
                    ..scalars
                };
                gpu.dispatch(Dispatch {
                    kernel: &ADAMW_MULTI,
                    overrides: &[],
                    params: bytemuck::bytes_of(&params),
                    buffers: &buffers,
                    also_uses: &uses,
                    workgroups: grid_1d(gpu, count * 256, ADAMW_MULTI.workgroup_size)?,
                    work,
                })?;
            }
        }
    }
    one_by_one(&plan.tails)
}

/// `step` for one tensor: its weight decay, or none.
fn for_tensor<'c>(step: &AdamWStep<'c>, decays: bool) -> AdamWStep<'c> {
    let mut one = *step;
    if !decays {
        one.config.weight_decay = 0.0;
    }
    one
}

/// Whether an operand of one tensor shares an element with an operand of another.
fn overlapping(tensors: &[AdamWTensor<'_>]) -> bool {
    let mut ranges: Vec<(u64, u64, u64, usize)> = tensors
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            t.operands().map(|s| {
                let start = u64::from(s.index());
                (s.buffer().segment_uid(), start, start + s.len(), i)
            })
        })
        .filter(|&(_, start, end, _)| end > start)
        .collect();
    ranges.sort_unstable();
    // Sorted by segment and start: a range overlaps an earlier one exactly when it starts
    // before the furthest end so far in its segment.
    let mut furthest: Option<(u64, u64, usize)> = None;
    for (segment, start, end, tensor) in ranges {
        match furthest {
            Some((s, e, t)) if s == segment && start < e => {
                if t != tensor {
                    return true;
                }
                furthest = Some((s, e.max(end), t));
            }
            _ => furthest = Some((segment, end, tensor)),
        }
    }
    false
}

/// The dispatches of one call: which segments each binds, and the chunk table.
struct Plan<'a> {
    groups: Vec<Group<'a>>,
    /// `CHUNK_WORDS` words per chunk, the groups' chunks in order.
    table: Vec<u32>,
    /// What goes through [`adamw_step`]: tails past the last whole vec4, unaligned tensors.
    tails: Vec<([DeviceSlice<'a>; 4], bool)>,
}

/// One dispatch (or a few, under a submission bound): its segments and its chunks.
struct Group<'a> {
    slots: MultiSlots<'a>,
    first_chunk: u64,
    chunks: u64,
    vec4s: u64,
    /// The tensors it updates (indices into the call's tensors).
    tensors: std::ops::Range<usize>,
}

impl Group<'_> {
    fn new(first_chunk: u64, first_tensor: usize) -> Self {
        Group {
            slots: MultiSlots::default(),
            first_chunk,
            chunks: 0,
            vec4s: 0,
            tensors: first_tensor..first_tensor,
        }
    }
}

impl<'a> Plan<'a> {
    fn of(step: &AdamWStep, tensors: &[AdamWTensor<'a>]) -> Result<Plan<'a>> {
        let decayed = step.config.scalars(step.step).decay_factor;
        let mut plan = Plan {
            groups: Vec::new(),
            table: Vec::new(),
            tails: Vec::new(),
        };
        let mut group = Group::new(0, 0);
        for (i, t) in tensors.iter().enumerate() {
            let operands = t.operands();
            let len = t.param.len();
            let aligned = operands.iter().all(|s| s.index() % 4 == 0);
            let vec4s = if aligned { len / 4 } else { 0 };
            if 4 * vec4s < len {
                plan.tails.push((t.part(4 * vec4s, len - 4 * vec4s)?, t.decays));
            }
            if vec4s == 0 {
                continue;
            }
            if !group.slots.fits(&operands) {
                let next = Group::new(group.first_chunk + group.chunks, i);
                plan.groups.push(std::mem::replace(&mut group, next));
            }
            let slots = operands.map(|s| group.slots.bind(s));
            let packed = slots[0] | slots[1] << 8 | slots[2] << 16 | slots[3] << 24;
            let decay = if t.decays { decayed } else { 1.0 };
            let mut done = 0;
            while done < vec4s {
                let count = CHUNK_VEC4S.min(vec4s - done);
                let at = |s: &DeviceSlice<'_>| s.index() / 4 + done as u32;
                plan.table.extend_from_slice(&[
                    packed,
                    at(&t.param),
                    at(&t.grad),
                    at(&t.exp_avg),
                    at(&t.exp_avg_sq),
                    count as u32,
                    decay.to_bits(),
                    0,
                ]);
                done += count;
                group.chunks += 1;
            }
            group.vec4s += vec4s;
            group.tensors.end = i + 1;
        }
        if group.chunks > 0 {
            plan.groups.push(group);
        }
        debug_assert_eq!(
            plan.table.len(),
            CHUNK_WORDS * plan.groups.iter().map(|g| g.chunks as usize).sum::<usize>()
        );
        Ok(plan)
    }
}
