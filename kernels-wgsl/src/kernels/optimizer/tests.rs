//! The `optimizer` launchers against [`reference`](super::reference) (SGD with and without
//! momentum, AdamW, at odd and 4-aligned offsets, loss-scaled gradients), their argument checks,
//! and the reference itself against steps worked by hand.

use super::reference;
use super::{AdamWConfig, AdamWStep, SgdConfig, SgdStep};
use crate::testing::{assert_close, gpu_and_rng, gpu_and_temporaries, Guarded, Rng};
use crate::testing::DEADLINE;
use crate::{Category, Error, Gpu, Result};

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

fn sgd_case(gpu: &Gpu, rng: &mut Rng, len: usize, config: &SgdConfig, grad_scale: f32) -> Result<()> {
    let name = |what: &str, step: u64| format!("sgd {what} len {len} step {step} {config:?}");
    let mut param = rng.vec_f32(len, -1.0, 1.0);
    // Random before the first step: first_step must ignore the buffer's contents.
    let mut momentum_buf = rng.vec_f32(len, -1.0, 1.0);
    let param_gpu = Guarded::upload(gpu, rng, &param, 3, "param")?;
    let grad_gpu = Guarded::random(gpu, rng, len, 5, "grad")?;
    let momentum_gpu = Guarded::upload(gpu, rng, &momentum_buf, 2, "momentum")?;
    let momentum_s = (config.momentum != 0.0).then_some(momentum_gpu.slice()?);
    for step in 0..STEPS {
        // Gradients as a loss-scaled backward would leave them: grad_scale undoes the scale.
        let grad = rng.vec_f32(len, -1.0 / grad_scale, 1.0 / grad_scale);
        gpu.write(&grad_gpu.buffer, grad_gpu.at(), &grad)?;
        let first_step = step == 0;
        let sgd = SgdStep {
            config: *config,
            first_step,
            grad_scale,
            control: None,
        };
        super::sgd_step(
            gpu,
            &sgd,
            param_gpu.slice()?,
            grad_gpu.slice()?,
            momentum_s,
        )?;
        reference::sgd_step(
            &mut param,
            &grad,
            &mut momentum_buf,
            config,
            first_step,
            grad_scale,
        );
        let (atol, rtol) = PARAM_TOL;
        param_gpu
            .check(gpu, &name("param", step), &param, atol, rtol)?;
        if config.momentum != 0.0 {
            let (atol, rtol) = MOMENT_TOL;
            momentum_gpu
                .check(gpu, &name("momentum", step), &momentum_buf, atol, rtol)?;
        }
    }
    // Without momentum the buffer is never touched (it is not even bound).
    if config.momentum == 0.0 {
        let initial = &momentum_gpu.initial[2..2 + len];
        momentum_gpu
            .check(gpu, &name("momentum untouched", STEPS), initial, 0.0, 0.0)?;
    }
    Ok(())
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
) -> Result<()> {
    let name = |what: &str, step: u64| {
        format!("adamw {what} len {len} offsets {offsets:?} step {step} {config:?}")
    };
    let mut param = rng.vec_f32(len, -1.0, 1.0);
    let mut exp_avg = vec![0.0; len];
    let mut exp_avg_sq = vec![0.0; len];
    let [op, og, om, ov] = offsets;
    let param_gpu = Guarded::upload(gpu, rng, &param, op, "param")?;
    let grad_gpu = Guarded::random(gpu, rng, len, og, "grad")?;
    let m_gpu = Guarded::upload(gpu, rng, &exp_avg, om, "exp_avg")?;
    let v_gpu = Guarded::upload(gpu, rng, &exp_avg_sq, ov, "exp_avg_sq")?;
    for step in 1..=STEPS {
        let grad = rng.vec_f32(len, -1.0 / grad_scale, 1.0 / grad_scale);
        gpu.write(&grad_gpu.buffer, grad_gpu.at(), &grad)?;
        let adamw = AdamWStep {
            config: *config,
            step,
            grad_scale,
            control: None,
        };
        let (p, g, m, v) = (
            param_gpu.slice()?,
            grad_gpu.slice()?,
            m_gpu.slice()?,
            v_gpu.slice()?,
        );
        super::adamw_step(gpu, &adamw, p, g, m, v)?;
        reference::adamw_step(
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
            .check(gpu, &name("param", step), &param, atol, rtol)?;
        let (atol, rtol) = MOMENT_TOL;
        m_gpu
            .check(gpu, &name("exp_avg", step), &exp_avg, atol, rtol)?;
        let (atol, rtol) = SECOND_MOMENT_TOL;
        v_gpu
            .check(gpu, &name("exp_avg_sq", step), &exp_avg_sq, atol, rtol)?;
    }
    Ok(())
}

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(81);
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
            sgd_case(&gpu, &mut rng, len, config, *grad_scale)?;
        }
        for (config, grad_scale) in &adamw_configs {
            for offsets in [[1, 4, 6, 3], [4, 8, 0, 12]] {
                adamw_case(&gpu, &mut rng, len, config, *grad_scale, offsets)?;
            }
        }
    }
    Ok(())
}

