//! The kernels suite: matmul GFLOP/s (squares, 16-bit squares on each path, and the peer MLP's products), checked against
//! unchecked shader modules, elementwise (fill, copy, add) and reduction (sum_all, sum_axis) GB/s,
//! per-dispatch overhead and cold pipeline creation,
//! on whatever adapter `Gpu::new` finds (lavapipe on a machine without a GPU).
//!
//! Timing: wall clock from recording the dispatches to the end of the fence wait (record, flush,
//! wait), after one warm-up run per shape (lavapipe JIT-compiles a pipeline on its first
//! dispatch); the median of the runs is reported. Elementwise GB/s count bytes read + written.
//! The machine's load average is printed, because on lavapipe other processes take the same cores.

use std::time::{Duration, Instant};

use anyhow::Result;
use plimsoll_kernels_wgsl::kernels::binary::{self, BinaryDims, BinaryOp};
use plimsoll_kernels_wgsl::kernels::convert::{F16Path, Halves};
use plimsoll_kernels_wgsl::kernels::matmul::{self, MatmulDims, MatmulEntry, entry_point};
use plimsoll_kernels_wgsl::kernels::unary::{self, UnaryOp};
use plimsoll_kernels_wgsl::kernels::{copy, fill, reduce};
use plimsoll_kernels_wgsl::{Category, DeviceBuffer, DeviceSlice, Gpu};

use super::Report;

/// Deadline of every fence wait: generous, a 2048³ matmul takes seconds on two busy cores.
const DEADLINE: Duration = Duration::from_secs(300);
/// Elements of the elementwise benchmarks (16M f32 = 64 MiB per buffer).
const ELEMENTWISE_LEN: u64 = 16 << 20;
/// Tiny dispatches recorded in one batch for the per-dispatch overhead.
const TINY_DISPATCHES: u32 = 1000;
/// Peer workload: MLP layer widths (784-1024-1024-1024-10) at batch 128; W is in×out.
const MLP_WIDTHS: [usize; 5] = [784, 1024, 1024, 1024, 10];
const MLP_BATCH: usize = 128;

/// The parts `cargo xtask bench kernels [PART...]` runs (all of them when none is named).
pub const PARTS: [&str; 12] = [
    "cold",
    "squares",
    "f16",
    "small",
    "checked",
    "mlp",
    "head",
    "elementwise",
    "rows",
    "conv",
    "overhead",
    "multi",
];

/// Runs the kernels suite, or the named `parts` of it.
pub fn run(parts: &[String]) -> Result<Report> {
    if let Some(bad) = parts.iter().find(|p| !PARTS.contains(&p.as_str())) {
        anyhow::bail!("unknown kernels part `{bad}`; parts: {}", PARTS.join(", "));
    }
    let wanted = |part: &str| parts.is_empty() || parts.iter().any(|p| p == part);
    let mut report = Report::new("kernels");
    let gpu = Gpu::new()?;
    println!("kernels: adapter {}", gpu.adapter());
    println!("kernels: load average at start {}", load_average());
    if wanted("cold") {
        pipelines_cold(&mut report)?;
    }
    if wanted("squares") {
        matmul_squares(&gpu, &mut report)?;
    }
    if wanted("f16") {
        matmul_f16(&gpu, &mut report)?;
    }
    if wanted("small") {
        matmul_small(&gpu, &mut report)?;
    }
    if wanted("checked") {
        matmul_checked_vs_unchecked(&gpu, &mut report)?;
    }
    if wanted("mlp") {
        matmul_mlp(&gpu, &mut report)?;
    }
    if wanted("head") {
        matmul_head(&gpu, &mut report)?;
    }
    if wanted("elementwise") {
        elementwise(&gpu, &mut report)?;
    }
    if wanted("rows") {
        super::kernel_families::row_kernels(&gpu, &mut report)?;
    }
    if wanted("conv") {
        super::kernel_families::conv_layers(&gpu, &mut report)?;
    }
    if wanted("overhead") {
        dispatch_overhead(&gpu, &mut report)?;
    }
    if wanted("multi") {
        super::kernel_families::multi_tensor(&gpu, &mut report)?;
    }
    println!("kernels: load average at end {}", load_average());
    Ok(report)
}

