//! Losses against f64 CPU references (forward and gradient).

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::kernels::cross_entropy::reference as cross_entropy;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, gpu, to_f64};
use plimsoll_nn::{Error, loss};

use crate::common::input;

#[test]
fn mse_matches_reference() {
    let gpu = gpu();
    let pred = Rng::new(30).vec_f32(7, -2.0, 2.0);
    let target = Rng::new(31).vec_f32(7, -2.0, 2.0);
    let p = input(&gpu, &pred, &[7]);
    let t = Tensor::from_slice(&gpu, &target, &[7]).unwrap();
    let l = loss::mse(&p, &t).unwrap();
    // mean((p - t)^2); d/dp = 2 (p - t) / n.
    let n = 7.0;
    let want: f64 = pred
        .iter()
        .zip(&target)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum::<f64>()
        / n;
    assert_close("mse", &[l.item().unwrap()], &[want], 1e-6, 1e-5);
    l.backward().unwrap();
    let grad: Vec<f64> = pred
        .iter()
        .zip(&target)
        .map(|(a, b)| 2.0 * f64::from(a - b) / n)
        .collect();
    assert_close(
        "d mse / d pred",
        &p.grad().unwrap().to_vec().unwrap(),
        &grad,
        1e-6,
        1e-5,
    );
    let wrong = Tensor::from_slice(&gpu, &[0.0; 7], &[7, 1]).unwrap();
    // No silent broadcasting.
    let err = loss::mse(&p, &wrong).unwrap_err();
    assert!(
        matches!(&err, Error::InputShape { module: "mse", expected, found }
            if found == &[7] && expected.contains("[7, 1]")),
        "{err}"
    );
}

#[test]
fn cross_entropy_matches_reference() {
    let gpu = gpu();
    let (rows, classes) = (4, 5);
    let logits = Rng::new(32).vec_f32(rows * classes, -3.0, 3.0);
    let targets = [1u32, 4, 0, 4];
    for smoothing in [0.0f32, 0.1] {
        let x = input(&gpu, &logits, &[rows, classes]);
        let t = Tensor::from_indices(&gpu, &targets, &[rows]).unwrap();
        let l = loss::cross_entropy(&x, &t, smoothing).unwrap();
        // Per row: q = (1 - s) onehot(target) + s / C; loss = -sum_c q_c log softmax_c;
        // d loss / d logit_c = (softmax_c - q_c) / rows (the reference's mean-reduced backward).
        let s = f64::from(smoothing);
        let logits64 = to_f64(&logits);
        let losses = cross_entropy::forward_f64(&logits64, &targets, rows, classes, s);
        let total: f64 = losses.iter().sum();
        let scale = 1.0 / rows as f64;
        let grad =
            cross_entropy::backward_f64(&logits64, &targets, rows, classes, s, &[1.0], scale);
        assert_close(
            "cross_entropy",
            &[l.item().unwrap()],
            &[total / rows as f64],
            1e-5,
            1e-5,
        );
        l.backward().unwrap();
        assert_close(
            "d ce / d logits",
            &x.grad().unwrap().to_vec().unwrap(),
            &grad,
            1e-6,
            1e-4,
        );
    }
    let x = input(&gpu, &logits, &[rows, classes]);
    let t = Tensor::from_indices(&gpu, &targets, &[rows]).unwrap();
    let err = loss::cross_entropy(&x, &t, 1.5).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                what: "cross_entropy",
                ..
            }
        ) && err.to_string().contains("label_smoothing 1.5"),
        "{err}"
    );
    let f32_targets = Tensor::from_slice(&gpu, &[0.0; 4], &[4]).unwrap();
    let err = loss::cross_entropy(&x, &f32_targets, 0.0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InputShape {
                module: "cross_entropy",
                ..
            }
        ) && err.to_string().contains("u32 class targets"),
        "{err}"
    );
}
