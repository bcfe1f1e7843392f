//! [`ShardedAdamW`]: AdamW that keeps the state of, and updates, only one rank's rows of the
//! parameters (ZeRO stages 1 and 2), and [`RowShard`], which rows those are.
//!
//! The trained parameters, flattened in order, are cut into `ranks` contiguous parts of nearly
//! equal size at row boundaries (a row: one entry of a tensor's first axis, so a rank's part of
//! a tensor is a view of it, and a matrix's part is still a matrix for weight decay's rule). The
//! parts differ by less than the longest row. Each rank's optimizer keeps `exp_avg` and
//! `exp_avg_sq` for its rows alone (1/N of AdamW's state) and updates those rows with the same
//! kernel; the trainer sums each rank's gradients for it (all-reduce, or with stage 2 a
//! reduce-scatter that leaves each rank only its rows' gradients, [`Optimizer::set_row_gradients`])
//! and gathers every rank's updated rows afterwards.

use std::collections::BTreeMap;
use std::ops::Range;

use plimsoll_autograd::{Category, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::Gpu;

use super::Optimizer;
use super::adamw::{AdamWConfig, Moments, moments_state};
use crate::error::{Error, Result};
use crate::state::HostTensor;

/// The rows of each trained parameter that one rank of `ranks` keeps (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowShard {
    rank: usize,
    ranks: usize,
    /// Per parameter (in the order given), its name, shape and the rows this rank keeps
    /// (possibly none).
    parts: Vec<(String, Vec<usize>, Range<usize>)>,
    /// This rank's elements within the parameters flattened in order.
    flat: Range<usize>,
}

/// Rows of a tensor of `shape` (its first axis; a 0-d tensor is one row) and elements per row.
fn rows_of(shape: &[usize]) -> (usize, usize) {
    match shape.split_first() {
        Some((&rows, rest)) => (rows, rest.iter().product()),
        None => (1, 1),
    }
}

impl RowShard {
    /// Rank `rank`'s rows of parameters of `shapes` (name and shape, in order) among `ranks`:
    /// the flattened parameters cut at the row boundary nearest each `k / ranks` of the whole.
    pub fn new(shapes: &[(String, Vec<usize>)], rank: usize, ranks: usize) -> RowShard {
        let ranks = ranks.max(1);
        let total: usize = shapes
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        // Rank r keeps the rows that start in its share: at flat elements from
        // ceil(r * total / ranks) on (the last rank keeps every row after its start).
        let cut = |r: usize| -> u128 { (r as u128 * total as u128).div_ceil(ranks as u128) };
        // Rows of a tensor at `at` with `rows` rows of `row_len` that start before `cut`.
        let before = |cut: u128, at: usize, rows: usize, row_len: usize| -> usize {
            let at = at as u128;
            match (cut > at, row_len) {
                (false, _) => 0,
                (true, 0) => rows,
                (true, len) => ((cut - at).div_ceil(len as u128)).min(rows as u128) as usize,
            }
        };
        let mut parts = Vec::with_capacity(shapes.len());
        let (mut at, mut flat_start, mut flat_end) = (0usize, None, 0usize);
        for (name, shape) in shapes {
            let (rows, row_len) = rows_of(shape);
            let first = match rank {
                0 => 0,
                r => before(cut(r), at, rows, row_len),
            };
            let end = match rank + 1 >= ranks {
                true => rows,
                false => before(cut(rank + 1), at, rows, row_len),
            }
            .max(first);
            if end > first {
                flat_start.get_or_insert(at + first * row_len);
                flat_end = at + end * row_len;
            }
            parts.push((name.clone(), shape.clone(), first..end));
            at += rows * row_len;
        }
        let start = flat_start.unwrap_or(flat_end);
        RowShard {
            rank,
            ranks,
            parts,
            flat: start..flat_end.max(start),
        }
    }

    /// Every rank's shard of `shapes`, in rank order.
    pub fn all(shapes: &[(String, Vec<usize>)], ranks: usize) -> Vec<RowShard> {
        (0..ranks.max(1))
            .map(|r| RowShard::new(shapes, r, ranks))
            .collect()
    }

