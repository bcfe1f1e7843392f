//! The row kernels (softmax, layer norm, cross-entropy) and attention under a bound on one
//! submission's GPU time ([`crate::pacing`]): a launch too long for it goes out in blocks of
//! rows or heads, each in a submission of its own, and every output is bit for bit the
//! unbounded launch's, in both row layouts, with a causal mask's period, grouped heads and
//! dropout. The values themselves are checked against the references in each family's tests.

use super::RowLayout;
use super::attention::{self, AttentionDims};
use super::cross_entropy::{self, CrossEntropyDims};
use super::layer_norm::{self, LayerNormDims};
use super::softmax::{self, SoftmaxKind};
use crate::testing::{DEADLINE, Rng, fresh_gpu};
use crate::{Category, DeviceBuffer, Gpu, Result};
use std::time::Duration;

/// A bound no dispatch fits: every block of the smallest size goes out alone.
const TINY: Duration = Duration::from_nanos(1);

/// Runs `record` (which records a launch into fresh outputs and returns them read back)
/// without a bound and under [`TINY`]; asserts the outputs equal bit for bit and at least
/// `least_early` early submissions under the bound (one per block after the first) on a CPU
/// adapter. On a GPU the piece count comes from the learned rates (`Gpu::pieces_within_bound`:
/// the variable part of a small launch's estimate is a few ns there, so fewer pieces), and at
/// least one early submission is asserted (seen on an H100: 14 and 34 where lavapipe gives 34
/// and 44).
fn same_under_a_bound(
    gpu: &Gpu,
    name: &str,
    least_early: u64,
    record: impl Fn() -> Result<Vec<Vec<f32>>>,
) -> Result<()> {
    gpu.set_max_submission(None);
    let whole = record()?;
    gpu.set_max_submission(Some(TINY));
    let early = gpu.pacing().early_submissions;
    let blocks = record()?;
    let early = gpu.pacing().early_submissions - early;
    gpu.set_max_submission(None);
    for (i, (w, b)) in whole.iter().zip(&blocks).enumerate() {
        let same = w.len() == b.len() && w.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{name}: output {i} changed when split");
    }
    let least_early = if gpu.is_cpu() {
        least_early
    } else {
        least_early.min(1)
    };
    assert!(
        early >= least_early,
        "{name}: {early} early submissions, at least {least_early} expected"
    );
    Ok(())
}

/// `data` at element `at` of a buffer of random guards (the launchers must add offsets).
fn upload_at(gpu: &Gpu, rng: &mut Rng, data: &[f32], at: usize) -> Result<DeviceBuffer> {
    let mut all = rng.vec_f32(at + data.len() + 3, -9.0, 9.0);
    all[at..at + data.len()].copy_from_slice(data);
    gpu.upload(&all, Category::Temporary, "bounded test")
}

/// `len` random values in `[lo, hi)` at element `at` of a buffer of random guards.
fn random_at(
    gpu: &Gpu,
    rng: &mut Rng,
    (len, lo, hi): (usize, f32, f32),
    at: usize,
) -> Result<DeviceBuffer> {
    let data = rng.vec_f32(len, lo, hi);
    upload_at(gpu, rng, &data, at)
}

/// A fresh output of `len` NaNs.
fn output(gpu: &Gpu, len: usize) -> Result<DeviceBuffer> {
    gpu.upload(&vec![f32::NAN; len], Category::Temporary, "bounded output")
}

/// Flushes and reads every buffer of `outputs` back.
fn read(gpu: &Gpu, outputs: &[&DeviceBuffer]) -> Result<Vec<Vec<f32>>> {
    gpu.flush("bounded test")?;
    outputs.iter().map(|b| gpu.read_all(b, DEADLINE)).collect()
}

