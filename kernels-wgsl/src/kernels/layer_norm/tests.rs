//! The `layer_norm` launchers against [`reference`](super::reference) (forward, the input and
//! parameter gradients, both row layouts), their argument and loop-limit checks, and the
//! reference itself against hand-worked values and finite differences.

use super::reference;
use super::LayerNormDims;
use crate::kernels::{RowLayout, largest_within};
use crate::testing::{assert_close, assert_loop_limit, dot, gpu_and_rng, gpu_and_temporaries, Guarded, largest_at_the_loop_limit, with_loop_limit, numeric_gradient, Rng, scratch};
use crate::{Category, Error, Gpu, Result};

const EPS: f32 = 1e-5;

// Tolerances. Forward: the row mean and the variance are f32 sums of <= 1000 terms of size
// <= ~4 (f64 in the reference): relative error <= ~1e-5 worst case; y = xhat*gamma + beta is
// O(10), so atol 2e-5, rtol 1e-4. mean/rstd: atol 1e-6, rtol 2e-5 (inverseSqrt is a few ulp;
// rstd reaches 1/sqrt(eps) ~ 316 when cols = 1). Backward (fed the reference's mean/rstd): dx
// subtracts two f32 row means of g and g*xhat (<= 1000 terms): absolute error ~rstd * 1e-5,
// atol 5e-5; dgamma/dbeta sum <= 129 rows in f32: rtol 1e-4, atol 2e-5.
const Y_TOL: (f64, f64) = (2e-5, 1e-4);
const STATS_TOL: (f64, f64) = (1e-6, 2e-5);
const DX_TOL: (f64, f64) = (5e-5, 1e-4);
const DPARAM_TOL: (f64, f64) = (2e-5, 1e-4);

fn check_case(gpu: &Gpu, rng: &mut Rng, layout: RowLayout, rows: usize, cols: usize) -> Result<()> {
    let name = |what: &str| format!("layer_norm {what} {layout:?} [{rows}, {cols}]");
    let n = rows * cols;
    let x = rng.vec_f32(n, -2.0, 2.0);
    let gamma = rng.vec_f32(cols, 0.5, 1.5);
    let beta = rng.vec_f32(cols, -1.0, 1.0);
    let dy = rng.vec_f32(n, -1.0, 1.0);
    let want = reference::forward(&x, &gamma, &beta, rows, cols, EPS);

    // Every tensor at its own non-zero offset; the small ones share segments.
    let x_gpu = Guarded::upload(gpu, rng, &x, 3, "x")?;
    let gamma_gpu = Guarded::upload(gpu, rng, &gamma, 1, "gamma")?;
    let beta_gpu = Guarded::upload(gpu, rng, &beta, 2, "beta")?;
    let y_gpu = Guarded::random(gpu, rng, n, 5, "y")?;
    let mean_gpu = Guarded::random(gpu, rng, rows, 4, "mean")?;
    let rstd_gpu = Guarded::random(gpu, rng, rows, 6, "rstd")?;
    let dims = LayerNormDims {
        rows: rows as u64,
        cols: cols as u64,
        eps: EPS,
        rms: false,
    };
    super::forward_in(
        gpu,
        layout,
        &dims,
        [
            y_gpu.slice()?,
            mean_gpu.slice()?,
            rstd_gpu.slice()?,
        ],
        [
            x_gpu.slice()?,
            gamma_gpu.slice()?,
            beta_gpu.slice()?,
        ],
    )?;

    // The backward reads the reference's saved statistics, so it is checked on its own.
    let saved_mean = Guarded::upload(gpu, rng, &want.mean, 7, "saved mean")?;
    let saved_rstd = Guarded::upload(gpu, rng, &want.rstd, 2, "saved rstd")?;
    let dy_gpu = Guarded::upload(gpu, rng, &dy, 1, "dy")?;
    let dx_gpu = Guarded::random(gpu, rng, n, 8, "dx")?;
    let dgamma_gpu = Guarded::random(gpu, rng, cols, 3, "dgamma")?;
    let dbeta_gpu = Guarded::random(gpu, rng, cols, 9, "dbeta")?;
    super::backward_in(
        gpu,
        layout,
        &dims,
        [
            dx_gpu.slice()?,
            dgamma_gpu.slice()?,
            dbeta_gpu.slice()?,
        ],
        [
            x_gpu.slice()?,
            gamma_gpu.slice()?,
            saved_mean.slice()?,
            saved_rstd.slice()?,
        ],
        dy_gpu.slice()?,
    )?;

    let (atol, rtol) = Y_TOL;
    y_gpu.check(gpu, &name("y"), &want.y, atol, rtol)?;
    let (atol, rtol) = STATS_TOL;
    mean_gpu
        .check(gpu, &name("mean"), &want.mean, atol, rtol)?;
    rstd_gpu
        .check(gpu, &name("rstd"), &want.rstd, atol, rtol)?;
    let grads =
        reference::backward(&x, &gamma, &want.mean, &want.rstd, &dy, rows, cols);
    let (atol, rtol) = DX_TOL;
    dx_gpu
        .check(gpu, &name("dx"), &grads.dx, atol, rtol)?;
    let (atol, rtol) = DPARAM_TOL;
    dgamma_gpu
        .check(gpu, &name("dgamma"), &grads.dgamma, atol, rtol)?;
    dbeta_gpu
        .check(gpu, &name("dbeta"), &grads.dbeta, atol, rtol)?;
    x_gpu
        .check(gpu, &name("x unchanged"), &x, 0.0, 0.0)?;
    Ok(())
}

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(61);
    for layout in RowLayout::available(&gpu) {
        for rows in [1usize, 3, 37, 129] {
            for cols in [1usize, 10, 33, 257, 1000] {
                check_case(&gpu, &mut rng, layout, rows, cols)?;
            }
        }
    }
    Ok(())
}

