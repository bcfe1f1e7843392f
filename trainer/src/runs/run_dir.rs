//! A run is a directory: [`RunDir`] makes one per run (never reusing another run's), holds an
//! exclusive lock on it while the run writes, and checks it writable before the first step.
//! [`list`] reads a folder of runs for `plimsoll runs`.
//!
//! What a run directory holds (written by the trainer and the `plimsoll` command):
//! `run.json` (the configuration), `metrics.jsonl`, `latest.safetensors` and
//! `best.safetensors` (training state: parameters, optimizer, position), `model.safetensors`
//! (the weights alone, PyTorch's names), `summary.json` (how the run ended), and `lock`.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::checkpoint_io::{BEST, LATEST};
use crate::error::{Error, Result};

/// The configuration record of a run.
pub const RUN_FILE: &str = "run.json";
/// How the run ended (written at its end).
pub const SUMMARY_FILE: &str = "summary.json";
/// The metrics, one JSON line per step and per evaluation.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The lock file.
pub const LOCK_FILE: &str = "lock";

/// A run's directory, locked for this process while the value lives.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    _lock: File,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl RunDir {
    /// A new directory `root/<prefix>` for a run, or `root/<prefix>-2`, `-3`, ... when that
    /// name is taken (two runs started in the same second get two directories).
    pub fn create_unique(root: &Path, prefix: &str) -> Result<RunDir> {
        std::fs::create_dir_all(root).map_err(io(root))?;
        for n in 1..10_000 {
            let name = if n == 1 {
                prefix.to_string()
            } else {
                format!("{prefix}-{n}")
            };
            let path = root.join(name);
            match std::fs::create_dir(&path) {
                Ok(()) => return RunDir::lock(path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io(&path)(e)),
            }
        }
        Err(Error::invalid(
            root.display().to_string(),
            format!("10,000 runs named {prefix}-N already; choose a --run-dir"),
        ))
    }

    /// `path` for a new run: created when absent; an existing directory must not hold a run
    /// already (a run never writes into another run's directory).
    pub fn create_at(path: &Path) -> Result<RunDir> {
        std::fs::create_dir_all(path).map_err(io(path))?;
        let dir = RunDir::lock(path.to_path_buf())?;
        if path.join(RUN_FILE).exists() || path.join(LATEST).exists() {
            return Err(Error::invalid(
                "--run-dir",
                format!(
                    "{} holds a run already; continue it with --resume {}, or give a new \
                     directory",
                    path.display(),
                    path.display()
                ),
            ));
        }
        Ok(dir)
    }

    /// The existing run at `path`, to continue it: it must hold `run.json`.
    pub fn open(path: &Path) -> Result<RunDir> {
        if !path.join(RUN_FILE).is_file() {
            return Err(Error::invalid(
                "--resume",
                format!(
                    "{} is not a run directory (no {RUN_FILE}); `plimsoll runs` lists the runs",
                    path.display()
                ),
            ));
        }
        RunDir::lock(path.to_path_buf())
    }

    /// Takes the directory's lock (failing at once when another process holds it) and checks
    /// that files can be created in it.
    fn lock(path: PathBuf) -> Result<RunDir> {
        let lock_path = path.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(Error::invalid(
                    path.display().to_string(),
                    format!(
                        "another plimsoll process{} is using this run directory; wait for it \
                         to finish, or give this run another --run-dir",
                        if holder.is_empty() {
                            String::new()
                        } else {
                            format!(" (pid {holder})")
                        }
                    ),
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(&lock_path)(e)),
        }
        file.set_len(0).map_err(io(&lock_path))?;
        write!(file, "{}", std::process::id()).map_err(io(&lock_path))?;
        let dir = RunDir { path, _lock: file };
        dir.check_writable()?;
        Ok(dir)
    }

    /// Creates, writes and removes a probe file: a directory the run could not write into is
    /// found before the first step, not after the last.
    pub fn check_writable(&self) -> Result<()> {
        let probe = self
            .path
            .join(format!(".write-probe.{}.tmp", std::process::id()));
        std::fs::write(&probe, b"plimsoll write probe\n").map_err(io(&probe))?;
        std::fs::remove_file(&probe).map_err(io(&probe))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Cuts `metrics.jsonl` in `dir` back to `step`, the step of the checkpoint a resumed run
/// continues from: from the first line of a later step (or evaluation), which the resumed run
/// replays, or a line torn by a crash, the file is cut off; events and earlier steps stay. So
/// the file reads as one run, each step once. Lines are in the order they happened, so what
/// stays is a prefix, and the cut is one truncation in place: it needs no free space (a disk
/// that filled up is the usual reason to resume). Returns the number of lines removed; a run
/// with no metrics file has nothing to cut.
pub fn rewind_metrics(dir: &Path, step: u64) -> Result<usize> {
    let path = dir.join(METRICS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(&path)(e)),
    };
    let mut kept_bytes = 0;
    let mut lines = text.split_inclusive('\n');
    for line in lines.by_ref() {
        let later = match serde_json::from_str::<serde_json::Value>(line.trim_end()) {
            Ok(v) => v
                .get("step")
                .and_then(serde_json::Value::as_u64)
                .is_some_and(|s| s > step),
            // A line cut short by a crash in its write (or with no end of line yet).
            Err(_) => true,
        };
        if later || !line.ends_with('\n') {
            let removed = 1 + lines.count();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(kept_bytes as u64))
                .map_err(io(&path))?;
            return Ok(removed);
        }
        kept_bytes += line.len();
    }
    Ok(0)
}

