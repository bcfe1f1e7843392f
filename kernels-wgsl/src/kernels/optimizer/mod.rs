//! `optimizer`: fused, in-place [`sgd_step`] and [`adamw_step`] with PyTorch's semantics and
//! operation order. In one place: the shader (`optimizer.wgsl`, beside this file), the launchers,
//! the CPU [`reference`](mod@reference) and the tests.
//!
//! The f32 scalars come from [`SgdConfig::scalars`] and [`AdamWConfig::scalars`], which the
//! reference uses too, so launcher and reference round the same f64 values the same way.
//! `grad_scale` multiplies the gradient first (mixed-precision unscale); pass 1 otherwise.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_ranges, launch_split, same_len};
use crate::pipeline::{Kernel, kernels, shader_params, shader_source};
use crate::slice::DeviceSlice;
use const_format::concatcp;

mod multi;
pub mod reference;

pub use multi::{AdamWTensor, adamw_steps, adamw_steps_in};
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod control_tests;

/// The module: `optimizer.wgsl` and the helpers it calls.
const WGSL: &str = concatcp!(
    include_str!("optimizer.wgsl"),
    shader_source!("indexing", "slots")
);

kernels! {
    "optimizer", source: WGSL, workgroup: ELEMENTWISE_WORKGROUP;
    /// The `sgd` entry point.
    SGD = "sgd" sgd_params: SgdParams, [param, grad, momentum_buf, sgd_control];
    /// The `adamw` entry point.
    ADAMW = "adamw" adamw_params: AdamWParams, [param, grad, exp_avg, exp_avg_sq, adamw_control];
    /// The `adamw_v4` entry point (four elements per invocation; vec4 views of the same bindings).
    ADAMW_V4 = "adamw_v4" adamw_params: AdamWParams, [
        param_v4: "array<vec4<f32>>",
        grad_v4: "array<vec4<f32>>",
        exp_avg_v4: "array<vec4<f32>>",
        exp_avg_sq_v4: "array<vec4<f32>>",
        adamw_control,
    ];
    /// The `step_control` entry point: the step's decision on the device ([`step_control`]).
    STEP_CONTROL = "step_control" control_params: ControlParams, [sums, decision];
}

/// The `adamw_multi` entry point (many tensors: their segments at the 16 slots, then the chunk
/// table; see [`adamw_steps`]).
pub const ADAMW_MULTI: Kernel = crate::kernels::slots::multi_tensor_kernel!(
    "optimizer",
    "adamw_multi",
    source: WGSL,
    adamw_params: AdamWParams,
    [chunks: "array<u32>", multi_control]
);

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    SGD,
    ADAMW,
    ADAMW_V4,
    ADAMW_MULTI,
    STEP_CONTROL,
];