fn dims(rows: u64, cols: u64) -> LayerNormDims {
    LayerNormDims {
        rows,
        cols,
        eps: EPS,
        rms: false,
    }
}

#[test]
fn layer_norm_rejects_bad_arguments() -> Result<()> {
    let (gpu, [big, small]) = gpu_and_temporaries([(120, "big"), (10, "small")])?;
    let (b100, s10) = (big.slice(0, 100)?, small.whole());
    super::forward(&gpu, &dims(10, 10), [b100, s10, s10], b100, s10, s10)?;
    let err =
        super::forward(&gpu, &dims(10, 0), [b100, s10, s10], b100, s10, s10).expect_err("must be refused");
    assert!(err.to_string().contains("0 columns"), "{err}");
    // gamma from offset 3: elements 3..13 of a 10-element buffer cannot be sliced, and the
    // launcher refuses the 7 that can.
    let err = small.slice(3, 10).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("elements 3..13"), "{err}");
    let gamma = small.slice(3, 7)?;
    let err =
        super::forward(&gpu, &dims(10, 10), [b100, s10, s10], b100, gamma, s10).expect_err("must be refused");
    assert!(err.to_string().contains("gamma: 7 elements given"), "{err}");
    // Each forward slice of the wrong length.
    let (b99, s9) = (big.slice(0, 99)?, small.slice(0, 9)?);
    let forwards = [
        ("y", [b99, s10, s10], b100, s10, s10),
        ("mean", [b100, s9, s10], b100, s10, s10),
        ("rstd", [b100, s10, s9], b100, s10, s10),
        ("x", [b100, s10, s10], b99, s10, s10),
        ("beta", [b100, s10, s10], b100, s10, s9),
    ];
    for (name, outputs, x, gamma, beta) in forwards {
        let err = super::forward(&gpu, &dims(10, 10), outputs, x, gamma, beta).expect_err("must be refused");
        assert!(
            err.to_string().contains(&format!("{name}: ")),
            "{name}: {err}"
        );
    }
    // dx from offset 21: elements 21..121 of a 120-element buffer.
    let err = big.slice(21, 100).expect_err("must be refused");
    assert!(err.to_string().contains("elements 21..121"), "{err}");
    let dx = big.slice(21, 99)?;
    let inputs = [b100, s10, s10, s10];
    let err = super::backward(&gpu, &dims(10, 10), [dx, s10, s10], inputs, b100).expect_err("must be refused");
    assert!(err.to_string().contains("dx: 99 elements given"), "{err}");
    let err = super::backward(&gpu, &dims(10, 10), [b100, s9, s10], inputs, b100).expect_err("must be refused");
    assert!(err.to_string().contains("dgamma: "), "{err}");
    let err = super::backward(&gpu, &dims(10, 10), [b100, s10, s10], inputs, b99).expect_err("must be refused");
    assert!(err.to_string().contains("dy: "), "{err}");
    let bad_rstd = [b100, s10, s10, s9];
    let err =
        super::backward(&gpu, &dims(10, 10), [b100, s10, s10], bad_rstd, b100).expect_err("must be refused");
    assert!(err.to_string().contains("rstd: "), "{err}");
    // Empty work.
    let (e, s0) = (big.slice(120, 0)?, small.slice(0, 0)?);
    super::forward(&gpu, &dims(0, 10), [e, s0, s0], e, s10, s10)?;
    Ok(())
}

