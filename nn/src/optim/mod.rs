//! Optimizers ([`Sgd`], [`AdamW`]) behind the [`Optimizer`] trait, gradient utilities
//! ([`zero_grad`], [`clip_grad_norm`], [`grad_norm`]) and learning-rate schedules
//! ([`LrSchedule`]).
//!
//! Conventions: an optimizer updates every parameter that has a gradient, in place, with one
//! fused kernel launch per tensor (`kernels-wgsl`'s `optimizer` family: the same f32 scalars as
//! its CPU reference). Its state is created lazily at the first step that sees a parameter, as
//! `Category::OptimizerState`, labelled `<kind>.<parameter name>`, which is also the state's
//! name in [`Optimizer::state`] (`exp_avg.0.weight`). A step creates and checks every state
//! tensor it needs before it records the first update, and drops what it created if one fails:
//! an out-of-memory there leaves the parameters and the optimizer as they were. Steps only
//! *record* launches; nothing waits for the GPU.

mod adamw;
mod clip;
mod host_adamw;
mod schedule;
mod sgd;
mod sharded;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::{clip_grad_norm, grad_norm};
pub use host_adamw::HostAdamW;
pub use schedule::LrSchedule;
pub use sgd::{Sgd, SgdConfig};
pub use sharded::{RowShard, ShardedAdamW, row_view};

use std::collections::BTreeMap;

