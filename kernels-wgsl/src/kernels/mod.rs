//! Kernel launchers, one module per family, named by the family's stem.
//!
//! # How to add a kernel family `<stem>`
//!
//! In one place: a folder `src/kernels/<stem>/` holding the shader `<stem>.wgsl` and `mod.rs`
//! with the launcher, `pub mod reference` (the CPU oracle) and `#[cfg(test)] pub(crate) mod
//! tests` with `pub(crate) fn matches_reference`, its entry points listed in `pub const KERNELS:
//! &[Kernel]` beside their declarations, and the stem added to `families!` below (the one list;
//! a family without that test or that list does not compile; [`ALL`] is made from the lists).
//! `fill` is the worked example; copy its shape (a family whose `mod.rs` would grow long keeps its
//! reference and tests in `reference.rs` and `tests.rs` beside it, as `binary` does). Every
//! family is in this layout; only the helpers several families share stay in `shaders/`
//! (`indexing.wgsl`, `f16_bits.wgsl`, ...), and the scaffolding their tests share in
//! [`crate::testing`].
//!
//! 1. **Shader** `<stem>.wgsl`. Start with a comment giving the binding layout, the
//!    workgroup size and why, and the bounds check. Bindings, always in this order:
//!    ```wgsl
//!    struct Params { offset_a: u32, len: u32, alpha: f32, _pad: u32 } // u32/i32/f32 scalars (or
//!                                  // vec4<u32> arrays), padded to a multiple of 16 bytes, <= 256
//!    @group(0) @binding(0) var<uniform> params: Params;
//!    @group(0) @binding(1) var<storage, read_write> a: array<f32>;   // ALWAYS read_write
//!    @group(0) @binding(2) var<storage, read_write> out: array<f32>;
//!    ```
//!    - Every storage binding is `read_write`, inputs included: tensors share segment buffers and
//!      wgpu rejects one buffer bound read-only and read-write in one dispatch.
//!    - Each binding is a whole *segment*, not the tensor: the launcher passes each slice's
//!      [`DeviceSlice::index`] in `Params` (`x_offset: x.index()`), and the shader adds it.
//!    - Integer data (indices, targets) and packed f16 (`pack2x16float`) use `array<u32>`.
//!    - Use `@workgroup_size(256)` for elementwise work and compute the index as
//!      `let i = flat_index(gid, nwg);` with `@builtin(num_workgroups) nwg` and
//!      `const WG: u32 = 256u;` (`shaders/indexing.wgsl`), so [`grid_1d`] can spread large
//!      launches over a 2-D grid. Return when `i >= params.len`.
//!    - A helper more than one shader needs (`indexing.wgsl`, `online_softmax.wgsl`,
//!      `workgroup_reduce.wgsl`, `f16_bits.wgsl`, ...) is written once in its own file and
//!      appended to each module that calls it (`shader_source!` in the launcher).
//!    - Specialise with WGSL `override` constants (tile sizes, flags) rather than string edits;
//!      they are part of the pipeline cache key.
//! 2. **Launcher** in `mod.rs`:
//!    - a `const KERNEL: Kernel = kernel!("<stem>", "<entry>", source: WGSL, [a, out], 256)`
//!      per entry point (several entry points of one module: one `kernels! { "<stem>", source:
//!      WGSL, workgroup: 256; NAME = "<entry>" [a, out]; .. }`, a line each), with `const WGSL: &str = concatcp!(include_str!("<stem>.wgsl"),
//!      shader_source!("indexing"))` for the helpers it calls (`source: include_str!(..)` alone
//!      for a file that calls none), and each in the family's `KERNELS`;
//!    - its `Params` in `shader_params!`, which declares them for Rust and WGSL at once
//!      (padding included);
//!    - `pub fn <stem>(gpu: &Gpu, [description,] out: DeviceSlice, a: DeviceSlice, ...)
//!      -> Result<()>`. One convention for every launcher: `gpu`, then what describes the
//!      work where there is more than a scalar or two (an op, or a `<Stem>Dims` / `<Stem>Step`
//!      struct of plain data, which the reference takes too), then one [`DeviceSlice`] per
//!      buffer, **outputs first**, then inputs. A slice's range was checked when it was made
//!      ([`crate::DeviceBuffer::slice`]); the launcher checks only that each slice's length is
//!      what the op needs (`expect_len`, [`same_len`]) and never sees a tensor. Then
//!      [`launch_1d`] (or [`Gpu::dispatch`] with a grid of its own), which records nothing for
//!      empty work. Launchers only *record*; the caller flushes, waits and reads back.
//! 3. **Reference** `pub mod reference` in `mod.rs`: plain loops on `&[f32]` (one `&[f32]` per
//!    slice, starting where the slice starts), same argument order, accumulating in `f64`.
//! 4. **Test** `#[cfg(test)] pub(crate) mod tests` in `mod.rs`, with `pub(crate) fn
//!    matches_reference`:
//!    ```ignore
//!    use crate::Result;
//!    use crate::testing::{assert_close, gpu, Rng, DEADLINE};
//!    #[test]
//!    pub(crate) fn matches_reference() -> Result<()> {   // `?`, no unwrap, even in tests
//!        let gpu = gpu();                                  // fails (never skips) without adapter
//!        let mut rng = Rng::new(7);
//!        for len in [1, 255, 257, 1000, 70_001] {         // odd sizes, not multiples of 256
//!            let a = rng.vec_f32(len, -2.0, 2.0);          // seeded, never all zeros
//!            let a_gpu = gpu.upload(&a, Category::Temporary, "a")?;
//!            // ... launch, then:
//!            let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE)?;
//!            assert_close("stem", &got, &want, 1e-6, 1e-6); // atol + rtol*|want|, first mismatch
//!        }
//!        Ok(())
//!    }
//!    ```
//!
//! # Loop limit on lavapipe
//!
//! Mesa's llvmpipe/lavapipe (gallivm, `LP_MAX_TGSI_LOOP_ITERATIONS`) gives each shader
//! invocation ONE budget of 65,535 loop *passes*, set at entry and shared by every loop it runs,
//! sequential or nested (helper functions are inlined into it). A pass is one trip through a
//! loop body, and the pass that tests the condition and leaves counts too: a loop of `n`
//! iterations costs `n + 1` passes, nested loops cost `(inner + 1)` per outer pass. When the
//! budget is spent the current loop exits and every later loop runs ONE pass, without any error.
//! `for`, `while` and `loop { if .. { break; } }` count alike. The budget belongs to a SIMD
//! group of 8 invocations (256-bit llvmpipe) and counts the passes of the group's longest-running
//! invocation; other groups and workgroups have their own. Measured on llvmpipe (LLVM 15.0.6,
//! Mesa 22.3.6) with a scratch kernel that counted its own iterations (body count / asked for):
//! one loop 65,535/65,535 and 65,535/65,536; two loops of 40,000 then a third of 5:
//! 40,000, 25,534 (= 65,535 - 40,001) and 1; 30,000 + 30,000 + 10,000: the third got 5,533;
//! 32,767 + 32,767: both exact; nested 255 x 255 exact (255 · 257 + 1 = 65,536 passes), nested
//! 300 x 300: 218 outer and 65,101 inner (302 passes per outer iteration); `loop`/`while` of
//! 70,001: 65,535; 64 and 256 invocations of 60,000 or 65,535 each: all exact; with lane 1 of
//! a SIMD group leaving its first loop early, its second loop was cut like its neighbours'.
//! Reading `U` elements per pass lifts the limit `U`-fold (8 per pass: 70,001 and 524,280
//! elements exact), but a remainder *loop* costs passes too (524,279 = 65,534 · 8 + 7: the last
//! 7 became 1). So column and row loops here take 8 elements per pass and finish the remainder
//! in a constant loop of 7 guarded steps (which the compiler may unroll; counted anyway):
//! [`loop_passes`]`(n) = n / 8 + 1 + 8`.
//!
//! Hence every launcher whose loops depend on its arguments computes its worst-case passes per
//! invocation (a `loop_iterations` function next to it, summing all loops of the entry point,
//! both sides of every data-dependent branch) and calls [`check_loop_limit`] before its range
//! checks: on an adapter with a [`Gpu::loop_iteration_limit`] a launch over it is
//! [`Error::LoopLimit`], never a truncated result. Loops bounded by constants (`binary`, `copy`:
//! rank <= 8) need no check.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::pipeline::Kernel;
use crate::recorder::Dispatch;
use crate::slice::DeviceSlice;

