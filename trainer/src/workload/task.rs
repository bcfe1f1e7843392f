//! What the trainer trains, behind three traits, so that nothing in the loop names a model or a
//! data set:
//!
//! - [`Recipe`]: how to build a model and its optimizer (the trainer builds the real one, the
//!   memory plan throwaway copies for its dry runs);
//! - [`Model`]: a built model: its parameters, the mean loss of a micro-batch (recorded for
//!   backward, with a checkpointing choice), and the evaluation sums of a chunk;
//! - [`Data`]: samples the trainer draws micro-batches from, by index.
//!
//! Implementations: the MLP classifier ([`crate::model::ModelSpec`]) on a table
//! ([`crate::Dataset`]), and nanoGPT's character-level GPT ([`crate::model::GptSpec`]) on token
//! windows ([`crate::data::TokenData`]).

use plimsoll_autograd::{Gpu, Tensor};
use plimsoll_nn::{HostTensor, LoadedState, Optimizer};

use crate::error::{Error, Result};

/// A micro-batch on the device: the model's inputs and the loss's targets.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Inputs (features `[n, d]` f32, or token ids `[n, t]` u32).
    pub inputs: Tensor,
    /// Targets (class ids `[n]`, or next tokens `[n, t]`, u32).
    pub targets: Tensor,
}

/// A batch built in host memory: `rows` samples, each `input_width` values and
/// `targets.len() / rows` targets, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBatch {
    /// Samples.
    pub rows: usize,
    /// Values per sample's input.
    pub input_width: usize,
    /// The inputs, `[rows, input_width]`.
    pub inputs: HostInputs,
    /// The targets, `[rows]` or `[rows, w]`.
    pub targets: Vec<u32>,
    /// `None`: one class per row (targets `[rows]`); `Some(w)`: `w` per row (`[rows, w]`).
    pub targets_per_row: Option<usize>,
}

/// What a [`HostBatch`]'s inputs are.
#[derive(Debug, Clone, PartialEq)]
pub enum HostInputs {
    /// Features, uploaded as f32 (`Category::Input`).
    Features(Vec<f32>),
    /// Token ids, uploaded as u32.
    Tokens(Vec<u32>),
    /// u8 images (`[rows, c, h, w]` bytes), uploaded four to a word and made normalised f32
    /// features on the device, with random crops and flips ([`crate::images::ImageTransform`]).
    Pixels(Vec<u8>, crate::images::ImageTransform),
}

impl HostBatch {
    /// Host bytes its vectors hold.
    pub fn bytes(&self) -> u64 {
        let inputs = match &self.inputs {
            HostInputs::Features(v) => v.len() * 4,
            HostInputs::Tokens(v) => v.len() * 4,
            HostInputs::Pixels(v, _) => v.len(),
        };
        (inputs + self.targets.len() * 4) as u64
    }

    /// Rows `rows` on the device, as [`Data::upload`] makes them. Errors: rows past the batch.
    pub fn upload_rows(&self, gpu: &Gpu, rows: std::ops::Range<usize>) -> Result<Batch> {
        use plimsoll_autograd::TensorOptions;
        use plimsoll_kernels_wgsl::Category;
        let n = rows.len();
        let per_target = self.targets_per_row.unwrap_or(1);
        let w = self.input_width;
        let bad = || {
            Error::invalid(
                "batch",
                format!("rows {rows:?} of a host batch of {}", self.rows),
            )
        };
        if rows.end > self.rows {
            return Err(bad());
        }
        let targets = self
            .targets
            .get(rows.start * per_target..rows.end * per_target)
            .ok_or_else(bad)?;
        let target_shape: Vec<usize> = match self.targets_per_row {
            None => vec![n],
            Some(t) => vec![n, t],
        };
        let inputs = match &self.inputs {
            HostInputs::Features(v) => Tensor::from_slice_with(
                gpu,
                v.get(rows.start * w..rows.end * w).ok_or_else(bad)?,
                &[n, w],
                TensorOptions {
                    category: Category::Input,
                    label: "batch features",
                    requires_grad: false,
                },
            )?,
            HostInputs::Tokens(v) => {
                let ids = v.get(rows.start * w..rows.end * w).ok_or_else(bad)?;
                Tensor::from_indices(gpu, ids, &[n, w])?
            }
            HostInputs::Pixels(v, transform) => {
                let pixels = v.get(rows.start * w..rows.end * w).ok_or_else(bad)?;
                transform.upload(gpu, pixels, n)?
            }
        };
        Ok(Batch {
            inputs,
            targets: Tensor::from_indices(gpu, targets, &target_shape)?,
        })
    }
}