use plimsoll_autograd::{Category, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::kernels::copy;

use crate::error::{Error, Result};

/// An optimizer: updates parameters from their gradients and keeps per-parameter state.
pub trait Optimizer {
    /// One update of every parameter in `params` that has a gradient (parameters without one
    /// are skipped), then the step count goes up by one. State for a parameter seen the first
    /// time is created here, for every such parameter before any update is recorded; an error
    /// in that phase leaves the parameters and the optimizer unchanged.
    fn step(&mut self, params: &[(String, Tensor)]) -> Result<()>;

    /// The learning rate of the next step.
    fn lr(&self) -> f32;

    /// Sets the learning rate (schedules call this before each step).
    fn set_lr(&mut self, lr: f32);

    /// Steps taken so far (restored by [`Optimizer::load_state`]).
    fn step_count(&self) -> u64;

    /// The state tensors, named `<kind>.<parameter name>` (`exp_avg.0.weight`,
    /// `exp_avg_sq.0.weight`, `momentum.0.weight`), sorted by name. Handles: they share storage
    /// with the optimizer's own.
    fn state(&self) -> Vec<(String, Tensor)>;

    /// The kinds of state kept per parameter once it has been updated (`["exp_avg",
    /// "exp_avg_sq"]` for AdamW, `["momentum"]` for SGD with momentum, none for plain SGD):
    /// what a checkpoint of a run past its first step must hold for every parameter.
    fn state_kinds(&self) -> Vec<&'static str>;

    /// Replaces the state with `state` (names as [`Optimizer::state`] gives them; the values are
    /// copied into fresh optimizer-state buffers) and the step count with `step_count`. Errors:
    /// a name this optimizer does not keep, or a parameter with only part of its state.
    fn load_state(&mut self, state: Vec<(String, Tensor)>, step_count: u64) -> Result<()>;

    /// Undoes the host side of the last [`Optimizer::step`] (its step count and the state it
    /// created) after its recorded update was discarded before it ran: the trainer records and
    /// submits an update all or nothing, and calls this when the submission failed. Calling it
    /// twice, or without a step, does nothing.
    fn undo_step(&mut self);

    /// Multiplies every gradient by `scale` inside the fused update (the mixed-precision
    /// unscale, `1 / loss_scale`); 1 by default.
    fn set_grad_scale(&mut self, scale: f32);

    /// The vector its updates read when decided on the device ([`Optimizer::set_controlled`]):
    /// the kernels' `optimizer::CONTROL_WORDS` words `[grad_scale, skip, halted, norm]` that
    /// `optimizer::step_control` writes, created zeroed on `gpu` (as
    /// `Category::OptimizerState`, labelled `step control`; not part of [`Optimizer::state`])
    /// at the first call and the same tensor after. `Ok(None)` (the default): this optimizer's
    /// updates take host values only.
    fn control(&mut self, gpu: &plimsoll_kernels_wgsl::Gpu) -> Result<Option<Tensor>> {
        let _ = gpu;
        Ok(None)
    }

    /// While `true`, the updates recorded read the gradient's scale and whether to skip from
    /// [`Optimizer::control`] (instead of [`Optimizer::set_grad_scale`]'s host value), so an
    /// update can be recorded before the host has read the step's gradient norm. A skipped
    /// update writes nothing, and the host learns of it later: [`Optimizer::rewind`] then takes
    /// the step count back. Ignored by an optimizer without a control vector.
    fn set_controlled(&mut self, controlled: bool) {
        let _ = controlled;
    }

    /// Sets the step count back to `step_count` (at most the current count), after the device
    /// skipped the updates recorded since ([`Optimizer::set_controlled`]): they wrote nothing,
    /// so only the count (AdamW's bias corrections) moves back. State created by those steps
    /// stays, as it was created (zeros), unless the optimizer says otherwise (SGD drops the
    /// momentum buffers those steps created). Does nothing by default.
    fn rewind(&mut self, step_count: u64) {
        let _ = step_count;
    }

    /// Whether the state lives in host memory ([`Optimizer::host_state`]), not on the device;
    /// false by default.
    fn state_on_host(&self) -> bool {
        false
    }

    /// The state as host copies (names as [`Optimizer::state`] gives them), for an optimizer
    /// that keeps it in host memory ([`HostAdamW`]); `None` (the default) for one whose state
    /// is [`Optimizer::state`] on the device.
    fn host_state(&self) -> Option<Vec<(String, crate::state::HostTensor)>> {
        None
    }

    /// Visits the state [`Optimizer::host_state`] gives (each tensor's name and values)
    /// without copying it, for a host copy refreshed in place; the default visits a copy.
    fn visit_host_state(&self, visit: &mut dyn FnMut(&str, &[f32])) {
        for (name, t) in self.host_state().unwrap_or_default() {
            visit(&name, &t.data);
        }
    }

    /// Replaces the state with host copies and the step count, for an optimizer that keeps its
    /// state in host memory; `Ok(false)` (the default) for one that keeps it on the device and
    /// takes it through [`Optimizer::load_state`].
    fn load_host_state(
        &mut self,
        state: Vec<(String, crate::state::HostTensor)>,
        step_count: u64,
    ) -> Result<bool> {
        let _ = (state, step_count);
        Ok(false)
    }

    /// A new optimizer of the same configuration that keeps its state in host memory and
    /// updates on the host (AdamW's is [`HostAdamW`]); `None` (the default) when this one has
    /// no such form.
    fn offloaded(&self) -> Option<Box<dyn Optimizer>> {
        None
    }

    /// Whether loading a checkpoint's state goes through [`Optimizer::load_host_state`] (host
    /// copies of whole tensors) rather than device tensors: true for an optimizer that keeps
    /// its state on the host or keeps only some rows of it; by default
    /// [`Optimizer::state_on_host`].
    fn loads_from_host(&self) -> bool {
        self.state_on_host()
    }

    /// A new optimizer of the same configuration that keeps the state of, and updates, only the
    /// rows of `shard` (ZeRO; AdamW's is [`ShardedAdamW`]), with its state on `gpu`; `None`
    /// (the default) when this one has no such form.
    fn sharded(
        &self,
        gpu: &plimsoll_kernels_wgsl::Gpu,
        shard: RowShard,
    ) -> Option<Box<dyn Optimizer>> {
        let _ = (gpu, shard);
        None
    }

    /// The rows this optimizer keeps state for and updates, when it keeps only one rank's
    /// ([`ShardedAdamW`]): its [`Optimizer::state`] is then those rows, not whole tensors.
    /// `None` (the default): whole tensors.
    fn row_shard(&self) -> Option<&RowShard> {
        None
    }

    /// The gradients of this optimizer's rows (per parameter name, shaped like the rows) for
    /// the next step, instead of the parameters' own (ZeRO stage 2, where a rank keeps only
    /// its rows' summed gradients). Errors for an optimizer that keeps whole tensors (the
    /// default).
    fn set_row_gradients(&mut self, grads: BTreeMap<String, Tensor>) -> Result<()> {
        drop(grads);
        Err(Error::OptimizerState {
            name: "(row gradients)".to_string(),
            message: "this optimizer updates whole tensors from their own gradients".to_string(),
        })
    }
}

/// Splits element counts `sizes` (in order) into buckets of at most `bucket` elements each,
/// as `start..end` ranges of `sizes`; one larger than a bucket gets one of its own: how the
/// tensors a read-back gathers are grouped ([`HostAdamW`], the trainer's all-reduce).
pub fn buckets(sizes: &[usize], bucket: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut filled) = (0, 0);
    for (i, &n) in sizes.iter().enumerate() {
        if filled > 0 && filled + n > bucket {
            out.push(start..i);
            (start, filled) = (i, 0);
        }
        filled += n;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// Frees every parameter's gradient (sets it to none), so nothing accumulates into the next
/// backward and the memory goes back to the allocator.
pub fn zero_grad(params: &[(String, Tensor)]) {
    for (_, p) in params {
        p.clear_grad();
    }
}

/// [`Optimizer::undo_step`] for an optimizer that keeps, in `undo`, its step count before its
/// last step and the names of the state entries that step created in `state`: both taken back
/// (once).
fn undo_last<S>(
    undo: &mut Option<(u64, Vec<String>)>,
    steps: &mut u64,
    state: &mut BTreeMap<String, S>,
) {
    if let Some((before, created)) = undo.take() {
        *steps = before;
        for name in created {
            state.remove(&name);
        }
    }
}

/// State tensors read back into host copies (a planning device's: shapes, no values).
fn host_copies(state: Vec<(String, Tensor)>) -> Result<Vec<(String, crate::state::HostTensor)>> {
    let mut host = Vec::with_capacity(state.len());
    for (name, t) in state {
        let values = match t.gpu().is_planning() {
            true => Vec::new(),
            false => t.to_vec()?,
        };
        host.push((
            name,
            crate::state::HostTensor::new(t.shape().to_vec(), values),
        ));
    }
    Ok(host)
}

/// [`Optimizer::control`] for an optimizer that keeps its control vector in `slot`: created
/// zeroed on `gpu` at the first call, the same tensor after.
fn control_vector(slot: &mut Option<Tensor>, gpu: &plimsoll_kernels_wgsl::Gpu) -> Result<Tensor> {
    if let Some(control) = slot {
        return Ok(control.clone());
    }
    let options = TensorOptions {
        category: Category::OptimizerState,
        label: "step control",
        requires_grad: false,
    };
    let words = plimsoll_kernels_wgsl::kernels::optimizer::CONTROL_WORDS as usize;
    let control = Tensor::zeros(gpu, &[words], options)?;
    *slot = Some(control.clone());
    Ok(control)
}

/// What an update's launch binds as its control ([`Optimizer::set_controlled`]): the vector
/// in `slot` while `controlled`, else none (host values).
fn control_slice(
    slot: &Option<Tensor>,
    controlled: bool,
) -> Result<Option<plimsoll_kernels_wgsl::DeviceSlice<'_>>> {
    match (slot, controlled) {
        (Some(control), true) => Ok(Some(control.elements()?)),
        _ => Ok(None),
    }
}

/// A zero-filled state tensor shaped like `param`, as `Category::OptimizerState`.
fn zeros_state(param: &Tensor, label: &str) -> Result<Tensor> {
    let options = TensorOptions {
        category: Category::OptimizerState,
        label,
        requires_grad: false,
    };
    Ok(Tensor::zeros(param.gpu(), param.shape(), options)?)
}

/// The first phase of every optimizer step: creates the state `make` builds for each parameter
/// with a gradient that has none yet, and checks every parameter's state with `check`, all
/// before any update is recorded. On a failure (out of memory, a mismatched shape) the state
/// created here is dropped again, so the optimizer is exactly as it was and no parameter has
/// changed: a step is all or nothing. Returns the names whose state was created.
fn prepare_state<S>(
    map: &mut BTreeMap<String, S>,
    params: &[(String, Tensor)],
    make: impl Fn(&str, &Tensor) -> Result<S>,
    check: impl Fn(&str, &S, &Tensor) -> Result<()>,
) -> Result<Vec<String>> {
    let mut created = Vec::new();
    let result = params
        .iter()
        .filter(|(_, p)| p.grad().is_some())
        .try_for_each(|(name, param)| {
            if !map.contains_key(name) {
                let state = make(name, param)?;
                map.insert(name.clone(), state);
                created.push(name.clone());
            }
            match map.get(name) {
                Some(state) => check(name, state, param),
                None => Ok(()),
            }
        });
    match result {
        Ok(()) => Ok(created),
        Err(e) => {
            for name in &created {
                map.remove(name);
            }
            Err(e)
        }
    }
}

/// A copy of `source` in a fresh `Category::OptimizerState` buffer labelled `label`.
fn copy_state(source: &Tensor, label: &str) -> Result<Tensor> {
    let kept = zeros_state(source, label)?;
    copy::copy(source.gpu(), kept.elements()?, source.elements()?)?;
    Ok(kept)
}

/// The state entries of `state` split by kind: `kinds` are the prefixes this optimizer keeps
/// (`"exp_avg"`); each entry `<kind>.<name>` lands in `out[kind][name]`, copied into
/// optimizer-state memory.
fn split_state(
    state: Vec<(String, Tensor)>,
    kinds: &[&str],
) -> Result<BTreeMap<String, BTreeMap<String, Tensor>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Tensor>> = kinds
        .iter()
        .map(|k| (k.to_string(), BTreeMap::new()))
        .collect();
    for (full, tensor) in state {
        let split = full.split_once('.');
        let Some((kind, name)) = split.filter(|(k, n)| kinds.contains(k) && !n.is_empty()) else {
            return Err(Error::OptimizerState {
                name: full,
                message: format!(
                    "not a state entry of this optimizer (expected <kind>.<parameter> with kind \
                     one of {kinds:?}); was it saved by another optimizer?"
                ),
            });
        };
        if tensor.dtype() != plimsoll_autograd::DType::F32 {
            return Err(Error::OptimizerState {
                name: full.clone(),
                message: format!("expected f32 data, got {:?}", tensor.dtype()),
            });
        }
        let copied = copy_state(&tensor, &full)?;
        if let Some(map) = out.get_mut(kind) {
            map.insert(name.to_string(), copied);
        }
    }
    Ok(out)
}

/// Errors unless the state tensor `state` (named `name`) is shaped like `param`.
fn check_state_shape(name: &str, state: &Tensor, param: &Tensor) -> Result<()> {
    if state.shape() != param.shape() {
        return Err(Error::OptimizerState {
            name: name.to_string(),
            message: format!(
                "shape {:?} does not match the parameter's {:?}; was the state loaded for \
                 another model?",
                state.shape(),
                param.shape()
            ),
        });
    }
    Ok(())
}
