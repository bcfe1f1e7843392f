//! CPU reference for [`optimizer`](super): fused SGD and AdamW steps, in place, with the semantics and
//! the operation order of PyTorch's `torch.optim.SGD` and `torch.optim.AdamW` (single-tensor,
//! `foreach=False`, `maximize=False`, `amsgrad=False`), in `f32` like PyTorch on `f32` tensors.
//!
//! Scalars that PyTorch computes in Python (`f64`), such as `1 - beta1`, `lr / (1 - beta1^t)` and
//! `sqrt(1 - beta2^t)`, are computed here in `f64` and rounded to `f32` once; the launcher writes
//! exactly these [`crate::kernels::optimizer::AdamWScalars`] /
//! [`crate::kernels::optimizer::SgdScalars`] into the shader's `Params`.
//!
//! `grad_scale` multiplies the gradient first (the mixed-precision unscale, `1/loss_scale`); it
//! is 1 for a plain step.

use super::{AdamWConfig, SgdConfig};

/// One SGD step in place. `first_step` is true when the momentum buffer does not exist yet in
/// PyTorch's terms (`buf = g`, no dampening); `momentum_buf` is unused when `momentum == 0`.
///
/// `g = grad*grad_scale + wd*p; buf = first ? g : momentum*buf + (1-dampening)*g;
/// update = nesterov ? g + momentum*buf : buf; p -= lr*update` (update = g without momentum).
pub fn sgd_step(
    param: &mut [f32],
    grad: &[f32],
    momentum_buf: &mut [f32],
    config: &SgdConfig,
    first_step: bool,
    grad_scale: f32,
) {
    let s = config.scalars();
    for i in 0..param.len() {
        let mut g = grad[i] * grad_scale;
        if s.weight_decay != 0.0 {
            g += s.weight_decay * param[i];
        }
        if s.momentum != 0.0 {
            let buf = if first_step {
                g
            } else {
                momentum_buf[i] * s.momentum + s.one_minus_dampening * g
            };
            momentum_buf[i] = buf;
            g = if config.nesterov {
                g + s.momentum * buf
            } else {
                buf
            };
        }
        param[i] += -s.lr * g;
    }
}

/// One AdamW step in place, PyTorch's order:
/// `p *= 1 - lr*wd; m += (1-b1)(g - m); v = b2 v + (1-b2) g^2;
/// p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)`, with `g = grad * grad_scale`.
pub fn adamw_step(
    param: &mut [f32],
    grad: &[f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    config: &AdamWConfig,
    step: u64,
    grad_scale: f32,
) {
    let s = config.scalars(step);
    for i in 0..param.len() {
        let g = grad[i] * grad_scale;
        param[i] *= s.decay_factor;
        exp_avg[i] += s.one_minus_beta1 * (g - exp_avg[i]);
        exp_avg_sq[i] = exp_avg_sq[i] * s.beta2 + s.one_minus_beta2 * g * g;
        let denom = exp_avg_sq[i].sqrt() / s.bias_correction2_sqrt + s.eps;
        param[i] += -s.step_size * (exp_avg[i] / denom);
    }
}

/// `optimizer.wgsl`'s `step_control` on the host, the same f32 operations in the same order:
/// the `partials` summed by 256 lanes (lane `l` adds elements `l`, `l + 256`, ... in order) and
/// a tree, then `[grad_scale, skip, halted, norm]` from the sum, the nonfinite `flagged` word,
/// whether an earlier step `halted`, and `inputs` (see [`super::step_control`]).
pub fn step_control(
    partials: &[f32],
    flagged: bool,
    halted: bool,
    inputs: &super::ControlInputs,
) -> [f32; 4] {
    const LANES: usize = 256;
    let mut lanes = [0.0f32; LANES];
    for (lane, sum) in lanes.iter_mut().enumerate() {
        for x in partials.iter().skip(lane).step_by(LANES) {
            *sum += *x;
        }
    }
    let mut stride = LANES / 2;
    while stride > 0 {
        for lane in 0..stride {
            lanes[lane] += lanes[lane + stride];
        }
        stride /= 2;
    }
    let norm = lanes[0].sqrt() / inputs.loss_scale;
    let skip = flagged || !norm.is_finite() || halted;
    let clip = match inputs.max_norm {
        Some(max) if max > 0.0 && norm > max => max / (norm + 1e-6),
        _ => 1.0,
    };
    let flag = if skip { 1.0 } else { 0.0 };
    [clip / inputs.loss_scale, flag, flag, norm]
}