#[test]
fn a_bounded_softmax_goes_out_in_blocks_of_rows_with_the_same_values() -> Result<()> {
    let gpu = fresh_gpu();
    let mut rng = Rng::new(41);
    // 5 heads of T = 7 causal rows: blocks of whole heads (a multiple of the mask's period).
    let (rows, cols) = (35usize, 7usize);
    let x = random_at(&gpu, &mut rng, (rows * cols, -4.0, 4.0), 5)?;
    let dy = random_at(&gpu, &mut rng, (rows * cols, -1.0, 1.0), 3)?;
    let n = (rows * cols) as u64;
    let (xs, dys) = (x.slice(5, n)?, dy.slice(3, n)?);
    let (r, c) = (rows as u64, cols as u64);
    for layout in RowLayout::available(&gpu) {
        for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
            same_under_a_bound(&gpu, &format!("{layout:?} {kind:?}"), r - 1, || {
                let (y, dx) = (output(&gpu, rows * cols)?, output(&gpu, rows * cols)?);
                softmax::forward_in(&gpu, layout, kind, y.whole(), xs, r, c)?;
                softmax::backward_in(&gpu, layout, kind, [dx.whole(), y.whole(), dys], r, c)?;
                read(&gpu, &[&y, &dx])
            })?;
        }
        same_under_a_bound(&gpu, &format!("{layout:?} causal"), 4, || {
            let y = output(&gpu, rows * cols)?;
            softmax::forward_causal_in(&gpu, layout, y.whole(), xs, r, c)?;
            read(&gpu, &[&y])
        })?;
    }
    Ok(())
}

#[test]
fn a_bounded_layer_norm_goes_out_in_blocks_of_rows_with_the_same_values() -> Result<()> {
    let gpu = fresh_gpu();
    let mut rng = Rng::new(42);
    let (rows, cols) = (19usize, 150usize);
    let n = rows * cols;
    let x = random_at(&gpu, &mut rng, (n, -3.0, 3.0), 1)?;
    let dy = random_at(&gpu, &mut rng, (n, -1.0, 1.0), 2)?;
    let gamma = random_at(&gpu, &mut rng, (cols, 0.5, 1.5), 3)?;
    let beta = random_at(&gpu, &mut rng, (cols, -0.5, 0.5), 0)?;
    let (xs, dys) = (x.slice(1, n as u64)?, dy.slice(2, n as u64)?);
    let (g, b) = (gamma.slice(3, cols as u64)?, beta.slice(0, cols as u64)?);
    for layout in RowLayout::available(&gpu) {
        for rms in [false, true] {
            let dims = LayerNormDims {
                rows: rows as u64,
                cols: cols as u64,
                eps: 1e-5,
                rms,
            };
            same_under_a_bound(
                &gpu,
                &format!("{layout:?} rms {rms}"),
                2 * (rows as u64 - 1),
                || {
                    let [y, dx] = [output(&gpu, n)?, output(&gpu, n)?];
                    let [mean, rstd] = [output(&gpu, rows)?, output(&gpu, rows)?];
                    let [dgamma, dbeta] = [output(&gpu, cols)?, output(&gpu, cols)?];
                    let stats = [mean.whole(), rstd.whole()];
                    layer_norm::forward_in(
                        &gpu,
                        layout,
                        &dims,
                        [y.whole(), stats[0], stats[1]],
                        [xs, g, b],
                    )?;
                    layer_norm::backward_in(
                        &gpu,
                        layout,
                        &dims,
                        [dx.whole(), dgamma.whole(), dbeta.whole()],
                        [xs, g, stats[0], stats[1]],
                        dys,
                    )?;
                    read(&gpu, &[&y, &mean, &rstd, &dx, &dgamma, &dbeta])
                },
            )?;
        }
    }
    Ok(())
}

#[test]
fn a_bounded_cross_entropy_goes_out_in_blocks_of_rows_with_the_same_values() -> Result<()> {
    let gpu = fresh_gpu();
    let mut rng = Rng::new(43);
    let (rows, cols) = (23usize, 45usize);
    let n = rows * cols;
    let logits = random_at(&gpu, &mut rng, (n, -5.0, 5.0), 3)?;
    let ids: Vec<u32> = (0..rows as u32 + 2)
        .map(|i| (i * 7 + 3) % cols as u32)
        .collect();
    let targets = gpu.upload(&ids, Category::Temporary, "targets")?;
    let per_row = random_at(&gpu, &mut rng, (rows, -1.0, 1.0), 1)?;
    let ls = logits.slice(3, n as u64)?;
    let ts = targets.slice(2, rows as u64)?;
    let dims = CrossEntropyDims {
        rows: rows as u64,
        cols: cols as u64,
        smoothing: 0.1,
    };
    for layout in RowLayout::available(&gpu) {
        // dloss one per row (its offset advances with the block) and one for all.
        for dloss in [per_row.slice(1, rows as u64)?, per_row.slice(4, 1)?] {
            let name = format!("{layout:?} dloss of {}", dloss.len());
            same_under_a_bound(&gpu, &name, 2 * (rows as u64 - 1), || {
                let [losses, dlogits] = [output(&gpu, rows)?, output(&gpu, n)?];
                cross_entropy::forward_in(&gpu, layout, &dims, losses.whole(), [ls, ts])?;
                cross_entropy::backward_in(
                    &gpu,
                    layout,
                    &dims,
                    dlogits.whole(),
                    [ls, ts, dloss],
                    0.25,
                )?;
                read(&gpu, &[&losses, &dlogits])
            })?;
        }
    }
    Ok(())
}

