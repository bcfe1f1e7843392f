//! Training checkpoints: one safetensors file holding every parameter (`param.<name>`) and every
//! optimizer-state tensor (`optim.<name>`), with the position of the run in its metadata (step,
//! epoch, samples consumed within the epoch, autograd random state, data seed, optimizer step count).
//! Written atomically by `plimsoll_nn::state::write_atomic` (a temporary file, then a rename),
//! so a crash mid-save leaves the previous checkpoint intact, after [`write_checked`] has found
//! room for the whole file on its file system: a full disk refuses the save before its first
//! byte, and a write that fails anyway removes its temporary file. Either is
//! [`Error::CheckpointNotWritten`], naming the checkpoints still on disk.
//!
//! Resuming restores the parameters and optimizer state bit for bit, and the data order is a
//! pure function of `(seed, epoch)`, so a resumed run computes exactly what the uninterrupted
//! run would have.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plimsoll_autograd::{Gpu, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::Category;
use plimsoll_nn::Optimizer;
use plimsoll_nn::state::{self, HostTensor, LoadedState};

use crate::error::{Error, Result};
use crate::scaler::LossScaler;

/// File name of the latest checkpoint inside the checkpoint directory.
pub const LATEST: &str = "latest.safetensors";

/// File name of the checkpoint with the lowest evaluation loss so far.
pub const BEST: &str = "best.safetensors";

/// The prefix of a checkpoint's parameter entries (`param.<name>`).
pub const PARAM_PREFIX: &str = "param.";
const OPTIM_PREFIX: &str = "optim.";

/// Where a run stands: everything besides tensors that resuming needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunPosition {
    /// Steps completed.
    pub step: u64,
    /// The epoch the next step belongs to (0-based).
    pub epoch: u64,
    /// Samples of that epoch already consumed (in the epoch's order). Counted in samples, not
    /// batches, so a run resumed with another effective batch goes on where it stopped.
    pub sample_in_epoch: usize,
    /// Autograd's random state (dropout masks) before the next step.
    pub rng_state: u64,
    /// The data-order seed (checked on resume).
    pub seed: u64,
    /// The micro-batch in use (after any out-of-memory recovery).
    pub micro_batch: usize,
    /// The lowest evaluation loss so far (the one in `best.safetensors`), if any.
    pub best_eval_loss: Option<f32>,
    /// The loss scaler of an f16 run (`None` in f32).
    pub loss_scaler: Option<LossScaler>,
}

/// The path of the latest checkpoint in `dir`.
pub fn latest_path(dir: &Path) -> PathBuf {
    dir.join(LATEST)
}

/// The path of the best checkpoint in `dir`.
pub fn best_path(dir: &Path) -> PathBuf {
    dir.join(BEST)
}

/// Saves parameters, optimizer state and `position` to `dir/<file>` ([`LATEST`] or [`BEST`]),
/// atomically.
pub fn save(
    dir: &Path,
    file: &str,
    params: &[(String, Tensor)],
    optimizer: &dyn Optimizer,
    position: &RunPosition,
) -> Result<PathBuf> {
    let state = host_state(params, optimizer, position)?;
    save_host(dir, file, &state, position.step)
}

/// What a checkpoint holds, read back into host memory: every parameter (`param.<name>`; the
/// model's buffers, which require no gradient, among them: [`crate::task::Model::buffers`]),
/// every optimizer-state tensor (`optim.<name>`) and `position` as metadata. [`save_host`]
/// writes it; [`restore`] puts it back.
pub fn host_state(
    params: &[(String, Tensor)],
    optimizer: &dyn Optimizer,
    position: &RunPosition,
) -> Result<LoadedState> {
    if optimizer.row_shard().is_some() {
        return Err(Error::invalid(
            "checkpoint",
            "a sharded optimizer holds one rank's rows: gather every rank's first \
             (host_state_with)",
        ));
    }
    let host = optimizer.host_state().unwrap_or_default();
    host_state_with(params, optimizer, host, position)
}