/// Declares the kernel families in the one-place layout, the one list of them: `pub mod
/// <stem>;` for each (`src/kernels/<stem>/mod.rs`, with its shader, launcher, CPU `reference`
/// and kernel test beside each other), and, in test builds, a list of each family's
/// `tests::matches_reference` (returning `Result<()>`), so a family without a kernel test
/// against its reference does not compile. The test runner runs those tests where they stand.
macro_rules! families {
    ($($stem:ident),+ $(,)?) => {
        $(pub mod $stem;)+

        /// Every kernel of the crate, one per entry point: each family's `KERNELS` (declared
        /// beside its entry points), in the order of this list. What the shader validation test
        /// checks, what a warm-up may compile before a run's first step, and where a module's
        /// binding declarations come from ([`Kernel::source`]).
        pub const ALL: &[Kernel] = {
            const PARTS: &[&[Kernel]] = &[$($stem::KERNELS),+];
            const LEN: usize = total_len(PARTS);
            const ALL: [Kernel; LEN] = concatenated(PARTS);
            &ALL
        };

        /// Each family's kernel test against its reference (naming it is the check).
        #[cfg(test)]
        #[allow(dead_code)]
        const REFERENCE_TESTS: &[fn() -> crate::Result<()>] = &[$($stem::tests::matches_reference),+];
    };
}

