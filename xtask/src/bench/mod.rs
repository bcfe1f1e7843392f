//! Benchmark suites. Each suite returns a [`Report`]; this module prints it as a table and writes
//! `target/bench/<suite>.json` in the one format every suite shares:
//! `{"suite": "allocator", "results": [{"name": "...", "value": 1.0, "unit": "..."}]}`.

use anyhow::{Context, Result, bail};
use serde::Serialize;

mod allocator;
mod kernel_families;
mod kernels;
mod mpi;
mod plan;
mod plan_presets;
mod train;
pub(crate) mod train_gpt;
mod train_images;
mod train_offload;

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// What was measured, e.g. `alloc_free_pair_10k_live/plimsoll`.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Its unit, e.g. `ns`, `GFLOP/s`, `ratio`.
    pub unit: String,
}

/// The results of one suite.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The suite's name; also the JSON file's stem.
    pub suite: String,
    /// Every figure, in the order measured.
    pub results: Vec<Measurement>,
}

impl Report {
    /// An empty report for `suite`.
    pub fn new(suite: &str) -> Self {
        Self {
            suite: suite.to_owned(),
            results: Vec::new(),
        }
    }

    /// Records a figure and prints it as a table row at once, so a long suite shows progress.
    pub fn push(&mut self, name: impl Into<String>, value: f64, unit: &str) {
        let name = name.into();
        println!("  {name:<58} {value:>14.3} {unit}");
        self.results.push(Measurement {
            name,
            value,
            unit: unit.to_owned(),
        });
    }

    /// The value of the figure named `name`, if recorded.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.results
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }
}

/// The parts of the train suite, which `bench train PART...` runs alone.
pub(crate) const TRAIN_PARTS: [&str; 11] = train::PARTS;

/// Every suite, in the order `all` runs them (also the list `cargo xtask help` prints).
pub(crate) const SUITES: &[&str] = &["allocator", "kernels", "plan", "train", "mpi"];

/// `cargo xtask bench [suite]`. In a debug build it re-runs itself through
/// `cargo run --release`, so no figure ever comes from unoptimised code.
pub fn run(args: &[String]) -> Result<()> {
    if cfg!(debug_assertions) {
        let mut cargo_args = vec![
            "run",
            "--quiet",
            "--release",
            "--package",
            "plimsoll-xtask",
            "--",
        ];
        cargo_args.push("bench");
        cargo_args.extend(args.iter().map(String::as_str));
        return crate::cargo(&cargo_args);
    }
    let Some(suite) = args.first() else {
        bail!("which suite? one of: {}, all", SUITES.join(", "));
    };
    let suites: Vec<&str> = if suite == "all" {
        SUITES.to_vec()
    } else {
        vec![suite.as_str()]
    };
    for suite in suites {
        let report = match suite {
            "allocator" => allocator::run()?,
            "kernels" => kernels::run(&args[1..])?,
            "plan" => plan::run(&args[1..])?,
            "train" => train::run(&args[1..])?,
            "mpi" => mpi::run()?,
            other => bail!(
                "unknown suite `{other}`; one of: {}, all",
                SUITES.join(", ")
            ),
        };
        write(&report)?;
    }
    Ok(())
}

fn write(report: &Report) -> Result<()> {
    let dir = crate::workspace_root().join("target").join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{}.json", report.suite));
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(&path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}
