//! A run's `run.json`: what a new run records, reading it back, and what changed when a run
//! is resumed.

use std::path::Path;

use clap::Parser;
use plimsoll_trainer::run_dir::RUN_FILE;
use plimsoll_trainer::{Error, Result};

use crate::workloads::Job;
use crate::{Cli, Command, GptShape, Workload};

/// Parses `train <name> <tokens>` (a run's recorded arguments) into a workload.
pub fn parse(name: &str, tokens: &[String]) -> Result<Workload> {
    let argv = ["plimsoll", "train", name]
        .into_iter()
        .map(String::from)
        .chain(tokens.iter().cloned());
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Train { workload },
        }) => Ok(workload),
        Ok(_) => Err(Error::invalid(
            "run.json",
            "the run did not record a training",
        )),
        Err(e) => Err(Error::invalid(
            "run.json",
            format!(
                "the run's recorded arguments no longer parse (written by another version?): {e}"
            ),
        )),
    }
}

/// A run's `run.json`.
pub fn read_record(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join(RUN_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text)
        .map_err(|e| Error::invalid(path.display().to_string(), format!("not JSON: {e}")))
}

/// The arguments `record` holds (`args`).
pub fn recorded_args(record: &serde_json::Value, dir: &Path) -> Result<Vec<String>> {
    record
        .get("args")
        .and_then(|a| serde_json::from_value(a.clone()).ok())
        .ok_or_else(|| {
            Error::invalid(
                dir.join(RUN_FILE).display().to_string(),
                "records no arguments (written by an older Plimsoll?); start a new run",
            )
        })
}

/// Whether `job`'s data differs from what the run recorded (`run.json`'s `data.sha256`): what
/// changed, in words, or `None`. `eval` refuses such a run, and so does a resume unless `--data`
/// is given again.
pub fn data_changed(record: &serde_json::Value, job: &Job) -> Option<String> {
    let saved = record.get("data").and_then(|d| d.get("sha256"))?;
    (saved.as_str() != Some(job.data.sha256.as_str())).then(|| {
        format!(
            "the run's data changed since it trained: {} had sha256 {saved}, now {}",
            job.data.source, job.data.sha256
        )
    })
}

/// The settings that differ between the run as recorded (`saved`, its `run.json`; `old`, its
/// arguments parsed again) and as resumed (`new`), as `name: [before, after]`; an error for
/// those that cannot change. Data that changed since the run began is refused unless
/// `explicit_data` (`--data` given with the resume).
pub fn changes(
    saved: &serde_json::Value,
    old: &Job,
    new: &Job,
    explicit_data: bool,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let model = |j: &Job| {
        let d = j.spec.describe();
        d.split(';').next().unwrap_or_default().to_string()
    };
    let invalid = |flag: &str, message: String| Err(Error::invalid(flag, message));
    if old.config.seed != new.config.seed {
        return invalid(
            "--seed",
            format!(
                "{}, but the run was started with seed {}; a resumed run keeps its seed",
                new.config.seed, old.config.seed
            ),
        );
    }
    if model(old) != model(new) {
        return invalid(
            "--resume",
            format!(
                "the run trained {}; these flags ask for {}. A resumed run keeps its model; \
                 start a new run for another",
                model(old),
                model(new)
            ),
        );
    }
    if let Some(changed) = data_changed(saved, new)
        && !explicit_data
    {
        return invalid(
            "--resume",
            format!(
                "{changed}. Restore it, or pass --data explicitly to go on with the new data \
                 (recorded in run.json)"
            ),
        );
    }
    let mut out = serde_json::Map::new();
    let (a, b) = (old.config.to_json(), new.config.to_json());
    if let (Some(a), Some(b)) = (a.as_object(), b.as_object()) {
        for (k, v) in b {
            if k != "checkpoint_dir" && a.get(k) != Some(v) {
                out.insert(k.clone(), serde_json::json!([a.get(k), v]));
            }
        }
    }
    let recorded = saved
        .get("data")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    if recorded != new.data.record() {
        out.insert(
            "data".into(),
            serde_json::json!([recorded, new.data.record()]),
        );
    }
    Ok(out)
}