families! {
    attention,
    augment,
    binary,
    conv2d,
    convert,
    copy,
    cross_entropy,
    dropout,
    embedding,
    fill,
    layer_norm,
    matmul,
    nonfinite,
    optimizer,
    pool2d,
    reduce,
    rotary,
    softmax,
    unary,
}

#[cfg(test)]
mod bounded_tests;
pub(crate) mod slots;

pub use slots::{MULTI_SLOTS, TensorLaunches};

/// The number of kernels in all of `parts`.
const fn total_len(parts: &[&[Kernel]]) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < parts.len() {
        n += parts[i].len();
        i += 1;
    }
    n
}

/// The kernels of `parts`, one after another (`N`: [`total_len`] of them).
const fn concatenated<const N: usize>(parts: &[&[Kernel]]) -> [Kernel; N] {
    let mut out = [fill::KERNEL; N];
    let (mut i, mut n) = (0, 0);
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            out[n] = parts[i][j];
            n += 1;
            j += 1;
        }
        i += 1;
    }
    assert!(n == N, "N must be the total length of the parts");
    out
}

/// Every pipeline the launchers of this crate can ask for: each kernel of [`ALL`] with each set
/// of override constants its launcher passes (the unary and binary ops' `OP`, matmul `main`'s
/// `TRANS_A`/`TRANS_B`, `main_scalar` taking its transposes as runtime flags; the 16-bit matmul
/// modules' `A_F16`/`B_F16`/`C_F16` too): what
/// [`Gpu::compile_kernels`] builds, and [`Gpu::compile_wanted`] when no planning twin asked for any.
pub fn variants() -> Vec<(&'static Kernel, Vec<(&'static str, f64)>)> {
    let mut out = Vec::new();
    for kernel in ALL {
        if [
            unary::FORWARD,
            unary::FORWARD_F16,
            unary::FORWARD_F16_NATIVE,
        ]
        .iter()
        .any(|k| k.stem == kernel.stem)
        {
            for op in unary::UnaryOp::ALL {
                out.push((kernel, unary::overrides(op).to_vec()));
            }
        } else if [
            binary::BROADCAST,
            binary::BROADCAST_F16,
            binary::BROADCAST_F16_NATIVE,
        ]
        .iter()
        .any(|k| k.stem == kernel.stem)
        {
            for op in binary::BinaryOp::ALL {
                out.push((kernel, binary::overrides(op).to_vec()));
            }
        } else if kernel.stem.starts_with(matmul::MAIN.stem)
            && (kernel.entry == matmul::MAIN.entry || matmul::is_coop(kernel))
            && kernel.stem != matmul::MAIN_F16.stem
        {
            for (a, b) in [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)] {
                out.push((kernel, vec![("TRANS_A", a), ("TRANS_B", b)]));
            }
        } else if let Some(sets) = matmul::f16_overrides(kernel) {
            out.extend(sets.into_iter().map(|set| (kernel, set)));
        } else {
            out.push((kernel, Vec::new()));
        }
    }
    out
}

