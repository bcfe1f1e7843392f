//! [`HostAdamW`]: AdamW whose moments live in host memory and whose update runs on the host
//! (ZeRO-Offload's optimizer side): the device holds no optimizer state, 8 bytes per parameter
//! less, at the price of each trained parameter's gradient and value read back and its new value
//! written, 12 bytes per parameter per step.

use std::collections::BTreeMap;

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::kernels::optimizer::{self as kernel, reference};

use super::Optimizer;
use super::adamw::AdamWConfig;
use crate::error::{Error, Result};
use crate::state::HostTensor;

/// Both moments of one parameter, in host memory.
#[derive(Debug, Clone, Default)]
struct HostMoments {
    /// The parameter's shape (the state's, in a checkpoint).
    shape: Vec<usize>,
    exp_avg: Vec<f32>,
    exp_avg_sq: Vec<f32>,
}

/// AdamW with its state in host memory. Each step reads every gradient and then every
/// parameter back, gathered on the device into buckets of up to 4 MiB with one read-back each
/// (nothing has changed if one cannot be read), then updates each parameter and its moments on
/// the host's threads with the same f32 arithmetic as the device's kernel
/// (`kernels::optimizer::reference::adamw_step`, which the kernel test holds the shader to), and
/// writes it. A parameter or gradient in host memory (streamed, [`Tensor::evict`]) is read and
/// written there, with no transfer. State names, the step count and the bias correction are [`super::AdamW`]'s, so a
/// checkpoint of either resumes the other. On a planning device a step changes nothing and keeps
/// nothing: the plan sees a device without optimizer state.
///
/// The writes go to the device's queue as they are made: a device lost among them leaves some
/// parameters updated, and the trainer's recovery restores the last good state, as for any
/// device loss. [`Optimizer::undo_step`] takes back the step count and the moments the step
/// created, not the parameters it wrote.
#[derive(Debug)]
pub struct HostAdamW {
    config: AdamWConfig,
    moments: BTreeMap<String, HostMoments>,
    steps: u64,
    grad_scale: f32,
    undo: Option<(u64, Vec<String>)>,
}

impl HostAdamW {
    /// An optimizer with `config`.
    pub fn new(config: AdamWConfig) -> HostAdamW {
        HostAdamW {
            config,
            moments: BTreeMap::new(),
            steps: 0,
            grad_scale: 1.0,
            undo: None,
        }
    }

    /// Host bytes the moments hold.
    pub fn host_bytes(&self) -> u64 {
        let values: usize = self
            .moments
            .values()
            .map(|m| m.exp_avg.len() + m.exp_avg_sq.len())
            .sum();
        4 * values as u64
    }
}

/// Values a bucket of read-backs gathers at most (4 MiB of f32, the device memory its gathered
/// copy takes; a larger tensor is a bucket of its own, read without a copy).
const BUCKET_ELEMENTS: usize = 1 << 20;

/// `tensors` flattened and joined on the device (recording nothing): one read-back for all. One
/// tensor is itself (no copy).
fn gathered<'a>(tensors: impl Iterator<Item = &'a Tensor>) -> Result<Tensor> {
    let _no_grad = plimsoll_autograd::no_grad();
    let tensors: Vec<&Tensor> = tensors.collect();
    if let [one] = tensors.as_slice() {
        return Ok((*one).clone());
    }
    let flat = tensors
        .into_iter()
        .map(|t| t.reshape(&[t.numel()]))
        .collect::<plimsoll_autograd::Result<Vec<Tensor>>>()?;
    let refs: Vec<&Tensor> = flat.iter().collect();
    Ok(Tensor::concat(&refs, 0)?)
}

/// Each of `bucket`'s values: gathered on the device into one read-back when every one is
/// there, else each read as it is (an evicted tensor's values are already in host memory,
/// [`Tensor::evict`]). On a planning device the values are empty and only the device's side
/// (the gathered copy) happens.
fn read_bucket(bucket: &[&Tensor]) -> Result<Vec<Vec<f32>>> {
    let planning = bucket.first().is_some_and(|t| t.gpu().is_planning());
    if !bucket.iter().all(|t| t.is_resident()) {
        return match planning {
            true => Ok(vec![Vec::new(); bucket.len()]),
            false => Ok(bucket
                .iter()
                .map(|t| t.to_vec())
                .collect::<plimsoll_autograd::Result<_>>()?),
        };
    }
    let joined = gathered(bucket.iter().copied())?;
    if planning {
        return Ok(vec![Vec::new(); bucket.len()]);
    }
    let values = joined.to_vec()?;
    let mut out = Vec::with_capacity(bucket.len());
    let mut at = 0;
    for t in bucket {
        let n = t.numel();
        out.push(values.get(at..at + n).unwrap_or(&[]).to_vec());
        at += n;
    }
    Ok(out)
}

