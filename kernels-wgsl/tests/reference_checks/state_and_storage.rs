//! Optimizer and non-finite check references (the embedding's and the f16 conversion's are checked
//! in `kernels::embedding::tests` and `kernels::convert::tests`).

use super::*;

// ------------------------------------------------------------------------------ optimizer

#[test]
fn adamw_one_step_by_hand() {
    // p = 1, g = 0.5, lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, t = 1:
    // p <- 1 * (1 - 0.1*0.01) = 0.999; m = 0.1 * 0.5 = 0.05; v = 0.001 * 0.25 = 0.00025;
    // bc1 = 0.1, bc2 = 0.001: m_hat = 0.5, sqrt(v_hat) = 0.5;
    // p <- 0.999 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.999 - 0.09999999800 = 0.8990000020
    let config = AdamWConfig {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let (mut p, mut m, mut v) = (vec![1.0f32], vec![0.0f32], vec![0.0f32]);
    optimizer::adamw_step(&mut p, &[0.5], &mut m, &mut v, &config, 1, 1.0);
    assert!((p[0] - 0.899).abs() < 1e-6, "p = {}", p[0]);
    assert!((m[0] - 0.05).abs() < 1e-8 && (v[0] - 0.000_25).abs() < 1e-10);
    // the first AdamW step moves every coordinate by about lr (sign of g), whatever |g|
    let (mut p, mut m, mut v) = (vec![0.0f32; 3], vec![0.0f32; 3], vec![0.0f32; 3]);
    let config = AdamWConfig {
        weight_decay: 0.0,
        ..config
    };
    optimizer::adamw_step(
        &mut p,
        &[1e-3, -7.0, 300.0],
        &mut m,
        &mut v,
        &config,
        1,
        1.0,
    );
    assert_close("adamw first step", &p, &[-0.1, 0.1, -0.1], 1e-5, 1e-5);
    // the scalars are the f64 formulas rounded once
    let s = config.scalars(3);
    assert_eq!(s.step_size, (0.1 / (1.0 - 0.9f64.powi(3))) as f32);
    assert_eq!(
        s.bias_correction2_sqrt,
        (1.0 - 0.999f64.powi(3)).sqrt() as f32
    );
}

#[test]
fn sgd_steps_by_hand() {
    // momentum 0.9, lr 0.1, g = 1 on both steps, p0 = 1:
    // plain:    step 1: buf = g = 1, p = 1 - 0.1 = 0.9; step 2: buf = 0.9 + 1 = 1.9, p = 0.71
    // nesterov: step 1: update = 1 + 0.9*1 = 1.9, p = 0.81; step 2: buf = 1.9,
    //           update = 1 + 0.9*1.9 = 2.71, p = 0.81 - 0.271 = 0.539
    for (nesterov, want) in [(false, [0.9f32, 0.71]), (true, [0.81, 0.539])] {
        let config = SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov,
        };
        let (mut p, mut buf) = (vec![1.0f32], vec![0.0f32]);
        optimizer::sgd_step(&mut p, &[1.0], &mut buf, &config, true, 1.0);
        assert!(
            (p[0] - want[0]).abs() < 1e-6,
            "nesterov={nesterov} step 1: {}",
            p[0]
        );
        optimizer::sgd_step(&mut p, &[1.0], &mut buf, &config, false, 1.0);
        assert!(
            (p[0] - want[1]).abs() < 1e-6,
            "nesterov={nesterov} step 2: {}",
            p[0]
        );
    }
    // weight decay 0.5, dampening 0.5, no momentum buffer on step 1 dampening:
    // step 1: g = 1 + 0.5*1 = 1.5, buf = 1.5, p = 1 - 0.15 = 0.85
    // step 2: g = 1 + 0.5*0.85 = 1.425, buf = 0.9*1.5 + 0.5*1.425 = 2.0625, p = 0.85 - 0.20625
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.5,
        weight_decay: 0.5,
        nesterov: false,
    };
    let (mut p, mut buf) = (vec![1.0f32], vec![0.0f32]);
    optimizer::sgd_step(&mut p, &[1.0], &mut buf, &config, true, 1.0);
    optimizer::sgd_step(&mut p, &[1.0], &mut buf, &config, false, 1.0);
    assert!(
        (p[0] - 0.643_75).abs() < 1e-6 && (buf[0] - 2.0625).abs() < 1e-6,
        "{p:?} {buf:?}"
    );
    // no momentum: plain p -= lr * g * grad_scale (grad_scale 0.5 unscales)
    let config = SgdConfig {
        momentum: 0.0,
        weight_decay: 0.0,
        ..config
    };
    let (mut p, mut buf) = (vec![1.0f32], vec![42.0f32]);
    optimizer::sgd_step(&mut p, &[2.0], &mut buf, &config, true, 0.5);
    assert_eq!((p[0], buf[0]), (0.9, 42.0));
}

// ------------------------------------------------------------------------------ nonfinite

#[test]
fn nonfinite_flags() {
    assert_eq!(
        nonfinite::flags(&[1.0, 2.0, f32::MAX]),
        [0, nonfinite::NO_INDEX]
    );
    assert_eq!(nonfinite::flags(&[1.0, f32::INFINITY, f32::NAN]), [1, 1]);
    assert_eq!(nonfinite::flags(&[f32::NAN]), [1, 0]);
    assert_eq!(
        nonfinite::first_nonfinite(&[0.0, -0.0, f32::NEG_INFINITY]),
        Some(2)
    );
}
