//! `plimsoll train`: a run in its own directory (see `plimsoll_trainer::run_dir`), or the
//! continuation of one (`--resume RUN`), with signals, progress and the run's records.
//!
//! A resumed run is rebuilt from the arguments its `run.json` recorded, with the flags given
//! alongside `--resume` applied on top (and recorded as changes). The model and the seed cannot
//! change; data whose checksum changed since the run began is refused unless `--data` is given.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use plimsoll_kernels_wgsl::kernels::{TensorLaunches, optimizer::ADAMW_MULTI};
use plimsoll_trainer::checkpoint_io::{latest_path, save_record};
use plimsoll_trainer::run_dir::{self, METRICS_FILE, RUN_FILE, RunDir, SUMMARY_FILE};
use plimsoll_trainer::{Error, JsonLines, Result, RunLength, RunSummary, Trainer};

use crate::progress::{self, Mode, Progress};
use crate::ranks::Ranks;
use crate::records::{changes, parse, plain, read_record, record, recorded_args};
use crate::workloads::{Job, job};
use crate::{CommonArgs, Workload, out, signals};

/// Every rank's end-of-run memory summary, in the run's directory.
pub const MEMORY_SUMMARY_FILE: &str = "memory_summary.txt";

/// Where runs go unless `--run-dir` says otherwise.
pub const RUNS_ROOT: &str = "runs";

/// Flags about the run's directory rather than the training: not recorded, not replayed.
const RUN_FLAGS: [(&str, bool); 4] = [
    ("--resume", true),
    ("--run-dir", true),
    ("--checkpoint-dir", true),
    ("--reset-optimizer", false),
];

impl Workload {
    /// The workload's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Digits(_) => "digits",
            Workload::MlpBench(_) => "mlp-bench",
            Workload::Shakespeare(_) => "shakespeare",
            Workload::Gpt(_) => "gpt",
            Workload::Resnet18(_) => "resnet18",
            Workload::Resnet34(_) => "resnet34",
            Workload::Resnet50(_) => "resnet50",
            Workload::Resnet101(_) => "resnet101",
            Workload::Resnet152(_) => "resnet152",
        }
    }

    /// The shared options.
    pub fn common(&self) -> &CommonArgs {
        match self {
            Workload::Digits(a) => &a.common,
            Workload::MlpBench(a) => &a.common,
            Workload::Shakespeare(a) | Workload::Gpt(a) => &a.common,
            Workload::Resnet18(a)
            | Workload::Resnet34(a)
            | Workload::Resnet50(a)
            | Workload::Resnet101(a)
            | Workload::Resnet152(a) => &a.common,
        }
    }
}

/// The tokens after `train <workload>` without the run-directory flags, and with a `--data`
/// path made absolute (a resumed run may start elsewhere). An absolute path that is not UTF-8
/// (the working directory's name, say) is refused: `run.json` could not record it unchanged.
fn training_tokens(argv: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut tokens = argv.iter().skip(3).peekable();
    while let Some(t) = tokens.next() {
        let (flag, inline) = match t.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (t.as_str(), None),
        };
        if let Some((_, takes_value)) = RUN_FLAGS.iter().find(|(f, _)| *f == flag) {
            if *takes_value && inline.is_none() {
                // `--resume` may stand alone: its value is the next token unless that is a flag.
                if tokens.peek().is_some_and(|n| !n.starts_with("--")) {
                    tokens.next();
                }
            }
            continue;
        }
        if flag == "--data" {
            let value = inline
                .map(str::to_string)
                .or_else(|| tokens.next().cloned());
            if let Some(v) = value {
                let abs = match std::fs::canonicalize(&v) {
                    Ok(p) => p.into_os_string().into_string().map_err(|p| {
                        Error::invalid(
                            "--data",
                            format!(
                                "{v} is {p:?}, which is not valid UTF-8: run.json records the \
                                 data's absolute path as text (to resume the run) and cannot \
                                 hold it unchanged; move or link the data under a UTF-8 path"
                            ),
                        )
                    })?,
                    Err(_) => v,
                };
                out.push("--data".to_string());
                out.push(abs);
            }
            continue;
        }
        out.push(t.clone());
    }
    Ok(out)
}