#[test]
fn optimizer_rejects_bad_arguments() -> Result<()> {
    let (gpu, [a, b]) = gpu_and_temporaries([(10, "a"), (10, "b")])?;
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
        control: None,
    };
    // grad = elements 1..11 of 10: no such slice; the 9 that fit differ from param's 10.
    let err = b.slice(1, 10).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("elements 1..11"), "{err}");
    let grad9 = b.slice(1, 9)?;
    let err = super::sgd_step(&gpu, &step(plain), a.whole(), grad9, None).expect_err("must be refused");
    assert!(err.to_string().contains("grad: 9 elements given"), "{err}");
    let momentum = SgdConfig {
        momentum: 0.9,
        ..plain
    };
    let err = super::sgd_step(&gpu, &step(momentum), a.whole(), b.whole(), None).expect_err("must be refused");
    assert!(err.to_string().contains("momentum buffer"), "{err}");
    let short = Some(b.slice(0, 9)?);
    let err = super::sgd_step(&gpu, &step(momentum), a.whole(), b.whole(), short).expect_err("must be refused");
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
        super::sgd_step(&gpu, &step(nesterov), a.whole(), b.whole(), with_buf).expect_err("must be refused");
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
        control: None,
    };
    let (a5, b5, b5_hi) = (
        a.slice(0, 5)?,
        b.slice(0, 5)?,
        b.slice(5, 5)?,
    );
    let err = super::adamw_step(&gpu, &adamw(0), a5, b5, a5, b5_hi).expect_err("must be refused");
    assert!(err.to_string().contains("1-based"), "{err}");
    // exp_avg_sq = elements 5..11 of 10: no such slice; the 5 that fit differ from the others' 6.
    let err = b.slice(5, 6).expect_err("must be refused");
    assert!(err.to_string().contains("elements 5..11"), "{err}");
    let (a6, b6) = (a.slice(0, 6)?, b.slice(0, 6)?);
    let err = super::adamw_step(&gpu, &adamw(1), a6, b6, a6, b5_hi).expect_err("must be refused");
    assert!(
        err.to_string().contains("exp_avg_sq: 5 elements given"),
        "{err}"
    );
    Ok(())
}

// ------------------------------------------------------------------------------- reference

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
    reference::adamw_step(&mut p, &[0.5], &mut m, &mut v, &config, 1, 1.0);
    assert!((p[0] - 0.899).abs() < 1e-6, "p = {}", p[0]);
    assert!((m[0] - 0.05).abs() < 1e-8 && (v[0] - 0.000_25).abs() < 1e-10);
    // the first AdamW step moves every coordinate by about lr (sign of g), whatever |g|
    let (mut p, mut m, mut v) = (vec![0.0f32; 3], vec![0.0f32; 3], vec![0.0f32; 3]);
    let config = AdamWConfig {
        weight_decay: 0.0,
        ..config
    };
    reference::adamw_step(
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
        reference::sgd_step(&mut p, &[1.0], &mut buf, &config, true, 1.0);
        assert!(
            (p[0] - want[0]).abs() < 1e-6,
            "nesterov={nesterov} step 1: {}",
            p[0]
        );
        reference::sgd_step(&mut p, &[1.0], &mut buf, &config, false, 1.0);
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
    reference::sgd_step(&mut p, &[1.0], &mut buf, &config, true, 1.0);
    reference::sgd_step(&mut p, &[1.0], &mut buf, &config, false, 1.0);
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
    reference::sgd_step(&mut p, &[2.0], &mut buf, &config, true, 0.5);
    assert_eq!((p[0], buf[0]), (0.9, 42.0));
}

