use plimsoll_kernels_wgsl::kernels::layer_norm::{self, LayerNormBuffers, LayerNormGradBuffers};
use plimsoll_kernels_wgsl::{Category, Gpu, reference};

use crate::common::{Guarded, Rng, gpu};

const EPS: f32 = 1e-5;

// Tolerances. Forward: the row mean and the variance are f32 sums of <= 1000 terms of size
// <= ~4 (f64 in the reference): relative error <= ~1e-5 worst case; y = xhat*gamma + beta is
// O(10), so atol 2e-5, rtol 1e-4. mean/rstd: atol 1e-6, rtol 2e-5 (inverseSqrt is a few ulp;
// rstd reaches 1/sqrt(eps) ~ 316 when cols = 1). Backward (fed the reference's mean/rstd): dx
// subtracts two f32 row means of g and g*xhat (<= 1000 terms): absolute error ~rstd * 1e-5,
// atol 5e-5; dgamma/dbeta sum <= 129 rows in f32: rtol 1e-4, atol 2e-5.
const Y_TOL: (f32, f32) = (2e-5, 1e-4);
const STATS_TOL: (f32, f32) = (1e-6, 2e-5);
const DX_TOL: (f32, f32) = (5e-5, 1e-4);
const DPARAM_TOL: (f32, f32) = (2e-5, 1e-4);

fn check_case(gpu: &Gpu, rng: &mut Rng, rows: usize, cols: usize) {
    let name = |what: &str| format!("layer_norm {what} [{rows}, {cols}]");
    let n = rows * cols;
    let x = rng.vec_f32(n, -2.0, 2.0);
    let gamma = rng.vec_f32(cols, 0.5, 1.5);
    let beta = rng.vec_f32(cols, -1.0, 1.0);
    let dy = rng.vec_f32(n, -1.0, 1.0);
    let want = reference::layer_norm::forward(&x, &gamma, &beta, rows, cols, EPS);

    // Every tensor at its own non-zero offset; the small ones share segments.
    let x_gpu = Guarded::upload(gpu, rng, &x, 3, "x");
    let gamma_gpu = Guarded::upload(gpu, rng, &gamma, 1, "gamma");
    let beta_gpu = Guarded::upload(gpu, rng, &beta, 2, "beta");
    let y_gpu = Guarded::random(gpu, rng, n, 5, "y");
    let mean_gpu = Guarded::random(gpu, rng, rows, 4, "mean");
    let rstd_gpu = Guarded::random(gpu, rng, rows, 6, "rstd");
    let forward = LayerNormBuffers {
        x: &x_gpu.buffer,
        x_offset: x_gpu.at(),
        gamma: &gamma_gpu.buffer,
        gamma_offset: gamma_gpu.at(),
        beta: &beta_gpu.buffer,
        beta_offset: beta_gpu.at(),
        y: &y_gpu.buffer,
        y_offset: y_gpu.at(),
        mean: &mean_gpu.buffer,
        mean_offset: mean_gpu.at(),
        rstd: &rstd_gpu.buffer,
        rstd_offset: rstd_gpu.at(),
    };
    layer_norm::forward(gpu, &forward, rows as u64, cols as u64, EPS).unwrap();

    // The backward reads the reference's saved statistics, so it is checked on its own.
    let saved_mean = Guarded::upload(gpu, rng, &want.mean, 7, "saved mean");
    let saved_rstd = Guarded::upload(gpu, rng, &want.rstd, 2, "saved rstd");
    let dy_gpu = Guarded::upload(gpu, rng, &dy, 1, "dy");
    let dx_gpu = Guarded::random(gpu, rng, n, 8, "dx");
    let dgamma_gpu = Guarded::random(gpu, rng, cols, 3, "dgamma");
    let dbeta_gpu = Guarded::random(gpu, rng, cols, 9, "dbeta");
    let backward = LayerNormGradBuffers {
        x: &x_gpu.buffer,
        x_offset: x_gpu.at(),
        gamma: &gamma_gpu.buffer,
        gamma_offset: gamma_gpu.at(),
        mean: &saved_mean.buffer,
        mean_offset: saved_mean.at(),
        rstd: &saved_rstd.buffer,
        rstd_offset: saved_rstd.at(),
        dy: &dy_gpu.buffer,
        dy_offset: dy_gpu.at(),
        dx: &dx_gpu.buffer,
        dx_offset: dx_gpu.at(),
        dgamma: &dgamma_gpu.buffer,
        dgamma_offset: dgamma_gpu.at(),
        dbeta: &dbeta_gpu.buffer,
        dbeta_offset: dbeta_gpu.at(),
    };
    layer_norm::backward(gpu, &backward, rows as u64, cols as u64).unwrap();

    let (atol, rtol) = Y_TOL;
    y_gpu.check(gpu, &name("y"), &want.y, atol, rtol);
    let (atol, rtol) = STATS_TOL;
    mean_gpu.check(gpu, &name("mean"), &want.mean, atol, rtol);
    rstd_gpu.check(gpu, &name("rstd"), &want.rstd, atol, rtol);
    let grads =
        reference::layer_norm::backward(&x, &gamma, &want.mean, &want.rstd, &dy, rows, cols);
    let (atol, rtol) = DX_TOL;
    dx_gpu.check(gpu, &name("dx"), &grads.dx, atol, rtol);
    let (atol, rtol) = DPARAM_TOL;
    dgamma_gpu.check(gpu, &name("dgamma"), &grads.dgamma, atol, rtol);
    dbeta_gpu.check(gpu, &name("dbeta"), &grads.dbeta, atol, rtol);
    x_gpu.check(gpu, &name("x unchanged"), &x, 0.0, 0.0);
}

#[test]
fn layer_norm_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(61);
    for rows in [1usize, 3, 37, 129] {
        for cols in [1usize, 10, 33, 257, 1000] {
            check_case(&gpu, &mut rng, rows, cols);
        }
    }
}

#[test]
fn layer_norm_rejects_bad_arguments() {
    let gpu = gpu();
    let big = gpu.alloc_elements(120, Category::Temporary, "big").unwrap();
    let small = gpu
        .alloc_elements(10, Category::Temporary, "small")
        .unwrap();
    let mut b = LayerNormBuffers {
        x: &big,
        x_offset: 0,
        gamma: &small,
        gamma_offset: 0,
        beta: &small,
        beta_offset: 0,
        y: &big,
        y_offset: 0,
        mean: &small,
        mean_offset: 0,
        rstd: &small,
        rstd_offset: 0,
    };
    let err = layer_norm::forward(&gpu, &b, 10, 0, EPS).unwrap_err();
    assert!(err.to_string().contains("0 columns"), "{err}");
    b.gamma_offset = 3;
    let err = layer_norm::forward(&gpu, &b, 10, 10, EPS).unwrap_err();
    assert!(err.to_string().contains("gamma: elements 3..13"), "{err}");
    let g = LayerNormGradBuffers {
        x: &big,
        x_offset: 0,
        gamma: &small,
        gamma_offset: 0,
        mean: &small,
        mean_offset: 0,
        rstd: &small,
        rstd_offset: 0,
        dy: &big,
        dy_offset: 0,
        dx: &big,
        dx_offset: 21,
        dgamma: &small,
        dgamma_offset: 0,
        dbeta: &small,
        dbeta_offset: 0,
    };
    let err = layer_norm::backward(&gpu, &g, 10, 10).unwrap_err();
    assert!(err.to_string().contains("dx: elements 21..121"), "{err}");
    b.gamma_offset = 0;
    layer_norm::forward(&gpu, &b, 0, 10, EPS).unwrap(); // empty work
}