/// [`host_state`] with the optimizer's state given in host memory (`host`: an offloaded
/// optimizer's, or a sharded run's gathered from every rank), besides what
/// [`Optimizer::state`] holds on the device (nothing, for a sharded optimizer: its rows are in
/// `host`).
pub fn host_state_with(
    params: &[(String, Tensor)],
    optimizer: &dyn Optimizer,
    host: Vec<(String, HostTensor)>,
    position: &RunPosition,
) -> Result<LoadedState> {
    let mut tensors: Vec<(String, Tensor)> = params
        .iter()
        .map(|(n, t)| (format!("{PARAM_PREFIX}{n}"), t.clone()))
        .collect();
    if optimizer.row_shard().is_none() {
        tensors.extend(
            optimizer
                .state()
                .into_iter()
                .map(|(n, t)| (format!("{OPTIM_PREFIX}{n}"), t)),
        );
    }
    let mut state = LoadedState {
        tensors: BTreeMap::new(),
        metadata: metadata(optimizer, position),
    };
    let mut entries = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        entries.push((name, HostTensor::new(t.shape().to_vec(), t.to_vec()?)));
    }
    entries.extend(
        host.into_iter()
            .map(|(n, t)| (format!("{OPTIM_PREFIX}{n}"), t)),
    );
    for (name, host) in entries {
        if state.tensors.insert(name.clone(), host).is_some() {
            return Err(Error::invalid(
                "checkpoint",
                format!("the name {name:?} appears twice; names must be unique"),
            ));
        }
    }
    Ok(state)
}

/// [`host_state`] written into `into`, a state taken before from the same trainer, reusing its
/// memory: every tensor is read into the values `into` holds under its name, so a host copy
/// refreshed again and again allocates nothing the size of the model. `Ok(false)` when `into`
/// does not hold the same tensors (names and sizes); its values are then partly overwritten
/// and it should be dropped, as after an error.
pub fn refresh_host_state(
    into: &mut LoadedState,
    params: &[(String, Tensor)],
    optimizer: &dyn Optimizer,
    position: &RunPosition,
) -> Result<bool> {
    if optimizer.row_shard().is_some() {
        return Ok(false);
    }
    let device: Vec<(String, Tensor)> = params
        .iter()
        .map(|(n, t)| (format!("{PARAM_PREFIX}{n}"), t.clone()))
        .chain(
            optimizer
                .state()
                .into_iter()
                .map(|(n, t)| (format!("{OPTIM_PREFIX}{n}"), t)),
        )
        .collect();
    let mut host_names = 0;
    let mut same = true;
    optimizer.visit_host_state(&mut |name, values| {
        host_names += 1;
        let held = into.tensors.get(&format!("{OPTIM_PREFIX}{name}"));
        same &= held.is_some_and(|h| h.data.len() == values.len());
    });
    same &= device.len() + host_names == into.tensors.len()
        && device.iter().all(|(name, t)| {
            into.tensors
                .get(name)
                .is_some_and(|h| h.data.len() == t.numel())
        });
    if !same {
        return Ok(false);
    }
    for (name, t) in &device {
        if let Some(held) = into.tensors.get_mut(name) {
            t.read_into(&mut held.data)?;
        }
    }
    optimizer.visit_host_state(&mut |name, values| {
        if let Some(held) = into.tensors.get_mut(&format!("{OPTIM_PREFIX}{name}")) {
            held.data.copy_from_slice(values);
        }
    });
    into.metadata = metadata(optimizer, position);
    Ok(true)
}

/// A checkpoint's metadata: the format, `position` and the optimizer's step count.
fn metadata(optimizer: &dyn Optimizer, position: &RunPosition) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::new();
    let mut put = |k: &str, v: String| metadata.insert(k.to_string(), v);
    put("format", FORMAT.to_string());
    put("step", position.step.to_string());
    put("epoch", position.epoch.to_string());
    put("sample_in_epoch", position.sample_in_epoch.to_string());
    put("rng_state", position.rng_state.to_string());
    put("seed", position.seed.to_string());
    put("micro_batch", position.micro_batch.to_string());
    put("optimizer_steps", optimizer.step_count().to_string());
    if let Some(best) = position.best_eval_loss {
        // Display prints the shortest text that parses back to the same f32.
        put("best_eval_loss", best.to_string());
    }
    if let Some(s) = position.loss_scaler {
        put("loss_scale", s.scale.to_string());
        put("loss_scale_good_steps", s.good_steps.to_string());
        put("skipped_steps", s.skipped_steps.to_string());
    }
    metadata
}

/// Writes `state` (from [`host_state`], the state after `step`) to `dir/<file>` atomically.
pub fn save_host(dir: &Path, file: &str, state: &LoadedState, step: u64) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(file);
    let bytes = state::serialize_host(&path, &state.tensors, &state.metadata)?;
    write_checked(&path, &bytes, step)?;
    Ok(path)
}