/// Elements below which an update runs on the calling thread alone.
const THREAD_ELEMENTS: usize = 1 << 16;

/// [`reference::adamw_step`] in pieces on the host's threads: each element's update depends
/// on that element alone, so the values are the same as one call's. A thread the system
/// refuses leaves its piece to the calling thread.
fn adamw_on_threads(
    param: &mut [f32],
    grad: &[f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    config: &kernel::AdamWConfig,
    step: u64,
    grad_scale: f32,
) {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let piece = param.len().div_ceil(threads).max(THREAD_ELEMENTS);
    if piece >= param.len() {
        reference::adamw_step(param, grad, exp_avg, exp_avg_sq, config, step, grad_scale);
        return;
    }
    type Piece<'a> = (&'a mut [f32], &'a [f32], &'a mut [f32], &'a mut [f32]);
    let pieces: Vec<std::sync::Mutex<Piece<'_>>> = param
        .chunks_mut(piece)
        .zip(grad.chunks(piece))
        .zip(exp_avg.chunks_mut(piece))
        .zip(exp_avg_sq.chunks_mut(piece))
        .map(|(((p, g), m), v)| std::sync::Mutex::new((p, g, m, v)))
        .collect();
    let run = |piece: &std::sync::Mutex<Piece<'_>>| {
        let mut piece = piece.lock().unwrap_or_else(|e| e.into_inner());
        let (p, g, m, v) = &mut *piece;
        reference::adamw_step(p, g, m, v, config, step, grad_scale);
    };
    std::thread::scope(|scope| {
        let refused: Vec<_> = pieces
            .iter()
            .filter(|piece| {
                std::thread::Builder::new()
                    .spawn_scoped(scope, || run(piece))
                    .is_err()
            })
            .collect();
        for piece in refused {
            run(piece);
        }
    });
}

/// `len` zeros, or an error when the host cannot give them (never an abort).
fn host_zeros(name: &str, len: usize) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::OptimizerState {
            name: name.to_string(),
            message: format!(
                "host memory refused {} bytes of optimizer state; free host memory or keep the \
             optimizer on the device",
                4 * len as u64
            ),
        })?;
    v.resize(len, 0.0);
    Ok(v)
}

impl HostAdamW {
    /// Zero moments for each trained parameter that has none, checking the others' lengths:
    /// the names created, or an error with none of them kept.
    fn create_moments(&mut self, trained: &[(&String, &Tensor, Tensor)]) -> Result<Vec<String>> {
        let mut created = Vec::new();
        let result = trained.iter().try_for_each(|(name, param, _)| {
            let len = param.numel();
            match self.moments.get(*name) {
                Some(m) if m.exp_avg.len() != len => Err(Error::OptimizerState {
                    name: format!("exp_avg.{name}"),
                    message: format!("{} values for a parameter of {len}", m.exp_avg.len()),
                }),
                Some(_) => Ok(()),
                None => {
                    let moments = HostMoments {
                        shape: param.shape().to_vec(),
                        exp_avg: host_zeros(&format!("exp_avg.{name}"), len)?,
                        exp_avg_sq: host_zeros(&format!("exp_avg_sq.{name}"), len)?,
                    };
                    self.moments.insert((*name).clone(), moments);
                    created.push((*name).clone());
                    Ok(())
                }
            }
        });
        match result {
            Ok(()) => Ok(created),
            Err(e) => {
                for name in &created {
                    self.moments.remove(name);
                }
                Err(e)
            }
        }
    }
}