#[test]
fn layer_norm_refuses_rows_and_columns_over_the_loop_limit() -> Result<()> {
    with_loop_limit("layer_norm_refuses_rows_and_columns_over_the_loop_limit", |gpu, limit, tiny| {
        // Every slice on one tiny buffer: the loop limit is checked before the slice lengths.
        let t = tiny.whole();
        let ir = RowLayout::InvocationPerRow;
        let cols = largest_within(limit, super::row_loop_iterations);
        assert_loop_limit(
            super::forward_in(gpu, ir, &dims(1, cols + 1), [t; 3], [t; 3]),
            "cols",
            cols,
        );
        assert_loop_limit(
            super::backward_in(gpu, ir, &dims(1, cols + 1), [t; 3], [t; 4], t),
            "cols",
            cols,
        );
        // A subgroup per row runs a subgroup's share of the columns per lane (the launchers'
        // choice for long rows where the adapter has subgroups).
        if let Some((lanes, _)) = crate::kernels::subgroup_rows(gpu) {
            let sg = RowLayout::SubgroupPerRow;
            let lanes = u64::from(lanes);
            let cols = largest_within(limit, |c| super::row_loop_iterations_subgroup(c, lanes));
            assert_loop_limit(
                super::forward(gpu, &dims(1, cols + 1), [t; 3], t, t, t),
                "cols",
                cols,
            );
            assert_loop_limit(
                super::backward_in(gpu, sg, &dims(1, cols + 1), [t; 3], [t; 4], t),
                "cols",
                cols,
            );
        }
        // A workgroup per row runs a 64th of the columns per invocation.
        let wg = RowLayout::WorkgroupPerRow;
        let cols = largest_within(limit, super::row_loop_iterations_rows);
        assert_loop_limit(
            super::forward_in(gpu, wg, &dims(1, cols + 1), [t; 3], [t; 3]),
            "cols",
            cols,
        );
        assert_loop_limit(
            super::backward_in(gpu, wg, &dims(1, cols + 1), [t; 3], [t; 4], t),
            "cols",
            cols,
        );
        let rows = largest_within(limit, super::column_loop_iterations);
        assert_loop_limit(
            super::backward(gpu, &dims(rows + 1, 1), [t; 3], [t; 4], t),
            "rows",
            rows,
        );
        Ok(())
    })
}