/// The chunked loss's products for one chunk of 64 rows of the default GPT (width 128) over
/// GPT-2's 50,257 tokens (`plimsoll_nn::loss::linear_cross_entropy`): the chunk's logits
/// `x · Wᵀ` (W stored `[V, C]`), `dX = dlogits · W`, and `dW += dlogitsᵀ · x`.
fn matmul_head(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let (rows, width, vocab) = (64, 128, 50_257);
    let cases = [
        (
            "logits",
            MatmulDims {
                trans_b: true,
                ..MatmulDims::dense(1, rows, vocab, width)
            },
        ),
        ("dx", MatmulDims::dense(1, rows, width, vocab)),
        (
            "dw",
            MatmulDims {
                trans_a: true,
                ..MatmulDims::dense(1, vocab, width, rows)
            },
        ),
    ];
    for (name, d) in cases {
        let [c, x, y] = matmul_buffers(gpu, &d)?;
        let seconds = median_seconds(gpu, 3, || {
            Ok(matmul::matmul(gpu, &d, c.whole(), x.whole(), y.whole())?)
        })?;
        let label = format!(
            "matmul/head/{name} {}x{}x{} [{}]",
            d.m,
            d.k,
            d.n,
            entry_name(&d)
        );
        report.push(label, gflops(&d, seconds), "GFLOP/s");
    }
    Ok(())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Records `record`, flushes, waits; returns the seconds from the start of recording.
fn time_once(gpu: &Gpu, mut record: impl FnMut() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    record()?;
    let fence = gpu.flush("bench")?;
    gpu.wait(&fence, DEADLINE)?;
    Ok(start.elapsed().as_secs_f64())
}

/// One warm-up run, then the median seconds of `runs` runs.
pub(super) fn median_seconds(
    gpu: &Gpu,
    runs: usize,
    mut record: impl FnMut() -> Result<()>,
) -> Result<f64> {
    time_once(gpu, &mut record)?;
    let mut times = (0..runs)
        .map(|_| time_once(gpu, &mut record))
        .collect::<Result<Vec<f64>>>()?;
    Ok(median(&mut times))
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// A buffer of `len` f32 filled with `value` (never zeros, so no operand is trivially sparse).
pub(super) fn filled(gpu: &Gpu, len: usize, value: f32, label: &str) -> Result<DeviceBuffer> {
    let buffer = gpu.alloc_elements(len as u64, Category::Temporary, label)?;
    fill::fill(gpu, buffer.whole(), value)?;
    Ok(buffer)
}

/// Buffers for one matmul: (out, lhs, rhs).
fn matmul_buffers(gpu: &Gpu, d: &MatmulDims) -> Result<[DeviceBuffer; 3]> {
    Ok([
        filled(gpu, d.m * d.n, 0.0, "bench c")?,
        filled(gpu, d.m * d.k, 0.01, "bench a")?,
        filled(gpu, d.k * d.n, 0.02, "bench b")?,
    ])
}

fn gflops(d: &MatmulDims, seconds: f64) -> f64 {
    2.0 * (d.batch * d.m * d.n * d.k) as f64 / seconds / 1e9
}

fn entry_name(d: &MatmulDims) -> &'static str {
    match entry_point(d) {
        MatmulEntry::Main => "main",
        MatmulEntry::MainScalar => "main_scalar",
    }
}

/// Time to create and first-dispatch (JIT) every kernel pipeline the crate has, on a fresh
/// `Gpu` (empty pipeline cache; Mesa may still reuse its on-disk shader cache): part of the cold
/// start. Operands are uploaded, not filled, so no kernel runs before the one timed.
fn pipelines_cold(report: &mut Report) -> Result<()> {
    let gpu = &Gpu::new()?;
    let tiny = |len: usize| gpu.upload(&vec![1.0f32; len], Category::Temporary, "bench tiny");
    let (b, c) = (&tiny(64)?, &tiny(64)?);
    gpu.synchronize(DEADLINE)?;
    let mut timed: Vec<(String, f64)> = vec![
        (
            "fill::fill".into(),
            time_once(gpu, || Ok(fill::fill(gpu, c.whole(), 2.0)?))?,
        ),
        (
            "copy::copy".into(),
            time_once(gpu, || {
                Ok(copy::copy(gpu, c.slice(0, 32)?, b.slice(0, 32)?)?)
            })?,
        ),
        (
            "copy::strided_copy".into(),
            time_once(gpu, || {
                Ok(copy::strided_copy(
                    gpu,
                    c.slice(0, 16)?,
                    b.whole(),
                    &[4, 4],
                    &[1, 4],
                )?)
            })?,
        ),
    ];
    for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
        // 4x4x4 on each entry point (`main` forced: the launcher sends products that small
        // to `main_scalar`).
        for (entry, name) in [
            (MatmulEntry::Main, "main"),
            (MatmulEntry::MainScalar, "main_scalar"),
        ] {
            let d = MatmulDims {
                trans_a,
                trans_b,
                ..MatmulDims::dense(1, 4, 4, 4)
            };
            timed.push((
                format!("matmul::{name} ta={trans_a} tb={trans_b}"),
                time_once(gpu, || {
                    let (out, lhs, rhs) = (c.slice(0, 16)?, b.slice(0, 16)?, b.slice(16, 16)?);
                    Ok(matmul::matmul_on(gpu, entry, &d, out, lhs, rhs)?)
                })?,
            ));
        }
    }
    for (name, seconds) in &timed {
        report.push(format!("pipeline_cold/{name}"), seconds * 1e3, "ms");
    }
    report.push(
        format!("pipeline_cold/total ({} pipelines)", timed.len()),
        timed.iter().map(|(_, s)| s).sum::<f64>() * 1e3,
        "ms",
    );
    Ok(())
}