#[test]
fn a_bounded_attention_goes_out_in_blocks_of_heads_with_the_same_values_and_mask() -> Result<()> {
    let gpu = fresh_gpu();
    let mut rng = Rng::new(44);
    // Grouped heads (blocks of whole groups of query heads; key/value heads one by one in
    // the backward) and dropout (the mask counts heads from the launch's first).
    for (heads_batch, group, dropout) in [(4u64, 1u64, 0.0f32), (6, 2, 0.25)] {
        let (time, head_dim) = (20u64, 8u64);
        let dims = AttentionDims {
            heads_batch,
            group,
            time,
            head_dim,
            scale: 0.35,
            dropout,
            seed: 0x1234_5678_9abc,
        };
        let rows = (heads_batch * time * head_dim) as usize;
        let kv = rows / group as usize;
        let stats = (heads_batch * time) as usize;
        let q = random_at(&gpu, &mut rng, (rows, -1.0, 1.0), 1)?;
        let k = random_at(&gpu, &mut rng, (kv, -1.0, 1.0), 2)?;
        let v = random_at(&gpu, &mut rng, (kv, -1.0, 1.0), 3)?;
        let d_o = random_at(&gpu, &mut rng, (rows, -1.0, 1.0), 4)?;
        let inputs = [
            q.slice(1, rows as u64)?,
            k.slice(2, kv as u64)?,
            v.slice(3, kv as u64)?,
        ];
        let name = format!("{heads_batch} heads in groups of {group}, dropout {dropout}");
        // Forward and dq: one block per group; dk/dv: one per key/value head and member.
        let least = 2 * (heads_batch / group - 1);
        same_under_a_bound(&gpu, &name, least, || {
            let [o, lse] = [output(&gpu, rows)?, output(&gpu, stats)?];
            attention::forward(&gpu, &dims, [o.whole(), lse.whole()], inputs)?;
            let [dq, dk, dv] = [output(&gpu, rows)?, output(&gpu, kv)?, output(&gpu, kv)?];
            let delta = output(&gpu, stats)?;
            attention::backward(
                &gpu,
                &dims,
                [dq.whole(), dk.whole(), dv.whole(), delta.whole()],
                [
                    inputs[0],
                    inputs[1],
                    inputs[2],
                    o.whole(),
                    lse.whole(),
                    d_o.slice(4, rows as u64)?,
                ],
            )?;
            read(&gpu, &[&o, &lse, &dq, &dk, &dv, &delta])
        })?;
    }
    Ok(())
}

#[test]
fn a_bounded_broadcast_goes_out_in_ranges_with_the_same_values_in_place_too() -> Result<()> {
    use super::binary::{self, BinaryDims, BinaryOp};
    let gpu = fresh_gpu();
    let mut rng = Rng::new(45);
    // A general broadcast, a bias row (`suffix_v4`: whole vec4s) and a column broadcast.
    let cases: [(&[usize], &[usize]); 3] =
        [(&[37, 5, 6], &[5, 1]), (&[33, 8], &[8]), (&[9, 1], &[9, 7])];
    for (a_shape, b_shape) in cases {
        let dims = BinaryDims {
            op: BinaryOp::Mul,
            a_shape,
            b_shape,
        };
        let (na, nb) = (a_shape.iter().product(), b_shape.iter().product());
        let shape = binary::broadcast_shapes("test", a_shape, b_shape)?;
        let n = shape.len();
        let a_data = rng.vec_f32(na, -2.0, 2.0);
        let b = random_at(&gpu, &mut rng, (nb, -2.0, 2.0), 0)?;
        let dy = random_at(&gpu, &mut rng, (n, -1.0, 1.0), 0)?;
        let bs = b.slice(0, nb as u64)?;
        let name = format!("{a_shape:?} * {b_shape:?}");
        same_under_a_bound(&gpu, &name, 2, || {
            let a = gpu.upload(&a_data, Category::Temporary, "a")?;
            let [out, da, db] = [output(&gpu, n)?, output(&gpu, n)?, output(&gpu, n)?];
            binary::broadcast(&gpu, &dims, out.whole(), a.whole(), bs)?;
            let dys = dy.slice(0, n as u64)?;
            binary::backward(&gpu, &dims, da.whole(), db.whole(), a.whole(), bs, dys)?;
            // In place where a has the output's shape: no range may compute another's.
            if na == n {
                binary::broadcast(&gpu, &dims, a.whole(), a.whole(), bs)?;
            }
            read(&gpu, &[&out, &da, &db, &a])
        })?;
    }
    Ok(())
}