/// What [`prepare`] gives: the locked directory, the job, its options, the arguments to record,
/// and for a resumed run the record of this resumption.
type Prepared = (
    Option<RunDir>,
    PathBuf,
    Job,
    CommonArgs,
    Vec<String>,
    Option<serde_json::Value>,
);

/// The run's directory and job: a new run, or the one `--resume` names rebuilt with the
/// explicit flags on top; and for a resumed run the changes to record.
///
/// A `follower` (a rank other than 0 of a data-parallel run) creates and locks nothing: for a
/// new run its path is empty, for a resumed one it is the run rank 0 resumes.
fn prepare(workload: Workload, argv: &[String], follower: bool) -> Result<Prepared> {
    let name = workload.name();
    let common = workload.common().clone();
    let explicit = training_tokens(argv)?;
    let Some(resume) = common.resume.clone() else {
        // The job first: bad flags and bad data leave no run directory behind.
        let (job, common) = job(workload)?;
        job.config.validate_for(job.spec.blocks())?;
        if follower {
            return Ok((None, PathBuf::new(), job, common, explicit, None));
        }
        let run = match &common.run_dir {
            Some(dir) => RunDir::create_at(dir)?,
            None => {
                let stamp = jiff::ZonedDateTime::now()
                    .strftime("%Y%m%d-%H%M%S")
                    .to_string();
                RunDir::create_unique(Path::new(RUNS_ROOT), &format!("{name}-{stamp}"))?
            }
        };
        let path = run.path().to_path_buf();
        return Ok((Some(run), path, job, common, explicit, None));
    };
    if common.run_dir.is_some() {
        return Err(Error::invalid(
            "--run-dir",
            "a resumed run keeps its directory; give --resume RUN alone",
        ));
    }
    let path = match resume {
        None => run_dir::newest(Path::new(RUNS_ROOT), Some(name))?.ok_or_else(|| {
            Error::invalid(
                "--resume",
                format!(
                    "no {name} run under {RUNS_ROOT}/; give the run's directory (`plimsoll \
                     runs` lists them)"
                ),
            )
        })?,
        Some(path) => path,
    };
    if path.to_str().is_none() {
        // The newest run's folder, renamed since: run.json and the metrics name it as text.
        return Err(Error::invalid(
            "--resume",
            format!(
                "the run's folder {path:?} is not valid UTF-8, and a run records its folder as \
                 text; rename it to a UTF-8 name and give it to --resume"
            ),
        ));
    }
    let run = match follower {
        true => None,
        false => Some(RunDir::open(&path)?),
    };
    let saved = read_record(&path)?;
    let saved_workload = saved
        .get("workload")
        .and_then(|w| w.as_str())
        .unwrap_or("?");
    if saved_workload != name {
        return Err(Error::invalid(
            "--resume",
            format!(
                "{} is a {saved_workload} run; resume it with `plimsoll train {saved_workload} \
                 --resume {}`",
                path.display(),
                path.display()
            ),
        ));
    }
    let before = recorded_args(&saved, &path)?;
    let mut merged = before.clone();
    merged.extend(explicit.iter().cloned());
    let explicit_data = explicit.iter().any(|t| t == "--data");
    let (old, _) = job(parse(name, &before)?)?;
    let (mut new, mut new_common) = job(parse(name, &merged)?)?;
    let changed = changes(&saved, &old, &new, explicit_data)?;
    new.config.validate_for(new.spec.blocks())?;
    if !latest_path(&path).exists() {
        // Said before "resuming": nothing of the run is touched.
        return Err(Error::invalid(
            "--resume",
            format!(
                "{} holds no checkpoint yet (the run stopped before its first save); start a new \
                 run",
                path.display()
            ),
        ));
    }
    already_done(&path, &new)?;
    new_common.resume = Some(Some(path.clone()));
    new_common.reset_optimizer = common.reset_optimizer;
    new.config.checkpoint_dir = None;
    let resume_record = serde_json::json!({
        "command": argv,
        "at": jiff::Timestamp::now().to_string(),
        "changes": changed,
        "reset_optimizer": common.reset_optimizer,
    });
    Ok((run, path, new, new_common, merged, Some(resume_record)))
}

