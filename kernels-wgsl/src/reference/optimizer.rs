//! CPU reference for `optimizer`: fused SGD and AdamW steps, in place, with the semantics and
//! the operation order of PyTorch's `torch.optim.SGD` and `torch.optim.AdamW` (single-tensor,
//! `foreach=False`, `maximize=False`, `amsgrad=False`), in `f32` like PyTorch on `f32` tensors.
//!
//! Scalars that PyTorch computes in Python (`f64`), such as `1 - beta1`, `lr / (1 - beta1^t)` and
//! `sqrt(1 - beta2^t)`, are computed here in `f64` and rounded to `f32` once; the launcher writes
//! exactly these [`AdamWScalars`] / [`SgdScalars`] into the shader's `Params`.
//!
//! `grad_scale` multiplies the gradient first (the mixed-precision unscale, `1/loss_scale`); it
//! is 1 for a plain step.

/// SGD hyper-parameters (PyTorch names).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor; 0 disables the momentum buffer entirely.
    pub momentum: f64,
    /// Dampening of the gradient added to the buffer (not applied on the first step).
    pub dampening: f64,
    /// L2 penalty added to the gradient: `g += weight_decay * p`.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
}

/// The `f32` scalars of an SGD step, as the shader's `SgdParams` holds them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdScalars {
    /// `lr`.
    pub lr: f32,
    /// `momentum`.
    pub momentum: f32,
    /// `1 - dampening` (computed in f64).
    pub one_minus_dampening: f32,
    /// `weight_decay`.
    pub weight_decay: f32,
}

impl SgdConfig {
    /// The scalars the launcher writes into `SgdParams`.
    pub fn scalars(&self) -> SgdScalars {
        SgdScalars {
            lr: self.lr as f32,
            momentum: self.momentum as f32,
            one_minus_dampening: (1.0 - self.dampening) as f32,
            weight_decay: self.weight_decay as f32,
        }
    }
}

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

/// AdamW hyper-parameters (PyTorch names).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator term.
    pub eps: f64,
    /// Decoupled weight decay: `p *= 1 - lr * weight_decay`.
    pub weight_decay: f64,
}

/// The `f32` scalars of one AdamW step at a given step number, as `AdamWParams` holds them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWScalars {
    /// `1 - lr * weight_decay`.
    pub decay_factor: f32,
    /// `1 - beta1` (the lerp weight of the first moment).
    pub one_minus_beta1: f32,
    /// `beta2`.
    pub beta2: f32,
    /// `1 - beta2`.
    pub one_minus_beta2: f32,
    /// `lr / (1 - beta1^t)`.
    pub step_size: f32,
    /// `sqrt(1 - beta2^t)`.
    pub bias_correction2_sqrt: f32,
    /// `eps`.
    pub eps: f32,
}

impl AdamWConfig {
    /// Bias corrections `(1 - beta1^t, 1 - beta2^t)` for step `t >= 1`, in `f64`.
    pub fn bias_corrections(&self, step: u64) -> (f64, f64) {
        let t = step as f64;
        (1.0 - self.beta1.powf(t), 1.0 - self.beta2.powf(t))
    }

    /// The scalars the launcher writes into `AdamWParams` for step `t >= 1` (1-based, as
    /// PyTorch's `state["step"]` after its increment).
    pub fn scalars(&self, step: u64) -> AdamWScalars {
        let (bc1, bc2) = self.bias_corrections(step);
        AdamWScalars {
            decay_factor: (1.0 - self.lr * self.weight_decay) as f32,
            one_minus_beta1: (1.0 - self.beta1) as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            step_size: (self.lr / bc1) as f32,
            bias_correction2_sqrt: bc2.sqrt() as f32,
            eps: self.eps as f32,
        }
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