#[test]
fn bounded_dropout_fill_nonfinite_and_optimizers_go_out_in_ranges_with_the_same_values()
-> Result<()> {
    use super::optimizer::{self, AdamWConfig, AdamWStep, SgdConfig, SgdStep};
    use super::{dropout, fill, nonfinite};
    let gpu = fresh_gpu();
    let mut rng = Rng::new(46);
    let len = 1001usize;
    let mut x_data = rng.vec_f32(len, -2.0, 2.0);
    // Two non-finite values: the first one's index is what the check reports.
    x_data[700] = f32::INFINITY;
    x_data[900] = f32::NAN;
    let x = upload_at(&gpu, &mut rng, &x_data, 2)?;
    let xs = x.slice(2, len as u64)?;
    let grad = random_at(&gpu, &mut rng, (len, -1.0, 1.0), 4)?;
    let gs = grad.slice(4, len as u64)?;
    let start = rng.vec_f32(len + 1, -1.0, 1.0);
    // Slices at 0 (vec4 ranges and a scalar tail) and at 1 (scalar ranges only).
    for at in [0u64, 1] {
        same_under_a_bound(&gpu, &format!("at {at}"), 2, || {
            let y = output(&gpu, len)?;
            dropout::dropout(&gpu, y.whole(), xs, 0.3, 77)?;
            let filled = output(&gpu, len + 1)?;
            fill::fill(&gpu, filled.slice(at, len as u64)?, 2.5)?;
            let flags = gpu.upload(&[0u32, nonfinite::NO_INDEX], Category::Temporary, "flags")?;
            nonfinite::accumulate(&gpu, flags.whole(), xs)?;
            let [p_sgd, momentum, p_adam, m, v] =
                [(); 5].map(|()| gpu.upload(&start, Category::Temporary, "optimizer state"));
            let (p_sgd, momentum, p_adam, m, v) = (p_sgd?, momentum?, p_adam?, m?, v?);
            fn part(b: &DeviceBuffer, at: u64, len: usize) -> Result<crate::DeviceSlice<'_>> {
                b.slice(at, len as u64)
            }
            let sgd = SgdStep {
                config: SgdConfig {
                    lr: 0.1,
                    momentum: 0.9,
                    dampening: 0.0,
                    weight_decay: 0.01,
                    nesterov: true,
                },
                first_step: false,
                grad_scale: 0.5,
                control: None,
            };
            optimizer::sgd_step(
                &gpu,
                &sgd,
                part(&p_sgd, at, len)?,
                gs,
                Some(part(&momentum, at, len)?),
            )?;
            let adamw = AdamWStep {
                config: AdamWConfig {
                    lr: 0.01,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: 0.1,
                },
                step: 3,
                grad_scale: 1.0,
                control: None,
            };
            optimizer::adamw_step(
                &gpu,
                &adamw,
                part(&p_adam, at, len)?,
                gs,
                part(&m, at, len)?,
                part(&v, at, len)?,
            )?;
            let flags: Vec<u32> = {
                gpu.flush("bounded test")?;
                gpu.read_all(&flags, DEADLINE)?
            };
            assert_eq!(flags, [1, 700], "the first non-finite element is found");
            let mut out = read(&gpu, &[&y, &filled, &p_sgd, &momentum, &p_adam, &m, &v])?;
            out.push(flags.iter().map(|&f| f as f32).collect());
            Ok(out)
        })?;
    }
    Ok(())
}

