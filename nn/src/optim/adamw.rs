//! [`AdamW`]: Adam with bias correction and decoupled weight decay, PyTorch's
//! `torch.optim.AdamW` semantics, one fused `adamw_step` launch per parameter. Adam is AdamW
//! with `weight_decay` 0.

use std::collections::BTreeMap;

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::kernels::optimizer::{
    self as kernel, AdamWStep, AdamWTensor, adamw_step, adamw_steps,
};

use super::{Optimizer, check_state_shape, prepare_state, split_state, zeros_state};
use crate::error::{Error, Result};

/// AdamW hyper-parameters (PyTorch names and defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
/// weight decay 1e-2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator term.
    pub eps: f32,
    /// Decoupled weight decay: `p *= 1 - lr * weight_decay` (0 gives Adam).
    pub weight_decay: f32,
    /// Decay only tensors of two or more dimensions (weights and embeddings, not biases and
    /// norm gains), as nanoGPT's parameter groups do; `false` (PyTorch's default) decays all.
    pub decay_matrices_only: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
            decay_matrices_only: false,
        }
    }
}

impl AdamWConfig {
    /// Whether a tensor of `rank` dimensions is decayed (see
    /// [`AdamWConfig::decay_matrices_only`]).
    pub fn decays(&self, rank: usize) -> bool {
        rank >= 2 || !self.decay_matrices_only
    }

    /// The kernel's (f64) configuration.
    pub fn to_reference(&self) -> kernel::AdamWConfig {
        kernel::AdamWConfig {
            lr: f64::from(self.lr),
            beta1: f64::from(self.beta1),
            beta2: f64::from(self.beta2),
            eps: f64::from(self.eps),
            weight_decay: f64::from(self.weight_decay),
        }
    }
}

/// Both moments of one parameter (or of one rank's rows of it: [`super::ShardedAdamW`]).
#[derive(Debug, Clone)]
pub(super) struct Moments {
    /// `m`, shaped like the parameter.
    pub(super) exp_avg: Tensor,
    /// `v`, shaped like the parameter.
    pub(super) exp_avg_sq: Tensor,
}

impl Moments {
    /// Records AdamW's step number `step` of `param` (in place) from `grad` with these
    /// moments, times `grad_scale`; decoupled weight decay when `decays`.
    pub(super) fn update(
        &self,
        config: &AdamWConfig,
        (step, grad_scale, decays): (u64, f32, bool),
        param: &Tensor,
        grad: &Tensor,
    ) -> Result<()> {
        let reference = config.to_reference();
        let launch = AdamWStep {
            config: kernel::AdamWConfig {
                weight_decay: if decays { reference.weight_decay } else { 0.0 },
                ..reference
            },
            step,
            grad_scale,
            control: None,
        };
        adamw_step(
            param.gpu(),
            &launch,
            param.elements()?,
            grad.elements()?,
            self.exp_avg.elements()?,
            self.exp_avg_sq.elements()?,
        )?;
        Ok(())
    }
}

