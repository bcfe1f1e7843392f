//! `cargo xtask`: the project's tasks, in Rust so they run the same everywhere.
//!
//! - `cargo xtask ci` does what CI does: format check, clippy with warnings as errors, all tests.
//! - `cargo xtask bench <suite>` runs a benchmark suite, prints a table and writes
//!   `target/bench/<suite>.json`.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod bench;

/// The help text; the suite list comes from [`bench::SUITES`], so it cannot fall behind.
fn help() -> String {
    format!(
        "\
cargo xtask <task>

Tasks:
  ci               cargo fmt --check, cargo clippy -D warnings, cargo test (what CI runs)
  bench <suite>    run a benchmark suite (always in release), print a table and write
                   target/bench/<suite>.json; suites: {suites}, all
  help             this text
",
        suites = bench::SUITES.join(", "),
    )
}

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<()> {
    match args.first().map(String::as_str) {
        None | Some("help" | "--help" | "-h") => {
            print!("{}", help());
            Ok(())
        }
        Some("ci") => ci(),
        Some("bench") => bench::run(&args[1..]),
        Some(other) => bail!("unknown task `{other}`\n\n{}", help()),
    }
}

/// Runs each CI step in order and stops at the first failure.
fn ci() -> Result<()> {
    let steps: [&[&str]; 3] = [
        &["fmt", "--all", "--check"],
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &["test", "--workspace"],
    ];
    for step in steps {
        cargo(step)?;
    }
    Ok(())
}

/// Runs `cargo <args>` with the same toolchain that runs xtask, failing on a non-zero exit.
pub(crate) fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .status()
        .with_context(|| format!("could not start `{cargo}`"))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The workspace root: `xtask/Cargo.toml` sits one level below it.
pub(crate) fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}