#[test]
fn layer_norm_at_the_loop_limit_matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(63);
    let cols = largest_at_the_loop_limit(&gpu, super::row_loop_iterations) as usize;
    check_case(&gpu, &mut rng, RowLayout::InvocationPerRow, 2, cols)?;
    // backward_params sums over the rows: with x = 1, mean = 0, rstd = 1 (xhat = 1) and small
    // integer dy, dgamma[j] = dbeta[j] = sum_r dy[r, j] is exact in f32, so a dropped row shows.
    let (rows, cols) = (
        largest_at_the_loop_limit(&gpu, super::column_loop_iterations) as usize,
        3,
    );
    let dy: Vec<f32> = (0..rows * cols).map(|e| (e % 5) as f32 - 1.0).collect();
    let want: Vec<f32> = (0..cols)
        .map(|j| (0..rows).map(|r| dy[r * cols + j] as f64).sum::<f64>() as f32)
        .collect();
    let up = |data: &[f32], label| gpu.upload(data, Category::Temporary, label);
    let (x, ones, zeros, dy_gpu) = (
        up(&vec![1.0; rows * cols], "x")?,
        up(&vec![1.0; rows.max(cols)], "gamma, rstd")?,
        up(&vec![0.0; rows], "mean")?,
        up(&dy, "dy")?,
    );
    let dx = scratch(&gpu, (rows * cols) as u64, "dx");
    let dgamma = Guarded::random(&gpu, &mut rng, cols, 2, "dgamma")?;
    let dbeta = Guarded::random(&gpu, &mut rng, cols, 1, "dbeta")?;
    let (gamma, rstd) = (
        ones.slice(0, cols as u64)?,
        ones.slice(0, rows as u64)?,
    );
    super::backward(
        &gpu,
        &dims(rows as u64, cols as u64),
        [dx.whole(), dgamma.slice()?, dbeta.slice()?],
        [x.whole(), gamma, zeros.whole(), rstd],
        dy_gpu.whole(),
    )?;
    dgamma
        .check(&gpu, &format!("dgamma over {rows} rows"), &want, 0.0, 0.0)?;
    dbeta
        .check(&gpu, &format!("dbeta over {rows} rows"), &want, 0.0, 0.0)?;
    Ok(())
}

// ------------------------------------------------------------------------------- reference

#[test]
fn layer_norm_hand_worked() {
    // x = [1, 2, 3, 4]: mean 2.5, var = (2.25 + 0.25 + 0.25 + 2.25)/4 = 1.25, eps 0:
    // rstd = 1/sqrt(1.25) = 0.8944272, y = [-1.3416408, -0.4472136, 0.4472136, 1.3416408]
    let f = reference::forward(&[1.0, 2.0, 3.0, 4.0], &[1.0; 4], &[0.0; 4], 1, 4, 0.0);
    assert_close("ln mean", &f.mean, &[2.5], 0.0, 1e-7);
    assert_close("ln rstd", &f.rstd, &[0.894_427_2], 0.0, 1e-6);
    let want = [-1.341_640_8, -0.447_213_6, 0.447_213_6, 1.341_640_8];
    assert_close("ln y", &f.y, &want, 1e-7, 1e-6);
    // gamma 2, beta 1: y' = 2y + 1
    let f2 = reference::forward(&[1.0, 2.0, 3.0, 4.0], &[2.0; 4], &[1.0; 4], 1, 4, 0.0);
    let want2: Vec<f32> = want.iter().map(|v| 2.0 * v + 1.0).collect();
    assert_close("ln affine", &f2.y, &want2, 1e-6, 1e-6);
}

#[test]
fn layer_norm_backward_matches_finite_differences() {
    let mut rng = Rng::new(0x5eed_0005);
    let (rows, cols, eps) = (3, 5, 1e-5);
    let x = rng.vec_f32(rows * cols, -2.0, 2.0);
    let gamma = rng.vec_f32(cols, 0.5, 1.5);
    let beta = rng.vec_f32(cols, -0.5, 0.5);
    let w = rng.vec_f32(rows * cols, -1.0, 1.0);
    let f = reference::forward(&x, &gamma, &beta, rows, cols, eps);
    let b = reference::backward(&x, &gamma, &f.mean, &f.rstd, &w, rows, cols);
    let loss = |x: &[f32], g: &[f32], bt: &[f32]| {
        dot(&w, &reference::forward(x, g, bt, rows, cols, eps).y)
    };
    let num_x = numeric_gradient(&x, 1e-3, |x| loss(x, &gamma, &beta));
    let num_g = numeric_gradient(&gamma, 1e-3, |g| loss(&x, g, &beta));
    let num_b = numeric_gradient(&beta, 1e-3, |bt| loss(&x, &gamma, bt));
    assert_close("ln dx", &b.dx, &num_x, 2e-3, 2e-3);
    assert_close("ln dgamma", &b.dgamma, &num_g, 2e-3, 2e-3);
    assert_close("ln dbeta", &b.dbeta, &num_b, 2e-3, 2e-3);
}

