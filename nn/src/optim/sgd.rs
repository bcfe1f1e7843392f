//! [`Sgd`]: stochastic gradient descent with momentum, dampening, Nesterov and L2 weight decay,
//! PyTorch's `torch.optim.SGD` semantics, one fused `sgd_step` launch per parameter.

use std::collections::BTreeMap;

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::kernels::optimizer::{self as kernel, SgdStep, sgd_step};

use super::{Optimizer, check_state_shape, prepare_state, split_state, zeros_state};
use crate::error::Result;

/// SGD hyper-parameters (PyTorch names and defaults, `lr` 0.01).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor; 0 keeps no state.
    pub momentum: f32,
    /// Dampening of the gradient added to the momentum buffer (not on the first step).
    pub dampening: f32,
    /// L2 penalty added to the gradient: `g += weight_decay * p`.
    pub weight_decay: f32,
    /// Nesterov momentum (needs `momentum > 0` and `dampening == 0`).
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: 0.01,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

impl SgdConfig {
    /// The kernel's (f64) configuration.
    pub fn to_reference(&self) -> kernel::SgdConfig {
        kernel::SgdConfig {
            lr: f64::from(self.lr),
            momentum: f64::from(self.momentum),
            dampening: f64::from(self.dampening),
            weight_decay: f64::from(self.weight_decay),
            nesterov: self.nesterov,
        }
    }
}

/// SGD. State: `momentum.<name>` per parameter when `momentum != 0`.
#[derive(Debug)]
pub struct Sgd {
    config: SgdConfig,
    /// Momentum buffers by parameter name; each shaped like its parameter.
    momentum: BTreeMap<String, Tensor>,
    steps: u64,
    grad_scale: f32,
    /// The device's decision ([`Optimizer::control`]), once asked for.
    control: Option<Tensor>,
    /// Whether the updates read it ([`Optimizer::set_controlled`]).
    controlled: bool,
    /// The step that created each momentum buffer (0: loaded), so that [`Optimizer::rewind`]
    /// drops those of steps the device skipped: the next step creates them again, as PyTorch's
    /// first step (`buf = g`).
    born: BTreeMap<String, u64>,
    /// The step count before the last step and the state it created, for
    /// [`Optimizer::undo_step`].
    undo: Option<(u64, Vec<String>)>,
}

impl Sgd {
    /// An optimizer with `config`. A Nesterov configuration without momentum, or with
    /// dampening, is refused by the first [`Optimizer::step`].
    pub fn new(config: SgdConfig) -> Sgd {
        Sgd {
            config,
            momentum: BTreeMap::new(),
            steps: 0,
            grad_scale: 1.0,
            control: None,
            controlled: false,
            born: BTreeMap::new(),
            undo: None,
        }
    }

    /// The configuration (with the current learning rate).
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        // The weights change: f16 copies made of them are stale.
        plimsoll_autograd::forget_weight_copies();
        let config = self.config.to_reference();
        self.undo = None;
        let created = if self.config.momentum != 0.0 {
            prepare_state(
                &mut self.momentum,
                params,
                |name, param| zeros_state(param, &format!("momentum.{name}")),
                |name, buf, param| check_state_shape(&format!("momentum.{name}"), buf, param),
            )?
        } else {
            Vec::new()
        };
        for name in &created {
            self.born.insert(name.clone(), self.steps + 1);
        }
        let control = super::control_slice(&self.control, self.controlled)?;
        for (name, param) in params {
            let Some(grad) = param.grad() else { continue };
            let launch = SgdStep {
                config,
                first_step: created.contains(name),
                grad_scale: self.grad_scale,
                control,
            };
            let momentum = self
                .momentum
                .get(name)
                .filter(|_| self.config.momentum != 0.0)
                .map(Tensor::elements)
                .transpose()?;
            sgd_step(
                param.gpu(),
                &launch,
                param.elements()?,
                grad.elements()?,
                momentum,
            )?;
        }
        self.undo = Some((self.steps, created));
        self.steps += 1;
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
        self.momentum
            .iter()
            .map(|(name, t)| (format!("momentum.{name}"), t.clone()))
            .collect()
    }

    fn state_kinds(&self) -> Vec<&'static str> {
        if self.config.momentum != 0.0 {
            vec!["momentum"]
        } else {
            Vec::new()
        }
    }

    fn load_state(&mut self, state: Vec<(String, Tensor)>, step_count: u64) -> Result<()> {
        let mut split = split_state(state, &["momentum"])?;
        self.momentum = split.remove("momentum").unwrap_or_default();
        self.born.clear();
        self.steps = step_count;
        self.undo = None;
        Ok(())
    }

    fn undo_step(&mut self) {
        super::undo_last(&mut self.undo, &mut self.steps, &mut self.momentum);
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

    /// Also drops the momentum buffers the skipped steps created (zeros they never wrote), so
    /// the next step creates them as a first step.
    fn rewind(&mut self, step_count: u64) {
        if step_count < self.steps {
            self.steps = step_count;
            self.undo = None;
            let later: Vec<String> = self
                .born
                .iter()
                .filter(|(_, born)| **born > step_count)
                .map(|(name, _)| name.clone())
                .collect();
            for name in later {
                self.born.remove(&name);
                self.momentum.remove(&name);
            }
        }
    }
}