/// `names` in `dir`, or when any of them is there already (an earlier part of a resumed run
/// wrote it), the same names with `-part<N>` before the extension for the smallest `N` from 2
/// that none of them has: a later part never overwrites an earlier part's files.
pub fn unused_names(dir: &Path, names: &[&str]) -> Vec<PathBuf> {
    let with = |n: u64| -> Vec<PathBuf> {
        names
            .iter()
            .map(|name| match (n, name.split_once('.')) {
                (1, _) => dir.join(name),
                (_, Some((stem, ext))) => dir.join(format!("{stem}-part{n}.{ext}")),
                (_, None) => dir.join(format!("{name}-part{n}")),
            })
            .collect()
    };
    (1..)
        .map(with)
        .find(|paths| paths.iter().all(|p| !p.exists()))
        .unwrap_or_else(|| with(1))
}

/// What `plimsoll runs` shows of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// The run's directory.
    pub path: PathBuf,
    /// The workload (`run.json`'s `workload`).
    pub workload: String,
    /// Steps saved in `latest.safetensors` (`None`: no checkpoint yet).
    pub step: Option<u64>,
    /// The lowest evaluation loss saved (`best.safetensors`).
    pub best_eval_loss: Option<f32>,
    /// `finished`, `interrupted`, `failed`, `running` (its lock is held) or `stopped` (no
    /// summary and no process: killed, or crashed).
    pub status: String,
    /// When the run started (`run.json`'s `started`; `None` when it has none).
    pub started: Option<jiff::Timestamp>,
}

/// The runs directly under `root` (directories holding `run.json`), oldest first by start time
/// (then by name; a run whose start is not recorded counts as the oldest).
pub fn list(root: &Path) -> Result<Vec<RunInfo>> {
    let mut runs = Vec::new();
    let entries = std::fs::read_dir(root).map_err(io(root))?;
    for entry in entries {
        let path = entry.map_err(io(root))?.path();
        let Ok(text) = std::fs::read_to_string(path.join(RUN_FILE)) else {
            continue;
        };
        let record: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let started = record
            .get("started")
            .and_then(|t| t.as_str())
            .and_then(|t| t.parse::<jiff::Timestamp>().ok());
        let workload = record
            .get("workload")
            .and_then(|w| w.as_str())
            .unwrap_or("?")
            .to_string();
        let meta = plimsoll_nn::state::metadata(&path.join(LATEST)).unwrap_or_default();
        // A run that failed before its first latest checkpoint may still have a best one.
        let best = || plimsoll_nn::state::metadata(&path.join(BEST)).unwrap_or_default();
        let status = match std::fs::read_to_string(path.join(SUMMARY_FILE)) {
            Ok(s) => serde_json::from_str::<serde_json::Value>(&s)
                .ok()
                .and_then(|v| v.get("status").and_then(|s| s.as_str()).map(String::from))
                .unwrap_or_else(|| "?".to_string()),
            Err(_) if is_locked(&path) => "running".to_string(),
            Err(_) => "stopped".to_string(),
        };
        runs.push(RunInfo {
            workload,
            step: meta.get("step").and_then(|v| v.parse().ok()),
            best_eval_loss: meta
                .get("best_eval_loss")
                .or(best().get("best_eval_loss"))
                .and_then(|v| v.parse().ok()),
            status,
            started,
            path,
        });
    }
    runs.sort_by(|a, b| (a.started, &a.path).cmp(&(b.started, &b.path)));
    Ok(runs)
}

/// The newest run under `root` (of `workload`, when given) by start time ([`list`]'s order).
/// `None` when there is none, or no `root`.
pub fn newest(root: &Path, workload: Option<&str>) -> Result<Option<PathBuf>> {
    newest_of(root, workload.as_slice())
}

/// The newest run under `root` of any of `workloads` (of any workload when empty).
pub fn newest_of(root: &Path, workloads: &[&str]) -> Result<Option<PathBuf>> {
    if !root.is_dir() {
        return Ok(None);
    }
    Ok(list(root)?
        .into_iter()
        .rev()
        .find(|r| workloads.is_empty() || workloads.contains(&r.workload.as_str()))
        .map(|r| r.path))
}

/// Whether another process holds the lock of the run at `path`.
fn is_locked(path: &Path) -> bool {
    let Ok(file) = File::open(path.join(LOCK_FILE)) else {
        return false;
    };
    matches!(
        file.try_lock_shared(),
        Err(std::fs::TryLockError::WouldBlock)
    )
}