/// Refuses to resume a run whose checkpoint is already at (or past) the length asked for: it
/// would train nothing and say only "N steps".
fn already_done(path: &Path, job: &Job) -> Result<()> {
    let Ok(meta) = plimsoll_nn::state::metadata(&latest_path(path)) else {
        return Ok(());
    };
    let at = |key: &str| meta.get(key).and_then(|v| v.parse::<u64>().ok());
    let (flag, message) = match job.config.length {
        RunLength::Steps(s) => match at("step") {
            Some(step) if step >= s => (
                "--steps",
                format!(
                    "{s}: the run in {} is already at step {step}",
                    path.display()
                ),
            ),
            _ => return Ok(()),
        },
        RunLength::Epochs(e) => match at("epoch") {
            Some(epoch) if epoch >= e => (
                "--epochs",
                format!(
                    "{e}: the run in {} has already finished {epoch} epochs",
                    path.display()
                ),
            ),
            _ => return Ok(()),
        },
    };
    Err(Error::invalid(
        flag,
        format!("{message}, so there is nothing to train; give a larger {flag} to go on"),
    ))
}

/// `argv` as text. `run.json` records a run's arguments as JSON strings, for `--resume` to
/// replay, and its command line; an argument that is not UTF-8 cannot be recorded without being
/// changed, so it is refused here, before anything is written, naming its flag.
fn utf8_arguments(argv: &[OsString]) -> Result<Vec<String>> {
    let mut text = Vec::with_capacity(argv.len());
    for (i, arg) in argv.iter().enumerate() {
        let Some(s) = arg.to_str() else {
            let lossy = arg.to_string_lossy();
            let before = i.checked_sub(1).and_then(|j| argv.get(j)?.to_str());
            let flag = match lossy.split_once('=') {
                Some((flag, _)) if flag.starts_with("--") => flag.to_string(),
                _ => before
                    .filter(|b| b.starts_with("--"))
                    .unwrap_or("argument")
                    .to_string(),
            };
            return Err(Error::invalid(
                flag,
                format!(
                    "{arg:?} is not valid UTF-8: run.json records a run's arguments as text \
                     (to resume it) and cannot hold it unchanged; rename the file or folder \
                     to a UTF-8 name, or give a link with one"
                ),
            ));
        };
        text.push(s.to_string());
    }
    Ok(text)
}

/// Trains; the exit code is 0, or 130 / 143 after SIGINT / SIGTERM (the run saved). Under
/// `mpirun` (the `mpi` feature), every rank trains the model on its shard of each batch and
/// rank 0 keeps the run's directory. An argument that is not UTF-8 is refused before anything
/// starts (see [`utf8_arguments`]).
pub fn train(workload: Workload, argv: &[OsString], started: Instant) -> Result<ExitCode> {
    let argv = &utf8_arguments(argv)?;
    // A weights file that cannot be read stops the run before it has a directory.
    if let Some(path) = &workload.common().init_from
        && let Err(e) = std::fs::File::open(path).and_then(|f| f.metadata())
    {
        return Err(Error::invalid(
            "--init-from",
            format!(
                "{}: {e}; give a model.safetensors or a checkpoint",
                path.display()
            ),
        ));
    }
    let ranks = Ranks::start()?;
    let outcome = match ranks.rank() {
        0 => lead(workload, argv, started, &ranks),
        _ => follow(workload, argv, started, &ranks),
    };
    if let Err(e) = &outcome {
        out::error(e);
        ranks.end_after_error();
    }
    outcome
}

