use plimsoll_kernels_wgsl::kernels::optimizer::{self, AdamWConfig, AdamWStep, SgdConfig, SgdStep};
use plimsoll_kernels_wgsl::testing::{Guarded, Rng, gpu};
use plimsoll_kernels_wgsl::{Category, Error, Gpu, reference};

const LENS: [usize; 4] = [1, 255, 1000, 10_007];
const STEPS: u64 = 4;

// Tolerances. Both sides compute in f32 with the same f32 scalars and the same operation order,
// so a step differs only where the GPU contracts a*b + c into an fma, and in lavapipe's sqrt and
// division (a few ulp, not correctly rounded). Over 4 steps that stays within ~10 ulp of each
// value: rtol 1e-5 (~80 ulp). The atol covers values that cancel to near 0 (p - lr*g,
// b*buf + g): a few ulp of the O(1) operands per step, 1e-6 for parameters and first moments;
// second moments are sums of non-negative terms ~(1 - beta2) g^2 (no cancellation): 1e-10.
const PARAM_TOL: (f64, f64) = (1e-6, 1e-5);
const MOMENT_TOL: (f64, f64) = (1e-6, 1e-5);
const SECOND_MOMENT_TOL: (f64, f64) = (1e-10, 1e-5);

fn sgd_case(gpu: &Gpu, rng: &mut Rng, len: usize, config: &SgdConfig, grad_scale: f32) {
    let name = |what: &str, step: u64| format!("sgd {what} len {len} step {step} {config:?}");
    let mut param = rng.vec_f32(len, -1.0, 1.0);
    // Random before the first step: first_step must ignore the buffer's contents.
    let mut momentum_buf = rng.vec_f32(len, -1.0, 1.0);
    let param_gpu = Guarded::upload(gpu, rng, &param, 3, "param").unwrap();
    let grad_gpu = Guarded::random(gpu, rng, len, 5, "grad").unwrap();
    let momentum_gpu = Guarded::upload(gpu, rng, &momentum_buf, 2, "momentum").unwrap();
    let momentum_s = (config.momentum != 0.0).then_some(momentum_gpu.slice().unwrap());
    for step in 0..STEPS {
        // Gradients as a loss-scaled backward would leave them: grad_scale undoes the scale.
        let grad = rng.vec_f32(len, -1.0 / grad_scale, 1.0 / grad_scale);
        gpu.write(&grad_gpu.buffer, grad_gpu.at(), &grad).unwrap();
        let first_step = step == 0;
        let sgd = SgdStep {
            config: *config,
            first_step,
            grad_scale,
        };
        optimizer::sgd_step(
            gpu,
            &sgd,
            param_gpu.slice().unwrap(),
            grad_gpu.slice().unwrap(),
            momentum_s,
        )
        .unwrap();
        reference::optimizer::sgd_step(
            &mut param,
            &grad,
            &mut momentum_buf,
            config,
            first_step,
            grad_scale,
        );
        let (atol, rtol) = PARAM_TOL;
        param_gpu
            .check(gpu, &name("param", step), &param, atol, rtol)
            .unwrap();
        if config.momentum != 0.0 {
            let (atol, rtol) = MOMENT_TOL;
            momentum_gpu
                .check(gpu, &name("momentum", step), &momentum_buf, atol, rtol)
                .unwrap();
        }
    }
    // Without momentum the buffer is never touched (it is not even bound).
    if config.momentum == 0.0 {
        let initial = &momentum_gpu.initial[2..2 + len];
        momentum_gpu
            .check(gpu, &name("momentum untouched", STEPS), initial, 0.0, 0.0)
            .unwrap();
    }
}

/// `offsets`: where param, grad, exp_avg and exp_avg_sq start in their buffers (all multiples
/// of 4 take the `adamw_v4` path for the whole vec4s and `adamw` for the rest).
fn adamw_case(
    gpu: &Gpu,
    rng: &mut Rng,
    len: usize,
    config: &AdamWConfig,
    grad_scale: f32,
    offsets: [usize; 4],
) {
    let name = |what: &str, step: u64| {
        format!("adamw {what} len {len} offsets {offsets:?} step {step} {config:?}")
    };
    let mut param = rng.vec_f32(len, -1.0, 1.0);
    let mut exp_avg = vec![0.0; len];
    let mut exp_avg_sq = vec![0.0; len];
    let [op, og, om, ov] = offsets;
    let param_gpu = Guarded::upload(gpu, rng, &param, op, "param").unwrap();
    let grad_gpu = Guarded::random(gpu, rng, len, og, "grad").unwrap();
    let m_gpu = Guarded::upload(gpu, rng, &exp_avg, om, "exp_avg").unwrap();
    let v_gpu = Guarded::upload(gpu, rng, &exp_avg_sq, ov, "exp_avg_sq").unwrap();
    for step in 1..=STEPS {
        let grad = rng.vec_f32(len, -1.0 / grad_scale, 1.0 / grad_scale);
        gpu.write(&grad_gpu.buffer, grad_gpu.at(), &grad).unwrap();
        let adamw = AdamWStep {
            config: *config,
            step,
            grad_scale,
        };
        let (p, g, m, v) = (
            param_gpu.slice().unwrap(),
            grad_gpu.slice().unwrap(),
            m_gpu.slice().unwrap(),
            v_gpu.slice().unwrap(),
        );
        optimizer::adamw_step(gpu, &adamw, p, g, m, v).unwrap();
        reference::optimizer::adamw_step(
            &mut param,
            &grad,
            &mut exp_avg,
            &mut exp_avg_sq,
            config,
            step,
            grad_scale,
        );
        let (atol, rtol) = PARAM_TOL;
        param_gpu
            .check(gpu, &name("param", step), &param, atol, rtol)
            .unwrap();
        let (atol, rtol) = MOMENT_TOL;
        m_gpu
            .check(gpu, &name("exp_avg", step), &exp_avg, atol, rtol)
            .unwrap();
        let (atol, rtol) = SECOND_MOMENT_TOL;
        v_gpu
            .check(gpu, &name("exp_avg_sq", step), &exp_avg_sq, atol, rtol)
            .unwrap();
    }
}

