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
/// `least_early` early submissions under the bound (one per block after the first).
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
    for layout in [RowLayout::InvocationPerRow, RowLayout::WorkgroupPerRow] {
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
    let (rows, cols) = (19usize, 37usize);
    let n = rows * cols;
    let x = random_at(&gpu, &mut rng, (n, -3.0, 3.0), 1)?;
    let dy = random_at(&gpu, &mut rng, (n, -1.0, 1.0), 2)?;
    let gamma = random_at(&gpu, &mut rng, (cols, 0.5, 1.5), 3)?;
    let beta = random_at(&gpu, &mut rng, (cols, -0.5, 0.5), 0)?;
    let (xs, dys) = (x.slice(1, n as u64)?, dy.slice(2, n as u64)?);
    let (g, b) = (gamma.slice(3, cols as u64)?, beta.slice(0, cols as u64)?);
    for layout in [RowLayout::InvocationPerRow, RowLayout::WorkgroupPerRow] {
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
    for layout in [RowLayout::InvocationPerRow, RowLayout::WorkgroupPerRow] {
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
