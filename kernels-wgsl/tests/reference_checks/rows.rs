//! Row references: cross-entropy, layer norm (softmax's are checked in
//! `kernels::softmax::tests`).

use super::*;

// -------------------------------------------------------------------------- cross_entropy

#[test]
fn cross_entropy_hand_worked() {
    // uniform logits over 3 classes: loss = log 3 = 1.0986123 for any target and any smoothing
    let loss = cross_entropy::forward(&[0.0, 0.0, 0.0, 5.0, 5.0, 5.0], &[0, 2], 2, 3, 0.0);
    assert_close("ce uniform", &loss, &[1.098_612_3, 1.098_612_3], 1e-7, 1e-6);
    // logits [1,2,3], target 2: loss = -log softmax_2 = -ln 0.66524096 = 0.40760596;
    // with eps = 0.1: 0.9 * 0.40760596 + 0.1 * (lse - mean x), lse = 3.40760596, mean x = 2
    //   = 0.36684536 + 0.14076060 = 0.50760596
    let loss = cross_entropy::forward(&[1.0, 2.0, 3.0], &[2], 1, 3, 0.0);
    assert_close("ce [1,2,3]", &loss, &[0.407_605_96], 1e-7, 1e-6);
    let loss = cross_entropy::forward(&[1.0, 2.0, 3.0], &[2], 1, 3, 0.1);
    assert_close("ce [1,2,3] eps", &loss, &[0.507_605_96], 1e-7, 1e-6);
    // backward, mean over 1 row, eps 0: softmax - onehot = [0.0900306, 0.2447285, -0.3347590]
    let d = cross_entropy::backward(&[1.0, 2.0, 3.0], &[2], 1, 3, 0.0, &[1.0], 1.0);
    assert_close(
        "ce grad",
        &d,
        &[0.090_030_57, 0.244_728_47, -0.334_759_04],
        1e-7,
        1e-6,
    );
    // an invalid target gives NaN loss and NaN gradient for that row only
    let loss = cross_entropy::forward(&[0.0, 0.0, 1.0, 2.0], &[2, 1], 2, 2, 0.0);
    assert!(loss[0].is_nan() && loss[1].is_finite());
    let d = cross_entropy::backward(&[0.0, 0.0, 1.0, 2.0], &[2, 1], 2, 2, 0.0, &[1.0], 0.5);
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
        let analytic = cross_entropy::backward(&x, &targets, rows, cols, smoothing, &[0.7], 0.25);
        let numeric = numeric_gradient(&x, 1e-3, |x| {
            let l = cross_entropy::forward(x, &targets, rows, cols, smoothing);
            0.7 * l.iter().map(|&v| f64::from(v)).sum::<f64>() / rows as f64
        });
        assert_close("ce backward mean", &analytic, &numeric, 1e-3, 1e-3);
        // per-row dloss (reduction none)
        let w = rng.vec_f32(rows, -1.0, 1.0);
        let analytic = cross_entropy::backward(&x, &targets, rows, cols, smoothing, &w, 1.0);
        let numeric = numeric_gradient(&x, 1e-3, |x| {
            dot(
                &w,
                &cross_entropy::forward(x, &targets, rows, cols, smoothing),
            )
        });
        assert_close("ce backward per-row", &analytic, &numeric, 1e-3, 1e-3);
    }
}

// ----------------------------------------------------------------------------- layer_norm

#[test]
fn layer_norm_hand_worked() {
    // x = [1, 2, 3, 4]: mean 2.5, var = (2.25 + 0.25 + 0.25 + 2.25)/4 = 1.25, eps 0:
    // rstd = 1/sqrt(1.25) = 0.8944272, y = [-1.3416408, -0.4472136, 0.4472136, 1.3416408]
    let f = layer_norm::forward(&[1.0, 2.0, 3.0, 4.0], &[1.0; 4], &[0.0; 4], 1, 4, 0.0);
    assert_close("ln mean", &f.mean, &[2.5], 0.0, 1e-7);
    assert_close("ln rstd", &f.rstd, &[0.894_427_2], 0.0, 1e-6);
    let want = [-1.341_640_8, -0.447_213_6, 0.447_213_6, 1.341_640_8];
    assert_close("ln y", &f.y, &want, 1e-7, 1e-6);
    // gamma 2, beta 1: y' = 2y + 1
    let f2 = layer_norm::forward(&[1.0, 2.0, 3.0, 4.0], &[2.0; 4], &[1.0; 4], 1, 4, 0.0);
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
    let f = layer_norm::forward(&x, &gamma, &beta, rows, cols, eps);
    let b = layer_norm::backward(&x, &gamma, &f.mean, &f.rstd, &w, rows, cols);
    let loss = |x: &[f32], g: &[f32], bt: &[f32]| {
        dot(&w, &layer_norm::forward(x, g, bt, rows, cols, eps).y)
    };
    let num_x = numeric_gradient(&x, 1e-3, |x| loss(x, &gamma, &beta));
    let num_g = numeric_gradient(&gamma, 1e-3, |g| loss(&x, g, &beta));
    let num_b = numeric_gradient(&beta, 1e-3, |bt| loss(&x, &gamma, bt));
    assert_close("ln dx", &b.dx, &num_x, 2e-3, 2e-3);
    assert_close("ln dgamma", &b.dgamma, &num_g, 2e-3, 2e-3);
    assert_close("ln dbeta", &b.dbeta, &num_b, 2e-3, 2e-3);
}