impl Optimizer for HostAdamW {
    fn step(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        plimsoll_autograd::forget_weight_copies();
        let step = self.steps + 1;
        self.undo = None;
        let trained: Vec<(&String, &Tensor, Tensor)> = params
            .iter()
            .filter_map(|(name, p)| p.grad().map(|g| (name, p, g)))
            .collect();
        let sizes: Vec<usize> = trained.iter().map(|(_, p, _)| p.numel()).collect();
        let groups = super::buckets(&sizes, BUCKET_ELEMENTS);
        let planning = trained
            .first()
            .is_some_and(|(_, p, _)| p.gpu().is_planning());
        if planning {
            // The device's side alone, in the same order: each bucket's gathered gradients,
            // then each bucket's gathered parameters.
            let grads: Vec<&Tensor> = trained.iter().map(|(_, _, g)| g).collect();
            let values: Vec<&Tensor> = trained.iter().map(|(_, p, _)| *p).collect();
            for tensors in [grads, values] {
                for range in &groups {
                    let _ = read_bucket(&tensors[range.clone()])?;
                }
            }
            self.undo = Some((self.steps, Vec::new()));
            self.steps = step;
            return Ok(());
        }
        // The host memory this step reads into (the gradients and the values), then the moments
        // it creates: asked for first (a refusal leaves everything as it was).
        if let Some((_, p, _)) = trained.first() {
            // The gradients and values, and one tensor's new values and moments while its
            // update is uploaded.
            let largest = sizes.iter().copied().max().unwrap_or(0) as u64;
            let read: u64 = sizes.iter().map(|&n| 8 * n as u64).sum::<u64>() + 12 * largest;
            p.gpu()
                .host_allocation("the gradients and parameters read back", read)?;
            let new: u64 = trained
                .iter()
                .filter(|(name, _, _)| !self.moments.contains_key(*name))
                .map(|(_, p, _)| 8 * p.numel() as u64)
                .sum();
            if new > 0 {
                let what = "the optimizer's state in host memory (--offload)";
                p.gpu().host_allocation(what, new)?;
            }
        }
        // Every gradient first, a bucket per read-back: a read that fails leaves everything as
        // it was.
        let tensors: Vec<&Tensor> = trained.iter().map(|(_, _, g)| g).collect();
        let mut grads: Vec<Vec<f32>> = Vec::with_capacity(trained.len());
        for range in &groups {
            grads.extend(read_bucket(&tensors[range.clone()])?);
        }
        // Then every parameter, before anything is written or created: a read that fails
        // leaves everything as it was.
        let tensors: Vec<&Tensor> = trained.iter().map(|(_, p, _)| *p).collect();
        let mut values: Vec<Vec<f32>> = Vec::with_capacity(trained.len());
        for range in &groups {
            values.extend(read_bucket(&tensors[range.clone()])?);
        }
        let created = self.create_moments(&trained)?;
        let reference_config = self.config.to_reference();
        let config = |param: &Tensor| kernel::AdamWConfig {
            weight_decay: match self.config.decays(param.rank()) {
                true => reference_config.weight_decay,
                false => 0.0,
            },
            ..reference_config
        };
        // Every parameter's new values go up before any moment changes: each update runs on
        // copies of its moments, and an upload that fails puts back the values written before
        // it, so the step leaves the model and the state as they were.
        let mut written = 0;
        for (((name, param, _), old), grad) in trained.iter().zip(&values).zip(&grads) {
            let Some(m) = self.moments.get(*name) else {
                continue;
            };
            let (mut new, mut exp_avg, mut exp_avg_sq) =
                (old.clone(), m.exp_avg.clone(), m.exp_avg_sq.clone());
            adamw_on_threads(
                &mut new,
                grad,
                &mut exp_avg,
                &mut exp_avg_sq,
                &config(param),
                step,
                self.grad_scale,
            );
            if let Err(e) = param.write_from_slice(&new) {
                // A device that cannot take the old values back is lost, and recovery
                // restores the state from its snapshot.
                for ((_, param, _), old) in trained.iter().zip(&values).take(written) {
                    let _ = param.write_from_slice(old);
                }
                for name in &created {
                    self.moments.remove(name);
                }
                return Err(e.into());
            }
            written += 1;
        }
        // Every upload went through: the moments take the same update (the same inputs, so the
        // same bits as the values written).
        for (((name, param, _), mut values), grad) in trained.iter().zip(values).zip(&grads) {
            let Some(m) = self.moments.get_mut(*name) else {
                continue;
            };
            adamw_on_threads(
                &mut values,
                grad,
                &mut m.exp_avg,
                &mut m.exp_avg_sq,
                &config(param),
                step,
                self.grad_scale,
            );
        }
        self.undo = Some((self.steps, created));
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

    /// Nothing on the device: the state is [`Optimizer::host_state`].
    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    fn state_kinds(&self) -> Vec<&'static str> {
        vec!["exp_avg", "exp_avg_sq"]
    }