shader_params! {
    /// The `SgdParams` of `optimizer.wgsl`.
    struct SgdParams {
        n: u32,
        lr: f32,
        momentum: f32,
        one_minus_dampening: f32,
        weight_decay: f32,
        grad_scale: f32,
        nesterov: u32,
        first_step: u32,
        param_offset: u32,
        grad_offset: u32,
        momentum_offset: u32,
        /// 1: the gradient's scale and the skip come from the control binding.
        controlled: u32,
        /// Element index of the control vector in its binding.
        control_offset: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }

    /// The `AdamWParams` of `optimizer.wgsl`.
    struct AdamWParams {
        n: u32,
        decay_factor: f32,
        one_minus_beta1: f32,
        beta2: f32,
        one_minus_beta2: f32,
        step_size: f32,
        bias_correction2_sqrt: f32,
        eps: f32,
        grad_scale: f32,
        param_offset: u32,
        grad_offset: u32,
        exp_avg_offset: u32,
        exp_avg_sq_offset: u32,
        first_chunk: u32,
        /// 1: the gradient's scale and the skip come from the control binding.
        controlled: u32,
        /// Element index of the control vector in its binding.
        control_offset: u32,
    }

    /// The `ControlParams` of `optimizer.wgsl` (`step_control`).
    struct ControlParams {
        n: u32,
        sums_offset: u32,
        flags_offset: u32,
        control_offset: u32,
        max_norm: f32,
        loss_scale: f32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// Refuses step 0 for launcher `op`: AdamW's steps count from 1.
fn check_step(op: &'static str, step: &AdamWStep) -> Result<()> {
    if step.step == 0 {
        return Err(Error::InvalidArgument {
            op,
            message: "step is 1-based (the bias corrections divide by 1 - beta^step); got 0"
                .to_string(),
        });
    }
    Ok(())
}

impl AdamWParams {
    /// `step`'s scalars (the gradient's scale included), every count and offset 0.
    fn scalars_of(step: &AdamWStep) -> AdamWParams {
        let s = step.config.scalars(step.step);
        AdamWParams {
            decay_factor: s.decay_factor,
            one_minus_beta1: s.one_minus_beta1,
            beta2: s.beta2,
            one_minus_beta2: s.one_minus_beta2,
            step_size: s.step_size,
            bias_correction2_sqrt: s.bias_correction2_sqrt,
            eps: s.eps,
            grad_scale: step.grad_scale,
            controlled: u32::from(step.control.is_some()),
            control_offset: step.control.map_or(0, |c| c.index()),
            ..AdamWParams::default()
        }
    }
}

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

/// One SGD launch: the hyper-parameters, whether it creates the momentum buffer, and the
/// gradient's scale.
#[derive(Clone, Copy)]
pub struct SgdStep<'a> {
    /// Hyper-parameters.
    pub config: SgdConfig,
    /// True on the step that creates the momentum buffer (its contents are then ignored).
    pub first_step: bool,
    /// Multiplies the gradient first (the mixed-precision unscale, `1/loss_scale`; 1 otherwise).
    pub grad_scale: f32,
    /// The step decided on the device ([`step_control`]'s [`CONTROL_WORDS`] words): when
    /// given, the gradient is multiplied by its first word instead of `grad_scale`, and
    /// nothing is written when its second is not 0.
    pub control: Option<DeviceSlice<'a>>,
}

/// One AdamW launch: the hyper-parameters, the 1-based step number and the gradient's scale.
#[derive(Clone, Copy)]
pub struct AdamWStep<'a> {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    /// 1-based step (PyTorch's `state["step"]` after its increment).
    pub step: u64,
    /// Multiplies the gradient first (the mixed-precision unscale, `1/loss_scale`; 1 otherwise).
    pub grad_scale: f32,
    /// The step decided on the device, as [`SgdStep::control`].
    pub control: Option<DeviceSlice<'a>>,
}

/// Words of a control vector ([`step_control`]): `[grad_scale, skip, halted, norm]`.
pub const CONTROL_WORDS: u64 = 4;

/// What [`step_control`] decides from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ControlInputs {
    /// Largest global gradient norm (`clip_grad_norm_`'s `max_norm`); `None`: no clipping.
    pub max_norm: Option<f32>,
    /// The loss scale the gradients carry (1 in f32): the norm and the update divide by it.
    pub loss_scale: f32,
}

/// Records the step's decision on the device (`optimizer.wgsl`'s `step_control`, one
/// workgroup) into `control` ([`CONTROL_WORDS`] words, `[grad_scale, skip, halted, norm]`):
/// the global norm from the `n` partial sums of squares in `partials`, clipping's factor, and
/// whether the update is skipped: when `flags` (the `nonfinite` kernel's first word, as f32
/// bits) is set, the norm is not finite, or an earlier step halted (`control[2]`, which stays 1
/// until the caller writes 0 there). An update recorded with `control`
/// ([`AdamWStep::control`]) then needs no host value. [`reference::step_control`] is the same
/// arithmetic in the same order.
pub fn step_control(
    gpu: &Gpu,
    inputs: &ControlInputs,
    partials: DeviceSlice<'_>,
    flags: DeviceSlice<'_>,
    control: DeviceSlice<'_>,
) -> Result<()> {
    let op = "optimizer::step_control";
    control.expect_len(op, "control", CONTROL_WORDS)?;
    flags.expect_len(op, "flags", 1)?;
    if !(inputs.loss_scale.is_finite() && inputs.loss_scale > 0.0) {
        return Err(Error::InvalidArgument {
            op,
            message: format!("the loss scale must be finite and positive, got {}", inputs.loss_scale),
        });
    }
    let params = ControlParams {
        n: partials.len() as u32,
        sums_offset: partials.index(),
        flags_offset: flags.index(),
        control_offset: control.index(),
        max_norm: inputs.max_norm.unwrap_or(0.0),
        loss_scale: inputs.loss_scale,
        ..ControlParams::default()
    };
    // The partials and the flags are one tensor's in practice: bind the partials' buffer and
    // address both in it.
    if flags.buffer().segment_uid() != partials.buffer().segment_uid() {
        return Err(Error::InvalidArgument {
            op,
            message: "the flags must lie in the partial sums' buffer (the read-back tensor \
                      `with_sums_of_squares_checked` makes holds both)"
                .to_string(),
        });
    }
    gpu.dispatch(crate::recorder::Dispatch {
        kernel: &STEP_CONTROL,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[partials, control],
        also_uses: &[flags],
        workgroups: [1, 1, 1],
        work: crate::recorder::Work {
            flops: partials.len(),
            bytes: 4 * (partials.len() + CONTROL_WORDS),
        },
    })
}