/// How long building and first-dispatching the run's kernels may take before the run gives up
/// (seconds on lavapipe; a driver that needs minutes is broken).
const COMPILE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// A rank other than 0: trains its shard, writes nothing (rank 0 has the run's directory).
fn follow(
    workload: Workload,
    argv: &[String],
    started: Instant,
    ranks: &Ranks,
) -> Result<ExitCode> {
    let (_, dir, mut job, common, _, _) = prepare(workload, argv, true)?;
    job.config.checkpoint_dir = None;
    let gpu = common.device.open()?;
    let name = job.name;
    let trainer = start_trainer(job, &gpu, &common, &dir, ranks)?;
    let (_, _, code, _, _) = run_training(
        trainer,
        name,
        &gpu,
        &common,
        &dir,
        Vec::new(),
        started,
        ranks,
    )?;
    Ok(code)
}

/// Rank 0 (or the only process): the run's directory, its records and the output.
fn lead(workload: Workload, argv: &[String], started: Instant, ranks: &Ranks) -> Result<ExitCode> {
    let (run, dir, job, common, args, resumed) = prepare(workload, argv, false)?;
    let arguments = Arguments {
        recorded: &args,
        command: argv,
    };
    let mut recorded = false;
    let outcome = train_in(
        &dir,
        job,
        &common,
        &arguments,
        resumed.as_ref(),
        started,
        ranks,
        &mut recorded,
    );
    if let Err(e) = &outcome
        && recorded
    {
        // The run's record of how it ended; the error itself is what the user sees. (A
        // refused resume recorded nothing, and writes nothing now either.)
        let failed = serde_json::json!({ "status": "failed", "error": e.to_string() });
        if let Err(not_saved) = save_record(&dir, SUMMARY_FILE, &failed) {
            out::warn(format_args!(
                "warning: the run's {SUMMARY_FILE} was not updated to `failed`: {not_saved}"
            ));
        }
    }
    drop(run);
    if outcome.is_err() && resumed.is_none() && !recorded {
        // A new run refused before its run.json (no device, a model or plan that does not fit)
        // leaves no directory behind: the lock is removed, then the folder if that left it
        // empty. From its run.json on, a directory is a run and keeps its records.
        let _ = std::fs::remove_file(dir.join(run_dir::LOCK_FILE));
        let _ = std::fs::remove_dir(&dir);
        let _ = std::fs::remove_dir(RUNS_ROOT);
    }
    outcome
}

/// The argument lists a run records in its `run.json`.
struct Arguments<'a> {
    /// The tokens after `train <workload>` that rebuild the run (`args`, replayed by
    /// `--resume`).
    recorded: &'a [String],
    /// The whole command line as given (`command`).
    command: &'a [String],
}