    /// The moments uploaded: for a caller that wants them on the device after all.
    fn load_state(&mut self, state: Vec<(String, Tensor)>, step_count: u64) -> Result<()> {
        self.load_host_state(super::host_copies(state)?, step_count)
            .map(|_| ())
    }

    fn state_on_host(&self) -> bool {
        true
    }

    fn host_state(&self) -> Option<Vec<(String, HostTensor)>> {
        let mut out = Vec::with_capacity(2 * self.moments.len());
        for (name, m) in &self.moments {
            let shape = m.shape.clone();
            out.push((
                format!("exp_avg.{name}"),
                HostTensor::new(shape.clone(), m.exp_avg.clone()),
            ));
            out.push((
                format!("exp_avg_sq.{name}"),
                HostTensor::new(shape, m.exp_avg_sq.clone()),
            ));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Some(out)
    }

    fn visit_host_state(&self, visit: &mut dyn FnMut(&str, &[f32])) {
        for (name, m) in &self.moments {
            visit(&format!("exp_avg.{name}"), &m.exp_avg);
            visit(&format!("exp_avg_sq.{name}"), &m.exp_avg_sq);
        }
    }

    fn load_host_state(
        &mut self,
        state: Vec<(String, HostTensor)>,
        step_count: u64,
    ) -> Result<bool> {
        let mut moments: BTreeMap<String, HostMoments> = BTreeMap::new();
        for (full, t) in state {
            let Some((kind, name)) = full.split_once('.') else {
                return Err(Error::OptimizerState {
                    name: full,
                    message: "not <kind>.<parameter>".to_string(),
                });
            };
            let entry = moments.entry(name.to_string()).or_default();
            entry.shape = t.shape;
            match kind {
                "exp_avg" => entry.exp_avg = t.data,
                "exp_avg_sq" => entry.exp_avg_sq = t.data,
                _ => {
                    return Err(Error::OptimizerState {
                        name: full.clone(),
                        message: "not a state entry of AdamW (exp_avg, exp_avg_sq)".to_string(),
                    });
                }
            }
        }
        if let Some((name, _)) = moments
            .iter()
            .find(|(_, m)| m.exp_avg.len() != m.exp_avg_sq.len())
        {
            return Err(Error::OptimizerState {
                name: name.clone(),
                message: "exp_avg and exp_avg_sq differ in length (or one is missing); AdamW \
                          needs both moments"
                    .to_string(),
            });
        }
        self.moments = moments;
        self.steps = step_count;
        self.undo = None;
        Ok(true)
    }

    fn undo_step(&mut self) {
        super::undo_last(&mut self.undo, &mut self.steps, &mut self.moments);
    }

    fn set_grad_scale(&mut self, scale: f32) {
        self.grad_scale = scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over several threads' pieces (and a last piece shorter than the others), the update is
    /// bit for bit the reference's in one call.
    #[test]
    fn the_update_on_threads_is_the_update_in_one_call() {
        let n = 3 * THREAD_ELEMENTS + 1234;
        let wave = |k: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * k).sin()).collect() };
        let config = kernel::AdamWConfig {
            weight_decay: 0.1,
            ..AdamWConfig::default().to_reference()
        };
        let (mut p1, g, mut m1, mut v1) = (wave(0.37), wave(0.11), wave(0.05), wave(0.07));
        let v1_abs: Vec<f32> = v1.iter().map(|x| x.abs()).collect();
        v1 = v1_abs;
        let (mut p2, mut m2, mut v2) = (p1.clone(), m1.clone(), v1.clone());
        reference::adamw_step(&mut p1, &g, &mut m1, &mut v1, &config, 3, 0.5);
        adamw_on_threads(&mut p2, &g, &mut m2, &mut v2, &config, 3, 0.5);
        assert!(p1 == p2 && m1 == m2 && v1 == v2);
        assert_ne!(p1, wave(0.37), "the update changed the values");
    }
}