/// RMSNorm (`rms: true`) in both row layouts against its own reference (the chain rule written
/// out, not the layer norm with the mean dropped): `y`, `rstd`, a zero `mean`, `dx` and `dgamma`,
/// with the backward fed the kernel's own saved statistics.
#[test]
fn rms_norm_matches_its_reference() -> Result<()> {
    use crate::kernels::{narrow, widen};
    let (gpu, mut rng) = gpu_and_rng(67);
    for layout in RowLayout::available(&gpu) {
        for (rows, cols) in [(1usize, 1usize), (3, 10), (37, 257), (5, 1000)] {
            let name = |what: &str| format!("rms_norm {what} {layout:?} [{rows}, {cols}]");
            let n = rows * cols;
            let x = rng.vec_f32(n, -2.0, 2.0);
            let gamma = rng.vec_f32(cols, 0.5, 1.5);
            let dy = rng.vec_f32(n, -1.0, 1.0);
            let (want_y, want_rstd) =
                reference::rms_forward_f64(&widen(&x), &widen(&gamma), rows, cols, EPS.into());
            let (want_dx, want_dgamma) = reference::rms_backward_f64(
                &widen(&x),
                &widen(&gamma),
                &widen(&dy),
                rows,
                cols,
                EPS.into(),
            );
            let x_gpu = Guarded::upload(&gpu, &mut rng, &x, 3, "x")?;
            let gamma_gpu = Guarded::upload(&gpu, &mut rng, &gamma, 1, "gamma")?;
            let y_gpu = Guarded::random(&gpu, &mut rng, n, 5, "y")?;
            let mean_gpu = Guarded::random(&gpu, &mut rng, rows, 4, "mean")?;
            let rstd_gpu = Guarded::random(&gpu, &mut rng, rows, 6, "rstd")?;
            let dims = LayerNormDims {
                rows: rows as u64,
                cols: cols as u64,
                eps: EPS,
                rms: true,
            };
            // beta is ignored: gamma stands in for it.
            super::forward_in(
                &gpu,
                layout,
                &dims,
                [y_gpu.slice()?, mean_gpu.slice()?, rstd_gpu.slice()?],
                [x_gpu.slice()?, gamma_gpu.slice()?, gamma_gpu.slice()?],
            )?;
            let dy_gpu = Guarded::upload(&gpu, &mut rng, &dy, 1, "dy")?;
            let dx_gpu = Guarded::random(&gpu, &mut rng, n, 8, "dx")?;
            let dgamma_gpu = Guarded::random(&gpu, &mut rng, cols, 3, "dgamma")?;
            let dbeta_gpu = Guarded::random(&gpu, &mut rng, cols, 9, "dbeta")?;
            super::backward_in(
                &gpu,
                layout,
                &dims,
                [dx_gpu.slice()?, dgamma_gpu.slice()?, dbeta_gpu.slice()?],
                [
                    x_gpu.slice()?,
                    gamma_gpu.slice()?,
                    mean_gpu.slice()?,
                    rstd_gpu.slice()?,
                ],
                dy_gpu.slice()?,
            )?;
            let (atol, rtol) = Y_TOL;
            y_gpu.check(&gpu, &name("y"), &narrow(&want_y), atol, rtol)?;
            let (atol, rtol) = STATS_TOL;
            rstd_gpu.check(&gpu, &name("rstd"), &narrow(&want_rstd), atol, rtol)?;
            mean_gpu.check(&gpu, &name("mean"), &vec![0.0; rows], 0.0, 0.0)?;
            let (atol, rtol) = DX_TOL;
            dx_gpu.check(&gpu, &name("dx"), &narrow(&want_dx), atol, rtol)?;
            let (atol, rtol) = DPARAM_TOL;
            dgamma_gpu.check(&gpu, &name("dgamma"), &narrow(&want_dgamma), atol, rtol)?;
        }
    }
    Ok(())
}