/// Records one SGD step on `param` (PyTorch's `torch.optim.SGD`), all slices of one length:
/// `g = grad*grad_scale + wd*p; buf = first_step ? g : momentum*buf + (1-dampening)*g;
/// p -= lr * (nesterov ? g + momentum*buf : buf)` (`p -= lr*g` without momentum).
/// `momentum_buf` is required when `momentum != 0`, else ignored. Errors: mismatched lengths,
/// momentum without a buffer, or nesterov without `momentum > 0` and `dampening == 0` (as
/// PyTorch refuses).
pub fn sgd_step(
    gpu: &Gpu,
    step: &SgdStep,
    param: DeviceSlice<'_>,
    grad: DeviceSlice<'_>,
    momentum_buf: Option<DeviceSlice<'_>>,
) -> Result<()> {
    let op = "optimizer::sgd_step";
    let invalid = |message: String| Error::InvalidArgument { op, message };
    let config = &step.config;
    if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
        return Err(invalid(format!(
            "nesterov needs momentum > 0 and dampening = 0, got momentum {} dampening {}",
            config.momentum, config.dampening
        )));
    }
    let s = config.scalars();
    let len = same_len(op, &[("param", param), ("grad", grad)])?;
    // Without momentum the shader never touches binding 3: bind grad there.
    let momentum_buf = match momentum_buf {
        Some(buf) => {
            buf.expect_len(op, "momentum_buf", len)?;
            buf
        }
        None if s.momentum != 0.0 => {
            return Err(invalid(format!(
                "momentum {} needs a momentum buffer of {len} elements",
                config.momentum
            )));
        }
        None => grad,
    };
    // Each range updates its own elements: every offset advanced, the length the range's.
    let params = |start: u32, end: u32| SgdParams {
        n: end - start,
        lr: s.lr,
        momentum: s.momentum,
        one_minus_dampening: s.one_minus_dampening,
        weight_decay: s.weight_decay,
        grad_scale: step.grad_scale,
        nesterov: u32::from(config.nesterov),
        first_step: u32::from(step.first_step),
        param_offset: param.index() + start,
        grad_offset: grad.index() + start,
        momentum_offset: momentum_buf.index() + start,
        controlled: u32::from(step.control.is_some()),
        control_offset: step.control.map_or(0, |c| c.index()),
        ..SgdParams::default()
    };
    let buffers = [param, grad, momentum_buf, step.control.unwrap_or(grad)];
    launch_ranges(gpu, &SGD, &[], &buffers, len, params)
}

/// Records one AdamW step on `param` (PyTorch's `torch.optim.AdamW`), all slices of one
/// length: `p *= 1 - lr*wd; m += (1-b1)(g - m); v = b2 v + (1-b2) g^2;
/// p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)`, `g = grad*grad_scale`. The moments are zeros
/// before the first step.
pub fn adamw_step(
    gpu: &Gpu,
    step: &AdamWStep,
    param: DeviceSlice<'_>,
    grad: DeviceSlice<'_>,
    exp_avg: DeviceSlice<'_>,
    exp_avg_sq: DeviceSlice<'_>,
) -> Result<()> {
    let op = "optimizer::adamw_step";
    check_step(op, step)?;
    let slices = [
        ("param", param),
        ("grad", grad),
        ("exp_avg", exp_avg),
        ("exp_avg_sq", exp_avg_sq),
    ];
    let len = same_len(op, &slices)?;
    let params = AdamWParams {
        n: len as u32,
        param_offset: param.index(),
        grad_offset: grad.index(),
        exp_avg_offset: exp_avg.index(),
        exp_avg_sq_offset: exp_avg_sq.index(),
        ..AdamWParams::scalars_of(step)
    };
    if let Some(control) = step.control {
        control.expect_len(op, "control", CONTROL_WORDS)?;
    }
    let buffers = [param, grad, exp_avg, exp_avg_sq, step.control.unwrap_or(grad)];
    // Four elements per invocation over the longest prefix of whole vec4s when every slice
    // starts on a multiple of 4 elements; `adamw` takes the rest (or everything); in ranges
    // under a submission bound.
    launch_split(gpu, [&ADAMW_V4, &ADAMW], &[], &buffers, len, |part| AdamWParams {
        n: part.count,
        param_offset: part.offset(param.index()),
        grad_offset: part.offset(grad.index()),
        exp_avg_offset: part.offset(exp_avg.index()),
        exp_avg_sq_offset: part.offset(exp_avg_sq.index()),
        ..params
    })
}