/// What this run writes to `run.json`: `args` to rebuild it, and `command`, the command line
/// as given (both text: `train` refuses arguments that are not UTF-8).
pub fn record(
    job: &Job,
    args: &[String],
    command: &[String],
    adapter: &str,
    ranks: usize,
) -> serde_json::Value {
    serde_json::json!({
        "plimsoll": env!("CARGO_PKG_VERSION"),
        "workload": job.name,
        "args": args,
        "command": command,
        "started": jiff::Timestamp::now().to_string(),
        "model": job.spec.describe(),
        "parameters": job.spec.parameter_count(),
        "data": job.data.record(),
        "train_data": job.train.describe(),
        "eval_data": job.test.as_ref().map(|t| t.describe()),
        "config": job.config.to_json(),
        "optimizer": job.optimizer_record(),
        "adapter": adapter,
        "ranks": ranks,
        "gpt": job.gpt_shape.map(GptShape::record),
        "lm": job.lm.map(|(arch, vocab)| lm_record(arch, vocab)),
        "tokenizer": job.tokenizer.as_ref().map(|t| serde_json::json!({
            "name": t.name(),
            "vocab_size": t.vocab_size(),
        })),
        "resumes": [],
    })
}

/// A value of `run.json` in words, for a line a user reads: a string as it is, `none` for
/// null, anything else as JSON (`64`, `0.5`).
pub fn plain(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "none".to_string(),
        other => other.to_string(),
    }
}

/// A language model's family and vocabulary as `run.json` records them (`lm`), what `sample`
/// rebuilds the model from: `{"arch": "gpt", "vocab_size": N}`, a Llama with its figures.
pub fn lm_record(arch: plimsoll_trainer::Arch, vocab_size: usize) -> serde_json::Value {
    match arch {
        plimsoll_trainer::Arch::Gpt => serde_json::json!({"arch": "gpt", "vocab_size": vocab_size}),
        plimsoll_trainer::Arch::Llama(l) => serde_json::json!({
            "arch": "llama",
            "vocab_size": vocab_size,
            "kv_heads": l.kv_heads,
            "mlp_width": l.mlp_width,
            "rope_theta": l.rope_theta,
            "tie_embeddings": l.tie_embeddings,
        }),
    }
}

/// The family and vocabulary [`lm_record`] wrote (`None` for a run recorded before it).
pub fn recorded_lm(
    record: &serde_json::Value,
) -> std::result::Result<Option<(plimsoll_trainer::Arch, usize)>, String> {
    let Some(lm) = record.get("lm").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let count = |name: &str| {
        lm.get(name)
            .and_then(serde_json::Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v > 0)
            .ok_or_else(|| format!("lm.{name} is missing or not a positive count"))
    };
    let vocab = count("vocab_size")?;
    let arch = match lm.get("arch").and_then(serde_json::Value::as_str) {
        Some("gpt") => plimsoll_trainer::Arch::Gpt,
        Some("llama") => plimsoll_trainer::Arch::Llama(plimsoll_trainer::LlamaShape {
            kv_heads: count("kv_heads")?,
            mlp_width: count("mlp_width")?,
            rope_theta: lm
                .get("rope_theta")
                .and_then(serde_json::Value::as_f64)
                .filter(|t| *t > 0.0)
                .ok_or("lm.rope_theta is missing or not positive")? as f32,
            tie_embeddings: lm
                .get("tie_embeddings")
                .and_then(serde_json::Value::as_bool)
                .ok_or("lm.tie_embeddings is missing")?,
        }),
        other => return Err(format!("lm.arch is {other:?}, not \"gpt\" or \"llama\"")),
    };
    Ok(Some((arch, vocab)))
}