/// Samples a run trains or evaluates on.
pub trait Data: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;

    /// Whether there is no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The samples `indices` (each `< len()`) as one micro-batch on the device.
    fn upload(&self, gpu: &Gpu, indices: &[usize]) -> Result<Batch>;

    /// The samples `indices` built in host memory, for the loader thread to make ahead of the
    /// step ([`HostBatch::upload_rows`] puts them on the device); `None` (the default) for data
    /// that builds its batches only through [`Data::upload`], which the step then calls itself.
    fn gather(&self, indices: &[usize]) -> Result<Option<HostBatch>> {
        let _ = indices;
        Ok(None)
    }

    /// Values per input sample: features of a row, or tokens of a window.
    fn input_width(&self) -> usize;

    /// Distinct targets: classes, or the vocabulary.
    fn classes(&self) -> usize;

    /// What a sample is, for messages (`1437 rows of 64 features, 10 classes`).
    fn describe(&self) -> String;
}

impl<D: Data + ?Sized> Data for Box<D> {
    fn len(&self) -> usize {
        (**self).len()
    }

    fn upload(&self, gpu: &Gpu, indices: &[usize]) -> Result<Batch> {
        (**self).upload(gpu, indices)
    }

    fn gather(&self, indices: &[usize]) -> Result<Option<HostBatch>> {
        (**self).gather(indices)
    }

    fn input_width(&self) -> usize {
        (**self).input_width()
    }

    fn classes(&self) -> usize {
        (**self).classes()
    }

    fn describe(&self) -> String {
        (**self).describe()
    }
}

/// Sums a model gives for one evaluated chunk; the trainer adds them up over the set.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EvalSums {
    /// Samples evaluated (rows, or predicted tokens).
    pub count: u64,
    /// Sum of the per-sample losses.
    pub loss_sum: f64,
    /// Correct predictions, for classifiers.
    pub correct: Option<u64>,
}

impl std::ops::Add for EvalSums {
    type Output = EvalSums;

    /// Sums of two chunks together.
    fn add(self, other: EvalSums) -> EvalSums {
        EvalSums {
            count: self.count + other.count,
            loss_sum: self.loss_sum + other.loss_sum,
            correct: match (self.correct, other.correct) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            },
        }
    }
}

/// An evaluation of a whole set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean loss per sample.
    pub loss: f32,
    /// Fraction correct, for classifiers.
    pub accuracy: Option<f32>,
    /// Samples evaluated.
    pub samples: u64,
    /// Peak allocated bytes during the evaluation (0 where nobody measured it).
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes during the evaluation (0 where nobody measured it).
    pub peak_reserved_bytes: u64,
}

impl From<EvalSums> for Evaluation {
    fn from(s: EvalSums) -> Evaluation {
        let n = s.count.max(1) as f64;
        Evaluation {
            loss: (s.loss_sum / n) as f32,
            accuracy: s.correct.map(|c| (c as f64 / n) as f32),
            samples: s.count,
            peak_allocated_bytes: 0,
            peak_reserved_bytes: 0,
        }
    }
}

