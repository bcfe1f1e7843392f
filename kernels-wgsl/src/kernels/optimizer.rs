//! `optimizer`: fused, in-place [`sgd_step`] and [`adamw_step`] with PyTorch's semantics and
//! operation order. Shader: `shaders/optimizer.wgsl`; reference: [`crate::reference::optimizer`].
//!
//! The f32 scalars come from the reference's [`SgdConfig::scalars`] and
//! [`AdamWConfig::scalars`], so launcher and reference round the same f64 values the same way.
//! `grad_scale` multiplies the gradient first (mixed-precision unscale); pass 1 otherwise.

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, check_range, grid_1d, segment_index};
use crate::pipeline::Kernel;
use crate::recorder::Dispatch;
use crate::reference::optimizer::{AdamWConfig, SgdConfig};

/// The `sgd` entry point.
pub const SGD: Kernel = Kernel {
    stem: "optimizer",
    wgsl: include_str!("../../shaders/optimizer.wgsl"),
    entry: "sgd",
    storage_bindings: 3,
    runtime_checks: crate::pipeline::RuntimeChecks::ON,
};

/// The `adamw` entry point.
pub const ADAMW: Kernel = Kernel {
    entry: "adamw",
    storage_bindings: 4,
    ..SGD
};

/// Mirrors `SgdParams` in `optimizer.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
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
    _pad0: u32,
}

/// Mirrors `AdamWParams` in `optimizer.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
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
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

/// The buffers of [`sgd_step`], each `[len]` f32 from its element offset.
#[derive(Debug, Clone, Copy)]
pub struct SgdBuffers<'a> {
    /// Parameters, updated in place.
    pub param: &'a DeviceBuffer,
    /// Element offset of `param`.
    pub param_offset: u64,
    /// Gradient (read only).
    pub grad: &'a DeviceBuffer,
    /// Element offset of `grad`.
    pub grad_offset: u64,
    /// Momentum buffer, updated in place; required when `momentum != 0`, else ignored (`None`).
    pub momentum_buf: Option<&'a DeviceBuffer>,
    /// Element offset of `momentum_buf`.
    pub momentum_buf_offset: u64,
}

/// The buffers of [`adamw_step`], each `[len]` f32 from its element offset.
#[derive(Debug, Clone, Copy)]
pub struct AdamWBuffers<'a> {
    /// Parameters, updated in place.
    pub param: &'a DeviceBuffer,
    /// Element offset of `param`.
    pub param_offset: u64,
    /// Gradient (read only).
    pub grad: &'a DeviceBuffer,
    /// Element offset of `grad`.
    pub grad_offset: u64,
    /// First moment `m`, updated in place (zeros before the first step).
    pub exp_avg: &'a DeviceBuffer,
    /// Element offset of `exp_avg`.
    pub exp_avg_offset: u64,
    /// Second moment `v`, updated in place (zeros before the first step).
    pub exp_avg_sq: &'a DeviceBuffer,
    /// Element offset of `exp_avg_sq`.
    pub exp_avg_sq_offset: u64,
}

/// Records one SGD step on `len` elements (PyTorch's `torch.optim.SGD`):
/// `g = grad*grad_scale + wd*p; buf = first_step ? g : momentum*buf + (1-dampening)*g;
/// p -= lr * (nesterov ? g + momentum*buf : buf)` (`p -= lr*g` without momentum).
/// `first_step` is true on the step that creates the momentum buffer (its contents are then
/// ignored). Errors: a bad range, momentum without a buffer, or nesterov without
/// `momentum > 0` and `dampening == 0` (as PyTorch refuses).
pub fn sgd_step(
    gpu: &Gpu,
    b: &SgdBuffers<'_>,
    len: u64,
    config: &SgdConfig,
    first_step: bool,
    grad_scale: f32,
) -> Result<()> {
    let op = "optimizer::sgd_step";
    let invalid = |message: String| Error::InvalidArgument { op, message };
    if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
        return Err(invalid(format!(
            "nesterov needs momentum > 0 and dampening = 0, got momentum {} dampening {}",
            config.momentum, config.dampening
        )));
    }
    let s = config.scalars();
    check_range(op, "param", b.param, b.param_offset, len)?;
    check_range(op, "grad", b.grad, b.grad_offset, len)?;
    // Without momentum the shader never touches binding 3: bind grad there.
    let (momentum_buf, momentum_offset) = match b.momentum_buf {
        Some(buf) => {
            check_range(op, "momentum_buf", buf, b.momentum_buf_offset, len)?;
            (buf, b.momentum_buf_offset)
        }
        None if s.momentum != 0.0 => {
            return Err(invalid(format!(
                "momentum {} needs a momentum buffer of {len} elements",
                config.momentum
            )));
        }
        None => (b.grad, b.grad_offset),
    };
    if len == 0 {
        return Ok(());
    }
    let params = SgdParams {
        n: len as u32,
        lr: s.lr,
        momentum: s.momentum,
        one_minus_dampening: s.one_minus_dampening,
        weight_decay: s.weight_decay,
        grad_scale,
        nesterov: u32::from(config.nesterov),
        first_step: u32::from(first_step),
        param_offset: segment_index(b.param, b.param_offset),
        grad_offset: segment_index(b.grad, b.grad_offset),
        momentum_offset: segment_index(momentum_buf, momentum_offset),
        _pad0: 0,
    };
    gpu.dispatch(Dispatch {
        kernel: &SGD,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[b.param, b.grad, momentum_buf],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}

/// Records one AdamW step on `len` elements (PyTorch's `torch.optim.AdamW`) at 1-based `step`
/// (PyTorch's `state["step"]` after its increment): `p *= 1 - lr*wd; m += (1-b1)(g - m);
/// v = b2 v + (1-b2) g^2; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)`, `g = grad*grad_scale`.
pub fn adamw_step(
    gpu: &Gpu,
    b: &AdamWBuffers<'_>,
    len: u64,
    config: &AdamWConfig,
    step: u64,
    grad_scale: f32,
) -> Result<()> {
    let op = "optimizer::adamw_step";
    if step == 0 {
        return Err(Error::InvalidArgument {
            op,
            message: "step is 1-based (the bias corrections divide by 1 - beta^step); got 0"
                .to_string(),
        });
    }
    check_range(op, "param", b.param, b.param_offset, len)?;
    check_range(op, "grad", b.grad, b.grad_offset, len)?;
    check_range(op, "exp_avg", b.exp_avg, b.exp_avg_offset, len)?;
    check_range(op, "exp_avg_sq", b.exp_avg_sq, b.exp_avg_sq_offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let s = config.scalars(step);
    let params = AdamWParams {
        n: len as u32,
        decay_factor: s.decay_factor,
        one_minus_beta1: s.one_minus_beta1,
        beta2: s.beta2,
        one_minus_beta2: s.one_minus_beta2,
        step_size: s.step_size,
        bias_correction2_sqrt: s.bias_correction2_sqrt,
        eps: s.eps,
        grad_scale,
        param_offset: segment_index(b.param, b.param_offset),
        grad_offset: segment_index(b.grad, b.grad_offset),
        exp_avg_offset: segment_index(b.exp_avg, b.exp_avg_offset),
        exp_avg_sq_offset: segment_index(b.exp_avg_sq, b.exp_avg_sq_offset),
        ..AdamWParams::default()
    };
    gpu.dispatch(Dispatch {
        kernel: &ADAMW,
        overrides: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[b.param, b.grad, b.exp_avg, b.exp_avg_sq],
        workgroups: grid_1d(gpu, len, ELEMENTWISE_WORKGROUP)?,
    })
}
