//! The `cross_entropy` launchers against [`reference`](super::reference) (loss and gradient,
//! label smoothing, out-of-range targets, both row layouts), their argument and loop-limit
//! checks, and the reference itself against hand-worked values and finite differences.

use super::reference;
use super::CrossEntropyDims;
use crate::kernels::{RowLayout, largest_within};
use crate::testing::{assert_close, assert_loop_limit, dot, gpu_and_rng, gpu_and_temporaries, Guarded, largest_at_the_loop_limit, with_loop_limit, numeric_gradient, Rng, upload_u32_at};
use crate::{Error, Gpu, Result};

// Tolerances. Loss: lse and the row mean are f32 sums of <= 1000 terms on the GPU (f64 in the
// reference) of magnitude <= ~8, so the absolute error of a loss of size ~log(cols) + 8 stays
// near 1e-6 (atol 1e-5, rtol 1e-5). Gradient: softmax_j - q_j with exp(x - lse) accurate to a
// few ulp once lse is (abs error ~1e-6), i.e. relative ~2e-6 of p_j <= 1, times g*scale <= 2:
// atol 4e-6, rtol 1e-4.
const LOSS_TOL: (f64, f64) = (1e-5, 1e-5);
const GRAD_TOL: (f64, f64) = (4e-6, 1e-4);

/// What the backward's `dloss` holds (the launcher tells them apart by its length).
#[derive(Clone, Copy, Debug)]
enum LossGradient {
    /// One value: the gradient of a reduced loss, for every row.
    Broadcast,
    /// `rows` values: one per row loss.
    PerRow,
}

struct Case {
    layout: RowLayout,
    rows: usize,
    cols: usize,
    smoothing: f32,
    dloss: LossGradient,
}

