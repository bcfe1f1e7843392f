//! One (or two) steps of each optimizer against values computed by hand from its formula;
//! state naming and round trip; schedules; a step that fails or is undone changes nothing.

use plimsoll_autograd::{Category, Tensor};
use plimsoll_kernels_wgsl::Error as KernelError;
use plimsoll_kernels_wgsl::testing::{assert_close, assert_exact, gpu};
use plimsoll_nn::{AdamW, AdamWConfig, Error, LrSchedule, Optimizer, Sgd, SgdConfig, zero_grad};

use crate::common::{param, set_grad};

#[test]
fn sgd_plain_step_by_hand() {
    let gpu = gpu();
    let w = param(&gpu, &[1.0, -2.0], &[2], "w");
    let params = vec![("w".to_string(), w.clone())];
    let mut opt = Sgd::new(SgdConfig {
        lr: 0.1,
        ..SgdConfig::default()
    });
    set_grad(&gpu, &w, &[0.5, 0.25]);
    opt.set_grad_scale(0.5);
    opt.step(&params).unwrap();
    // p -= lr * (grad_scale * g): 1 - 0.1 * 0.25 = 0.975; -2 - 0.1 * 0.125 = -2.0125.
    assert_close("sgd", &w.to_vec().unwrap(), &[0.975, -2.0125], 1e-7, 1e-6);
    assert!(opt.state().is_empty(), "no momentum, no state");
    assert_eq!(opt.step_count(), 1);
}

#[test]
fn sgd_nesterov_two_steps_by_hand() {
    let gpu = gpu();
    let w = param(&gpu, &[1.0, -2.0], &[2], "w");
    let params = vec![("w".to_string(), w.clone())];
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 0.1,
        nesterov: true,
    };
    let mut opt = Sgd::new(config);
    // Step 1 (g = [0.5, 0.25]): g' = g + wd p = [0.6, 0.05]; buf = g' (first step);
    // update = g' + 0.9 buf = [1.14, 0.095]; p = p - 0.1 update = [0.886, -2.0095].
    set_grad(&gpu, &w, &[0.5, 0.25]);
    opt.step(&params).unwrap();
    assert_close(
        "sgd step 1",
        &w.to_vec().unwrap(),
        &[0.886, -2.0095],
        1e-6,
        1e-6,
    );
    // Step 2 (same g): g' = [0.5 + 0.0886, 0.25 - 0.20095] = [0.5886, 0.04905];
    // buf = 0.9 [0.6, 0.05] + g' = [1.1286, 0.09405]; update = g' + 0.9 buf =
    // [1.60434, 0.133695]; p = [0.886 - 0.160434, -2.0095 - 0.0133695] = [0.725566, -2.0228695].
    set_grad(&gpu, &w, &[0.5, 0.25]);
    opt.step(&params).unwrap();
    assert_close(
        "sgd step 2",
        &w.to_vec().unwrap(),
        &[0.725566, -2.0228695],
        1e-6,
        1e-6,
    );
    let state = opt.state();
    assert_eq!(state.len(), 1);
    assert_eq!(state[0].0, "momentum.w");
    assert_eq!(state[0].1.category(), Category::OptimizerState);
    assert_eq!(state[0].1.label(), "momentum.w");
    assert_close(
        "momentum",
        &state[0].1.to_vec().unwrap(),
        &[1.1286, 0.09405],
        1e-6,
        1e-6,
    );

    let bad = SgdConfig {
        nesterov: true,
        momentum: 0.0,
        ..config
    };
    set_grad(&gpu, &w, &[0.5, 0.25]);
    // Nesterov without momentum is refused, by the fused kernel's launcher.
    let err = Sgd::new(bad).step(&params).unwrap_err();
    assert!(
        matches!(err, Error::Kernel(KernelError::InvalidArgument { .. }))
            && err.to_string().contains("nesterov needs momentum > 0"),
        "{err}"
    );
}