/// `v` widened to `f64`: what a family's `f32` reference entry points hand to its `f64` ones. (A
/// reference that finite differences differentiate, in autograd's gradient checks and nn's module
/// tests, computes in `f64` (`*_f64` entry points); its `f32` entry points, which the kernel tests
/// call, widen their inputs and round each output once ([`narrow`]).)
pub(crate) fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// `v` rounded to `f32`: what a family's `f32` reference entry points return (see [`widen`]).
pub(crate) fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Workgroup size of the elementwise kernels (matches `@workgroup_size(256)` in their WGSL).
pub const ELEMENTWISE_WORKGROUP: u32 = 256;

/// Workgroup counts covering `len` invocations in groups of `workgroup_size`: `[x, y, 1]` with `x`
/// at most the device's `max_compute_workgroups_per_dimension`; shaders index
/// `gid.x + gid.y * num_workgroups.x * workgroup_size` and bounds-check against `len`.
pub fn grid_1d(gpu: &Gpu, len: u64, workgroup_size: u32) -> Result<[u32; 3]> {
    let max = u64::from(gpu.limits().max_compute_workgroups_per_dimension.max(1));
    let groups = len.div_ceil(u64::from(workgroup_size.max(1))).max(1);
    let x = groups.min(max);
    let y = groups.div_ceil(x);
    if y > max {
        return Err(Error::InvalidArgument {
            op: "grid_1d",
            message: format!("{len} invocations need {groups} workgroups, more than {max}^2"),
        });
    }
    Ok([x as u32, y as u32, 1])
}