fn matmul_squares(gpu: &Gpu, report: &mut Report) -> Result<()> {
    for (size, runs) in [(256, 5), (512, 5), (1024, 5), (2048, 3)] {
        let d = MatmulDims::dense(1, size, size, size);
        let [c, a, b] = matmul_buffers(gpu, &d)?;
        let seconds = median_seconds(gpu, runs, || {
            Ok(matmul::matmul(gpu, &d, c.whole(), a.whole(), b.whole())?)
        })?;
        report.push(
            format!("matmul/square {size}^3 [{}]", entry_name(&d)),
            gflops(&d, seconds),
            "GFLOP/s",
        );
    }
    Ok(())
}

/// Square products with 16-bit A and B and an f32 C on each path the device has: cooperative
/// matrices (tensor cores, where the adapter offers them: [`Gpu::matmul_path`]) and the SIMT
/// `main` on native f16; then with an f32 A (the cooperative path rounds it to f16 as it
/// stages it); beside the f32 `main`. On a CPU adapter 512³ only; on a GPU 1024³ to
/// 4096³, each timed batch holding 10 products (one submission's overhead spread over them).
fn matmul_f16(gpu: &Gpu, report: &mut Report) -> Result<()> {
    if gpu.set_f16_path(F16Path::Native).is_err() {
        println!("kernels: matmul/f16 skipped: the adapter has no SHADER_F16");
        return Ok(());
    }
    let cpu = gpu.is_cpu();
    let (sizes, per_batch): (&[usize], usize) = match cpu {
        true => (&[512], 1),
        false => (&[1024, 2048, 4096], 10),
    };
    let coop = gpu.adapter().cooperative_matmul;
    println!("kernels: matmul path {}", gpu.matmul_path().describe());
    for &size in sizes {
        let d = MatmulDims::dense(1, size, size, size);
        let halves = (size * size) as u64;
        // 0x211f is 0.01 in f16 (never zeros: no operand is trivially sparse).
        let words = vec![0x211f_211fu32; (size * size).div_ceil(2)];
        let a = gpu.upload(&words, Category::Temporary, "bench a16")?;
        let b = gpu.upload(&words, Category::Temporary, "bench b16")?;
        let c = filled(gpu, size * size, 0.0, "bench c")?;
        let (a16, b16) = (Halves::of(&a, 0, halves)?, Halves::of(&b, 0, halves)?);
        let paths: &[(bool, &str)] = match coop {
            true => &[(true, "cooperative"), (false, "simt")],
            false => &[(false, "simt")],
        };
        for &(on, name) in paths {
            if coop {
                gpu.set_cooperative_matmul(on)?;
            }
            let seconds = median_seconds(gpu, 5, || {
                for _ in 0..per_batch {
                    matmul::matmul(gpu, &d, c.whole(), a16, b16)?;
                }
                Ok(())
            })? / per_batch as f64;
            report.push(
                format!("matmul/f16 {size}^3 [{name}]"),
                gflops(&d, seconds),
                "GFLOP/s",
            );
        }
        let [c32, a32, b32] = matmul_buffers(gpu, &d)?;
        // A in f32 (a gradient), B in f16 (a weight's copy): the backward's products.
        for &(on, name) in paths {
            if coop {
                gpu.set_cooperative_matmul(on)?;
            }
            let seconds = median_seconds(gpu, 5, || {
                for _ in 0..per_batch {
                    matmul::matmul(gpu, &d, c.whole(), a32.whole(), b16)?;
                }
                Ok(())
            })? / per_batch as f64;
            report.push(
                format!("matmul/f16 {size}^3 A f32 [{name}]"),
                gflops(&d, seconds),
                "GFLOP/s",
            );
        }
        let seconds = median_seconds(gpu, 5, || {
            for _ in 0..per_batch {
                matmul::matmul(gpu, &d, c32.whole(), a32.whole(), b32.whole())?;
            }
            Ok(())
        })? / per_batch as f64;
        report.push(
            format!("matmul/f16 {size}^3 [f32 main, for comparison]"),
            gflops(&d, seconds),
            "GFLOP/s",
        );
    }
    if coop {
        gpu.set_cooperative_matmul(true)?;
    }
    Ok(())
}

