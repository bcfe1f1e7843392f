//! Kernel families beyond matmul and the elementwise ops, for `cargo xtask bench kernels`: the
//! row kernels (softmax and layer norm in each layout the device has, cross-entropy, the sums
//! of squares by chunks), the embedding, AdamW and
//! the f16 conversions, each as GB/s of what it reads and writes once; and ResNet-18's first
//! convolutions, as GFLOP/s beside the matmul of the same product.

use anyhow::Result;
use plimsoll_kernels_wgsl::kernels::TensorLaunches;
use plimsoll_kernels_wgsl::kernels::conv2d::{self, Conv2dDims};
use plimsoll_kernels_wgsl::kernels::convert::{self, F16Path, Halves};
use plimsoll_kernels_wgsl::kernels::cross_entropy::{self, CrossEntropyDims};
use plimsoll_kernels_wgsl::kernels::embedding;
use plimsoll_kernels_wgsl::kernels::layer_norm::{self, LayerNormDims};
use plimsoll_kernels_wgsl::kernels::matmul::{self, MatmulDims};
use plimsoll_kernels_wgsl::kernels::optimizer::{self, AdamWConfig, AdamWStep};
use plimsoll_kernels_wgsl::kernels::reduce;
use plimsoll_kernels_wgsl::kernels::softmax::{self, RowLayout, SoftmaxKind};
use plimsoll_kernels_wgsl::{Category, DeviceBuffer, Gpu};

use super::Report;
use super::kernels::{filled, median_seconds};

/// The row kernels (softmax and layer norm in each layout the device has; cross-entropy) at few long rows and
/// many short ones, GB/s of the rows read and written.
pub(super) fn row_kernels(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let x = filled(gpu, 1 << 22, 0.25, "bench rows x")?;
    let y = filled(gpu, 1 << 22, 0.0, "bench rows y")?;
    for (rows, cols) in [
        (32u64, 1u64 << 17),
        (256, 16384),
        (1024, 4096),
        (16384, 256),
        (65536, 64),
        (262144, 16),
    ] {
        let len = rows * cols;
        for layout in RowLayout::available(gpu) {
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
            let chosen = chosen_mark(softmax::row_layout(gpu, rows, cols) == layout);
            report.push(
                format!("rows/softmax ({rows}, {cols}) [{layout:?}{chosen}]"),
                8.0 * len as f64 / seconds / 1e9,
                "GB/s",
            );
        }
    }
    // The gradient norm's sums of squares by chunks of 256, over 4 Mi elements.
    let len = 1u64 << 22;
    let chunks = reduce::squares_chunks(len);
    for layout in [RowLayout::InvocationPerRow, RowLayout::SubgroupPerRow] {
        if layout == RowLayout::SubgroupPerRow && !RowLayout::available(gpu).contains(&layout) {
            continue;
        }
        let seconds = median_seconds(gpu, 5, || {
            Ok(reduce::sum_squares_chunks_in(
                gpu,
                layout,
                y.slice(0, chunks)?,
                x.slice(0, len)?,
            )?)
        })?;
        let chosen = chosen_mark(reduce::squares_layout(gpu) == layout);
        report.push(
            format!("rows/sum_squares_chunks ({len}) [{layout:?}{chosen}]"),
            4.0 * len as f64 / seconds / 1e9,
            "GB/s",
        );
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
    for layout in RowLayout::available(gpu) {
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
            Ok(layer_norm::forward_in(gpu, layout, &dims, outputs, inputs)?)
        })?;
        let chosen = chosen_mark(softmax::row_layout(gpu, rows, cols) == layout);
        report.push(
            format!("rows/layer_norm forward ({rows}, {cols}) [{layout:?}{chosen}]"),
            8.0 * len as f64 / seconds / 1e9,
            "GB/s",
        );
    }
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
    let step = first_adamw_step(0.0);
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