#[test]
fn bounded_rotary_and_embedding_gather_go_out_in_blocks_with_the_same_values() -> Result<()> {
    use super::embedding;
    use super::rotary::{self, RotaryDims};
    let gpu = fresh_gpu();
    let mut rng = Rng::new(47);
    // 3 sequences of 5 positions: blocks of whole sequences (row r is position r % 5).
    let dims = RotaryDims {
        rows: 15,
        time: 5,
        head_dim: 6,
        base: 10_000.0,
        offset: 7,
    };
    let n = (dims.rows * dims.head_dim) as usize;
    let x = random_at(&gpu, &mut rng, (n, -1.0, 1.0), 3)?;
    let xs = x.slice(3, n as u64)?;
    let (vocab, dim, tokens) = (11u64, 6u64, 9usize);
    let table = random_at(&gpu, &mut rng, ((vocab * dim) as usize, -1.0, 1.0), 1)?;
    let ts = table.slice(1, vocab * dim)?;
    // An id past the table: a row of NaN, written by whichever block holds it.
    let ids: Vec<u32> = (0..tokens as u32)
        .map(|t| if t == 6 { 99 } else { (t * 5) % 11 })
        .collect();
    let ids = gpu.upload(&ids, Category::Temporary, "ids")?;
    same_under_a_bound(&gpu, "rotary and gather", 2, || {
        let [y, back, rows] = [
            output(&gpu, n)?,
            output(&gpu, n)?,
            output(&gpu, tokens * 6)?,
        ];
        rotary::rotary(&gpu, &dims, y.whole(), xs, false)?;
        rotary::rotary(&gpu, &dims, back.whole(), y.whole(), true)?;
        embedding::gather(&gpu, rows.whole(), ts, ids.whole(), vocab, dim)?;
        read(&gpu, &[&y, &back, &rows])
    })
}

#[test]
fn bounded_16_bit_ops_and_conversions_go_out_in_ranges_with_the_same_values() -> Result<()> {
    use super::binary::{self, BinaryDims, BinaryOp};
    use super::convert::{self, Halves, f16_words};
    use super::unary::{self, UnaryOp};
    for (path, gpu) in crate::testing::f16_devices() {
        let mut rng = Rng::new(48);
        let len = 301u64;
        let x = random_at(&gpu, &mut rng, (len as usize, -3.0, 3.0), 0)?;
        let b = random_at(&gpu, &mut rng, (len as usize, -3.0, 3.0), 0)?;
        let (xs, bs) = (x.slice(0, len)?, b.slice(0, len)?);
        let shape = [len as usize];
        let dims = BinaryDims {
            op: BinaryOp::Mul,
            a_shape: &shape,
            b_shape: &shape,
        };
        same_under_a_bound(&gpu, &format!("{path:?}"), 2, || {
            let words = |what| {
                let zeros = vec![0u32; f16_words(len) as usize + 1];
                gpu.upload(&zeros, Category::Temporary, what)
            };
            let [hx, hb, hy, hz, hs] = ["x", "b", "y", "z", "s"].map(words);
            let (hx, hb, hy, hz, hs) = (hx?, hb?, hy?, hz?, hs?);
            // x from the high half of its first word: partly filled first and last words.
            let at = |buffer, offset| Halves::of(buffer, offset, len);
            convert::f32_to_f16(&gpu, at(&hx, 1)?, xs)?;
            convert::f32_to_f16(&gpu, at(&hb, 0)?, bs)?;
            unary::forward_f16(&gpu, UnaryOp::Tanh, at(&hy, 0)?, at(&hx, 1)?, 1.0)?;
            binary::broadcast_f16(&gpu, &dims, at(&hz, 0)?, at(&hx, 1)?, at(&hb, 0)?)?;
            binary::scalar_f16(&gpu, BinaryOp::Sub, at(&hs, 0)?, at(&hy, 0)?, 0.5, false)?;
            // In place: a range that computed another's elements would apply the op twice.
            unary::forward_f16(&gpu, UnaryOp::Tanh, at(&hy, 0)?, at(&hy, 0)?, 1.0)?;
            binary::scalar_f16(&gpu, BinaryOp::Sub, at(&hs, 0)?, at(&hs, 0)?, 0.5, true)?;
            binary::broadcast_f16(&gpu, &dims, at(&hz, 0)?, at(&hz, 0)?, at(&hb, 0)?)?;
            let back = output(&gpu, len as usize)?;
            convert::f16_to_f32(&gpu, back.whole(), at(&hz, 0)?)?;
            gpu.flush("bounded test")?;
            let mut out = Vec::new();
            for buffer in [&hx, &hb, &hy, &hz, &hs] {
                let words: Vec<u32> = gpu.read_all(buffer, DEADLINE)?;
                out.push(words.into_iter().map(f32::from_bits).collect());
            }
            out.push(gpu.read_all(&back, DEADLINE)?);
            Ok(out)
        })?;
    }
    Ok(())
}

