//! The mpi suite: data-parallel training under `mpirun` with 1 and 2 ranks on this machine, and
//! 2 ranks with each ZeRO stage (`--shard optimizer|gradients`), for the shakespeare GPT
//! (default shape, batch 12) and mlp-bench (batch 128): the median step time, the bytes each
//! rank passes to the collective calls per step, the median time a step spends in them
//! (reading gradients back, waiting for the other rank, writing the sums or the gathered
//! parameters) and rank 0's optimizer state. It builds `plimsoll` in release with the `mpi` feature and runs the command as a user
//! would, reading each run's `metrics.jsonl`.
//!
//! On one machine the ranks share its cores, so this shows the all-reduce's cost and overhead,
//! not scaling; `docs/scaling.md` works out scaling on paper.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::Report;

/// Steps of each run; the first [`SKIPPED`] (pipelines, plan, first touch) are not counted.
const STEPS: u64 = 14;
const SKIPPED: usize = 4;

/// Runs the mpi suite.
pub fn run() -> Result<Report> {
    let mut report = Report::new("mpi");
    let root = crate::workspace_root();
    crate::cargo(&[
        "build",
        "--release",
        "-p",
        "plimsoll-trainer",
        "--features",
        "mpi",
        "--bin",
        "plimsoll",
    ])?;
    let bin = root.join("target/release/plimsoll");
    let work = root.join("target/bench/mpi-runs");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let steps = STEPS.to_string();
    let workloads: [(&str, Vec<&str>); 2] = [
        (
            "gpt",
            vec!["shakespeare", "--steps", &steps, "--eval-every", "1000"],
        ),
        ("mlp-bench", vec!["mlp-bench", "--steps", &steps]),
    ];
    // One process, two ranks, and two ranks with each ZeRO stage (`--shard`).
    let variants = [(1, "none"), (2, "none"), (2, "optimizer"), (2, "gradients")];
    for (name, args) in &workloads {
        for (ranks, shard) in variants {
            let run = work.join(format!("{name}-{ranks}-{shard}"));
            let mut args = args.clone();
            args.extend(["--shard", shard]);
            let lines = mpirun(&bin, ranks, &args, &run)?;
            let sharded = match shard {
                "none" => String::new(),
                s => format!("_shard_{s}"),
            };
            let plural = if ranks > 1 { "s" } else { "" };
            let prefix = format!("{name}/{ranks}_rank{plural}{sharded}");
            report.push(
                format!("{prefix}/optimizer_state_rank0"),
                optimizer_state_bytes(&run)?,
                "bytes",
            );
            let field = |key: &str| -> Vec<f64> {
                lines
                    .iter()
                    .skip(SKIPPED)
                    .filter_map(|l| l.get(key).and_then(serde_json::Value::as_f64))
                    .collect()
            };
            report.push(
                format!("{prefix}/step_median"),
                median(field("step_ms")),
                "ms",
            );
            report.push(
                format!("{prefix}/allreduce_bytes_per_step"),
                median(field("allreduce_bytes")),
                "bytes",
            );
            report.push(
                format!("{prefix}/allreduce_median"),
                median(field("allreduce_ms")),
                "ms",
            );
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(report)
}

/// `mpirun -np ranks <bin> train <args> --run-dir run`; the step lines of its metrics.
fn mpirun(
    bin: &Path,
    ranks: usize,
    args: &[&str],
    run: &PathBuf,
) -> Result<Vec<serde_json::Value>> {
    let output = Command::new("mpirun")
        .args([
            "--enable-recovery",
            "--oversubscribe",
            "-np",
            &ranks.to_string(),
        ])
        .arg(bin)
        .arg("train")
        .args(args)
        .arg("--run-dir")
        .arg(run)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .context("could not start mpirun (install openmpi-bin)")?;
    if !output.status.success() {
        bail!(
            "mpirun -np {ranks} {} failed: {}\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = std::fs::read_to_string(run.join("metrics.jsonl"))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("step_ms").is_some())
        .collect())
}

/// Rank 0's optimizer state at the end of a run (its memory summary's `optimizer_state`,
/// current), in bytes.
fn optimizer_state_bytes(run: &Path) -> Result<f64> {
    let path = run.join("memory_summary.txt");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let line = text
        .lines()
        .find(|l| {
            l.trim_start_matches('|')
                .trim_start()
                .starts_with("optimizer_state ")
        })
        .with_context(|| format!("no optimizer_state line in {}", path.display()))?;
    let current = line.split('|').nth(2).unwrap_or_default().trim();
    let (number, unit) = current.split_once(' ').unwrap_or((current, "B"));
    let scale = match unit {
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => 1.0,
    };
    Ok(number.parse::<f64>().unwrap_or(f64::NAN) * scale)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n => values[n / 2],
    }
}