#[test]
fn adamw_two_steps_by_hand_and_state_round_trip() {
    let gpu = gpu();
    let w = param(&gpu, &[1.0], &[1], "w");
    let params = vec![("w".to_string(), w.clone())];
    let config = AdamWConfig {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        decay_matrices_only: false,
    };
    let mut opt = AdamW::new(config);
    // Step 1 (g = 0.5): p *= 1 - lr wd = 0.99; m = 0.1 * 0.5 = 0.05; v = 0.001 * 0.25 = 0.00025;
    // m/(1 - 0.9) = 0.5, v/(1 - 0.999) = 0.25, sqrt = 0.5;
    // p = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.890000002.
    set_grad(&gpu, &w, &[0.5]);
    opt.step(&params).unwrap();
    assert_close(
        "adamw step 1",
        &w.to_vec().unwrap(),
        &[0.890_000_002],
        1e-6,
        1e-6,
    );
    let names: Vec<String> = opt.state().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["exp_avg.w", "exp_avg_sq.w"]);
    assert!(
        opt.state()
            .iter()
            .all(|(_, t)| t.category() == Category::OptimizerState)
    );

    // A second optimizer resumed from the first one's state continues identically.
    let mut resumed = AdamW::new(config);
    resumed.load_state(opt.state(), opt.step_count()).unwrap();
    assert_eq!(resumed.step_count(), 1);
    let w2 = param(&gpu, &w.to_vec().unwrap(), &[1], "w2");
    let params2 = vec![("w".to_string(), w2.clone())];

    // Step 2 (g = -0.25): p = 0.89 * 0.99 = 0.8811; m = 0.9 * 0.05 + 0.1 * (-0.25) = 0.02;
    // v = 0.999 * 0.00025 + 0.001 * 0.0625 = 0.00031225; bc1 = 1 - 0.81 = 0.19,
    // bc2 = 1 - 0.998001 = 0.001999; p = 0.8811 - 0.1 / 0.19 * 0.02 /
    // (sqrt(0.00031225) / sqrt(0.001999) + 1e-8) = 0.8544662987.
    set_grad(&gpu, &w, &[-0.25]);
    opt.step(&params).unwrap();
    assert_close(
        "adamw step 2",
        &w.to_vec().unwrap(),
        &[0.854_466_298_7],
        1e-6,
        1e-6,
    );
    set_grad(&gpu, &w2, &[-0.25]);
    resumed.step(&params2).unwrap();
    assert_eq!(
        w2.to_vec().unwrap(),
        w.to_vec().unwrap(),
        "resumed optimizer diverged"
    );
    let m: Vec<f32> = opt.state()[0].1.to_vec().unwrap();
    assert_close("exp_avg", &m, &[0.02], 1e-7, 1e-6);

    // Parameters without a gradient are skipped; state names that are not AdamW's are refused.
    zero_grad(&params);
    opt.step(&params).unwrap();
    assert!(w.grad().is_none());
    let foreign = vec![("momentum.w".to_string(), w.clone())];
    let err = AdamW::new(config).load_state(foreign, 1).unwrap_err();
    assert!(
        matches!(&err, Error::OptimizerState { name, .. } if name == "momentum.w"),
        "{err}"
    );
    let half = vec![("exp_avg.w".to_string(), w.clone())];
    let err = AdamW::new(config).load_state(half, 1).unwrap_err();
    assert!(
        matches!(&err, Error::OptimizerState { name, message } if name == "exp_avg_sq.w"
            && message.contains("missing")),
        "{err}"
    );
}

#[test]
fn schedules_at_key_steps() {
    let constant = LrSchedule::Constant { lr: 0.3 };
    assert_eq!(constant.lr_at(0), 0.3);
    assert_eq!(constant.lr_at(1_000_000), 0.3);
    let s = LrSchedule::WarmupCosine {
        peak_lr: 1.0,
        warmup_steps: 10,
        total_steps: 110,
        min_lr: 0.1,
    };
    let close = |step: u64, want: f64| {
        let got = f64::from(s.lr_at(step));
        assert!(
            (got - want).abs() < 1e-6,
            "step {step}: got {got}, want {want}"
        );
    };
    close(0, 0.1); // 1.0 * 1 / 10
    close(4, 0.5); // 1.0 * 5 / 10
    close(9, 1.0); // end of warm-up
    close(10, 1.0); // cosine at progress 0
    close(60, 0.55); // progress 1/2: 0.1 + 0.9 * (1 + cos(pi/2)) / 2
    close(
        35,
        0.1 + 0.9 * (1.0 + (std::f64::consts::PI / 4.0).cos()) / 2.0,
    );
    close(110, 0.1);
    close(10_000, 0.1);
    let no_warmup = LrSchedule::WarmupCosine {
        peak_lr: 2.0,
        warmup_steps: 0,
        total_steps: 4,
        min_lr: 0.0,
    };
    assert_eq!(no_warmup.lr_at(0), 2.0);
    assert!((no_warmup.lr_at(2) - 1.0).abs() < 1e-6);
}