/// One tensor of the multi-tensor test: its length, its operands' offsets (see `adamw_case`),
/// and whether it is decayed.
const MULTI_TENSORS: [(usize, [usize; 4], bool); 12] = [
    (1, [0, 4, 8, 0], true),
    (3, [4, 0, 0, 4], false),
    (4, [8, 4, 4, 8], true),
    (255, [0, 0, 0, 0], true),
    (1000, [4, 8, 12, 0], false),
    (8192, [0, 4, 0, 4], true),
    // Two chunks and a tail of 3 elements.
    (8192 + 3, [4, 4, 8, 8], true),
    // Unaligned operands: the whole tensor through `adamw_step`.
    (10_007, [1, 4, 6, 3], true),
    (64, [0, 0, 4, 4], false),
    (7, [12, 0, 4, 8], true),
    (4 * 2048 * 3 + 4, [0, 8, 4, 0], true),
    (33, [4, 4, 4, 4], false),
];

/// `adamw_steps` over tensors in many segments (more than one dispatch binds) gives what one
/// `adamw_step` per tensor gives, and the reference's values: tails, unaligned tensors, chunks
/// and undecayed tensors included, no guard touched.
#[test]
fn adamw_steps_match_one_launch_per_tensor() -> Result<()> {
    // Small segments: every tensor but the smallest gets one of its own, so the 48 operands
    // span more segments than one dispatch binds.
    let gpu = crate::testing::gpu_with(crate::GpuOptions {
        small_segment_bytes: Some(4096),
        ..crate::GpuOptions::from_env()
    });
    let mut rng = Rng::new(83);
    let config = AdamWConfig {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let grad_scale = 0.5;
    struct Side {
        param: Guarded,
        grad: Guarded,
        m: Guarded,
        v: Guarded,
    }
    let mut host = Vec::new();
    let mut sides: [Vec<Side>; 2] = [Vec::new(), Vec::new()];
    for (len, [op, og, om, ov], _) in MULTI_TENSORS {
        let param = rng.vec_f32(len, -1.0, 1.0);
        let zeros = vec![0.0; len];
        for side in &mut sides {
            side.push(Side {
                param: Guarded::upload(&gpu, &mut rng, &param, op, "param")?,
                grad: Guarded::random(&gpu, &mut rng, len, og, "grad")?,
                m: Guarded::upload(&gpu, &mut rng, &zeros, om, "exp_avg")?,
                v: Guarded::upload(&gpu, &mut rng, &zeros, ov, "exp_avg_sq")?,
            });
        }
        host.push((param, zeros.clone(), zeros));
    }
    let segments: std::collections::BTreeSet<_> = sides[0]
        .iter()
        .flat_map(|s| [&s.param, &s.grad, &s.m, &s.v])
        .map(|g| g.buffer.placement().0)
        .collect();
    assert!(
        segments.len() > crate::kernels::MULTI_SLOTS,
        "{} segments: the test needs more than one dispatch",
        segments.len()
    );
    for step in 1..=STEPS {
        let launch = AdamWStep {
            config,
            step,
            grad_scale,
            control: None,
        };
        for (i, &(len, _, decays)) in MULTI_TENSORS.iter().enumerate() {
            let grad = rng.vec_f32(len, -2.0, 2.0);
            for side in &sides {
                gpu.write(&side[i].grad.buffer, side[i].grad.at(), &grad)?;
            }
            let (p, m, v) = &mut host[i];
            let mut one = config;
            if !decays {
                one.weight_decay = 0.0;
            }
            reference::adamw_step(p, &grad, m, v, &one, step, grad_scale);
        }
        let mut tensors = Vec::new();
        for (s, &(_, _, decays)) in sides[0].iter().zip(&MULTI_TENSORS) {
            tensors.push(super::AdamWTensor {
                param: s.param.slice()?,
                grad: s.grad.slice()?,
                exp_avg: s.m.slice()?,
                exp_avg_sq: s.v.slice()?,
                decays,
            });
        }
        super::adamw_steps_in(&gpu, crate::kernels::TensorLaunches::Multi, &launch, &tensors)?;
        for (s, &(_, _, decays)) in sides[1].iter().zip(&MULTI_TENSORS) {
            let mut one = launch;
            if !decays {
                one.config.weight_decay = 0.0;
            }
            let slices = (s.param.slice()?, s.grad.slice()?, s.m.slice()?, s.v.slice()?);
            super::adamw_step(&gpu, &one, slices.0, slices.1, slices.2, slices.3)?;
        }
        for (i, (len, _, _)) in MULTI_TENSORS.iter().enumerate() {
            let name = |what: &str| format!("adamw_steps tensor {i} (len {len}) {what} step {step}");
            let (p, m, v) = &host[i];
            let [many, one] = [&sides[0][i], &sides[1][i]];
            let (atol, rtol) = PARAM_TOL;
            let got = many.param.check(&gpu, &name("param"), p, atol, rtol)?;
            one.param.check(&gpu, &name("param, one launch per tensor"), &got, 0.0, 1e-6)?;
            let (atol, rtol) = MOMENT_TOL;
            let got = many.m.check(&gpu, &name("exp_avg"), m, atol, rtol)?;
            one.m.check(&gpu, &name("exp_avg, one launch per tensor"), &got, 0.0, 1e-6)?;
            let (atol, rtol) = SECOND_MOMENT_TOL;
            let got = many.v.check(&gpu, &name("exp_avg_sq"), v, atol, rtol)?;
            one.v.check(&gpu, &name("exp_avg_sq, one launch per tensor"), &got, 0.0, 1e-6)?;
        }
    }
    Ok(())
}

/// A gradient that `adamw_steps` reads through another tensor's binding of its segment counts
/// as used by the open batch: freed right after the call, its bytes given to a new buffer and
/// overwritten, the update still reads the gradient as it was (the upload submits the batch
/// first instead of overtaking it).
#[test]
fn adamw_steps_mark_every_operand_as_used() -> Result<()> {
    let gpu = crate::testing::fresh_gpu();
    let mut rng = Rng::new(84);
    let config = AdamWConfig {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let len = 256;
    // Small tensors share one segment: the dispatch binds it once, through the first one's
    // parameter.
    let upload = |values: &[f32], label: &str| gpu.upload(values, Category::Temporary, label);
    let (p0, p1) = (rng.vec_f32(len, -1.0, 1.0), rng.vec_f32(len, -1.0, 1.0));
    let zeros = vec![0.0f32; len];
    let g = rng.vec_f32(len, -1.0, 1.0);
    // First, so that live buffers, not the chunk table freed after the call, lie next to it.
    let grad1 = upload(&g, "g1")?;
    let param = [upload(&p0, "p0")?, upload(&p1, "p1")?];
    let moments = [
        upload(&zeros, "m0")?,
        upload(&zeros, "v0")?,
        upload(&zeros, "m1")?,
        upload(&zeros, "v1")?,
    ];
    let grad0 = upload(&g, "g0")?;
    assert_eq!(grad1.placement().0, param[0].placement().0, "one segment");
    let step = AdamWStep {
        config,
        step: 1,
        grad_scale: 1.0,
        control: None,
    };
    fn tensor<'a>(
        [param, grad, exp_avg, exp_avg_sq]: [crate::DeviceSlice<'a>; 4],
    ) -> super::AdamWTensor<'a> {
        super::AdamWTensor {
            param,
            grad,
            exp_avg,
            exp_avg_sq,
            decays: false,
        }
    }
    let m = |i: usize| moments[i].whole();
    super::adamw_steps_in(
        &gpu,
        crate::kernels::TensorLaunches::Multi,
        &step,
        &[
            tensor([param[0].whole(), grad0.whole(), m(0), m(1)]),
            tensor([param[1].whole(), grad1.whole(), m(2), m(3)]),
        ],
    )?;
    let placement = grad1.placement();
    drop(grad1);
    let reused = gpu.alloc_elements(len as u64, Category::Temporary, "reused")?;
    assert_eq!(reused.placement(), placement, "the freed gradient's bytes");
    gpu.write(&reused, 0, &vec![1e6f32; len])?;
    let mut want = p1.clone();
    let (mut m1, mut v1) = (zeros.clone(), zeros.clone());
    reference::adamw_step(&mut want, &g, &mut m1, &mut v1, &config, 1, 1.0);
    let got: Vec<f32> = gpu.read_all(&param[1], DEADLINE)?;
    let (atol, rtol) = PARAM_TOL;
    assert_close("p1 after the update", &got, &want, atol, rtol);
    Ok(())
}