#[test]
fn optimizer_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(81);
    let sgd = |lr, momentum, dampening, weight_decay, nesterov| SgdConfig {
        lr,
        momentum,
        dampening,
        weight_decay,
        nesterov,
    };
    let sgd_configs = [
        (sgd(0.1, 0.0, 0.0, 0.0, false), 1.0),          // plain
        (sgd(0.05, 0.9, 0.1, 0.0, false), 1.0),         // momentum with dampening
        (sgd(0.05, 0.9, 0.0, 0.01, true), 1.0),         // nesterov + weight decay
        (sgd(0.1, 0.0, 0.0, 0.05, false), 1.0 / 256.0), // weight decay, loss-scaled grads
    ];
    let adamw_configs = [
        (
            AdamWConfig {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
            },
            1.0,
        ),
        (
            AdamWConfig {
                lr: 3e-3,
                beta1: 0.8,
                beta2: 0.95,
                eps: 1e-6,
                weight_decay: 0.0,
            },
            0.125,
        ),
    ];
    for len in LENS {
        for (config, grad_scale) in &sgd_configs {
            sgd_case(&gpu, &mut rng, len, config, *grad_scale);
        }
        for (config, grad_scale) in &adamw_configs {
            for offsets in [[1, 4, 6, 3], [4, 8, 0, 12]] {
                adamw_case(&gpu, &mut rng, len, config, *grad_scale, offsets);
            }
        }
    }
}

#[test]
fn optimizer_rejects_bad_arguments() {
    let gpu = gpu();
    let a = gpu.alloc_elements(10, Category::Temporary, "a").unwrap();
    let b = gpu.alloc_elements(10, Category::Temporary, "b").unwrap();
    let plain = SgdConfig {
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
    };
    let step = |config| SgdStep {
        config,
        first_step: true,
        grad_scale: 1.0,
    };
    // grad = elements 1..11 of 10: no such slice; the 9 that fit differ from param's 10.
    let err = b.slice(1, 10).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("elements 1..11"), "{err}");
    let grad9 = b.slice(1, 9).unwrap();
    let err = optimizer::sgd_step(&gpu, &step(plain), a.whole(), grad9, None).unwrap_err();
    assert!(err.to_string().contains("grad: 9 elements given"), "{err}");
    let momentum = SgdConfig {
        momentum: 0.9,
        ..plain
    };
    let err = optimizer::sgd_step(&gpu, &step(momentum), a.whole(), b.whole(), None).unwrap_err();
    assert!(err.to_string().contains("momentum buffer"), "{err}");
    let short = Some(b.slice(0, 9).unwrap());
    let err = optimizer::sgd_step(&gpu, &step(momentum), a.whole(), b.whole(), short).unwrap_err();
    assert!(
        err.to_string().contains("momentum_buf: 9 elements given"),
        "{err}"
    );
    let nesterov = SgdConfig {
        dampening: 0.1,
        nesterov: true,
        ..momentum
    };
    let with_buf = Some(b.whole());
    let err =
        optimizer::sgd_step(&gpu, &step(nesterov), a.whole(), b.whole(), with_buf).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. })
            && err
                .to_string()
                .contains("dampening = 0, got momentum 0.9 dampening 0.1"),
        "{err}"
    );
    let config = AdamWConfig {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let adamw = |step| AdamWStep {
        config,
        step,
        grad_scale: 1.0,
    };
    let (a5, b5, b5_hi) = (
        a.slice(0, 5).unwrap(),
        b.slice(0, 5).unwrap(),
        b.slice(5, 5).unwrap(),
    );
    let err = optimizer::adamw_step(&gpu, &adamw(0), a5, b5, a5, b5_hi).unwrap_err();
    assert!(err.to_string().contains("1-based"), "{err}");
    // exp_avg_sq = elements 5..11 of 10: no such slice; the 5 that fit differ from the others' 6.
    let err = b.slice(5, 6).unwrap_err();
    assert!(err.to_string().contains("elements 5..11"), "{err}");
    let (a6, b6) = (a.slice(0, 6).unwrap(), b.slice(0, 6).unwrap());
    let err = optimizer::adamw_step(&gpu, &adamw(1), a6, b6, a6, b5_hi).unwrap_err();
    assert!(
        err.to_string().contains("exp_avg_sq: 5 elements given"),
        "{err}"
    );
}