/// Records `kernel` over `len` invocations in groups of its workgroup size ([`grid_1d`]), with
/// `params` (its `Params`, from `shader_params!`) and `buffers` for bindings `1..=N`; records
/// nothing when `len` is 0.
pub fn launch_1d<P: bytemuck::Pod>(
    gpu: &Gpu,
    kernel: &Kernel,
    overrides: &[(&str, f64)],
    params: &P,
    buffers: &[DeviceSlice<'_>],
    len: u64,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    gpu.dispatch(Dispatch {
        kernel,
        overrides,
        params: bytemuck::bytes_of(params),
        buffers,
        also_uses: &[],
        workgroups: grid_1d(gpu, len, kernel.workgroup_size)?,
        work: crate::recorder::Work::of_slices(buffers),
    })
}

/// Records `kernel` over `len` invocations like [`launch_1d`], in ranges under a bound on one
/// submission's GPU time ([`Gpu::set_max_submission`]): `params(start, end)` builds the
/// `Params` of the invocations `start..end`, which the shader numbers from `start` and stops
/// at `end` (so that no range computes another's elements: an op in place stays correct).
pub(crate) fn launch_ranges<P: bytemuck::Pod>(
    gpu: &Gpu,
    kernel: &Kernel,
    overrides: &[(&str, f64)],
    buffers: &[DeviceSlice<'_>],
    len: u64,
    params: impl Fn(u32, u32) -> P,
) -> Result<()> {
    launch_units(gpu, kernel, overrides, buffers, len, |start, end| {
        (params(start as u32, end as u32), end - start)
    })
}

/// Records `kernel` over `units` equal units of work (elements, pairs of halves, words) in
/// blocks under a bound on one submission's GPU time ([`Gpu::set_max_submission`]): `block(s,
/// e)` gives the `Params` and the invocations of the units `s..e` (no invocations: nothing
/// recorded). One block without a bound.
pub(crate) fn launch_units<P: bytemuck::Pod>(
    gpu: &Gpu,
    kernel: &Kernel,
    overrides: &[(&str, f64)],
    buffers: &[DeviceSlice<'_>],
    units: u64,
    block: impl Fn(u64, u64) -> (P, u64),
) -> Result<()> {
    launch_blocks(gpu, kernel, overrides, buffers, [units, 1], block)
}

/// [`launch_units`] in blocks of whole `period`s of units (a causal period of rows, whole
/// sequences): `block(s, e)` gives the `Params` and the invocations of the units `s..e`.
pub(crate) fn launch_blocks<P: bytemuck::Pod>(
    gpu: &Gpu,
    kernel: &Kernel,
    overrides: &[(&str, f64)],
    buffers: &[DeviceSlice<'_>],
    [units, period]: [u64; 2],
    block: impl Fn(u64, u64) -> (P, u64),
) -> Result<()> {
    let whole = crate::recorder::Work::of_slices(buffers);
    for (first, count, work) in blocks_within_bound(gpu, kernel, [units, period], whole) {
        let (params, invocations) = block(first, first + count);
        if invocations == 0 {
            continue;
        }
        gpu.dispatch(Dispatch {
            kernel,
            overrides,
            params: bytemuck::bytes_of(&params),
            buffers,
            also_uses: &[],
            workgroups: grid_1d(gpu, invocations, kernel.workgroup_size)?,
            work,
        })?;
    }
    Ok(())
}

/// One part of an elementwise launch split by [`launch_split`]: `count` invocations from element
/// `start` of every slice; with `vec4`, each invocation handles four consecutive elements and
/// the shader indexes the slices' `vec4` views.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    /// Four elements per invocation (offsets in `vec4`s).
    pub(crate) vec4: bool,
    /// First element of the part, from the start of every slice.
    pub(crate) start: u32,
    /// Invocations (elements, or `vec4`s when `vec4`).
    pub(crate) count: u32,
}

impl Part {
    /// The shader offset of a slice whose first element is at segment index `index`.
    pub(crate) fn offset(&self, index: u32) -> u32 {
        if self.vec4 {
            (index + self.start) / 4
        } else {
            index + self.start
        }
    }
}

/// Records an elementwise op over `len` elements of every slice of `buffers` (all at least
/// `len` long): when every slice starts at a multiple of 4 elements, the longest prefix of whole
/// `vec4`s on `v4` (four elements per invocation: on lavapipe every storage access is a per-lane
/// loop, so a `vec4` access moves four elements for the price of one), and the rest on
/// `scalar`. `params` builds each part's `Params` (see [`Part::offset`]). The profile counts
/// `4 · elements` bytes per slice and part. Under a bound on one submission's GPU time
/// ([`Gpu::set_max_submission`]), a part too long for it goes out in ranges.
pub(crate) fn launch_split<P: bytemuck::Pod>(
    gpu: &Gpu,
    [v4, scalar]: [&Kernel; 2],
    overrides: &[(&str, f64)],
    buffers: &[DeviceSlice<'_>],
    len: u64,
    params: impl Fn(Part) -> P,
) -> Result<()> {
    let aligned = buffers.iter().all(|b| b.index().is_multiple_of(4));
    let vectors = if aligned { len / 4 } else { 0 };
    let parts = [
        (true, 0, vectors, v4),
        (false, 4 * vectors, len - 4 * vectors, scalar),
    ];
    let work = |invocations: u64, vec4: bool| crate::recorder::Work {
        flops: 0,
        bytes: 4 * invocations * if vec4 { 4 } else { 1 } * buffers.len() as u64,
    };
    for (vec4, start, count, kernel) in parts {
        if count == 0 {
            continue;
        }
        // Under a bound on one submission's GPU time, in ranges that each fit it
        // (crate::pacing); the same values whatever the ranges.
        let pieces = gpu.pieces_within_bound(kernel, count, work(count, vec4));
        let per_piece = count.div_ceil(pieces);
        let mut first = 0;
        while first < count {
            let invocations = per_piece.min(count - first);
            let part = Part {
                vec4,
                start: (start + if vec4 { 4 * first } else { first }) as u32,
                count: invocations as u32,
            };
            gpu.dispatch(Dispatch {
                kernel,
                overrides,
                params: bytemuck::bytes_of(&params(part)),
                buffers,
                also_uses: &[],
                workgroups: grid_1d(gpu, invocations, kernel.workgroup_size)?,
                work: work(invocations, vec4),
            })?;
            first += invocations;
        }
    }
    Ok(())
}

/// Invocations per workgroup of the workgroup-per-row kernels (softmax, layer norm,
/// cross-entropy).
pub const ROW_WORKGROUP: u32 = 64;

/// How a row kernel spreads its rows over the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowLayout {
    /// One invocation per row, looping over its columns (`kernels/softmax/softmax.wgsl`): best when
    /// there are enough rows to fill the device.
    InvocationPerRow,
    /// One workgroup of [`ROW_WORKGROUP`] invocations per row, each taking every 64th column,
    /// the row's statistic combined by a tree in workgroup memory (`kernels/softmax/softmax_rows.wgsl`
    /// placed by `shaders/row_workgroup.wgsl`): few long rows then still use the whole of a GPU.
    WorkgroupPerRow,
    /// One subgroup per row (the same `*_rows.wgsl` bodies placed by
    /// `shaders/row_subgroup.wgsl`): each lane takes every `lanes`-th column, so a subgroup
    /// reads its row in contiguous runs, and the row's statistic is combined by subgroup
    /// operations (`subgroupAdd`, `subgroupMax`), without workgroup memory or barriers. Needs
    /// wgpu's `SUBGROUP` feature and subgroups of at most [`ROW_WORKGROUP`] lanes
    /// ([`subgroup_rows`]); elsewhere a launch in it is [`Error::InvalidArgument`].
    SubgroupPerRow,
}

impl RowLayout {
    /// The layouts `gpu` can run: [`RowLayout::SubgroupPerRow`] only where [`subgroup_rows`]
    /// says so (tests and benchmarks compare them).
    pub fn available(gpu: &Gpu) -> Vec<RowLayout> {
        let mut out = vec![RowLayout::InvocationPerRow, RowLayout::WorkgroupPerRow];
        if subgroup_rows(gpu).is_some() {
            out.push(RowLayout::SubgroupPerRow);
        }
        out
    }
}

/// Where `gpu` can run [`RowLayout::SubgroupPerRow`]: the fewest and the most lanes a
/// subgroup has (the adapter's subgroup sizes, the largest at most [`ROW_WORKGROUP`]); `None`
/// without wgpu's `SUBGROUP` feature.
pub fn subgroup_rows(gpu: &Gpu) -> Option<(u32, u32)> {
    gpu.adapter()
        .subgroup_sizes
        .filter(|&(least, most)| least >= 1 && most <= ROW_WORKGROUP && least <= most)
}

/// The fewest lanes that take one row's columns in `layout` on `gpu` (each then loops over
/// `ceil(cols / lanes)` of them): 1, [`ROW_WORKGROUP`], or the adapter's smallest subgroup;
/// [`Error::InvalidArgument`] naming `op` for a subgroup layout the device cannot run.
pub(crate) fn row_lanes(gpu: &Gpu, op: &'static str, layout: RowLayout) -> Result<u64> {
    match layout {
        RowLayout::InvocationPerRow => Ok(1),
        RowLayout::WorkgroupPerRow => Ok(u64::from(ROW_WORKGROUP)),
        RowLayout::SubgroupPerRow => Ok(u64::from(subgroup_rows_for(gpu, op)?.0)),
    }
}

/// [`subgroup_rows`], or [`Error::InvalidArgument`] naming `op` where the device cannot run a
/// subgroup per row.
pub(crate) fn subgroup_rows_for(gpu: &Gpu, op: &'static str) -> Result<(u32, u32)> {
    subgroup_rows(gpu).ok_or_else(|| Error::InvalidArgument {
        op,
        message: format!(
            "adapter {:?} cannot run a subgroup per row (no SUBGROUP feature, or subgroups of \
             more than {ROW_WORKGROUP} lanes: {:?}); use kernels::row_layout's choice",
            gpu.adapter().name,
            gpu.adapter().subgroup_sizes
        ),
    })
}

/// On a GPU adapter, the fewest rows for which [`row_layout`] keeps an invocation per row:
/// below it (with at least [`ROW_WORKGROUP`] columns) each row gets a workgroup. Not measured
/// here (no GPU in this project's CI): an estimate from a GPU needing tens of thousands of
/// invocations in flight, which an invocation per row gives only with that many rows. `cargo
/// xtask bench kernels` prints both layouts (`rows/softmax ...`) to set it on a real device.
pub const GPU_INVOCATION_PER_ROW_MIN_ROWS: u64 = 4096;

/// On a CPU adapter with subgroups, the fewest columns for which [`row_layout`] gives each row a
/// subgroup. Measured on lavapipe (`cargo xtask bench kernels rows`, softmax, three runs, 8-lane
/// subgroups): a subgroup per row against an invocation per row ran at 2.2x at 32 rows of
/// 131,072 columns, 1.0-1.1x from 256 to 16,384 columns, 0.86x at 64 columns and 0.59x at 16.
pub const CPU_SUBGROUP_MIN_COLS: u64 = 256;

/// The layout the launchers use for `rows` rows of `cols` columns on `gpu`'s adapter:
/// - on a CPU adapter (lavapipe), a subgroup per row for rows of at least
///   [`CPU_SUBGROUP_MIN_COLS`] columns where it has subgroups, an invocation per row
///   otherwise. Never a workgroup per row: measured there (`cargo xtask bench kernels`,
///   softmax, medians of 3 runs), it is as fast at 32 rows of 131,072 columns (1.26 against
///   1.19 GB/s) and slower from 256 rows on (1.40 against 2.18 GB/s at 256 x 16,384; 0.48
///   against 2.94 at 16,384 x 256): its barriers cost more than the idle lanes save;
/// - on a GPU, a workgroup per row below [`GPU_INVOCATION_PER_ROW_MIN_ROWS`] rows of at least
///   [`ROW_WORKGROUP`] columns;
/// - on a GPU with subgroups ([`subgroup_rows`]), a subgroup per row otherwise, for rows at
///   least as long as the largest subgroup: an invocation per row reads its row alone, so a
///   subgroup's loads land `cols` elements apart, where a subgroup per row reads each row in
///   contiguous runs (not measured on a GPU yet: `cargo xtask bench kernels rows` prints
///   every layout);
/// - an invocation per row otherwise.
pub fn row_layout(gpu: &Gpu, rows: u64, cols: u64) -> RowLayout {
    let subgroups = subgroup_rows(gpu);
    if gpu.is_cpu() {
        return match subgroups {
            Some(_) if cols >= CPU_SUBGROUP_MIN_COLS => RowLayout::SubgroupPerRow,
            _ => RowLayout::InvocationPerRow,
        };
    }
    if rows < GPU_INVOCATION_PER_ROW_MIN_ROWS && cols >= u64::from(ROW_WORKGROUP) {
        return RowLayout::WorkgroupPerRow;
    }
    match subgroups {
        Some((_, most)) if cols >= u64::from(most) => RowLayout::SubgroupPerRow,
        _ => RowLayout::InvocationPerRow,
    }
}

/// Records `kernel` over `rows` rows: an invocation per row ([`grid_1d`] in groups of the
/// kernel's workgroup size), or one workgroup per row (2-D grid past the device's per-dimension
/// limit). `params(first, count)` builds the `Params` of the rows `first..first + count`: their
/// `rows` field `count`, each row-indexed offset advanced by `first` rows. Under a bound on one
/// submission's GPU time ([`Gpu::set_max_submission`]) a launch too long for it goes out in
/// blocks of rows, each block a multiple of `period` rows (a causal mask's period: row `r` is
/// query position `r % period` in every block too); the same values whatever the blocks.
pub(crate) fn launch_rows<P: bytemuck::Pod>(
    gpu: &Gpu,
    layout: RowLayout,
    kernel: &Kernel,
    buffers: &[DeviceSlice<'_>],
    [rows, period]: [u64; 2],
    params: impl Fn(u32, u32) -> P,
) -> Result<()> {
    // A workgroup per row: a whole workgroup's invocations per row. A subgroup per row: the
    // largest subgroup's lanes per row, so the grid has a subgroup for every row whatever size
    // the subgroups take (row_subgroup.wgsl).
    let per_row = match layout {
        RowLayout::InvocationPerRow => 1,
        RowLayout::WorkgroupPerRow => u64::from(kernel.workgroup_size),
        RowLayout::SubgroupPerRow => u64::from(subgroup_rows_for(gpu, kernel.entry)?.1),
    };
    launch_blocks(gpu, kernel, &[], buffers, [rows, period], |s, e| {
        (params(s as u32, (e - s) as u32), (e - s) * per_row)
    })
}

/// The blocks `(first, count, work)` in which a launch of `kernel` over `units` equal units
/// (rows, heads) doing `whole` work goes out: one block without a bound on one submission's GPU
/// time ([`Gpu::pieces_within_bound`]), else blocks of a multiple of `period` units each
/// estimated within the bound, each with its share of the work.
pub(crate) fn blocks_within_bound(
    gpu: &Gpu,
    kernel: &Kernel,
    [units, period]: [u64; 2],
    whole: crate::recorder::Work,
) -> Vec<(u64, u64, crate::recorder::Work)> {
    let period = period.max(1);
    let periods = units.div_ceil(period);
    let pieces = gpu.pieces_within_bound(kernel, periods, whole);
    let per_piece = period * periods.div_ceil(pieces.max(1));
    let share =
        |v: u64, count: u64| (u128::from(v) * u128::from(count) / u128::from(units.max(1))) as u64;
    let mut blocks = Vec::new();
    let mut first = 0;
    while first < units {
        let count = per_piece.min(units - first);
        let work = crate::recorder::Work {
            flops: share(whole.flops, count),
            bytes: share(whole.bytes, count),
        };
        blocks.push((first, count, work));
        first += count;
    }
    blocks
}

/// The common length of `slices` for launcher `op`, or [`Error::InvalidArgument`] naming the
/// first slice whose length differs from the first one's.
pub fn same_len(op: &'static str, slices: &[(&str, DeviceSlice<'_>)]) -> Result<u64> {
    let Some((_, first)) = slices.first() else {
        return Ok(0);
    };
    for (name, slice) in slices {
        slice.expect_len(op, name, first.len())?;
    }
    Ok(first.len())
}

/// Output positions of a window of `kernel` taps `dilation` apart, moved `stride` at a time
/// over `size` pixels with `padding` on each side (a convolution's or a pooling's, along one
/// side): `(size + 2 padding - span) / stride + 1`, `span = dilation (kernel - 1) + 1`. Expects
/// `kernel`, `stride`, `dilation` >= 1 and a span within the padded input ([`check_window`]).
pub(crate) fn window_positions(size: u64, [kernel, stride, padding, dilation]: [u64; 4]) -> u64 {
    let span = dilation * (kernel - 1) + 1;
    (size + 2 * padding - span) / stride + 1
}

/// Refuses, for launcher `op`, a window along `side` whose span (`dilation (kernel - 1) + 1`)
/// passes the padded input, with the figures.
pub(crate) fn check_window(
    op: &'static str,
    side: &str,
    size: u64,
    [kernel, padding, dilation]: [u64; 3],
) -> Result<()> {
    let span = dilation
        .saturating_mul(kernel.saturating_sub(1))
        .saturating_add(1);
    let padded = size.saturating_add(padding.saturating_mul(2));
    if span > padded {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "the window spans {span} pixels of {side} (kernel {kernel}, dilation \
                 {dilation}), more than the padded input's {padded} (input {size}, padding \
                 {padding} a side)"
            ),
        });
    }
    Ok(())
}

