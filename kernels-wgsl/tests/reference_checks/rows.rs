//! The cross-entropy reference (softmax's and layer norm's are checked in their families'
//! `kernels::<stem>::tests`).

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