/// The RMSNorm reference's gradients against finite differences of its forward.
#[test]
fn rms_norm_reference_matches_finite_differences() {
    let (rows, cols) = (3, 5);
    let mut rng = Rng::new(5);
    let x: Vec<f64> = rng.vec_f32(rows * cols, -2.0, 2.0).iter().map(|&v| v.into()).collect();
    let gamma: Vec<f64> = rng.vec_f32(cols, 0.5, 1.5).iter().map(|&v| v.into()).collect();
    let dy: Vec<f64> = rng.vec_f32(rows * cols, -1.0, 1.0).iter().map(|&v| v.into()).collect();
    let loss = |x: &[f64], g: &[f64]| -> f64 {
        let (y, _) = reference::rms_forward_f64(x, g, rows, cols, 1e-5);
        y.iter().zip(&dy).map(|(a, b)| a * b).sum()
    };
    let (dx, dgamma) = reference::rms_backward_f64(&x, &gamma, &dy, rows, cols, 1e-5);
    let h = 1e-6;
    for k in 0..x.len() {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[k] += h;
        down[k] -= h;
        let num = (loss(&up, &gamma) - loss(&down, &gamma)) / (2.0 * h);
        assert!((num - dx[k]).abs() < 1e-6 * (1.0 + num.abs()), "dx[{k}] {} vs {num}", dx[k]);
    }
    for k in 0..cols {
        let (mut up, mut down) = (gamma.clone(), gamma.clone());
        up[k] += h;
        down[k] -= h;
        let num = (loss(&x, &up) - loss(&x, &down)) / (2.0 * h);
        assert!((num - dgamma[k]).abs() < 1e-6 * (1.0 + num.abs()), "dgamma[{k}]");
    }
}

/// `forward_add` writes `a + b` and is `forward` of that sum, and `backward_adding` adds to
/// `dx` what `backward` writes, both bit for bit (every layout, guards around each tensor).
fn check_fused_case(
    gpu: &Gpu,
    rng: &mut Rng,
    layout: RowLayout,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let name = |what: &str| format!("layer_norm fused {what} {layout:?} [{rows}, {cols}]");
    let n = rows * cols;
    let (a, b) = (rng.vec_f32(n, -2.0, 2.0), rng.vec_f32(n, -2.0, 2.0));
    let sum: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
    let (g, bt) = (rng.vec_f32(cols, 0.5, 1.5), rng.vec_f32(cols, -1.0, 1.0));
    let gamma = Guarded::upload(gpu, rng, &g, 1, "gamma")?;
    let beta = Guarded::upload(gpu, rng, &bt, 2, "beta")?;
    let dims = LayerNormDims {
        rows: rows as u64,
        cols: cols as u64,
        eps: EPS,
        rms: false,
    };
    // Unfused: forward of the sum, uploaded.
    let x_sum = Guarded::upload(gpu, rng, &sum, 3, "sum")?;
    let outs = |rng: &mut Rng| -> Result<[Guarded; 3]> {
        Ok([
            Guarded::random(gpu, rng, n, 5, "y")?,
            Guarded::random(gpu, rng, rows, 4, "mean")?,
            Guarded::random(gpu, rng, rows, 6, "rstd")?,
        ])
    };
    let plain = outs(rng)?;
    super::forward_in(
        gpu,
        layout,
        &dims,
        [plain[0].slice()?, plain[1].slice()?, plain[2].slice()?],
        [x_sum.slice()?, gamma.slice()?, beta.slice()?],
    )?;
    let fused = outs(rng)?;
    let (a_gpu, b_gpu) = (
        Guarded::upload(gpu, rng, &a, 7, "a")?,
        Guarded::upload(gpu, rng, &b, 2, "b")?,
    );
    let sum_gpu = Guarded::random(gpu, rng, n, 9, "sum out")?;
    super::forward_add_in(
        gpu,
        layout,
        &dims,
        [fused[0].slice()?, fused[1].slice()?, fused[2].slice()?],
        [sum_gpu.slice()?, a_gpu.slice()?, b_gpu.slice()?],
        [gamma.slice()?, beta.slice()?],
    )?;
    sum_gpu.check(gpu, &name("sum"), &sum, 0.0, 0.0)?;
    let mut saved = Vec::new();
    for (what, (p, f)) in ["y", "mean", "rstd"].iter().zip(plain.iter().zip(&fused)) {
        let want = p.check(gpu, &name(what), &vec![0.0; p.slice()?.len() as usize], 1e9, 0.0)?;
        f.check(gpu, &name(what), &want, 0.0, 0.0)?;
        saved.push(want);
    }
    a_gpu.check(gpu, &name("a unchanged"), &a, 0.0, 0.0)?;
    // In place: the sum written over b.
    let in_place = outs(rng)?;
    let b_over = Guarded::upload(gpu, rng, &b, 6, "b, then the sum")?;
    super::forward_add_in(
        gpu,
        layout,
        &dims,
        [in_place[0].slice()?, in_place[1].slice()?, in_place[2].slice()?],
        [b_over.slice()?, a_gpu.slice()?, b_over.slice()?],
        [gamma.slice()?, beta.slice()?],
    )?;
    b_over.check(gpu, &name("sum over b"), &sum, 0.0, 0.0)?;
    for (what, (f, want)) in ["y", "mean", "rstd"].iter().zip(in_place.iter().zip(&saved)) {
        f.check(gpu, &name(&format!("{what} in place")), want, 0.0, 0.0)?;
    }

    // Backward: into fresh dx, and added onto dx's earlier values.
    let dy = rng.vec_f32(n, -1.0, 1.0);
    let dy = Guarded::upload(gpu, rng, &dy, 1, "dy")?;
    let before = rng.vec_f32(n, -3.0, 3.0);
    let written = Guarded::random(gpu, rng, n, 8, "dx")?;
    let added = Guarded::upload(gpu, rng, &before, 4, "dx added")?;
    let params = |rng: &mut Rng| -> Result<[Guarded; 2]> {
        Ok([
            Guarded::random(gpu, rng, cols, 3, "dgamma")?,
            Guarded::random(gpu, rng, cols, 9, "dbeta")?,
        ])
    };
    let (pw, pa) = (params(rng)?, params(rng)?);
    let saved_gpu = [&plain[1], &plain[2]];
    for (dx, p, adding) in [(&written, &pw, false), (&added, &pa, true)] {
        let launch = match adding {
            false => super::backward_in,
            true => super::backward_adding_in,
        };
        launch(
            gpu,
            layout,
            &dims,
            [dx.slice()?, p[0].slice()?, p[1].slice()?],
            [
                x_sum.slice()?,
                gamma.slice()?,
                saved_gpu[0].slice()?,
                saved_gpu[1].slice()?,
            ],
            dy.slice()?,
        )?;
    }
    let any = |len: usize| vec![0.0; len];
    let dx = written.check(gpu, &name("dx"), &any(n), 1e9, 0.0)?;
    let want: Vec<f32> = before.iter().zip(&dx).map(|(p, d)| p + d).collect();
    added.check(gpu, &name("dx added"), &want, 0.0, 0.0)?;
    for (w, a) in pw.iter().zip(&pa) {
        let want = w.check(gpu, &name("dparam"), &any(cols), 1e9, 0.0)?;
        a.check(gpu, &name("dparam beside dx added"), &want, 0.0, 0.0)?;
    }
    Ok(())
}