/// [`train`] inside the run's directory `dir` (locked by the caller). `recorded` becomes true
/// once run.json is written: after the memory plan (and for a resumed run its checkpoint)
/// is accepted, before anything else is written.
#[allow(clippy::too_many_arguments)]
fn train_in(
    dir: &Path,
    mut job: Job,
    common: &CommonArgs,
    arguments: &Arguments<'_>,
    resumed: Option<&serde_json::Value>,
    started: Instant,
    ranks: &Ranks,
    recorded: &mut bool,
) -> Result<ExitCode> {
    let dir = dir.to_path_buf();
    let common = common.clone();
    job.config.checkpoint_dir = Some(dir.clone());
    let gpu = common.device.open()?;
    let mut saved = match resumed {
        Some(_) => read_record(&dir)?,
        None => record(
            &job,
            arguments.recorded,
            arguments.command,
            &gpu.adapter().to_string(),
            ranks.ranks(),
        ),
    };
    // The arithmetic of the 16-bit matmuls (tensor cores or not), for this part of the run.
    let matmul = match job.config.precision {
        plimsoll_trainer::Precision::F16 => gpu.matmul_path().describe(),
        plimsoll_trainer::Precision::F32 => "SIMT f32",
    };
    // How AdamW's update and the gradient norm go out (--tensor-launches).
    let launches = TensorLaunches::chosen(&gpu, &ADAMW_MULTI).describe();
    if let Some(record) = saved.as_object_mut() {
        record.insert("matmul".to_string(), serde_json::json!(matmul));
        record.insert("tensor_launches".to_string(), serde_json::json!(launches));
    }
    if let Some(r) = resumed {
        let step = plimsoll_nn::state::metadata(&latest_path(&dir))
            .ok()
            .and_then(|m| m.get("step").cloned())
            .unwrap_or_else(|| "?".into());
        out::say(format_args!("resuming {} at step {step}", dir.display()));
        if let Some(c) = r.get("changes").and_then(|c| c.as_object())
            && !c.is_empty()
        {
            let list: Vec<String> = c
                .iter()
                .map(|(k, v)| format!("{k} {} -> {}", plain(&v[0]), plain(&v[1])))
                .collect();
            out::say(format_args!(
                "changed (recorded in run.json): {}",
                list.join(", ")
            ));
        }
        let mut r = r.clone();
        let before = saved.get("ranks").and_then(|r| r.as_u64()).unwrap_or(1);
        if before != ranks.ranks() as u64 {
            r["changes"]["ranks"] = serde_json::json!([before, ranks.ranks()]);
            out::say(format_args!(
                "the run was trained on {before} rank(s); it goes on with {}: each rank's shard \
                 of a batch changes, the update does not (recorded in run.json)",
                ranks.ranks()
            ));
            saved["ranks"] = serde_json::json!(ranks.ranks());
        }
        saved["args"] = serde_json::json!(arguments.recorded);
        // The data it goes on with (the same, or what --data gave): what eval checks next.
        saved["data"] = job.data.record();
        if let Some(list) = saved.get_mut("resumes").and_then(|l| l.as_array_mut()) {
            list.push(r);
        } else {
            saved["resumes"] = serde_json::json!([r]);
        }
    }
    for note in &job.notes {
        out::say(note);
    }
    // What the driver says is left to this process, where it says (VK_EXT_memory_budget).
    let device_memory = gpu.device_memory().map_or(String::new(), |m| {
        format!(
            " (its driver lets this process use {}; {} in use)",
            plimsoll_allocator::format_bytes(m.budget_bytes),
            plimsoll_allocator::format_bytes(m.usage_bytes)
        )
    });
    out::say(format_args!(
        "training {} ({} parameters) on {}{device_memory}{}; matmuls: {matmul}; updates: \
         {launches}; run directory {}",
        job.name,
        job.spec.parameter_count(),
        gpu.adapter(),
        match ranks.ranks() {
            1 => String::new(),
            n => format!(
                " and {} more rank(s), each on its shard of every batch",
                n - 1
            ),
        },
        dir.display()
    ));
    let name = job.name;
    let trainer = start_trainer(job, &gpu, &common, &dir, ranks)?;
    let step = trainer.position().step;
    // Everything is checked (the memory plan made, a resumed run's checkpoint loaded): the run's
    // record comes first, before the kernels' compile and any step. A configuration the plan
    // refused left no run behind, and a refused resume wrote nothing.
    save_record(&dir, RUN_FILE, &saved)?;
    *recorded = true;
    if resumed.is_some() {
        // The steps after the checkpoint, which this part replays, leave metrics.jsonl (each
        // step is there once), and the last part's summary goes until this part writes its own.
        let replayed = run_dir::rewind_metrics(&dir, step)?;
        if replayed > 0 {
            out::say(format_args!(
                "{replayed} line(s) after step {step} left {METRICS_FILE}: the steps since the \
                 checkpoint run again"
            ));
        }
        match std::fs::remove_file(dir.join(SUMMARY_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::Io {
                    path: dir.join(SUMMARY_FILE),
                    source: e,
                });
            }
            _ => {}
        }
    }
    let mut metrics = vec![JsonLines::create(
        &dir.join(METRICS_FILE),
        resumed.is_some(),
    )?];
    if let Some(p) = &common.metrics_out {
        metrics.push(JsonLines::create(p, resumed.is_some())?);
    }
    for m in &mut metrics {
        // A first line now: a file that cannot be written fails before step 1, not after.
        let event = if resumed.is_some() { "resume" } else { "start" };
        m.write(&serde_json::json!({"event": event, "run": dir, "at_step": step}))?;
    }
    let outcome = run_training(trainer, name, &gpu, &common, &dir, metrics, started, ranks);
    let (s, seconds, code, host, memory) = match outcome {
        Ok(done) => done,
        Err(e) => {
            // Shown now: dropping the device below may wait (within its drop deadline) for
            // stalled GPU work to finish, so the process never exits with work still running.
            out::error(&e);
            return Err(e);
        }
    };
    let summary = serde_json::json!({
        "status": if s.interrupted { "interrupted" } else { "finished" },
        "steps": s.steps,
        "training_loss": s.last_loss.map(f32_json),
        "last_evaluation": s.last_evaluation.map(|e| serde_json::json!({
            "loss": f32_json(e.loss),
            "accuracy": e.accuracy.map(f32_json),
        })),
        "best_eval_loss": s.best_eval_loss.map(f32_json),
        "device_losses": s.device_losses,
        "seconds": seconds,
    });
    save_record(&dir, SUMMARY_FILE, &summary)?;
    out::say(memory);
    out::say(host);
    Ok(code)
}