/// Small squares on both entry points ([`matmul::matmul_on`]), 20 products per timed batch:
/// where `main`'s 128×128 workgroup tile leaves the device idle. The launcher's small-product
/// rule ([`matmul::MAIN_MIN_FLOPS`]) comes from these lines and `pipeline_cold`.
fn matmul_small(gpu: &Gpu, report: &mut Report) -> Result<()> {
    for size in [32, 64, 128, 192, 256] {
        let d = MatmulDims::dense(1, size, size, size);
        let c = filled(gpu, d.m * d.n, 0.0, "bench c")?;
        let a = filled(gpu, d.m * d.k, 0.01, "bench a")?;
        let b = filled(gpu, d.k * d.n, 0.02, "bench b")?;
        for entry in [MatmulEntry::Main, MatmulEntry::MainScalar] {
            let name = match entry {
                MatmulEntry::Main => "main",
                MatmulEntry::MainScalar => "main_scalar",
            };
            let seconds = median_seconds(gpu, 5, || {
                for _ in 0..20 {
                    matmul::matmul_on(gpu, entry, &d, c.whole(), a.whole(), b.whole())?;
                }
                Ok(())
            })? / 20.0;
            report.push(
                format!("matmul/small {size}^3 [{name}]"),
                gflops(&d, seconds),
                "GFLOP/s",
            );
        }
    }
    Ok(())
}

/// The 1024³ matmul with checked and unchecked shader modules, runs interleaved so that a change
/// in machine load hits both alike.
fn matmul_checked_vs_unchecked(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let d = MatmulDims::dense(1, 1024, 1024, 1024);
    let [c, a, b] = matmul_buffers(gpu, &d)?;
    let run = |launch: Launch| {
        time_once(gpu, || {
            Ok(launch(gpu, &d, c.whole(), a.whole(), b.whole())?)
        })
    };
    run(matmul::matmul_unchecked)?;
    run(checked_matmul)?;
    let (mut unchecked, mut checked) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        unchecked.push(run(matmul::matmul_unchecked)?);
        checked.push(run(checked_matmul)?);
    }
    let (unchecked, checked) = (median(&mut unchecked), median(&mut checked));
    report.push(
        "matmul/modules 1024^3 unchecked",
        gflops(&d, unchecked),
        "GFLOP/s",
    );
    report.push(
        "matmul/modules 1024^3 checked",
        gflops(&d, checked),
        "GFLOP/s",
    );
    report.push(
        "matmul/modules 1024^3 speed-up unchecked over checked",
        checked / unchecked,
        "ratio",
    );
    Ok(())
}

/// One product of the peer MLP: `(label, dims)`, named by M×K×N.
fn mlp_product(
    label: &str,
    m: usize,
    k: usize,
    n: usize,
    trans: (bool, bool),
) -> (String, MatmulDims) {
    let d = MatmulDims {
        trans_a: trans.0,
        trans_b: trans.1,
        ..MatmulDims::dense(1, m, n, k)
    };
    (format!("{label} {m}x{k}x{n} [{}]", entry_name(&d)), d)
}