#[test]
fn the_fused_add_and_the_adding_backward_are_the_separate_ops_bit_for_bit() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(67);
    for layout in RowLayout::available(&gpu) {
        for (rows, cols) in [(1usize, 1usize), (3, 10), (37, 33), (5, 257), (2, 1000)] {
            check_fused_case(&gpu, &mut rng, layout, rows, cols)?;
        }
    }
    Ok(())
}

/// `forward_add`'s sum may be written over `b` exactly (in place), not over `a` nor over a part
/// of `b`.
#[test]
fn forward_add_refuses_a_sum_over_part_of_its_addends() -> Result<()> {
    let (gpu, [big, params, stats]) =
        gpu_and_temporaries([(400, "big"), (10, "params"), (20, "stats")])?;
    let (p, st) = (params.whole(), [stats.slice(0, 10)?, stats.slice(10, 10)?]);
    let (y, a, b) = (big.slice(0, 100)?, big.slice(100, 100)?, big.slice(200, 100)?);
    let launch = |sum| super::forward_add(&gpu, &dims(10, 10), [y, st[0], st[1]], [sum, a, b], p, p);
    launch(big.slice(300, 100)?)?;
    launch(b)?;
    for (sum, name) in [(a, "a"), (big.slice(150, 100)?, "a"), (big.slice(250, 100)?, "b")] {
        let err = launch(sum).expect_err("must be refused");
        assert!(err.to_string().contains(&format!("overlaps {name}")), "{err}");
    }
    Ok(())
}