fn check_case(gpu: &Gpu, rng: &mut Rng, case: &Case) -> Result<()> {
    let Case {
        layout,
        rows,
        cols,
        smoothing,
        dloss,
    } = *case;
    let name = |what: &str| format!("{what} {layout:?} [{rows}, {cols}] eps {smoothing} {dloss:?}");
    let logits = rng.vec_f32(rows * cols, -4.0, 4.0);
    let mut targets: Vec<u32> = (0..rows).map(|_| rng.below(cols as u64) as u32).collect();
    if rows == 37 {
        targets[5] = cols as u32; // invalid: that row's loss and gradient are NaN, no OOB read
    }
    // Mean reduction (scale 1/rows) of the broadcast gradient of the reduced loss; a per-row
    // gradient with scale 1 (sum / none).
    let (dloss_values, scale) = match dloss {
        LossGradient::Broadcast => (vec![rng.f32_in(0.5, 2.0)], 1.0 / rows as f32),
        LossGradient::PerRow => (rng.vec_f32(rows, -2.0, 2.0), 1.0),
    };

    let logits_gpu = Guarded::upload(gpu, rng, &logits, 3, "logits")?;
    let targets_gpu = upload_u32_at(gpu, &targets, 5, "targets")?;
    let losses_gpu = Guarded::random(gpu, rng, rows, 2, "losses")?;
    let dloss_gpu = Guarded::upload(gpu, rng, &dloss_values, 1, "dloss")?;
    let dlogits_gpu = Guarded::random(gpu, rng, rows * cols, 6, "dlogits")?;
    let dims = CrossEntropyDims {
        rows: rows as u64,
        cols: cols as u64,
        smoothing,
    };
    let targets_s = targets_gpu.slice(5, rows as u64)?;
    let logits_s = logits_gpu.slice()?;
    let losses_s = losses_gpu.slice()?;
    super::forward_in(gpu, layout, &dims, losses_s, [logits_s, targets_s])?;
    let (dlogits_s, dloss_s) = (dlogits_gpu.slice()?, dloss_gpu.slice()?);
    let inputs = [logits_s, targets_s, dloss_s];
    super::backward_in(gpu, layout, &dims, dlogits_s, inputs, scale)?;

    let want = reference::forward(&logits, &targets, rows, cols, smoothing);
    let (atol, rtol) = LOSS_TOL;
    losses_gpu
        .check(gpu, &name("cross_entropy forward"), &want, atol, rtol)?;
    let want = reference::backward(
        &logits,
        &targets,
        rows,
        cols,
        smoothing,
        &dloss_values,
        scale,
    );
    let (atol, rtol) = GRAD_TOL;
    dlogits_gpu
        .check(gpu, &name("cross_entropy backward"), &want, atol, rtol)?;
    Ok(())
}

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(51);
    let layouts = RowLayout::available(&gpu);
    let gradients = [(0.0, LossGradient::Broadcast), (0.1, LossGradient::PerRow)];
    for &layout in &layouts {
        for rows in [1usize, 3, 37, 129] {
            for cols in [1usize, 10, 33, 257, 1000] {
                for (smoothing, dloss) in gradients {
                    let case = Case {
                        layout,
                        rows,
                        cols,
                        smoothing,
                        dloss,
                    };
                    check_case(&gpu, &mut rng, &case)?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn cross_entropy_rejects_bad_arguments() -> Result<()> {
    let (gpu, [logits, losses]) = gpu_and_temporaries([(100, "logits"), (10, "losses")])?;
    let targets = upload_u32_at(&gpu, &[0; 10], 0, "targets")?;
    let dims = |rows, cols, smoothing| CrossEntropyDims {
        rows,
        cols,
        smoothing,
    };
    let (lg, tg, ls) = (logits.whole(), targets.whole(), losses.whole());
    super::forward(&gpu, &dims(10, 10, 0.0), ls, lg, tg)?;
    // Zero classes, smoothing outside [0, 1], and each range one element too far.
    let err = super::forward(&gpu, &dims(10, 0, 0.0), ls, lg, tg).expect_err("must be refused");
    assert!(err.to_string().contains("0 classes"), "{err}");
    for smoothing in [1.5, f32::NAN] {
        let err = super::forward(&gpu, &dims(10, 10, smoothing), ls, lg, tg).expect_err("must be refused");
        let want = format!("label smoothing {smoothing} outside [0, 1]");
        assert!(
            matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains(&want),
            "{err}"
        );
    }
    // Targets from offset 1: elements 1..11 of a 10-element buffer cannot be sliced, and the
    // launcher refuses the 9 that can.
    let err = targets.slice(1, 10).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("elements 1..11"), "{err}");
    let t9 = targets.slice(1, 9)?;
    let err = super::forward(&gpu, &dims(10, 10, 0.0), ls, lg, t9).expect_err("must be refused");
    assert!(
        err.to_string().contains("targets: 9 elements given"),
        "{err}"
    );
    // Likewise losses and logits.
    let err = losses.slice(1, 10).expect_err("must be refused");
    assert!(
        matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("elements 1..11"),
        "{err}"
    );
    let l9 = losses.slice(1, 9)?;
    let err = super::forward(&gpu, &dims(10, 10, 0.0), l9, lg, tg).expect_err("must be refused");
    assert!(
        err.to_string().contains("losses: 9 elements given"),
        "{err}"
    );
    let lg99 = logits.slice(1, 99)?;
    let err = super::forward(&gpu, &dims(10, 10, 0.0), ls, lg99, tg).expect_err("must be refused");
    assert!(
        err.to_string().contains("logits: 99 elements given"),
        "{err}"
    );
    // A per-row dloss needs 10 elements from offset 1 of a 10-element buffer (no such slice; the
    // 9 that fit are neither 1 nor rows); a broadcast one needs 1.
    let err = super::backward(&gpu, &dims(10, 10, 0.0), lg, lg, tg, l9, 1.0).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("dloss"), "{err}");
    let d1 = losses.slice(1, 1)?;
    super::backward(&gpu, &dims(10, 10, 0.0), lg, lg, tg, d1, 0.1)?;
    // dlogits of the wrong length.
    let err = super::backward(&gpu, &dims(10, 10, 0.0), lg99, lg, tg, d1, 0.1).expect_err("must be refused");
    assert!(
        err.to_string().contains("dlogits: 99 elements given"),
        "{err}"
    );
    Ok(())
}

// Loop limit: checked before the slice lengths, so one-element buffers show the refusal.
#[test]
fn cross_entropy_refuses_rows_over_the_loop_limit() -> Result<()> {
    with_loop_limit("cross_entropy_refuses_rows_over_the_loop_limit", |gpu, limit, tiny| {
        let t = tiny.whole();
        let mut layouts: Vec<(RowLayout, crate::testing::Passes)> =
            vec![(RowLayout::InvocationPerRow, Box::new(super::loop_iterations))];
        // A subgroup per row runs a subgroup's share of the columns per lane (the launchers'
        // choice for long rows where the adapter has subgroups).
        if let Some((lanes, _)) = crate::kernels::subgroup_rows(gpu) {
            let lanes = u64::from(lanes);
            layouts.push((
                RowLayout::SubgroupPerRow,
                Box::new(move |c| crate::kernels::softmax::loop_iterations_subgroup(c, lanes)),
            ));
        }
        for (layout, passes) in layouts {
            let largest = largest_within(limit, passes);
            let over = largest + 1;
            let dims = CrossEntropyDims {
                rows: 1,
                cols: over,
                smoothing: 0.0,
            };
            assert_loop_limit(
                super::forward_in(gpu, layout, &dims, t, [t, t]),
                "cols",
                largest,
            );
            let dims = CrossEntropyDims {
                rows: 2,
                cols: over,
                smoothing: 0.1,
            };
            let result = super::backward_in(gpu, layout, &dims, t, [t, t, t], 1.0);
            assert_loop_limit(result, "cols", largest);
        }
        // The launchers' choice at the longest rows the invocation-per-row layout takes
        // refuses only past its own layout's limit.
        let cols = largest_within(limit, super::loop_iterations);
        let dims = CrossEntropyDims {
            rows: 1,
            cols: cols + 1,
            smoothing: 0.0,
        };
        let chosen = crate::kernels::row_layout(gpu, 1, cols + 1);
        let result = super::forward(gpu, &dims, t, t, t);
        match chosen {
            RowLayout::InvocationPerRow => assert_loop_limit(result, "cols", cols),
            // Past the loop check the one-element slices are refused.
            _ => assert!(
                matches!(result, Err(Error::InvalidArgument { .. })),
                "{result:?}"
            ),
        }
        Ok(())
    })
}

#[test]
fn cross_entropy_at_the_loop_limit_matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(53);
    let cols = largest_at_the_loop_limit(&gpu, super::loop_iterations) as usize;
    let case = Case {
        layout: RowLayout::InvocationPerRow,
        rows: 2,
        cols,
        smoothing: 0.1,
        dloss: LossGradient::PerRow,
    };
    check_case(&gpu, &mut rng, &case)?;
    Ok(())
}

// ------------------------------------------------------------------------------- reference

#[test]
fn cross_entropy_hand_worked() {
    // uniform logits over 3 classes: loss = log 3 = 1.0986123 for any target and any smoothing
    let loss = reference::forward(&[0.0, 0.0, 0.0, 5.0, 5.0, 5.0], &[0, 2], 2, 3, 0.0);
    assert_close("ce uniform", &loss, &[1.098_612_3, 1.098_612_3], 1e-7, 1e-6);
    // logits [1,2,3], target 2: loss = -log softmax_2 = -ln 0.66524096 = 0.40760596;
    // with eps = 0.1: 0.9 * 0.40760596 + 0.1 * (lse - mean x), lse = 3.40760596, mean x = 2
    //   = 0.36684536 + 0.14076060 = 0.50760596
    let loss = reference::forward(&[1.0, 2.0, 3.0], &[2], 1, 3, 0.0);
    assert_close("ce [1,2,3]", &loss, &[0.407_605_96], 1e-7, 1e-6);
    let loss = reference::forward(&[1.0, 2.0, 3.0], &[2], 1, 3, 0.1);
    assert_close("ce [1,2,3] eps", &loss, &[0.507_605_96], 1e-7, 1e-6);
    // backward, mean over 1 row, eps 0: softmax - onehot = [0.0900306, 0.2447285, -0.3347590]
    let d = reference::backward(&[1.0, 2.0, 3.0], &[2], 1, 3, 0.0, &[1.0], 1.0);
    assert_close(
        "ce grad",
        &d,
        &[0.090_030_57, 0.244_728_47, -0.334_759_04],
        1e-7,
        1e-6,
    );
    // an invalid target gives NaN loss and NaN gradient for that row only
    let loss = reference::forward(&[0.0, 0.0, 1.0, 2.0], &[2, 1], 2, 2, 0.0);
    assert!(loss[0].is_nan() && loss[1].is_finite());
    let d = reference::backward(&[0.0, 0.0, 1.0, 2.0], &[2, 1], 2, 2, 0.0, &[1.0], 0.5);
    assert!(d[0].is_nan() && d[1].is_nan() && d[2].is_finite() && d[3].is_finite());
}

#[test]
fn cross_entropy_backward_matches_finite_differences() {
    let mut rng = Rng::new(0x5eed_0004);
    let (rows, cols) = (4, 6);
    let x = rng.vec_f32(rows * cols, -3.0, 3.0);
    let targets = [0u32, 5, 2, 2];
    for smoothing in [0.0f32, 0.1] {
        // mean reduction: L = (1/rows) sum_r l_r, dloss = 0.7 (a device scalar), scale = 1/rows
        let analytic = reference::backward(&x, &targets, rows, cols, smoothing, &[0.7], 0.25);
        let numeric = numeric_gradient(&x, 1e-3, |x| {
            let l = reference::forward(x, &targets, rows, cols, smoothing);
            0.7 * l.iter().map(|&v| f64::from(v)).sum::<f64>() / rows as f64
        });
        assert_close("ce backward mean", &analytic, &numeric, 1e-3, 1e-3);
        // per-row dloss (reduction none)
        let w = rng.vec_f32(rows, -1.0, 1.0);
        let analytic = reference::backward(&x, &targets, rows, cols, smoothing, &w, 1.0);
        let numeric = numeric_gradient(&x, 1e-3, |x| {
            dot(
                &w,
                &reference::forward(x, &targets, rows, cols, smoothing),
            )
        });
        assert_close("ce backward per-row", &analytic, &numeric, 1e-3, 1e-3);
    }
}
