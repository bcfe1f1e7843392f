//! `cargo xtask`: the project's tasks, in Rust so they run the same everywhere.
//!
//! - `cargo xtask ci` does what CI does: format check, clippy with warnings as errors, all tests.
//! - `cargo xtask bench <suite>` runs a benchmark suite, prints a table and writes
//!   `target/bench/<suite>.json`.

use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod bench;

const HELP: &str = "\
cargo xtask <task>

Tasks:
  ci               cargo fmt --check, cargo clippy -D warnings, cargo test (what CI runs)
  bench <suite>    run a benchmark suite (always in release), print a table and write
                   target/bench/<suite>.json; suites: allocator, kernels, all
  help             this text
";

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
            print!("{HELP}");
            Ok(())
        }
        Some("ci") => ci(),
        Some("bench") => bench::run(&args[1..]),
        Some(other) => bail!("unknown task `{other}`\n\n{HELP}"),
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