/// [`build_within_budget`] for a run of `config`: with [`Offload::OptimizerState`] the
/// optimizer is the recipe's in its host form ([`Optimizer::offloaded`]); on several ranks with
/// a [`Shard`] other than none, its form that keeps this rank's rows ([`Optimizer::sharded`],
/// [`crate::TrainConfig::rank`]). Errors: an optimizer that has no such form, or both asked.
///
/// [`Offload::OptimizerState`]: crate::config::Offload::OptimizerState
/// [`Shard`]: crate::config::Shard
pub fn build_for_run(
    recipe: &dyn Recipe,
    gpu: &Gpu,
    config: &crate::config::TrainConfig,
) -> Result<(Box<dyn Model>, Box<dyn Optimizer>)> {
    let (model, optimizer) = match config.offload.parameters_on_host() {
        // The blocks' parameters go to host memory as each block is made: the model is built
        // without ever holding them all on the device.
        true => {
            let _evict = plimsoll_nn::evict_blocks_as_built();
            build_within(recipe, gpu, false)?
        }
        false => build_within_budget(recipe, gpu)?,
    };
    let (rank, ranks) = config.rank;
    if config.offload.parameters_on_host() {
        if ranks > 1 {
            return Err(Error::invalid(
                "--offload parameters",
                "streaming the parameters is for one process: with several, leave --offload                  parameters out (--shard divides the optimizer's state among the ranks)",
            ));
        }
        // A model whose blocks were built on the device all the same (one that builds them
        // otherwise): they leave now.
        let streamed = model.streamed_parameters();
        let refs: Vec<&Tensor> = streamed.iter().map(|(_, t)| t).collect();
        Tensor::evict(&refs, plimsoll_kernels_wgsl::Evict::ReadBack)?;
    }
    if config.shard != crate::config::Shard::None && ranks > 1 {
        if config.offload.optimizer_on_host() {
            return Err(Error::invalid(
                "--shard",
                "the optimizer's state is either in host memory (--offload optimizer or activations) or \
                 divided among the ranks (--shard), not both: leave one out",
            ));
        }
        let shapes: Vec<(String, Vec<usize>)> = model
            .parameters()
            .iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(n, t)| (n.clone(), t.shape().to_vec()))
            .collect();
        let shard = plimsoll_nn::RowShard::new(&shapes, rank, ranks);
        let sharded = optimizer.sharded(gpu, shard).ok_or_else(|| {
            Error::invalid(
                "--shard",
                "this run's optimizer has no sharded form (AdamW has; SGD has not): leave \
                 --shard out",
            )
        })?;
        return Ok((model, sharded));
    }
    match config.offload {
        crate::config::Offload::None | crate::config::Offload::Auto => Ok((model, optimizer)),
        crate::config::Offload::OptimizerState
        | crate::config::Offload::Activations
        | crate::config::Offload::Parameters => {
            let host = optimizer.offloaded().ok_or_else(|| {
                Error::invalid(
                    "--offload optimizer",
                    "this run's optimizer keeps its state on the device only (AdamW has a \
                     host form; SGD has not): leave --offload out",
                )
            })?;
            Ok((model, host))
        }
    }
}

/// `recipe.build(gpu)`, with parameters that cannot fit the budget (counted first, or an
/// out-of-memory while building) reported as [`Error::ModelTooLarge`], whose advice fits that
/// case, and parameters the host cannot initialise as [`Error::HostMemory`].
pub fn build_within_budget(
    recipe: &dyn Recipe,
    gpu: &Gpu,
) -> Result<(Box<dyn Model>, Box<dyn Optimizer>)> {
    build_within(recipe, gpu, true)
}

/// [`build_within_budget`]; without `all_on_device` (parameter streaming) the parameters are
/// not counted against the budget first, since the blocks' leave the device as they are made,
/// and an out-of-memory while building is itself (a plan's dry run then does not fit).
fn build_within(
    recipe: &dyn Recipe,
    gpu: &Gpu,
    all_on_device: bool,
) -> Result<(Box<dyn Model>, Box<dyn Optimizer>)> {
    let parameters = recipe.parameter_count();
    let budget_bytes = gpu.memory_budget_bytes();
    if all_on_device && crate::host::product(parameters, 4) > budget_bytes {
        return Err(Error::ModelTooLarge {
            budget_bytes,
            parameters,
        });
    }
    crate::host::check(
        &format!("initialising {parameters} parameters"),
        parameters as u64,
        4,
    )?;
    recipe.build(gpu).map_err(|e| {
        if let Some((label, bytes, max_bytes)) = e.too_large_for_binding() {
            Error::TensorTooLarge {
                label: label.to_string(),
                bytes,
                max_bytes,
                made_by: "the model's parameters".to_string(),
                hint: "a parameter split across bindings is not supported yet: use a smaller \
                       model (a smaller vocabulary or --width)"
                    .to_string(),
            }
        } else if e.is_out_of_memory() && all_on_device {
            Error::ModelTooLarge {
                budget_bytes: gpu.memory_budget_bytes(),
                parameters: recipe.parameter_count(),
            }
        } else {
            e
        }
    })
}

/// A built model.
pub trait Model: Send {
    /// Every trainable parameter with its name, in a stable order (the optimizer's, the
    /// checkpoint's and the non-finite check's).
    fn parameters(&self) -> Vec<(String, Tensor)>;

    /// The mean loss of `batch` (recorded for backward), running every run of `segment_len`
    /// blocks through autograd's checkpoint (0: none), with `label_smoothing`.
    fn loss(&self, batch: &Batch, segment_len: usize, label_smoothing: f32) -> Result<Tensor>;

    /// The evaluation sums of `batch` (called under `no_grad`, in evaluation mode).
    fn evaluate(&self, batch: &Batch) -> Result<EvalSums>;

    /// Switches training (`true`) or evaluation mode.
    fn set_training(&mut self, training: bool);