    /// This shard's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks share the parameters.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The rows of parameter `name` this rank keeps (`None` for a parameter it does not know;
    /// an empty range for one it keeps none of).
    pub fn rows(&self, name: &str) -> Option<Range<usize>> {
        self.parts
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, r)| r.clone())
    }

    /// This rank's elements of the parameters flattened in order.
    pub fn flat(&self) -> Range<usize> {
        self.flat.clone()
    }

    /// Per parameter in order: its name, shape and this rank's rows.
    pub fn parts(&self) -> &[(String, Vec<usize>, Range<usize>)] {
        &self.parts
    }

    /// The shape of this rank's rows of parameter `name`, if it keeps any.
    pub fn row_shape(&self, name: &str) -> Option<Vec<usize>> {
        let (_, shape, rows) = self.parts.iter().find(|(n, _, _)| n == name)?;
        if rows.is_empty() {
            return None;
        }
        let mut out = shape.clone();
        match out.first_mut() {
            Some(first) => *first = rows.len(),
            None => out = vec![1],
        }
        Some(out)
    }
}

/// Rows `rows` of `t` as a view (the whole of a 0-d tensor, as one row), outside any graph.
pub fn row_view(t: &Tensor, rows: &Range<usize>) -> Result<Tensor> {
    let _no_grad = plimsoll_autograd::no_grad();
    let t = match t.rank() {
        0 => t.reshape(&[1])?,
        _ => t.clone(),
    };
    Ok(t.slice(0, rows.start, rows.len())?)
}

/// AdamW over one rank's rows ([`RowShard`]): each row's update is [`super::AdamW`]'s, with
/// the same kernel and scalars, so the ranks together make exactly its step. State names are
/// AdamW's (`exp_avg.<parameter>`), shaped like the rows kept ([`Optimizer::row_shard`] says
/// which); the trainer gathers every rank's rows into a whole checkpoint, and
/// [`Optimizer::load_host_state`] takes a whole one and keeps this rank's rows.
#[derive(Debug)]
pub struct ShardedAdamW {
    gpu: Gpu,
    config: AdamWConfig,
    shard: RowShard,
    moments: BTreeMap<String, Moments>,
    /// Gradients of this rank's rows given by [`Optimizer::set_row_gradients`] (stage 2), used
    /// by the next step instead of the parameters' own.
    row_grads: BTreeMap<String, Tensor>,
    steps: u64,
    grad_scale: f32,
    undo: Option<(u64, Vec<String>)>,
}

impl ShardedAdamW {
    /// An optimizer with `config` over the rows of `shard`, whose state lives on `gpu` (the
    /// parameters' device).
    pub fn new(gpu: &Gpu, config: AdamWConfig, shard: RowShard) -> ShardedAdamW {
        ShardedAdamW {
            gpu: gpu.clone(),
            config,
            shard,
            moments: BTreeMap::new(),
            row_grads: BTreeMap::new(),
            steps: 0,
            grad_scale: 1.0,
            undo: None,
        }
    }

    fn state_tensor(&self, shape: &[usize], label: &str) -> Result<Tensor> {
        let options = TensorOptions {
            category: Category::OptimizerState,
            label,
            requires_grad: false,
        };
        Ok(Tensor::zeros(&self.gpu, shape, options)?)
    }

    /// The gradient of `name`'s rows `rows`: given by [`Optimizer::set_row_gradients`], else a
    /// view of the parameter's own.
    fn row_grad(&self, name: &str, param: &Tensor, rows: &Range<usize>) -> Result<Option<Tensor>> {
        if let Some(g) = self.row_grads.get(name) {
            return Ok(Some(g.clone()));
        }
        param.grad().map(|g| row_view(&g, rows)).transpose()
    }
}

