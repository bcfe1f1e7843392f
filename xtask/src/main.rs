//! `cargo xtask`: the project's tasks, in Rust so they run the same everywhere.
//!
//! - `cargo xtask ci` does what CI does: a warning for each non-test source file over
//!   [`line_limit::WARN_LINES`] lines (which files count is in [`line_limit`]), format check, clippy
//!   with warnings as errors, all tests, the MPI tests (the `mpi` feature under `mpirun`),
//!   then `chaos`, `soak --quick` and `pictures`.
//! - `cargo xtask bench <suite>` runs a benchmark suite, prints a table and writes
//!   `target/bench/<suite>.json`.
//! - `cargo xtask chaos` injects a fault at every failure point of a training step (see
//!   `chaos.rs`); `cargo xtask soak` checks that long runs hold still (see [`soak`]);
//!   `cargo xtask pictures` opens a run's pictures in their consumers (see [`pictures`]).

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod bench;
#[cfg(debug_assertions)]
mod chaos;
mod line_limit;
mod pictures;
mod soak;

/// The help text; the suite list comes from [`bench::SUITES`], so it cannot fall behind.
fn help() -> String {
    format!(
        "\
cargo xtask <task>

Tasks:
  ci               what CI runs, stopping at the first failure:
                   1. a warning (never a failure) for each non-test source file over {max}
                      lines (every .rs under a crate's src/, except under tests/, benches/ or
                      examples/ and files named tests.rs or *_tests.rs)
                   2. cargo fmt --check
                   3. cargo clippy --workspace --all-targets -D warnings
                   4. cargo test --workspace
                   5. with the mpi feature (needs Open MPI's mpirun, libopenmpi-dev and
                      libclang-dev): cargo clippy --workspace --features
                      plimsoll-trainer/mpi --all-targets -D warnings, cargo test -p plimsoll-trainer --features mpi
                      --test mpi (data-parallel training under mpirun)
                   6. cargo xtask chaos
                   7. cargo xtask soak --quick
                   8. cargo xtask pictures
  chaos            every failure point of a training step of an MLP and a small GPT, each
                   made to fail and to lose the device in turn: each must recover to the
                   undisturbed result or end in a typed error with the model unchanged
  bench <suite>    run a benchmark suite (always in release), print a table and write
                   target/bench/<suite>.json; suites: {suites}, all
                   (`bench train` takes parts to run alone: {parts})
  pictures         a short GPT run's memory timeline, memory_viz snapshot, kernel profile,
                   Chrome trace and report, each opened by its consumer (headless Chromium,
                   Python's pickle and json); screenshot in target/pictures/report.png
  soak [--quick] [--release] [--only NAME] [--binary PATH]
                   every training path through `plimsoll train`, in release (--quick: tiny
                   models, a few hundred steps, the dev build): device memory, the counted
                   Rust heap and resident memory must not grow after warm-up
  help             this text
",
        max = line_limit::WARN_LINES,
        suites = bench::SUITES.join(", "),
        parts = bench::TRAIN_PARTS.join(", "),
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
        Some("chaos") => chaos(&args[1..]),
        Some("soak") => soak::run(&args[1..]),
        Some("pictures") => pictures::run_task(&args[1..]),
        Some(other) => bail!("unknown task `{other}`\n\n{}", help()),
    }
}

/// Runs each CI step in order and stops at the first failure: the long-file warnings first
/// (milliseconds, no build), then the cargo steps, chaos and pictures. Each step's time is
/// printed when it ends, and all of them with the total at the end.
fn ci() -> Result<()> {
    let started = std::time::Instant::now();
    for warning in line_limit::warnings(&workspace_root())? {
        eprintln!("{warning}");
    }
    let steps: [&[&str]; 5] = [
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
        // With `mpi`, only the trainer, xtask and the MPI crates are checked again: the
        // trainer's empty build script names `syn` with bindgen's features, so both builds
        // share every other dependency.
        &[
            "clippy",
            "--workspace",
            "--features",
            "plimsoll-trainer/mpi",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &[
            "test",
            "-p",
            "plimsoll-trainer",
            "--features",
            "mpi",
            "--test",
            "mpi",
        ],
    ];
    let mut times: Vec<(String, f64)> = Vec::new();
    let mut timed = |name: String, step: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        let start = std::time::Instant::now();
        let result = step();
        let seconds = start.elapsed().as_secs_f64();
        eprintln!("ci: `{name}` took {seconds:.0} s");
        times.push((name, seconds));
        result
    };
    for (i, step) in steps.into_iter().enumerate() {
        if i == 3 {
            require_mpi()?;
        }
        let name = format!("cargo {}", step.join(" "));
        if step == ["test", "--workspace"] {
            timed(name, &mut || test_listing_skips(step))?;
        } else {
            timed(name, &mut || cargo(step))?;
        }
    }
    eprintln!("$ cargo xtask chaos");
    timed("cargo xtask chaos".into(), &mut || chaos(&[]))?;
    eprintln!("$ cargo xtask soak --quick");
    timed("cargo xtask soak --quick".into(), &mut || {
        soak::run(&["--quick".to_string()])
    })?;
    eprintln!("$ cargo xtask pictures");
    timed("cargo xtask pictures".into(), &mut || {
        pictures::run_task(&[])
    })?;
    eprintln!("ci: time of each part");
    for (name, seconds) in &times {
        eprintln!("  {seconds:>7.0} s  {name}");
    }
    eprintln!("  {:>7.0} s  total", started.elapsed().as_secs_f64());
    Ok(())
}

/// `cargo <args>` with `testing::SKIPPED_ENV` naming `target/skipped-tests.txt`, then how many
/// tests reported themselves skipped (`testing::skip`: the harness counts them as passed) and
/// which. Skips are listed, never a failure; the result is the tests'.
fn test_listing_skips(args: &[&str]) -> Result<()> {
    use plimsoll_kernels_wgsl::testing::SKIPPED_ENV;
    let file = workspace_root().join("target").join("skipped-tests.txt");
    // A stale list would count the last run's skips again.
    let _ = std::fs::remove_file(&file);
    let result = cargo_with_env(args, &[(SKIPPED_ENV, file.as_os_str())]);
    let skipped = std::fs::read_to_string(&file).unwrap_or_default();
    let lines: Vec<&str> = skipped.lines().collect();
    eprintln!(
        "ci: {} test(s) skipped (counted as passed above)",
        lines.len()
    );
    for line in lines {
        eprintln!("  {line}");
    }
    result
}

/// The MPI steps need Open MPI's `mpirun` (and, to build, its headers and libclang).
fn require_mpi() -> Result<()> {
    let found = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        bail!(
            "no `mpirun` on the path: the MPI tests need Open MPI. `bash .ci/run` installs it \
             (apt-get install openmpi-bin libopenmpi-dev libclang-dev)"
        );
    }
    Ok(())
}

/// `cargo xtask chaos`, which needs a debug build: fault injection is compiled out of release
/// builds (`cargo xtask` builds xtask in the dev profile).
fn chaos(args: &[String]) -> Result<()> {
    #[cfg(debug_assertions)]
    return chaos::run(args);
    #[cfg(not(debug_assertions))]
    bail!(
        "chaos needs a debug build (fault injection is compiled out of release builds); run it \
         as `cargo xtask chaos`, not from a release build ({} arguments ignored)",
        args.len()
    )
}

/// Runs `cargo <args>` with the same toolchain that runs xtask, failing on a non-zero exit.
pub(crate) fn cargo(args: &[&str]) -> Result<()> {
    cargo_with_env(args, &[])
}

/// [`cargo`] with environment variables set for it.
fn cargo_with_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let shown: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={} ", v.display()))
        .collect();
    eprintln!("$ {}cargo {}", shown.concat(), args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
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