/// Forward `Y = X·W` (B×in · in×out), and backward `dX = dY·Wᵀ` (trans_b on the stored in×out
/// W) and `dW = Xᵀ·dY` (trans_a on the stored B×in X) for each distinct layer shape; then one
/// training step's whole set of products in one batch.
fn matmul_mlp(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let layers: Vec<(usize, usize)> = MLP_WIDTHS.windows(2).map(|w| (w[0], w[1])).collect();
    let b = MLP_BATCH;
    let mut distinct = layers.clone();
    distinct.dedup();
    for (i, &(input, output)) in distinct.iter().enumerate() {
        let layer = i + 1;
        for (label, d) in [
            mlp_product(&format!("fwd{layer}"), b, input, output, (false, false)),
            mlp_product(&format!("dX{layer}"), b, output, input, (false, true)),
            mlp_product(&format!("dW{layer}"), input, b, output, (true, false)),
        ] {
            let [c, x, y] = matmul_buffers(gpu, &d)?;
            let seconds = median_seconds(gpu, 5, || {
                Ok(matmul::matmul(gpu, &d, c.whole(), x.whole(), y.whole())?)
            })?;
            report.push(
                format!("matmul/mlp/{label}"),
                gflops(&d, seconds),
                "GFLOP/s",
            );
        }
    }
    // One step: forward through every layer, dW for every layer, dX for all but the first.
    // Checked and unchecked modules alternate run by run, so load changes hit both alike.
    let mut step = Vec::new();
    for (l, &(input, output)) in layers.iter().enumerate() {
        step.push(mlp_product("fwd", b, input, output, (false, false)).1);
        step.push(mlp_product("dW", input, b, output, (true, false)).1);
        if l > 0 {
            step.push(mlp_product("dX", b, output, input, (false, true)).1);
        }
    }
    let buffers = step
        .iter()
        .map(|d| matmul_buffers(gpu, d))
        .collect::<Result<Vec<_>>>()?;
    let flop: f64 = step.iter().map(|d| 2.0 * (d.m * d.n * d.k) as f64).sum();
    let launchers: [(&str, Launch); 2] = [
        ("unchecked", matmul::matmul_unchecked),
        ("checked", checked_matmul),
    ];
    let run_step = |launch: Launch| {
        time_once(gpu, || {
            for (d, [c, x, y]) in step.iter().zip(&buffers) {
                launch(gpu, d, c.whole(), x.whole(), y.whole())?;
            }
            Ok(())
        })
    };
    let mut times = [Vec::new(), Vec::new()];
    for run in 0..8 {
        for (i, (_, launch)) in launchers.iter().enumerate() {
            let seconds = run_step(*launch)?;
            if run > 0 {
                times[i].push(seconds); // run 0 is the warm-up
            }
        }
    }
    let count = step.len();
    for ((name, _), mut times) in launchers.into_iter().zip(times) {
        let seconds = median(&mut times);
        report.push(
            format!("matmul/mlp/step {count} products, {name} modules"),
            seconds * 1e3,
            "ms",
        );
        report.push(
            format!("matmul/mlp/step {count} products, {name} modules, rate"),
            flop / seconds / 1e9,
            "GFLOP/s",
        );
    }
    Ok(())
}

/// [`matmul::matmul`] on f32 slices, as a [`Launch`].
fn checked_matmul(
    gpu: &Gpu,
    d: &MatmulDims,
    c: DeviceSlice<'_>,
    a: DeviceSlice<'_>,
    b: DeviceSlice<'_>,
) -> plimsoll_kernels_wgsl::Result<()> {
    matmul::matmul(gpu, d, c, a, b)
}

type Launch = for<'a> fn(
    &Gpu,
    &MatmulDims,
    DeviceSlice<'a>,
    DeviceSlice<'a>,
    DeviceSlice<'a>,
) -> plimsoll_kernels_wgsl::Result<()>;

