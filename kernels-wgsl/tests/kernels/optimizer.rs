use plimsoll_kernels_wgsl::kernels::optimizer::{self, AdamWBuffers, SgdBuffers};
use plimsoll_kernels_wgsl::reference::optimizer::{AdamWConfig, SgdConfig};
use plimsoll_kernels_wgsl::{Category, Gpu, reference};

use crate::common::{Guarded, Rng, gpu};

const LENS: [usize; 4] = [1, 255, 1000, 10_007];
const STEPS: u64 = 4;

// Tolerances. Both sides compute in f32 with the same f32 scalars and the same operation order,
// so a step differs only where the GPU contracts a*b + c into an fma, and in lavapipe's sqrt and
// division (a few ulp, not correctly rounded). Over 4 steps that stays within ~10 ulp of each
// value: rtol 1e-5 (~80 ulp). The atol covers values that cancel to near 0 (p - lr*g,
// b*buf + g): a few ulp of the O(1) operands per step, 1e-6 for parameters and first moments;
// second moments are sums of non-negative terms ~(1 - beta2) g^2 (no cancellation): 1e-10.
const PARAM_TOL: (f32, f32) = (1e-6, 1e-5);
const MOMENT_TOL: (f32, f32) = (1e-6, 1e-5);
const SECOND_MOMENT_TOL: (f32, f32) = (1e-10, 1e-5);

fn sgd_case(gpu: &Gpu, rng: &mut Rng, len: usize, config: &SgdConfig, grad_scale: f32) {
    let name = |what: &str, step: u64| format!("sgd {what} len {len} step {step} {config:?}");
    let mut param = rng.vec_f32(len, -1.0, 1.0);
    // Random before the first step: first_step must ignore the buffer's contents.
    let mut momentum_buf = rng.vec_f32(len, -1.0, 1.0);
    let param_gpu = Guarded::upload(gpu, rng, &param, 3, "param");
    let grad_gpu = Guarded::random(gpu, rng, len, 5, "grad");
    let momentum_gpu = Guarded::upload(gpu, rng, &momentum_buf, 2, "momentum");
    let buffers = SgdBuffers {
        param: &param_gpu.buffer,
        param_offset: param_gpu.at(),
        grad: &grad_gpu.buffer,
        grad_offset: grad_gpu.at(),
        momentum_buf: (config.momentum != 0.0).then_some(&momentum_gpu.buffer),
        momentum_buf_offset: momentum_gpu.at(),
    };
    for step in 0..STEPS {
        // Gradients as a loss-scaled backward would leave them: grad_scale undoes the scale.
        let grad = rng.vec_f32(len, -1.0 / grad_scale, 1.0 / grad_scale);
        gpu.write(&grad_gpu.buffer, grad_gpu.at(), &grad).unwrap();
        let first_step = step == 0;
        optimizer::sgd_step(gpu, &buffers, len as u64, config, first_step, grad_scale).unwrap();
        reference::optimizer::sgd_step(
            &mut param,
            &grad,
            &mut momentum_buf,
            config,
            first_step,
            grad_scale,
        );
        let (atol, rtol) = PARAM_TOL;
        param_gpu.check(gpu, &name("param", step), &param, atol, rtol);
        if config.momentum != 0.0 {
            let (atol, rtol) = MOMENT_TOL;
            momentum_gpu.check(gpu, &name("momentum", step), &momentum_buf, atol, rtol);
        }
    }
    // Without momentum the buffer is never touched (it is not even bound).
    if config.momentum == 0.0 {
        let initial = &momentum_gpu.initial[2..2 + len];
        momentum_gpu.check(gpu, &name("momentum untouched", STEPS), initial, 0.0, 0.0);
    }
}

fn adamw_case(gpu: &Gpu, rng: &mut Rng, len: usize, config: &AdamWConfig, grad_scale: f32) {
    let name = |what: &str, step: u64| format!("adamw {what} len {len} step {step} {config:?}");
    let mut param = rng.vec_f32(len, -1.0, 1.0);
    let mut exp_avg = vec![0.0; len];
    let mut exp_avg_sq = vec![0.0; len];
    let param_gpu = Guarded::upload(gpu, rng, &param, 1, "param");
    let grad_gpu = Guarded::random(gpu, rng, len, 4, "grad");
    let m_gpu = Guarded::upload(gpu, rng, &exp_avg, 6, "exp_avg");
    let v_gpu = Guarded::upload(gpu, rng, &exp_avg_sq, 3, "exp_avg_sq");
    let buffers = AdamWBuffers {
        param: &param_gpu.buffer,
        param_offset: param_gpu.at(),
        grad: &grad_gpu.buffer,
        grad_offset: grad_gpu.at(),
        exp_avg: &m_gpu.buffer,
        exp_avg_offset: m_gpu.at(),
        exp_avg_sq: &v_gpu.buffer,
        exp_avg_sq_offset: v_gpu.at(),
    };
    for step in 1..=STEPS {
        let grad = rng.vec_f32(len, -1.0 / grad_scale, 1.0 / grad_scale);
        gpu.write(&grad_gpu.buffer, grad_gpu.at(), &grad).unwrap();
        optimizer::adamw_step(gpu, &buffers, len as u64, config, step, grad_scale).unwrap();
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
        param_gpu.check(gpu, &name("param", step), &param, atol, rtol);
        let (atol, rtol) = MOMENT_TOL;
        m_gpu.check(gpu, &name("exp_avg", step), &exp_avg, atol, rtol);
        let (atol, rtol) = SECOND_MOMENT_TOL;
        v_gpu.check(gpu, &name("exp_avg_sq", step), &exp_avg_sq, atol, rtol);
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
            adamw_case(&gpu, &mut rng, len, config, *grad_scale);
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
    let mut sgd = SgdBuffers {
        param: &a,
        param_offset: 0,
        grad: &b,
        grad_offset: 1,
        momentum_buf: None,
        momentum_buf_offset: 0,
    };
    let err = optimizer::sgd_step(&gpu, &sgd, 10, &plain, true, 1.0).unwrap_err();
    assert!(err.to_string().contains("grad: elements 1..11"), "{err}");
    sgd.grad_offset = 0;
    let momentum = SgdConfig {
        momentum: 0.9,
        ..plain
    };
    let err = optimizer::sgd_step(&gpu, &sgd, 10, &momentum, true, 1.0).unwrap_err();
    assert!(err.to_string().contains("momentum buffer"), "{err}");
    let nesterov = SgdConfig {
        dampening: 0.1,
        nesterov: true,
        ..momentum
    };
    sgd.momentum_buf = Some(&b);
    assert!(optimizer::sgd_step(&gpu, &sgd, 10, &nesterov, true, 1.0).is_err());
    let adamw = AdamWBuffers {
        param: &a,
        param_offset: 0,
        grad: &b,
        grad_offset: 0,
        exp_avg: &a,
        exp_avg_offset: 0,
        exp_avg_sq: &b,
        exp_avg_sq_offset: 5,
    };
    let config = AdamWConfig {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let err = optimizer::adamw_step(&gpu, &adamw, 5, &config, 0, 1.0).unwrap_err();
    assert!(err.to_string().contains("1-based"), "{err}");
    let err = optimizer::adamw_step(&gpu, &adamw, 6, &config, 1, 1.0).unwrap_err();
    assert!(
        err.to_string().contains("exp_avg_sq: elements 5..11"),
        "{err}"
    );
}