/// ResNet-18's first convolutions (torchvision's shapes: the 7x7 stem, a 3x3 of layer1, the
/// strided 3x3 and the 1x1 shortcut of layer2) on one 224x224 image: GFLOP/s of the `conv2d`
/// kernels' forward and both gradients, beside the tuned matmul of the same product (the
/// implicit GEMM: output positions x out channels x in channels · kernel taps); each on the
/// path the launchers choose and by direct summation.
pub(super) fn conv_layers(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let layers = [
        ("conv1 7x7/2 3->64 @224", 3, 224, 64, 7, 2, 3),
        ("layer1 3x3 64->64 @56", 64, 56, 64, 3, 1, 1),
        ("layer2 3x3/2 64->128 @56", 64, 56, 128, 3, 2, 1),
        ("layer2 1x1/2 64->128 @56", 64, 56, 128, 1, 2, 0),
    ];
    for (name, c, side, o, k, stride, pad) in layers {
        let dims = Conv2dDims {
            batch: 1,
            in_channels: c,
            in_size: [side, side],
            out_channels: o,
            kernel: [k, k],
            stride: [stride, stride],
            padding: [pad, pad],
            dilation: [1, 1],
            groups: 1,
        };
        let x = filled(gpu, dims.input_len() as usize, 0.01, "bench conv x")?;
        let w = filled(gpu, dims.weight_len() as usize, 0.02, "bench conv w")?;
        let y = filled(gpu, dims.output_len() as usize, 0.0, "bench conv y")?;
        let dx = filled(gpu, dims.input_len() as usize, 0.0, "bench conv dx")?;
        let dw = filled(gpu, dims.weight_len() as usize, 0.0, "bench conv dw")?;
        let [oh, ow] = dims.out_size()?;
        let (m, n, kk) = (oh * ow, o, c * k * k);
        let flops = 2.0 * (m * n * kk) as f64;
        let (xs, ys, ws, dxs, dws) = (x.whole(), y.whole(), w.whole(), dx.whole(), dw.whole());
        let path = conv2d::path(gpu, &dims);
        let runs: [(String, &dyn Fn() -> Result<()>); 6] = [
            (format!("forward [{path:?}]"), &|| {
                Ok(conv2d::forward(gpu, &dims, ys, xs, ws, None)?)
            }),
            (format!("input gradient [{path:?}]"), &|| {
                Ok(conv2d::backward_input(gpu, &dims, dxs, ys, ws)?)
            }),
            (format!("weight gradient [{path:?}]"), &|| {
                Ok(conv2d::backward_weight(gpu, &dims, dws, xs, ys)?)
            }),
            ("forward [Direct]".into(), &|| {
                Ok(conv2d::forward_direct(gpu, &dims, ys, xs, ws, None)?)
            }),
            ("input gradient [Direct]".into(), &|| {
                Ok(conv2d::backward_input_direct(gpu, &dims, dxs, ys, ws)?)
            }),
            ("weight gradient [Direct]".into(), &|| {
                Ok(conv2d::backward_weight_direct(gpu, &dims, dws, xs, ys)?)
            }),
        ];
        for (what, run) in runs {
            let seconds = median_seconds(gpu, 3, run)?;
            report.push(
                format!("conv/resnet18 {name} {what}"),
                flops / seconds / 1e9,
                "GFLOP/s",
            );
        }
        let d = MatmulDims::dense(1, m as usize, n as usize, kk as usize);
        let (c_buf, a_buf, b_buf) = (
            filled(gpu, (m * n) as usize, 0.0, "bench c")?,
            filled(gpu, (m * kk) as usize, 0.01, "bench a")?,
            filled(gpu, (kk * n) as usize, 0.02, "bench b")?,
        );
        let seconds = median_seconds(gpu, 3, || {
            Ok(matmul::matmul(
                gpu,
                &d,
                c_buf.whole(),
                a_buf.whole(),
                b_buf.whole(),
            )?)
        })?;
        report.push(
            format!("conv/resnet18 {name} matmul {m}x{n}x{kk}"),
            flops / seconds / 1e9,
            "GFLOP/s",
        );
    }
    Ok(())
}

/// What a layout's row says when it is the launchers' choice.
fn chosen_mark(chosen: bool) -> &'static str {
    if chosen { ", chosen" } else { "" }
}

/// AdamW's first step at PyTorch's defaults with `weight_decay`.
fn first_adamw_step(weight_decay: f64) -> AdamWStep<'static> {
    AdamWStep {
        config: AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        },
        step: 1,
        grad_scale: 1.0,
        control: None,
    }
}