fn elementwise(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let len = ELEMENTWISE_LEN;
    let src = filled(gpu, len as usize, 1.5, "bench src")?;
    let dst = filled(gpu, len as usize, 0.0, "bench dst")?;
    let bytes = (len * 4) as f64;
    let seconds = median_seconds(gpu, 5, || Ok(fill::fill(gpu, dst.whole(), 2.5)?))?;
    report.push("elementwise/fill 16M f32", bytes / seconds / 1e9, "GB/s");
    let seconds = median_seconds(gpu, 5, || Ok(copy::copy(gpu, dst.whole(), src.whole())?))?;
    report.push(
        "elementwise/copy 16M f32",
        2.0 * bytes / seconds / 1e9,
        "GB/s",
    );
    let shape = [len as usize];
    let seconds = median_seconds(gpu, 5, || {
        let dims = BinaryDims {
            op: BinaryOp::Add,
            a_shape: &shape,
            b_shape: &shape,
        };
        Ok(binary::broadcast(
            gpu,
            &dims,
            dst.whole(),
            src.whole(),
            src.whole(),
        )?)
    })?;
    let add = 3.0 * bytes / seconds / 1e9;
    report.push("elementwise/add 16M f32", add, "GB/s");
    let copy_rate = report.value("elementwise/copy 16M f32").unwrap_or(f64::NAN);
    report.push("elementwise/add over copy", add / copy_rate, "ratio");
    let seconds = median_seconds(gpu, 5, || {
        let dims = BinaryDims {
            op: BinaryOp::Add,
            a_shape: &[4096, 4096],
            b_shape: &[4096],
        };
        Ok(binary::broadcast(
            gpu,
            &dims,
            dst.whole(),
            src.whole(),
            src.slice(0, 4096)?,
        )?)
    })?;
    report.push(
        "elementwise/add bias row (4096, 4096) + (4096)",
        (2.0 * bytes + 4.0 * 4096.0) / seconds / 1e9,
        "GB/s",
    );
    let seconds = median_seconds(gpu, 5, || {
        Ok(unary::forward(
            gpu,
            UnaryOp::Gelu,
            dst.whole(),
            src.whole(),
            1.0,
        )?)
    })?;
    report.push(
        "elementwise/gelu 16M f32",
        2.0 * bytes / seconds / 1e9,
        "GB/s",
    );
    // Attention's (B, T, 3, H, D) -> (3, B, H, T, D) with B 16, T 256, H 8, D 64 (a permute
    // whose innermost run of 64 stays contiguous; 6.3M elements).
    let (b, t, h, d) = (16u32, 256u32, 8u32, 64u32);
    let permuted = [3, b, h, t, d];
    let strides = [h * d, t * 3 * h * d, d, 3 * h * d, 1];
    let moved = permuted.iter().map(|&x| x as u64).product::<u64>();
    let seconds = median_seconds(gpu, 5, || {
        Ok(copy::strided_copy(
            gpu,
            dst.slice(0, moved)?,
            src.slice(0, moved)?,
            &permuted,
            &strides,
        )?)
    })?;
    report.push(
        "elementwise/strided_copy attention permute 6.3M f32",
        8.0 * moved as f64 / seconds / 1e9,
        "GB/s",
    );
    let seconds = median_seconds(gpu, 5, || {
        Ok(reduce::sum_all(gpu, dst.slice(0, 1)?, src.whole())?)
    })?;
    report.push(
        "reduce/sum_all 16M f32",
        (bytes + 4.0) / seconds / 1e9,
        "GB/s",
    );
    // (4096, 4096): axis 1 sums along rows (contiguous), axis 0 down columns (strided).
    let side = 4096usize;
    for axis in [1, 0] {
        let seconds = median_seconds(gpu, 5, || {
            let out = dst.slice(0, side as u64)?;
            Ok(reduce::sum_axis(
                gpu,
                out,
                src.whole(),
                &[side, side],
                axis,
            )?)
        })?;
        let moved = bytes + (side * 4) as f64;
        report.push(
            format!("reduce/sum_axis (4096, 4096) axis {axis}"),
            moved / seconds / 1e9,
            "GB/s",
        );
    }
    Ok(())
}

/// Per-dispatch cost of many tiny dispatches in one batch: one flush, one wait, divided.
fn dispatch_overhead(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let buffer = filled(gpu, 64, 0.0, "bench tiny")?;
    let seconds = median_seconds(gpu, 5, || {
        for i in 0..TINY_DISPATCHES {
            fill::fill(gpu, buffer.whole(), i as f32)?;
        }
        Ok(())
    })?;
    report.push(
        format!("dispatch_overhead/{TINY_DISPATCHES} tiny fills, one batch"),
        seconds / f64::from(TINY_DISPATCHES) * 1e6,
        "us",
    );
    Ok(())
}
