//! `plimsoll eval RUN` and `plimsoll runs`: what a run reached, read back from its directory.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use plimsoll_trainer::checkpoint_io::{BEST, LATEST};
use plimsoll_trainer::run_dir;
use plimsoll_trainer::{Error, Result, Trainer};

use crate::out;
use crate::records::{read_record, recorded_args};
use crate::train::RUNS_ROOT;

/// Which checkpoint of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// `best.safetensors` when the run has one, else `latest.safetensors`.
    Auto,
    /// The lowest evaluation loss so far.
    Best,
    /// The last saved state.
    Latest,
}

impl Which {
    /// The checkpoint file of `dir` this names.
    pub fn path(self, dir: &Path) -> Result<PathBuf> {
        let file = match self {
            Which::Best => BEST,
            Which::Latest => LATEST,
            Which::Auto if dir.join(BEST).exists() => BEST,
            Which::Auto => LATEST,
        };
        let path = dir.join(file);
        if path.exists() {
            Ok(path)
        } else {
            Err(Error::invalid(
                "--checkpoint",
                format!(
                    "{} does not exist (the run saved no such checkpoint yet)",
                    path.display()
                ),
            ))
        }
    }
}

/// The options of `plimsoll eval`.
#[derive(Args)]
pub struct EvalArgs {
    /// The run's directory [default: the newest run under runs/].
    run: Option<PathBuf>,
    /// Which checkpoint to evaluate.
    #[arg(long, value_enum, default_value_t = Which::Auto)]
    checkpoint: Which,
    #[command(flatten)]
    device: crate::DeviceArgs,
}

/// The run `given`, or the newest under `runs/` (of `workload`, when given).
pub fn run_or_newest(given: Option<&Path>, workloads: &[&str]) -> Result<PathBuf> {
    if let Some(p) = given {
        if !p.join(run_dir::RUN_FILE).is_file() {
            return Err(Error::invalid(
                "run",
                format!(
                    "{} is not a run directory (no run.json); `plimsoll runs` lists the runs",
                    p.display()
                ),
            ));
        }
        return Ok(p.to_path_buf());
    }
    run_dir::newest_of(Path::new(RUNS_ROOT), workloads)?.ok_or_else(|| {
        Error::invalid(
            "run",
            format!(
                "no {}run under {RUNS_ROOT}/ here; give the run's directory, or train first",
                match workloads {
                    [] => String::new(),
                    w => format!("{} ", w.join(" or ")),
                }
            ),
        )
    })
}

/// Evaluates a run's checkpoint on its evaluation data and prints the result.
pub fn eval(args: &EvalArgs) -> Result<()> {
    let dir = run_or_newest(args.run.as_deref(), &[])?;
    let record = read_record(&dir)?;
    let name = record
        .get("workload")
        .and_then(|w| w.as_str())
        .unwrap_or_default()
        .to_string();
    let workload = crate::records::parse(&name, &recorded_args(&record, &dir)?)?;
    let path = args.checkpoint.path(&dir)?;
    let (mut job, mut common) = crate::workloads::job(workload)?;
    if job.test.is_none() {
        return Err(Error::invalid(
            "eval",
            format!("the {name} workload has no evaluation data"),
        ));
    }
    if let Some(changed) = crate::records::data_changed(&record, &job) {
        return Err(Error::invalid(
            "eval",
            format!("{changed}; restore it to evaluate the run on the data it trained on"),
        ));
    }
    common.device = args.device.clone();
    job.config.memory_budget_bytes = args.device.memory_budget;
    job.config.fence_deadline = args.device.deadline();
    // The memory plan picks the evaluation chunk (the micro-batch) and, for a GPT, whether
    // it needs the memory-efficient variant (GPT-2's whole logits pass lavapipe's binding), as
    // the run's own plan did; out-of-memory still halves the chunk.
    job.config.micro_batch = None;
    job.config.checkpointing = plimsoll_trainer::CheckpointPolicy::Automatic;
    job.config.checkpoint_dir = None;
    let gpu = common.device.open()?;
    let mut trainer = Trainer::new(&gpu, job.config, job.spec.as_ref(), job.train, job.test)?;
    trainer.resume_with(&path, true)?;
    let step = trainer.position().step;
    let evaluation = trainer
        .evaluate()?
        .ok_or_else(|| Error::invalid("eval", "no evaluation data"))?;
    out::say(format_args!(
        "{} ({}, step {step}): {}{} ({} predictions)",
        dir.display(),
        path.file_name()
            .map(|f| f.to_string_lossy())
            .unwrap_or_default(),
        crate::progress::describe(&evaluation),
        evaluation
            .accuracy
            .map(|_| format!(", loss {:.4}", evaluation.loss))
            .unwrap_or_default(),
        evaluation.samples
    ));
    Ok(())
}

/// The options of `plimsoll runs`.
#[derive(Args)]
pub struct RunsArgs {
    /// The folder of runs.
    #[arg(default_value = RUNS_ROOT)]
    dir: PathBuf,
}

/// Lists the runs in a folder.
pub fn runs(args: &RunsArgs) -> Result<()> {
    if !args.dir.is_dir() {
        return Err(Error::invalid(
            "runs",
            format!(
                "{} is not a directory; train first (runs go to {RUNS_ROOT}/) or name the folder",
                args.dir.display()
            ),
        ));
    }
    let runs = run_dir::list(&args.dir)?;
    if runs.is_empty() {
        out::say(format_args!("no runs in {}", args.dir.display()));
        return Ok(());
    }
    out::say(format_args!(
        "{:<40} {:<12} {:>7} {:>10}  status",
        "run", "workload", "step", "best loss"
    ));
    for r in runs {
        out::say(format_args!(
            "{:<40} {:<12} {:>7} {:>10}  {}",
            r.path.display(),
            r.workload,
            r.step.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            r.best_eval_loss
                .map(|l| format!("{l:.4}"))
                .unwrap_or_else(|| "-".into()),
            r.status
        ));
    }
    Ok(())
}

/// The options of `plimsoll report`.
#[derive(Args)]
pub struct ReportArgs {
    /// The run's directory [default: the newest run under runs/].
    run: Option<PathBuf>,
}

/// Writes a run's report.html.
pub fn report(args: &ReportArgs) -> Result<()> {
    let dir = run_or_newest(args.run.as_deref(), &[])?;
    let path = plimsoll_trainer::report::write_report(&dir)?;
    out::say(format_args!(
        "wrote {} (self-contained: open it in a browser, no network needed)",
        path.display()
    ));
    Ok(())
}
