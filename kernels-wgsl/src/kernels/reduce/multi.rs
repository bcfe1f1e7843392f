//! [`sum_squares_many`]: the sums of squares of many tensors, and copies of partial sums already
//! computed, in a few `squares_multi` dispatches instead of one launch per tensor (the step's
//! read-back: a gradient norm over every parameter). Each dispatch binds up to
//! [`crate::kernels::MULTI_SLOTS`] segments ([`crate::kernels::slots`]) and reads where each
//! source lies from a table uploaded once per call. The CPU, and a device with fewer storage
//! bindings per stage than the kernel needs, get one launch per source, with the same chunks
//! ([`TensorLaunches::chosen`]).

use plimsoll_allocator::Category;

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::slots::{MultiSlots, TensorLaunches, binds_all};
use crate::kernels::{blocks_within_bound, copy, grid_1d};
use crate::pipeline::{Kernel, shader_params, shader_source};
use crate::recorder::{Dispatch, Work};
use crate::slice::DeviceSlice;
use const_format::concatcp;

use super::{squares_chunks, sum_squares_chunks};

/// The module: `squares_multi.wgsl` and the helpers it calls.
const WGSL: &str = concatcp!(
    include_str!("squares_multi.wgsl"),
    shader_source!("indexing", "slots")
);

/// The `squares_multi` entry point: the 16 slots, `dst`, `table`.
pub const SQUARES_MULTI: Kernel = crate::kernels::slots::multi_tensor_kernel!(
    "squares_multi",
    "squares_multi",
    source: WGSL,
    squares_params: SquaresParams,
    [dst, table: "array<u32>"]
);

