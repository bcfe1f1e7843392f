//! Kernel families beyond matmul and the elementwise ops, for `cargo xtask bench kernels`: the
//! row kernels (softmax in both layouts, layer norm, cross-entropy), the embedding, AdamW and
//! the f16 conversions, each as GB/s of what it reads and writes once.

use anyhow::Result;
use plimsoll_kernels_wgsl::kernels::convert::{self, F16Path, Halves};
use plimsoll_kernels_wgsl::kernels::cross_entropy::{self, CrossEntropyDims};
use plimsoll_kernels_wgsl::kernels::embedding;
use plimsoll_kernels_wgsl::kernels::layer_norm::{self, LayerNormDims};
use plimsoll_kernels_wgsl::kernels::optimizer::{self, AdamWConfig, AdamWStep};
use plimsoll_kernels_wgsl::kernels::softmax::{self, RowLayout, SoftmaxKind};
use plimsoll_kernels_wgsl::{Category, DeviceBuffer, Gpu};

use super::Report;
use super::kernels::{filled, median_seconds};

/// The row kernels (softmax in both layouts; layer norm; cross-entropy) at few long rows and
/// many short ones, GB/s of the rows read and written.
pub(super) fn row_kernels(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let x = filled(gpu, 1 << 22, 0.25, "bench rows x")?;
    let y = filled(gpu, 1 << 22, 0.0, "bench rows y")?;
    for (rows, cols) in [
        (32u64, 1u64 << 17),
        (256, 16384),
        (1024, 4096),
        (16384, 256),
    ] {
        let len = rows * cols;
        for layout in [RowLayout::InvocationPerRow, RowLayout::WorkgroupPerRow] {
            let seconds = median_seconds(gpu, 5, || {
                Ok(softmax::forward_in(
                    gpu,
                    layout,
                    SoftmaxKind::Softmax,
                    y.slice(0, len)?,
                    x.slice(0, len)?,
                    rows,
                    cols,
                )?)
            })?;
            let chosen = if softmax::row_layout(gpu, rows, cols) == layout {
                ", chosen"
            } else {
                ""
            };
            report.push(
                format!("rows/softmax ({rows}, {cols}) [{layout:?}{chosen}]"),
                8.0 * len as f64 / seconds / 1e9,
                "GB/s",
            );
        }
    }
    other_families(gpu, report, (&x, &y))
}

/// Layer norm, cross-entropy, the embedding and AdamW at GPT-like sizes, GB/s of what each
/// reads and writes once.
fn other_families(
    gpu: &Gpu,
    report: &mut Report,
    (x, y): (&DeviceBuffer, &DeviceBuffer),
) -> Result<()> {
    let (rows, cols) = (4096u64, 512u64);
    let len = rows * cols;
    let params = filled(gpu, 4 * cols as usize, 1.0, "bench ln params")?;
    let stats = filled(gpu, 2 * rows as usize, 0.0, "bench ln stats")?;
    let dims = LayerNormDims {
        rows,
        cols,
        eps: 1e-5,
        rms: false,
    };
    let seconds = median_seconds(gpu, 5, || {
        let outputs = [
            y.slice(0, len)?,
            stats.slice(0, rows)?,
            stats.slice(rows, rows)?,
        ];
        let inputs = [
            x.slice(0, len)?,
            params.slice(0, cols)?,
            params.slice(cols, cols)?,
        ];
        Ok(layer_norm::forward(
            gpu, &dims, outputs, inputs[0], inputs[1], inputs[2],
        )?)
    })?;
    report.push(
        format!("rows/layer_norm forward ({rows}, {cols})"),
        8.0 * len as f64 / seconds / 1e9,
        "GB/s",
    );
    let targets = gpu.upload(
        &vec![3u32; rows as usize],
        Category::Temporary,
        "bench targets",
    )?;
    let ce = CrossEntropyDims {
        rows,
        cols,
        smoothing: 0.0,
    };
    let seconds = median_seconds(gpu, 5, || {
        Ok(cross_entropy::forward(
            gpu,
            &ce,
            stats.slice(0, rows)?,
            x.slice(0, len)?,
            targets.whole(),
        )?)
    })?;
    report.push(
        format!("rows/cross_entropy forward ({rows}, {cols})"),
        4.0 * len as f64 / seconds / 1e9,
        "GB/s",
    );
    // scatter_add sorts the tokens by id, then sums each table element over its row's tokens
    let (vocab, dim, tokens) = (128u64, 256u64, 1024u64);
    let ids = gpu.upload(
        &(0..tokens as u32)
            .map(|t| t % vocab as u32)
            .collect::<Vec<u32>>(),
        Category::Temporary,
        "bench ids",
    )?;
    let seconds = median_seconds(gpu, 5, || {
        Ok(embedding::gather(
            gpu,
            y.slice(0, tokens * dim)?,
            x.slice(0, vocab * dim)?,
            ids.whole(),
            vocab,
            dim,
        )?)
    })?;
    report.push(
        format!("embedding/gather {tokens} tokens x {dim}"),
        8.0 * (tokens * dim) as f64 / seconds / 1e9,
        "GB/s",
    );
    let seconds = median_seconds(gpu, 3, || {
        Ok(embedding::scatter_add(
            gpu,
            y.slice(0, vocab * dim)?,
            x.slice(0, tokens * dim)?,
            ids.whole(),
            vocab,
            dim,
        )?)
    })?;
    report.push(
        format!("embedding/scatter_add {tokens} tokens x {dim} into {vocab} rows"),
        4.0 * (tokens * dim + vocab * dim) as f64 / seconds / 1e9,
        "GB/s",
    );
    let n = 1u64 << 20;
    let moments = filled(gpu, 2 * n as usize, 0.0, "bench moments")?;
    let step = AdamWStep {
        config: AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        step: 1,
        grad_scale: 1.0,
    };
    let seconds = median_seconds(gpu, 5, || {
        Ok(optimizer::adamw_step(
            gpu,
            &step,
            y.slice(0, n)?,
            x.slice(0, n)?,
            moments.slice(0, n)?,
            moments.slice(n, n)?,
        )?)
    })?;
    report.push(
        "optimizer/adamw 1M parameters",
        7.0 * 4.0 * n as f64 / seconds / 1e9,
        "GB/s",
    );
    convert_family(gpu, report, (x, y))
}

/// f32 to f16 and back (what `--precision f16` adds per activation), on each path the device
/// has, at an odd half offset; GB/s of the 6 bytes per element read and written.
fn convert_family(
    gpu: &Gpu,
    report: &mut Report,
    (x, y): (&DeviceBuffer, &DeviceBuffer),
) -> Result<()> {
    let n = 1u64 << 21;
    for path in [F16Path::Native, F16Path::Packed] {
        if path == F16Path::Native && gpu.set_f16_path(path).is_err() {
            continue;
        }
        let seconds = median_seconds(gpu, 5, || {
            let halves = Halves::of(y, 1, n)?;
            Ok(convert::f32_to_f16_on(gpu, path, halves, x.slice(0, n)?)?)
        })?;
        report.push(
            format!("convert/f32_to_f16 {path:?} 2M elements"),
            6.0 * n as f64 / seconds / 1e9,
            "GB/s",
        );
        let seconds = median_seconds(gpu, 5, || {
            let halves = Halves::of(y, 1, n)?;
            Ok(convert::f16_to_f32_on(gpu, path, x.slice(0, n)?, halves)?)
        })?;
        report.push(
            format!("convert/f16_to_f32 {path:?} 2M elements"),
            6.0 * n as f64 / seconds / 1e9,
            "GB/s",
        );
    }
    Ok(())
}