/// An f32 as the JSON number of its shortest decimal (`0.1`, where `json!` would write the
/// f64 it widens to, `0.10000000149011612`).
fn f32_json(v: f32) -> serde_json::Value {
    v.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// The run's trainer (its memory plan made) and, for a resumed run, its checkpoint loaded:
/// everything checked before a resumed run writes a byte.
fn start_trainer(
    job: Job,
    gpu: &plimsoll_trainer::Gpu,
    common: &CommonArgs,
    dir: &Path,
    ranks: &Ranks,
) -> Result<Trainer> {
    // A run with its micro-batch and checkpointing given makes no plan: it is rehearsed on a
    // planning twin instead, so the compile before step 1 builds the kernels it uses (not all
    // of them), and a choice that will run out of memory is said now.
    let rehearsal = plimsoll_trainer::plan::rehearse(
        gpu,
        (job.spec.as_ref(), job.train.as_ref(), job.test.as_deref()),
        &job.config,
        ranks.ranks(),
    )?;
    if let Some(p) = rehearsal.filter(|p| !p.fits()) {
        out::say(format_args!(
            "warning: a dry run of micro-batch {} with checkpointing {} runs out of memory \
             under the budget of {}; the run will halve the micro-batch when it does (leave \
             --micro-batch and --checkpointing out to let the plan choose)",
            p.micro_batch,
            plimsoll_trainer::plan::segment_name(p.segment_len),
            plimsoll_allocator::format_bytes(gpu.memory_budget_bytes()),
        ));
    }
    let mut trainer = Trainer::new_distributed(
        gpu,
        job.config,
        job.spec.as_ref(),
        job.train,
        job.test,
        ranks.collective(),
    )?;
    if common.resume.is_some() {
        let path = latest_path(dir);
        trainer.resume_with(&path, common.reset_optimizer)?;
    } else if let Some(path) = &common.init_from {
        trainer.init_from(path)?;
    }
    Ok(trainer)
}

/// The training itself, after the run's records are in place.
#[allow(clippy::too_many_arguments)]
fn run_training(
    mut trainer: Trainer,
    workload: &str,
    gpu: &plimsoll_trainer::Gpu,
    common: &CommonArgs,
    dir: &Path,
    metrics: Vec<JsonLines>,
    started: Instant,
    ranks: &Ranks,
) -> Result<(RunSummary, f64, ExitCode, String, String)> {
    // Before the kernels' compile (seconds on lavapipe): Ctrl-C or SIGTERM during it stops the
    // run as during a step (a second one exits at once), not by the default kill.
    let signal = signals::watch(trainer.stop_flag())?;
    // The pipelines the plan's dry run dispatched, built and run once now: outside any
    // step's deadline (lavapipe compiles a shader at a dispatch, docs/wgpu.md §5.1).
    let compile = Instant::now();
    let compiled = gpu.compile_wanted(COMPILE_DEADLINE)?;
    out::say(format_args!(
        "compiled the run's {} GPU kernels on {} threads in {:.1} s (once per run, before step 1)",
        compiled.built,
        compiled.threads,
        compile.elapsed().as_secs_f64()
    ));
    let mode = Mode::detect(common.log_every, trainer.total_steps());
    let mut progress = Progress::new(
        mode,
        trainer.total_steps(),
        trainer.position().step,
        metrics,
        started,
    );
    let run_start = Instant::now();
    let summary = trainer.run(&mut progress);
    progress.finish();
    let summary = summary?;
    let seconds = run_start.elapsed().as_secs_f64();
    // Every rank's memory summary, into rank 0's run directory. The trainer's device: after a
    // device loss it is not the one the run started on.
    let memory = trainer.gpu().memory_summary().to_string();
    let summaries = trainer.gather(memory.clone().into_bytes())?;
    if !summaries.is_empty() && ranks.rank() == 0 {
        let text: String = summaries
            .iter()
            .enumerate()
            .map(|(r, s)| format!("rank {r}:\n{}\n", String::from_utf8_lossy(s)))
            .collect();
        let path = dir.join(MEMORY_SUMMARY_FILE);
        std::fs::write(&path, text).map_err(|source| Error::Io { path, source })?;
    }
    let mut code = ExitCode::SUCCESS;
    if summary.interrupted {
        let name = signal.name();
        // Rank 0 saved; the other ranks stopped after the same step and have nothing to add.
        if ranks.rank() == 0 {
            let launcher = match ranks.ranks() {
                1 => String::new(),
                n => format!("mpirun --enable-recovery -np {n} "),
            };
            out::warn(format_args!(
                "{name} at step {}; saved {}; continue with: {launcher}plimsoll train {} \
                 --resume {}",
                summary.steps,
                latest_path(dir).display(),
                workload,
                dir.display()
            ));
        }
        code = signal.exit_code();
    }
    // Only a run that finished a step here says when (a resumed run's progress counts from
    // its own first step; a run stopped before step 1 has none).
    let first_step = progress
        .first_step_done
        .map(|t| format!("; first step done {:.2} s after start", t.as_secs_f64()))
        .unwrap_or_default();
    out::say(format_args!(
        "{} steps in {seconds:.1} s{}{}{first_step}",
        summary.steps,
        summary
            .last_loss
            .map(|l| format!(", training loss {l:.4} (mean of the last steps)"))
            .unwrap_or_default(),
        summary
            .last_evaluation
            .map(|e| format!(", {}", progress::describe(&e)))
            .unwrap_or_default(),
    ));
    if let Some(e) = progress.metrics_error.take() {
        return Err(e);
    }
    let loader = trainer.loader();
    let mut host = format!(
        "host memory: the data loader's batches took at most {} ({} built ahead; --prefetch)",
        plimsoll_allocator::format_bytes(loader.host_bytes()),
        loader.depth()
    );
    if let Some(p) = trainer.plan().filter(|p| p.offload_host_bytes > 0) {
        host.push_str(&format!(
            "; the optimizer's state {} (--offload {})",
            plimsoll_allocator::format_bytes(p.offload_host_bytes),
            p.offload
        ));
        if p.offload_activation_bytes > 0 {
            host.push_str(&format!(
                "; checkpointed segments' inputs {} at most (planned)",
                plimsoll_allocator::format_bytes(p.offload_activation_bytes)
            ));
        }
        if p.offload_streamed_parameters > 0 {
            host.push_str(&format!(
                "; streamed parameters and their gradients {}",
                plimsoll_allocator::format_bytes(p.offload_streamed_parameters * 8)
            ));
        }
    }
    Ok((summary, seconds, code, host, memory))
}