shader_params! {
    /// The `Params` of `squares_multi.wgsl`.
    struct SquaresParams {
        units: u32,
        first_unit: u32,
        tensors: u32,
        table_offset: u32,
        dst_offset: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// Words per source in the table (`squares_multi.wgsl`).
const ENTRY_WORDS: usize = 4;

/// The flag of a copied source in its table entry's first word.
const COPIED: u32 = 256;

/// One source of [`sum_squares_many`].
#[derive(Clone, Copy, Debug)]
pub enum SquaresSource<'a> {
    /// A tensor: [`squares_chunks`]`(len)` sums of squares, as [`super::sum_squares_chunks`]
    /// computes them on a device without subgroups.
    Tensor(DeviceSlice<'a>),
    /// Partial sums already computed: copied, one per element.
    Partials(DeviceSlice<'a>),
}

impl<'a> SquaresSource<'a> {
    /// The elements of `out` it writes.
    pub fn outputs(&self) -> u64 {
        match self {
            SquaresSource::Tensor(x) => squares_chunks(x.len()),
            SquaresSource::Partials(p) => p.len(),
        }
    }

    fn slice(&self) -> DeviceSlice<'a> {
        match self {
            SquaresSource::Tensor(x) | SquaresSource::Partials(x) => *x,
        }
    }
}

/// Records, for each of `sources` in turn into consecutive elements of `out`, its
/// [`SquaresSource::outputs`]: a tensor's sums of squares by [`super::SQUARES_CHUNK`] elements,
/// or the partial sums copied; in the launches [`TensorLaunches::chosen`] picks for the device.
pub fn sum_squares_many(
    gpu: &Gpu,
    out: DeviceSlice<'_>,
    sources: &[SquaresSource<'_>],
) -> Result<()> {
    let launches = TensorLaunches::chosen(gpu, &SQUARES_MULTI);
    sum_squares_many_in(gpu, launches, out, sources)
}

/// [`sum_squares_many`] in `launches`: [`TensorLaunches::Multi`] records a few dispatches (see
/// the module docs; the same chunks, additions and order as [`super::sum_squares_chunks`] with
/// an invocation per chunk), on a device that cannot bind them one launch per source. Errors:
/// `out` not exactly as long as the outputs, a refused table allocation or upload (nothing
/// recorded), or the launches' own.
pub fn sum_squares_many_in(
    gpu: &Gpu,
    launches: TensorLaunches,
    out: DeviceSlice<'_>,
    sources: &[SquaresSource<'_>],
) -> Result<()> {
    let op = "reduce::sum_squares_many";
    let total: u64 = sources.iter().map(SquaresSource::outputs).sum();
    out.expect_len(op, "out", total)?;
    if total > u64::from(u32::MAX) {
        return Err(Error::InvalidArgument {
            op,
            message: format!("{total} outputs, more than a u32 counts: split the sources"),
        });
    }
    if launches == TensorLaunches::OnePerTensor || !binds_all(gpu, &SQUARES_MULTI) {
        let mut at = 0;
        for source in sources {
            let n = source.outputs();
            let into = out.slice(at, n)?;
            match source {
                SquaresSource::Tensor(x) => sum_squares_chunks(gpu, into, *x)?,
                SquaresSource::Partials(p) => copy::copy(gpu, into, *p)?,
            }
            at += n;
        }
        return Ok(());
    }
    // The table, and the dispatches: each a run of sources whose segments fit the slots.
    let mut table: Vec<u32> = Vec::with_capacity(ENTRY_WORDS * sources.len());
    let mut groups: Vec<Group<'_>> = Vec::new();
    let mut group = Group::starting(0, 0);
    let mut unit = 0u64;
    for (i, source) in sources.iter().enumerate() {
        let n = source.outputs();
        if n == 0 {
            continue;
        }
        let slice = source.slice();
        if !group.slots.fits(&[slice]) {
            let next = Group::starting(i, unit);
            groups.push(std::mem::replace(&mut group, next));
        }
        let slot = group.slots.bind(slice);
        let copied = matches!(source, SquaresSource::Partials(_));
        table.extend_from_slice(&[
            slot | if copied { COPIED } else { 0 },
            slice.index(),
            slice.len() as u32,
            unit as u32,
        ]);
        group.sources.end = i + 1;
        group.entries += 1;
        group.units += n;
        group.bytes += 4 * slice.len();
        unit += n;
    }
    if group.units > 0 {
        groups.push(group);
    }
    if table.is_empty() {
        return Ok(());
    }
    let table = gpu.upload(&table, Category::Temporary, "squares table")?;
    let mut first_entry = 0u32;
    for group in &groups {
        let mut buffers = group.slots.bindings();
        buffers.push(out);
        buffers.push(table.whole());
        let uses: Vec<DeviceSlice<'_>> =
            sources[group.sources.clone()].iter().map(SquaresSource::slice).collect();
        let whole = Work {
            flops: 0,
            bytes: group.bytes + 4 * group.units,
        };
        for (first, count, work) in blocks_within_bound(gpu, &SQUARES_MULTI, [group.units, 1], whole)
        {
            let params = SquaresParams {
                units: count as u32,
                first_unit: (group.first_unit + first) as u32,
                tensors: group.entries,
                table_offset: table.whole().index() + ENTRY_WORDS as u32 * first_entry,
                dst_offset: out.index(),
                ..SquaresParams::default()
            };
            gpu.dispatch(Dispatch {
                kernel: &SQUARES_MULTI,
                overrides: &[],
                params: bytemuck::bytes_of(&params),
                buffers: &buffers,
                also_uses: &uses,
                workgroups: grid_1d(gpu, count, SQUARES_MULTI.workgroup_size)?,
                work,
            })?;
        }
        first_entry += group.entries;
    }
    Ok(())
}

/// One dispatch (or a few under a submission bound): its segments and its sources.
struct Group<'a> {
    slots: MultiSlots<'a>,
    /// The sources it reads (indices into the call's sources; empty ones included).
    sources: std::ops::Range<usize>,
    /// Its table entries (the sources with outputs).
    entries: u32,
    first_unit: u64,
    units: u64,
    bytes: u64,
}

impl Group<'_> {
    fn starting(first_source: usize, first_unit: u64) -> Self {
        Group {
            slots: MultiSlots::default(),
            sources: first_source..first_source,
            entries: 0,
            first_unit,
            units: 0,
            bytes: 0,
        }
    }
}