/// nanoGPT's groups: with `decay_matrices_only`, a matrix decays and a vector does not. With a
/// zero gradient Adam's step is 0 (m = v = 0), so only the decay moves a parameter:
/// `p *= 1 - lr * wd = 1 - 0.1 * 0.5 = 0.95`.
#[test]
fn adamw_decays_only_matrices_when_asked() {
    let gpu = gpu();
    let matrix = param(&gpu, &[1.0, 2.0], &[1, 2], "m");
    let vector = param(&gpu, &[1.0, 2.0], &[2], "v");
    let params = vec![
        ("m".to_string(), matrix.clone()),
        ("v".to_string(), vector.clone()),
    ];
    let config = AdamWConfig {
        lr: 0.1,
        weight_decay: 0.5,
        decay_matrices_only: true,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(config);
    set_grad(&gpu, &matrix, &[0.0, 0.0]);
    set_grad(&gpu, &vector, &[0.0, 0.0]);
    opt.step(&params).unwrap();
    assert_close(
        "matrix",
        &matrix.to_vec().unwrap(),
        &[0.95, 1.9],
        1e-7,
        1e-6,
    );
    assert_exact("vector", &vector.to_vec().unwrap(), &[1.0, 2.0]);
}

/// A step is all or nothing. Four 2 MiB parameters (each in a segment of its own) with
/// gradients, and a budget with room for about one parameter's new state: the first step runs
/// out of memory creating state, and every parameter, the (empty) state and the step count are
/// as before. With the budget raised, the same step gives bit for bit what a fresh optimizer
/// gives on a fresh copy of the parameters.
#[test]
fn an_optimizer_step_that_runs_out_of_memory_changes_nothing() {
    use plimsoll_kernels_wgsl::testing::fresh_gpu;
    const N: usize = 512 * 1024;
    type Make = fn() -> Box<dyn Optimizer>;
    let optimizers: [(&str, Make, u64); 2] = [
        ("AdamW", || Box::new(AdamW::new(AdamWConfig::default())), 5),
        (
            "SGD with momentum",
            || {
                Box::new(Sgd::new(SgdConfig {
                    momentum: 0.9,
                    ..SgdConfig::default()
                }))
            },
            3,
        ),
    ];
    for (what, make, room_mib) in optimizers {
        let gpu = fresh_gpu();
        let values: Vec<Vec<f32>> = (0..4)
            .map(|t| {
                (0..N)
                    .map(|i| ((i * 7 + t) % 13) as f32 / 13.0 - 0.5)
                    .collect()
            })
            .collect();
        let grads: Vec<Vec<f32>> = (0..4)
            .map(|t| {
                (0..N)
                    .map(|i| ((i * 5 + t) % 11) as f32 / 11.0 - 0.4)
                    .collect()
            })
            .collect();
        let build = |prefix: &str| -> Vec<(String, Tensor)> {
            values
                .iter()
                .zip(&grads)
                .enumerate()
                .map(|(t, (v, g))| {
                    let name = format!("{prefix}{t}");
                    let p = param(&gpu, v, &[N], &name);
                    set_grad(&gpu, &p, g);
                    (name, p)
                })
                .collect()
        };
        let params = build("p");
        gpu.flush("test").unwrap();
        gpu.empty_cache();
        let reserved = gpu.with_allocator(|a| a.stats().reserved_bytes);
        gpu.set_memory_budget(reserved + room_mib * 1024 * 1024);
        let mut opt = make();
        let err = opt.step(&params).unwrap_err();
        assert!(err.to_string().contains("out of memory"), "{what}: {err}");
        for ((name, p), v) in params.iter().zip(&values) {
            assert_eq!(&p.to_vec().unwrap(), v, "{what}: {name} changed");
        }
        assert!(opt.state().is_empty(), "{what}: state left behind");
        assert_eq!(opt.step_count(), 0, "{what}");

        gpu.set_memory_budget(u64::MAX);
        opt.step(&params).unwrap();
        let fresh = build("q");
        make().step(&fresh).unwrap();
        for ((name, p), (_, q)) in params.iter().zip(&fresh) {
            assert_eq!(p.to_vec().unwrap(), q.to_vec().unwrap(), "{what}: {name}");
        }
    }
}

/// `undo_step` takes back the host side of a step whose recorded update never ran: the step
/// count and the state it created. A step after it is the first step again (its moments start
/// at zero: the same values as a fresh optimizer's first step).
#[test]
fn undo_step_takes_back_the_step_count_and_new_state() {
    let gpu = gpu();
    let fresh = param(&gpu, &[1.0, -2.0], &[2], "w");
    let undone = param(&gpu, &[1.0, -2.0], &[2], "w");
    let mut a = AdamW::new(AdamWConfig::default());
    let mut b = AdamW::new(AdamWConfig::default());
    set_grad(&gpu, &undone, &[0.5, 0.25]);
    let params = vec![("w".to_string(), undone.clone())];
    b.step(&params).unwrap();
    gpu.flush("test").unwrap();
    b.undo_step();
    assert_eq!(b.step_count(), 0);
    assert!(b.state().is_empty());
    b.undo_step(); // twice: nothing more to undo
    assert_eq!(b.step_count(), 0);
    // Put the parameter back (the discarded update did not run), then step both.
    let back = Tensor::from_slice(&gpu, &[1.0, -2.0], &[2]).unwrap();
    plimsoll_kernels_wgsl::kernels::copy::copy(
        &gpu,
        undone.elements().unwrap(),
        back.elements().unwrap(),
    )
    .unwrap();
    set_grad(&gpu, &fresh, &[0.5, 0.25]);
    set_grad(&gpu, &undone, &[0.5, 0.25]);
    a.step(&[("w".to_string(), fresh.clone())]).unwrap();
    b.step(&params).unwrap();
    assert_eq!(b.step_count(), 1);
    assert_eq!(fresh.to_vec().unwrap(), undone.to_vec().unwrap());
    let (sa, sb) = (a.state(), b.state());
    assert_eq!(sa.len(), 2);
    for ((na, ta), (nb, tb)) in sa.iter().zip(&sb) {
        assert_eq!(na, nb);
        assert_eq!(ta.to_vec().unwrap(), tb.to_vec().unwrap(), "{na}");
    }
}

/// An optimizer's step drops the f16 weight copies an `f16_weight_copies` guard holds, so a
/// forward after the update reads the new weights even if one guard spans both updates.
#[test]
fn an_optimizer_step_refreshes_f16_weight_copies() {
    use plimsoll_autograd::{f16_activations, f16_weight_copies};
    for (opt_name, mut opt) in [
        (
            "sgd",
            Box::new(Sgd::new(SgdConfig {
                lr: 0.5,
                ..SgdConfig::default()
            })) as Box<dyn Optimizer>,
        ),
        (
            "adamw",
            Box::new(AdamW::new(AdamWConfig {
                lr: 0.5,
                ..AdamWConfig::default()
            })),
        ),
    ] {
        let gpu = gpu();
        let w = param(&gpu, &[1.0, -2.0, 0.5, 3.0], &[2, 2], "w");
        let x = Tensor::from_slice(&gpu, &[1.0, 1.0], &[1, 2]).unwrap();
        let params = vec![("w".to_string(), w.clone())];
        let forward = || {
            let _half = f16_activations();
            x.matmul_transposed(&w).unwrap()
        };
        let _weights = f16_weight_copies();
        forward().sum_all().unwrap().backward().unwrap();
        opt.step(&params).unwrap();
        // y = x · wᵀ with the updated weights, as f16 rounds them.
        let w_now =
            plimsoll_kernels_wgsl::kernels::convert::reference::round_to_f16(&w.to_vec().unwrap());
        let want = [w_now[0] + w_now[1], w_now[2] + w_now[3]];
        let got = forward().to_vec().unwrap();
        assert_close(opt_name, &got, &want, 1e-3, 1e-3);
    }
}