/// Writes `bytes` (the state after `step`) to `path` atomically, after checking that its file
/// system has room for all of them where the platform says (statvfs): refused early rather
/// than a partial file. Either failure is [`Error::CheckpointNotWritten`], with the checkpoints
/// left on disk; no temporary file remains.
pub fn write_checked(path: &Path, bytes: &[u8], step: u64) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let room = free_space(dir);
    // Whole blocks: the file takes its length rounded up to the file system's block.
    let needed_bytes = match room {
        Some((_, block)) if block > 0 => (bytes.len() as u64).div_ceil(block) * block,
        _ => bytes.len() as u64,
    };
    let available_bytes = room.map(|(free, _)| free);
    let not_written = |cause: String| Error::CheckpointNotWritten {
        path: path.to_path_buf(),
        step,
        cause,
        needed_bytes,
        available_bytes,
        saved: checkpoints_in(dir),
    };
    if available_bytes.is_some_and(|free| free < needed_bytes) {
        return Err(not_written(
            "refused before writing: not enough free space".to_string(),
        ));
    }
    match state::write_atomic(path, bytes) {
        Ok(()) => Ok(()),
        Err(plimsoll_nn::Error::Io {
            action,
            path: file,
            source,
        }) => Err(not_written(format!(
            "{action} {}: {source}; its temporary file was removed",
            file.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Bytes free to this (unprivileged) process on the file system holding `dir`, and its block
/// size; `None` where the platform does not say.
pub fn free_space(dir: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        let s = rustix::fs::statvfs(dir).ok()?;
        Some((s.f_bavail.saturating_mul(s.f_frsize), s.f_frsize))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        None
    }
}

/// The checkpoints in `dir` ([`LATEST`], [`BEST`]) that read back, with the step each holds.
pub fn checkpoints_in(dir: &Path) -> Vec<(PathBuf, u64)> {
    [LATEST, BEST]
        .iter()
        .map(|name| dir.join(name))
        .filter_map(|path| {
            let step = state::metadata(&path).ok()?.get("step")?.parse().ok()?;
            Some((path, step))
        })
        .collect()
}

/// Writes `record` (what the run was told: see `TrainConfig::to_json`) as pretty JSON to
/// `dir/<name>`, atomically (a temporary file, then a rename; removed when either fails).
pub fn save_record(dir: &Path, name: &str, record: &serde_json::Value) -> Result<PathBuf> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let text = serde_json::to_string_pretty(record)
        .map_err(|e| Error::invalid(path.display().to_string(), e.to_string()))?;
    let written = std::fs::write(&tmp, text + "\n")
        .map_err(io(&tmp))
        .and_then(|()| std::fs::rename(&tmp, &path).map_err(io(&path)));
    if let Err(e) = written {
        // A partial record is useless; the one it was to replace is intact.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

fn meta<T: std::str::FromStr>(loaded: &LoadedState, path: &Path, key: &str) -> Result<T> {
    loaded
        .metadata
        .get(key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            Error::invalid(
                path.display().to_string(),
                format!(
                    "checkpoint metadata lacks a valid {key:?}; not a plimsoll-trainer checkpoint?"
                ),
            )
        })
}

/// The `format` metadata this version writes and reads. Version 2: linear weights in PyTorch's
/// `[out, in]` layout (version 1 stored `[in, out]`, which would load a square layer transposed).
/// Version 3: the position in samples within the epoch (`sample_in_epoch`), not batches.
pub const FORMAT: &str = "plimsoll-trainer/3";

/// What [`load`] checks beyond names and shapes.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadChecks {
    /// Refuse a checkpoint saved with another data seed.
    pub expected_seed: Option<u64>,
    /// Accept a checkpoint without the optimizer's state (the optimizer starts afresh, step
    /// count included). Without it, a checkpoint past its first step must hold every kind of
    /// [`Optimizer::state_kinds`] for every parameter.
    pub reset_optimizer: bool,
}

/// Loads `path` into `params` and `optimizer`; returns the saved position. Everything is
/// checked before a single parameter is written, so a refused checkpoint leaves the model as it
/// was: the format, the position, every parameter's name and shape, that every saved value is
/// finite, the seed and the optimizer state as `checks` asks.
pub fn load(
    gpu: &Gpu,
    path: &Path,
    params: &[(String, Tensor)],
    optimizer: &mut dyn Optimizer,
    checks: LoadChecks,
) -> Result<RunPosition> {
    let loaded = state::load(path)?;
    // A token table this device keeps in other parts than the saving device did (or whole):
    // its parameter and optimizer entries regrouped to this device's parts.
    let mut wanted: Vec<(String, Vec<usize>)> = Vec::new();
    for (name, t) in params {
        wanted.push((format!("{PARAM_PREFIX}{name}"), t.shape().to_vec()));
        if !t.requires_grad() {
            continue; // a buffer: no optimizer state
        }
        for kind in optimizer.state_kinds() {
            wanted.push((format!("{OPTIM_PREFIX}{kind}.{name}"), t.shape().to_vec()));
        }
    }
    let loaded = crate::task::regroup_tables(loaded, &wanted);
    restore(gpu, &loaded, path, params, optimizer, checks)
}

/// Uploads optimizer state entries (`<kind>.<parameter>` with shape and values, in the order
/// given: a checkpoint's, by name) as `Category::OptimizerState` and hands them to `optimizer`
/// with the step count `steps`: what a resume allocates before its first step. On a planning
/// device the values are not read (each entry is its allocation alone).
pub(crate) fn upload_optimizer_state<'a>(
    gpu: &Gpu,
    entries: impl IntoIterator<Item = (&'a str, &'a [usize], &'a [f32])>,
    optimizer: &mut dyn Optimizer,
    steps: u64,
) -> Result<()> {
    // An optimizer that keeps its state in host memory takes it there: nothing on the device
    // (and on a planning device, nothing at all). A sharded one takes its rows of the host
    // copies (on a planning device, of none: each row block is its allocation alone).
    if optimizer.loads_from_host() {
        if gpu.is_planning() && optimizer.state_on_host() {
            return Ok(());
        }
        let host: Vec<(String, HostTensor)> = entries
            .into_iter()
            .map(|(n, s, v)| (n.to_string(), HostTensor::new(s.to_vec(), v.to_vec())))
            .collect();
        optimizer.load_host_state(host, steps)?;
        return Ok(());
    }
    let mut state = Vec::new();
    for (name, shape, values) in entries {
        let options = TensorOptions {
            category: Category::OptimizerState,
            label: name,
            requires_grad: false,
        };
        let t = match gpu.is_planning() {
            true => Tensor::unwritten(gpu, shape, options)?,
            false => Tensor::from_slice_with(gpu, values, shape, options)?,
        };
        state.push((name.to_string(), t));
    }
    optimizer.load_state(state, steps)?;
    Ok(())
}

/// The plan's dry run of a resumed run ([`crate::TrainConfig::resumed_at`]):
/// on the planning device `gpu`, the optimizer state a checkpoint of `params` holds after a
/// step (each parameter that trains, each kind of `optimizer`'s state), allocated in the
/// checkpoint's name order as [`restore`] allocates it.
pub(crate) fn planned_resume(
    gpu: &Gpu,
    params: &[(String, Tensor)],
    optimizer: &mut dyn Optimizer,
) -> Result<()> {
    let kinds = optimizer.state_kinds();
    let mut entries: Vec<(String, Vec<usize>)> = params
        .iter()
        .filter(|(_, t)| t.requires_grad())
        .flat_map(|(name, t)| {
            kinds
                .iter()
                .map(move |kind| (format!("{kind}.{name}"), t.shape().to_vec()))
        })
        .collect();
    entries.sort();
    let entries = entries
        .iter()
        .map(|(name, shape)| (name.as_str(), shape.as_slice(), &[][..]));
    upload_optimizer_state(gpu, entries, optimizer, 1)
}

/// [`load`] of a state already in host memory (a checkpoint read, or [`host_state`]'s),
/// `origin` naming it in errors; the same checks, and the same all-or-nothing writes.
pub fn restore(
    gpu: &Gpu,
    loaded: &LoadedState,
    origin: &Path,
    params: &[(String, Tensor)],
    optimizer: &mut dyn Optimizer,
    checks: LoadChecks,
) -> Result<RunPosition> {
    let path = origin;
    let format = loaded.metadata.get("format").map(String::as_str);
    if format != Some(FORMAT) {
        return Err(Error::invalid(
            path.display().to_string(),
            format!(
                "checkpoint format {} is not {FORMAT} (an older Plimsoll wrote it: version 1 \
                 stored linear weights [in, out], version 2 the position in batches); train \
                 again from scratch",
                format.unwrap_or("(none)")
            ),
        ));
    }
    let position = RunPosition {
        step: meta(loaded, path, "step")?,
        epoch: meta(loaded, path, "epoch")?,
        sample_in_epoch: meta(loaded, path, "sample_in_epoch")?,
        rng_state: meta(loaded, path, "rng_state")?,
        seed: meta(loaded, path, "seed")?,
        micro_batch: meta(loaded, path, "micro_batch")?,
        best_eval_loss: match loaded.metadata.get("best_eval_loss") {
            None => None,
            Some(_) => Some(meta(loaded, path, "best_eval_loss")?),
        },
        loss_scaler: match loaded.metadata.get("loss_scale") {
            None => None,
            Some(_) => Some(LossScaler {
                scale: meta(loaded, path, "loss_scale")?,
                good_steps: meta(loaded, path, "loss_scale_good_steps")?,
                skipped_steps: meta(loaded, path, "skipped_steps")?,
            }),
        },
    };
    if let Some(s) = position.loss_scaler
        && !(s.scale.is_finite() && s.scale > 0.0)
    {
        return Err(Error::invalid(
            path.display().to_string(),
            format!("loss scale {} is not a positive finite number", s.scale),
        ));
    }
    let optimizer_steps: u64 = meta(loaded, path, "optimizer_steps")?;
    let bad = |message: String| Error::invalid(path.display().to_string(), message);
    if let Some(seed) = checks.expected_seed
        && position.seed != seed
    {
        return Err(bad(format!(
            "saved with data seed {}, this run has {seed}; pass --seed {} to resume it",
            position.seed, position.seed
        )));
    }
    let mut writes = Vec::with_capacity(params.len());
    for (name, param) in params {
        let saved = loaded
            .tensors
            .get(&format!("{PARAM_PREFIX}{name}"))
            .ok_or_else(|| {
                bad(format!(
                    "no saved value for parameter {name:?}; another model?"
                ))
            })?;
        if saved.shape.as_slice() != param.shape() {
            return Err(bad(format!(
                "parameter {name:?} has shape {:?}, saved {:?}",
                param.shape(),
                saved.shape
            )));
        }
        if let Some(at) = saved.data.iter().position(|v| !v.is_finite()) {
            let count = saved.data.iter().filter(|v| !v.is_finite()).count();
            return Err(bad(format!(
                "parameter {name:?} holds {count} non-finite values (the first, {}, at element \
                 {at}); the run diverged or the file is damaged. Nothing was loaded; resume \
                 from best.safetensors or an earlier run",
                saved.data[at]
            )));
        }
        writes.push((param, &saved.data));
    }
    let kinds = optimizer.state_kinds();
    if !checks.reset_optimizer && optimizer_steps > 0 {
        // Buffers (tensors that do not require a gradient) have no optimizer state.
        for (name, _) in params.iter().filter(|(_, t)| t.requires_grad()) {
            for kind in &kinds {
                let key = format!("{OPTIM_PREFIX}{kind}.{name}");
                if !loaded.tensors.contains_key(&key) {
                    return Err(bad(format!(
                        "no optimizer state {kind:?} for parameter {name:?} after \
                         {optimizer_steps} optimizer steps; resuming would restart the \
                         optimizer's moments. Nothing was loaded; pass --reset-optimizer to \
                         resume with a fresh optimizer anyway"
                    )));
                }
            }
        }
    }
    let mut optimizer_state = Vec::new();
    for (key, saved) in &loaded.tensors {
        if checks.reset_optimizer {
            break;
        }
        if let Some(name) = key.strip_prefix(OPTIM_PREFIX) {
            if saved.data.iter().any(|v| !v.is_finite()) {
                return Err(bad(format!(
                    "optimizer state {name:?} holds non-finite values; the file is damaged. \
                     Nothing was loaded; pass --reset-optimizer to resume with a fresh optimizer"
                )));
            }
            optimizer_state.push((name, saved.shape.as_slice(), saved.data.as_slice()));
        }
    }
    let steps = if checks.reset_optimizer {
        0
    } else {
        optimizer_steps
    };
    upload_optimizer_state(gpu, optimizer_state, optimizer, steps)?;
    for (param, data) in writes {
        param.write_from_slice(data)?;
    }
    Ok(position)
}