/// The parameters of nanoGPT's GPU configuration (6 layers, 6 heads, width 384, context 256,
/// vocabulary 65) as `plimsoll_nn::Gpt` holds them, in module order: each one's length and
/// whether AdamW decays it (two or more dimensions, nanoGPT's groups).
fn gpt_parameters(gpu: &Gpu) -> Result<Vec<(usize, bool)>> {
    use plimsoll_nn::Module;
    let config = plimsoll_nn::GptConfig {
        vocab_size: 65,
        block_size: 256,
        n_layer: 6,
        n_head: 6,
        n_embd: 384,
    };
    let model = plimsoll_nn::Gpt::new(gpu, config, 1)?;
    Ok(model
        .parameters()
        .iter()
        .map(|(_, t)| (t.numel(), t.rank() >= 2))
        .collect())
}

/// Dispatches in the device's latest submission (each timed call is one: it flushes once).
fn last_submission_dispatches(gpu: &Gpu) -> f64 {
    gpu.recent_submissions()
        .0
        .last()
        .map_or(f64::NAN, |s| f64::from(s.dispatches))
}

/// AdamW and the gradient norm's sums of squares over every parameter of nanoGPT's GPU
/// configuration: one launch per tensor against the multi-tensor launchers (`adamw_steps_in`,
/// `sum_squares_many_in`), milliseconds per call, and how many dispatches each records.
pub(super) fn multi_tensor(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let parameters = gpt_parameters(gpu)?;
    let total: usize = parameters.iter().map(|&(len, _)| len).sum();
    let mut buffers = Vec::new();
    for &(len, _) in &parameters {
        buffers.push([
            filled(gpu, len, 0.5, "bench param")?,
            filled(gpu, len, 0.01, "bench grad")?,
            filled(gpu, len, 0.0, "bench exp_avg")?,
            filled(gpu, len, 0.0, "bench exp_avg_sq")?,
        ]);
    }
    let step = first_adamw_step(0.01);
    let tensors: Vec<optimizer::AdamWTensor<'_>> = buffers
        .iter()
        .zip(&parameters)
        .map(|([p, g, m, v], &(_, decays))| optimizer::AdamWTensor {
            param: p.whole(),
            grad: g.whole(),
            exp_avg: m.whole(),
            exp_avg_sq: v.whole(),
            decays,
        })
        .collect();
    let name = format!(
        "{} tensors, {:.1}M parameters",
        parameters.len(),
        total as f64 / 1e6
    );
    let sources: Vec<reduce::SquaresSource<'_>> = buffers
        .iter()
        .map(|[_, g, _, _]| reduce::SquaresSource::Tensor(g.whole()))
        .collect();
    let outputs: u64 = sources.iter().map(reduce::SquaresSource::outputs).sum();
    let out = filled(gpu, outputs as usize, 0.0, "bench squares")?;
    let adamw_chosen = TensorLaunches::chosen(gpu, &optimizer::ADAMW_MULTI);
    let squares_chosen = TensorLaunches::chosen(gpu, &reduce::SQUARES_MULTI);
    for launches in [TensorLaunches::OnePerTensor, TensorLaunches::Multi] {
        let how = launches.describe();
        let seconds = median_seconds(gpu, 5, || {
            Ok(optimizer::adamw_steps_in(gpu, launches, &step, &tensors)?)
        })?;
        let mark = chosen_mark(adamw_chosen == launches);
        report.push(
            format!("multi/adamw {how}{mark}, {name}"),
            seconds * 1e3,
            "ms",
        );
        let dispatches = last_submission_dispatches(gpu);
        report.push(
            format!("multi/adamw {how}, dispatches"),
            dispatches,
            "dispatches",
        );
        let seconds = median_seconds(gpu, 5, || {
            Ok(reduce::sum_squares_many_in(
                gpu,
                launches,
                out.whole(),
                &sources,
            )?)
        })?;
        let mark = chosen_mark(squares_chosen == launches);
        report.push(
            format!("multi/squares {how}{mark}, {name}"),
            seconds * 1e3,
            "ms",
        );
        let dispatches = last_submission_dispatches(gpu);
        report.push(
            format!("multi/squares {how}, dispatches"),
            dispatches,
            "dispatches",
        );
    }
    Ok(())
}