impl Optimizer for ShardedAdamW {
    fn step(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        plimsoll_autograd::forget_weight_copies();
        let step = self.steps + 1;
        self.undo = None;
        // Every update's tensors first (creating the state it lacks): nothing is recorded if
        // one cannot be made.
        let mut updates = Vec::new();
        let mut created = Vec::new();
        let prepared: Result<()> = params.iter().try_for_each(|(name, param)| {
            let Some(rows) = self.shard.rows(name).filter(|r| !r.is_empty()) else {
                return Ok(());
            };
            let Some(grad) = self.row_grad(name, param, &rows)? else {
                return Ok(());
            };
            let shape = self.shard.row_shape(name).unwrap_or_default();
            if grad.numel() != shape.iter().product::<usize>() {
                return Err(Error::OptimizerState {
                    name: name.clone(),
                    message: format!(
                        "a gradient of shape {:?} for rows shaped {shape:?}",
                        grad.shape()
                    ),
                });
            }
            if !self.moments.contains_key(name) {
                let moments = Moments {
                    exp_avg: self.state_tensor(&shape, &format!("exp_avg.{name}"))?,
                    exp_avg_sq: self.state_tensor(&shape, &format!("exp_avg_sq.{name}"))?,
                };
                self.moments.insert(name.clone(), moments);
                created.push(name.clone());
            }
            let decays = self.config.decays(param.rank());
            updates.push((name.clone(), row_view(param, &rows)?, grad, decays));
            Ok(())
        });
        if let Err(e) = prepared {
            for name in &created {
                self.moments.remove(name);
            }
            return Err(e);
        }
        for (name, rows, grad, decays) in &updates {
            let Some(m) = self.moments.get(name) else {
                continue;
            };
            m.update(&self.config, (step, self.grad_scale, *decays), rows, grad)?;
        }
        self.row_grads.clear();
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

    /// This rank's rows of the state (see [`Optimizer::row_shard`]).
    fn state(&self) -> Vec<(String, Tensor)> {
        moments_state(&self.moments)
    }

    fn state_kinds(&self) -> Vec<&'static str> {
        vec!["exp_avg", "exp_avg_sq"]
    }

    /// Whole tensors (AdamW's): read back, and this rank's rows kept.
    fn load_state(&mut self, state: Vec<(String, Tensor)>, step_count: u64) -> Result<()> {
        self.load_host_state(super::host_copies(state)?, step_count)
            .map(|_| ())
    }

    fn loads_from_host(&self) -> bool {
        true
    }

    /// Whole tensors (a checkpoint's, AdamW's names and shapes): this rank's rows uploaded. On
    /// a planning device (no values) each row block is its allocation alone.
    fn load_host_state(
        &mut self,
        state: Vec<(String, HostTensor)>,
        step_count: u64,
    ) -> Result<bool> {
        let mut moments: BTreeMap<String, (Option<Tensor>, Option<Tensor>)> = BTreeMap::new();
        for (full, t) in state {
            let bad = |message: String| Error::OptimizerState {
                name: full.clone(),
                message,
            };
            let Some((kind, name)) = full.split_once('.') else {
                return Err(bad("not <kind>.<parameter>".to_string()));
            };
            let Some((_, shape, rows)) = self.shard.parts.iter().find(|(n, _, _)| n == name) else {
                return Err(bad("no such trained parameter in this model".to_string()));
            };
            if &t.shape != shape {
                return Err(bad(format!(
                    "shape {:?} does not match the parameter's {shape:?}; was the state saved \
                     for another model?",
                    t.shape
                )));
            }
            let Some(row_shape) = self.shard.row_shape(name) else {
                continue; // none of its rows are this rank's
            };
            let (_, row_len) = rows_of(shape);
            let options = TensorOptions {
                category: Category::OptimizerState,
                label: &full,
                requires_grad: false,
            };
            let tensor = match self.gpu.is_planning() || t.data.is_empty() {
                true => Tensor::unwritten(&self.gpu, &row_shape, options)?,
                false => {
                    let part = t
                        .data
                        .get(rows.start * row_len..rows.end * row_len)
                        .ok_or_else(|| bad(format!("{} values for {shape:?}", t.data.len())))?;
                    Tensor::from_slice_with(&self.gpu, part, &row_shape, options)?
                }
            };
            let entry = moments.entry(name.to_string()).or_default();
            match kind {
                "exp_avg" => entry.0 = Some(tensor),
                "exp_avg_sq" => entry.1 = Some(tensor),
                _ => {
                    return Err(bad(
                        "not a state entry of AdamW (exp_avg, exp_avg_sq)".into()
                    ));
                }
            }
        }
        let mut kept = BTreeMap::new();
        for (name, pair) in moments {
            let (Some(exp_avg), Some(exp_avg_sq)) = pair else {
                return Err(Error::OptimizerState {
                    name,
                    message: "only one of exp_avg and exp_avg_sq; AdamW needs both moments"
                        .to_string(),
                });
            };
            kept.insert(
                name,
                Moments {
                    exp_avg,
                    exp_avg_sq,
                },
            );
        }
        self.moments = kept;
        self.row_grads.clear();
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

    fn row_shard(&self) -> Option<&RowShard> {
        Some(&self.shard)
    }

    fn set_row_gradients(&mut self, grads: BTreeMap<String, Tensor>) -> Result<()> {
        self.row_grads = grads;
        Ok(())
    }
}