/// Refuses, for launcher `op`, a tensor of `shape` (`name`) with more elements than a `u32`
/// index reaches, with the figures.
pub(crate) fn check_u32_elements(op: &'static str, tensors: &[(&str, &[u64])]) -> Result<()> {
    for (name, shape) in tensors {
        let len = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        if len.is_none_or(|len| len > u64::from(u32::MAX)) {
            return Err(Error::InvalidArgument {
                op,
                message: format!(
                    "the {name} {shape:?} has more than 2^32 - 1 elements; split the batch"
                ),
            });
        }
    }
    Ok(())
}

/// Elements per loop pass of the unrolled row and column loops (module docs).
pub const ELEMENTS_PER_LOOP_PASS: u64 = 8;

/// Loop passes (module docs, "Loop limit on lavapipe") of one unrolled loop over `n` elements:
/// `n / 8` passes of 8 and the leaving pass, then a constant loop of 7 guarded steps and its
/// leaving pass for the remainder.
pub const fn loop_passes(n: u64) -> u64 {
    n / ELEMENTS_PER_LOOP_PASS + 1 + ELEMENTS_PER_LOOP_PASS
}

/// The largest `value <= u32::MAX` with `passes(value) <= limit` (`passes` non-decreasing), or
/// 0 when none is: the figure a [`Error::LoopLimit`] hint names.
pub fn largest_within(limit: u64, passes: impl Fn(u64) -> u64) -> u64 {
    let (mut lo, mut hi) = (0u64, u64::from(u32::MAX));
    if passes(hi) <= limit {
        return hi;
    }
    // Invariant: passes(hi) > limit; passes(lo) <= limit, or lo == 0.
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if passes(mid) <= limit {
            lo = mid
        } else {
            hi = mid
        }
    }
    lo
}

/// `Err(LoopLimit)` when one invocation of `op` would loop `passes(value)` times, more than
/// [`Gpu::loop_iteration_limit`]; `what` names the argument `value` is (e.g. `"cols"`), for the
/// hint, which gives its largest allowed value. Always `Ok` on adapters without a limit.
pub fn check_loop_limit(
    gpu: &Gpu,
    op: &'static str,
    what: &str,
    value: u64,
    passes: impl Fn(u64) -> u64,
) -> Result<()> {
    let Some(limit) = gpu.loop_iteration_limit() else {
        return Ok(());
    };
    let iterations = passes(value);
    if iterations <= limit {
        return Ok(());
    }
    let largest = largest_within(limit, passes);
    Err(Error::LoopLimit {
        op,
        iterations,
        limit,
        hint: format!(
            "{what} = {value} is too large here: use {what} <= {largest} (split the work)"
        ),
    })
}