    /// State that belongs to the model but is not trained (BatchNorm's running statistics),
    /// with dotted names: saved and restored with the parameters (checkpoints, the snapshot a
    /// lost device goes on from), never given to the optimizer. None by default.
    fn buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// The parameters that parameter streaming keeps in host memory between their uses
    /// ([`crate::Offload::Parameters`]): those of blocks that run in checkpointed segments
    /// ([`plimsoll_nn::CausalLm::block_parameters`]). None by default: a model without such
    /// blocks keeps every parameter on the device.
    fn streamed_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// What the exported `model.safetensors` holds: the names and layouts of the matching
    /// PyTorch model's `state_dict()`, so that `load_state_dict(..., strict=True)` takes it.
    /// By default the parameters; a model with tied weights lists each name of the shared tensor.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        self.parameters()
    }

    /// What the exported `model.safetensors` holds, read back to the host: [`Model::state_dict`]
    /// with each table kept in parts joined under its own name ([`host_state`]). A model whose
    /// export layout differs (a transpose) overrides it.
    fn export_entries(&self) -> Result<Vec<(String, HostTensor)>> {
        host_state(self.state_dict())
    }

    /// The `config.json` written beside the exported `model.safetensors` (Hugging Face's, for
    /// `from_pretrained`), if the model's layout has one. None by default.
    fn export_config(&self) -> Option<serde_json::Value> {
        None
    }

    /// A weights file (`--init-from`) turned into entries named and shaped as
    /// [`Model::parameters`] (a layout of [`Model::state_dict`] mapped back); the caller then
    /// checks every name and shape. As it is by default.
    fn import_state(&self, loaded: LoadedState) -> Result<LoadedState> {
        Ok(loaded)
    }
}

/// Cloning a boxed [`Recipe`] (the trainer keeps one to plan again when the budget changes);
/// implemented for every `Clone` recipe.
pub trait RecipeClone {
    /// A boxed copy.
    fn clone_recipe(&self) -> Box<dyn Recipe>;
}

impl<T: Recipe + Clone + 'static> RecipeClone for T {
    fn clone_recipe(&self) -> Box<dyn Recipe> {
        Box::new(self.clone())
    }
}

/// How to build a model and its optimizer.
pub trait Recipe: RecipeClone + Send + Sync {
    /// A fresh model and optimizer on `gpu` (the same every time: seeded).
    fn build(&self, gpu: &Gpu) -> Result<(Box<dyn Model>, Box<dyn Optimizer>)>;

    /// Units that checkpointing can recompute (the segment lengths the plan tries divide them).
    fn blocks(&self) -> usize;

    /// Parameter elements.
    fn parameter_count(&self) -> usize;

    /// Checks that the model fits `data` (widths, classes, vocabulary, context).
    fn check(&self, data: &dyn Data) -> Result<()>;

    /// One line naming the model and its optimizer, for the log and the run record
    /// (`MLP 64-128-10, Relu, seed 0; Adam(..)`).
    fn describe(&self) -> String;

    /// A variant of this recipe that needs less memory for a slower step (a GPT's fused
    /// attention), with a line saying what it changes and why the plan chose it: the memory
    /// plan takes it when this recipe does not fit the largest micro-batch without
    /// checkpointing and the variant does better. `None` by default.
    fn memory_efficient_variant(&self) -> Option<(String, Box<dyn Recipe>)> {
        None
    }

    /// Whether a step computes the same whatever the micro-batches it is split into (up to
    /// rounding): false for a model with BatchNorm, whose statistics are each micro-batch's.
    /// The plan says so when it splits such a model's batch, and `--micro-batch-invariant`
    /// refuses the split. True by default.
    fn micro_batch_invariant(&self) -> bool {
        true
    }

    /// Rows per chunk of a chunked loss at `micro_batch` samples of `input_width` (a GPT's
    /// context), on bindings of `max_binding_bytes`; `None` when the loss is not chunked.
    fn loss_chunk_rows(
        &self,
        micro_batch: usize,
        input_width: usize,
        max_binding_bytes: u64,
    ) -> Option<usize> {
        let _ = (micro_batch, input_width, max_binding_bytes);
        None
    }
}