#[test]
fn bounded_strided_copies_go_out_in_ranges_with_the_same_values() -> Result<()> {
    use super::convert::Halves;
    use super::copy;
    let gpu = fresh_gpu();
    let mut rng = Rng::new(49);
    let src = random_at(&gpu, &mut rng, (2500, -1.0, 1.0), 0)?;
    // A transpose (an element per invocation), a permutation of vec4s, runs of 2 vec4s, and
    // a transpose of halves (a word per invocation).
    let cases: [(&[u32], &[u32]); 3] = [
        (&[30, 25], &[1, 30]),
        (&[3, 50, 4], &[4, 12, 1]),
        (&[10, 30, 8], &[8, 80, 1]),
    ];
    same_under_a_bound(&gpu, "strided copies", 2, || {
        let mut outs = Vec::new();
        for (shape, strides) in cases {
            let len: u32 = shape.iter().product();
            let dst = output(&gpu, len as usize)?;
            copy::strided_copy(&gpu, dst.whole(), src.slice(0, 2500)?, shape, strides)?;
            outs.push(dst);
        }
        let halves = output(&gpu, 400)?;
        let (from, to) = (Halves::of(&src, 1, 750)?, Halves::of(&halves, 0, 750)?);
        copy::strided_copy_f16(&gpu, to, from, &[30, 25], &[1, 30])?;
        outs.push(halves);
        read(&gpu, &outs.iter().collect::<Vec<_>>())
    })
}

#[test]
fn bounded_axis_reductions_and_sums_of_squares_go_out_in_ranges_with_the_same_values() -> Result<()>
{
    use super::reduce;
    let gpu = fresh_gpu();
    let mut rng = Rng::new(50);
    let shape = [3usize, 70, 5];
    let n: usize = shape.iter().product();
    let x = random_at(&gpu, &mut rng, (n, -2.0, 2.0), 1)?;
    let xs = x.slice(1, n as u64)?;
    // Sums of squares over several chunks of 256 (the last one partial), from a vec4 start.
    let long = random_at(&gpu, &mut rng, (1500, -1.0, 1.0), 0)?;
    let chunks = reduce::squares_chunks(1500) as usize;
    same_under_a_bound(&gpu, "axis reductions", 2, || {
        let mut outs = Vec::new();
        // Over the middle axis (outer 3, inner 5) and the first (outer 1: a bias gradient).
        for axis in [1usize, 0] {
            let kept: usize = n / shape[axis];
            let [sum, mean, max, idx] = [(); 4].map(|()| output(&gpu, kept));
            let (sum, mean, max, idx) = (sum?, mean?, max?, idx?);
            reduce::sum_axis(&gpu, sum.whole(), xs, &shape, axis)?;
            reduce::mean_axis(&gpu, mean.whole(), xs, &shape, axis)?;
            reduce::max_axis(&gpu, max.whole(), idx.whole(), xs, &shape, axis)?;
            let dx = output(&gpu, n)?;
            reduce::max_backward(&gpu, dx.whole(), sum.whole(), idx.whole(), &shape, axis)?;
            outs.extend([sum, mean, max, idx, dx]);
        }
        let squares = output(&gpu, chunks)?;
        reduce::sum_squares_chunks(&gpu, squares.whole(), long.slice(0, 1500)?)?;
        outs.push(squares);
        if super::subgroup_rows(&gpu).is_some() {
            let squares = output(&gpu, chunks)?;
            let sg = RowLayout::SubgroupPerRow;
            reduce::sum_squares_chunks_in(&gpu, sg, squares.whole(), long.slice(0, 1500)?)?;
            outs.push(squares);
        }
        read(&gpu, &outs.iter().collect::<Vec<_>>())
    })
}