/// `moments` as [`Optimizer::state`] lists them: `exp_avg.<name>` and `exp_avg_sq.<name>`,
/// sorted by name.
pub(super) fn moments_state(moments: &BTreeMap<String, Moments>) -> Vec<(String, Tensor)> {
    let mut out: Vec<(String, Tensor)> = Vec::with_capacity(2 * moments.len());
    for (name, m) in moments {
        out.push((format!("exp_avg.{name}"), m.exp_avg.clone()));
        out.push((format!("exp_avg_sq.{name}"), m.exp_avg_sq.clone()));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// AdamW. State: `exp_avg.<name>` and `exp_avg_sq.<name>` per parameter. The bias correction
/// uses the optimizer's step count (one counter for every parameter: a parameter first seen at
/// a later step is corrected as if its moments had been zero before, unlike PyTorch's
/// per-parameter count; the two agree whenever every parameter gets a gradient every step).
#[derive(Debug)]
pub struct AdamW {
    config: AdamWConfig,
    moments: BTreeMap<String, Moments>,
    steps: u64,
    grad_scale: f32,
    /// The device's decision ([`Optimizer::control`]), once asked for.
    control: Option<Tensor>,
    /// Whether the updates read it ([`Optimizer::set_controlled`]).
    controlled: bool,
    /// The step count before the last step and the state it created, for
    /// [`Optimizer::undo_step`].
    undo: Option<(u64, Vec<String>)>,
}

impl AdamW {
    /// An optimizer with `config`.
    pub fn new(config: AdamWConfig) -> AdamW {
        AdamW {
            config,
            moments: BTreeMap::new(),
            steps: 0,
            grad_scale: 1.0,
            control: None,
            controlled: false,
            undo: None,
        }
    }

    /// The configuration (with the current learning rate).
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// Records step `step` of every parameter with a gradient and moments, in a few
    /// dispatches (`adamw_steps`), each as `Moments::update` would update it alone.
    fn record_update(&self, params: &[(String, Tensor)], step: u64) -> Result<()> {
        let mut updated: Vec<(&Tensor, Tensor, &Moments, bool)> = Vec::with_capacity(params.len());
        for (name, param) in params {
            let Some(grad) = param.grad() else { continue };
            let Some(moments) = self.moments.get(name) else {
                continue;
            };
            updated.push((param, grad, moments, self.config.decays(param.rank())));
        }
        let tensors = updated
            .iter()
            .map(|(param, grad, moments, decays)| {
                Ok(AdamWTensor {
                    param: param.elements()?,
                    grad: grad.elements()?,
                    exp_avg: moments.exp_avg.elements()?,
                    exp_avg_sq: moments.exp_avg_sq.elements()?,
                    decays: *decays,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some((param, ..)) = updated.first() {
            let launch = AdamWStep {
                config: self.config.to_reference(),
                step,
                grad_scale: self.grad_scale,
                control: super::control_slice(&self.control, self.controlled)?,
            };
            adamw_steps(param.gpu(), &launch, &tensors)?;
        }
        Ok(())
    }
}

impl Optimizer for AdamW {
    fn step(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        // The weights change: f16 copies made of them are stale.
        plimsoll_autograd::forget_weight_copies();
        let step = self.steps + 1;
        self.undo = None;
        let created = prepare_state(
            &mut self.moments,
            params,
            |name, param| {
                Ok(Moments {
                    exp_avg: zeros_state(param, &format!("exp_avg.{name}"))?,
                    exp_avg_sq: zeros_state(param, &format!("exp_avg_sq.{name}"))?,
                })
            },
            |name, moments, param| {
                check_state_shape(&format!("exp_avg.{name}"), &moments.exp_avg, param)?;
                check_state_shape(&format!("exp_avg_sq.{name}"), &moments.exp_avg_sq, param)
            },
        )?;
        // From here a failure (the multi-tensor launches' table refused, a launch refused)
        // forgets the state this step created: the caller's atomic section discards what was
        // recorded, so the optimizer is as it was.
        self.undo = Some((self.steps, created));
        if let Err(e) = self.record_update(params, step) {
            self.undo_step();
            return Err(e);
        }
        self.steps = step;
        Ok(())
    }

    fn lr(&self) -> f32 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f32) {
        self.config.lr = lr;
    }

    fn step_count(&self) -> u64 {
        self.steps
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        moments_state(&self.moments)
    }

    fn state_kinds(&self) -> Vec<&'static str> {
        vec!["exp_avg", "exp_avg_sq"]
    }

    fn load_state(&mut self, state: Vec<(String, Tensor)>, step_count: u64) -> Result<()> {
        let mut split = split_state(state, &["exp_avg", "exp_avg_sq"])?;
        let mut exp_avg = split.remove("exp_avg").unwrap_or_default();
        let mut exp_avg_sq = split.remove("exp_avg_sq").unwrap_or_default();
        let mut moments = BTreeMap::new();
        for (name, m) in std::mem::take(&mut exp_avg) {
            let Some(v) = exp_avg_sq.remove(&name) else {
                return Err(Error::OptimizerState {
                    name: format!("exp_avg_sq.{name}"),
                    message: "missing while exp_avg is present; AdamW needs both moments"
                        .to_string(),
                });
            };
            moments.insert(
                name,
                Moments {
                    exp_avg: m,
                    exp_avg_sq: v,
                },
            );
        }
        if let Some(name) = exp_avg_sq.keys().next() {
            return Err(Error::OptimizerState {
                name: format!("exp_avg.{name}"),
                message: "missing while exp_avg_sq is present; AdamW needs both moments"
                    .to_string(),
            });
        }
        self.moments = moments;
        self.steps = step_count;
        self.undo = None;
        Ok(())
    }

    fn undo_step(&mut self) {
        super::undo_last(&mut self.undo, &mut self.steps, &mut self.moments);
    }

    fn set_grad_scale(&mut self, scale: f32) {
        self.grad_scale = scale;
    }

    fn control(&mut self, gpu: &plimsoll_kernels_wgsl::Gpu) -> Result<Option<Tensor>> {
        super::control_vector(&mut self.control, gpu).map(Some)
    }

    fn set_controlled(&mut self, controlled: bool) {
        self.controlled = controlled;
    }

    fn rewind(&mut self, step_count: u64) {
        if step_count < self.steps {
            self.steps = step_count;
            self.undo = None;
        }
    }

    /// [`super::HostAdamW`] of this configuration (with the current learning rate), no state.
    fn offloaded(&self) -> Option<Box<dyn Optimizer>> {
        Some(Box::new(super::HostAdamW::new(self.config)))
    }

    /// [`super::ShardedAdamW`] of this configuration over `shard`'s rows, no state.
    fn sharded(
        &self,
        gpu: &plimsoll_kernels_wgsl::Gpu,
        shard: super::RowShard,
    ) -> Option<Box<dyn Optimizer>> {
        Some(Box::new(super::ShardedAdamW::new(gpu, self.config, shard)))
    }
}