/// `entries` read back to the host, the parts of a tensor kept in parts (`X.part0`, `X.part1`,
/// ... of whole rows: [`plimsoll_nn::Embedding::in_parts`], [`plimsoll_nn::Linear::in_parts`])
/// joined into one `X` in order: the whole tensor, as PyTorch's models hold it.
pub fn host_state(entries: Vec<(String, Tensor)>) -> Result<Vec<(String, HostTensor)>> {
    let mut out: Vec<(String, HostTensor)> = Vec::with_capacity(entries.len());
    for (name, t) in entries {
        let shape = t.shape().to_vec();
        let data = t.to_vec()?;
        match name.rsplit_once(".part") {
            Some((base, index)) if index.parse::<usize>().is_ok() => {
                let joined = out.last_mut().filter(|(n, h)| {
                    n == base && !h.shape.is_empty() && h.shape.get(1..) == shape.get(1..)
                });
                match (joined, index == "0") {
                    (Some((_, whole)), false) => {
                        whole.shape[0] += shape[0];
                        whole.data.extend_from_slice(&data);
                    }
                    _ => out.push((base.to_string(), HostTensor::new(shape, data))),
                }
            }
            _ => out.push((name, HostTensor::new(shape, data))),
        }
    }
    Ok(out)
}

/// `loaded` regrouped to the names and shapes `wanted`, for a table another device kept in
/// other parts, or whole (`X`, or `X.part0`, `X.part1`, ... of whole rows: parts are what a
/// device whose bindings cannot hold the table keeps, [`plimsoll_nn::Embedding::in_parts`]).
/// When an entry of `wanted` is missing, every complete run of parts in `loaded` is joined into
/// its whole table, and each whole table is cut into the parts `wanted` names, by rows.
/// Everything else is left as it was; what still does not fit is for the caller's name and
/// shape checks to report.
pub fn regroup_tables(mut loaded: LoadedState, wanted: &[(String, Vec<usize>)]) -> LoadedState {
    if wanted.iter().all(|(n, _)| loaded.tensors.contains_key(n)) {
        return loaded;
    }
    // Join: X.part0, X.part1, ... (consecutive from 0, one width) into X.
    let mut groups: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    for name in loaded.tensors.keys() {
        if let Some((base, index)) = name.rsplit_once(".part")
            && let Ok(i) = index.parse::<usize>()
        {
            groups.entry(base.to_string()).or_default().push(i);
        }
    }
    for (base, mut indices) in groups {
        indices.sort_unstable();
        let names: Vec<String> = indices.iter().map(|i| format!("{base}.part{i}")).collect();
        let pieces: Vec<&HostTensor> = names.iter().filter_map(|n| loaded.tensors.get(n)).collect();
        let trailing: Option<&[usize]> = pieces.first().and_then(|t| t.shape.get(1..));
        let whole_rows = indices.iter().enumerate().all(|(k, &i)| k == i)
            && pieces.len() == indices.len()
            && pieces
                .iter()
                .all(|t| !t.shape.is_empty() && t.shape.get(1..) == trailing);
        if !whole_rows || loaded.tensors.contains_key(&base) {
            continue;
        }
        let mut shape = vec![pieces.iter().map(|t| t.shape[0]).sum::<usize>()];
        shape.extend_from_slice(trailing.unwrap_or(&[]));
        let joined = HostTensor::new(
            shape,
            pieces.iter().flat_map(|t| t.data.iter().copied()).collect(),
        );
        for n in &names {
            loaded.tensors.remove(n);
        }
        loaded.tensors.insert(base, joined);
    }
    // Cut: X into the parts `wanted` names.
    let mut parts: std::collections::BTreeMap<&str, Vec<(&str, &[usize])>> = Default::default();
    for (name, shape) in wanted {
        if let Some((base, index)) = name.rsplit_once(".part")
            && index.parse::<usize>().is_ok()
            && !loaded.tensors.contains_key(name)
        {
            parts.entry(base).or_default().push((name.as_str(), shape));
        }
    }
    for (base, pieces) in parts {
        let Some(whole) = loaded.tensors.get(base) else {
            continue;
        };
        let rows: usize = pieces
            .iter()
            .map(|(_, s)| s.first().copied().unwrap_or(0))
            .sum();
        let trailing: &[usize] = pieces.first().and_then(|(_, s)| s.get(1..)).unwrap_or(&[]);
        let fits = whole.shape.first() == Some(&rows)
            && whole.shape.get(1..) == Some(trailing)
            && pieces.iter().all(|(_, s)| s.get(1..) == Some(trailing));
        if !fits {
            continue;
        }
        let width: usize = trailing.iter().product();
        let mut first = 0;
        let mut cut = Vec::with_capacity(pieces.len());
        for (name, shape) in &pieces {
            let n = shape.first().copied().unwrap_or(0) * width;
            let data = whole.data[first..first + n].to_vec();
            first += n;
            cut.push((name.to_string(), HostTensor::new(shape.to_vec(), data)));
        }
        loaded.tensors.remove(base);
        loaded.tensors.extend(cut);
    }
    loaded
}
