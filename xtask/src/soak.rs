//! `cargo xtask soak`: long runs hold still. Every training path runs through the `plimsoll`
//! command as a user runs it, with `--metrics-out`, and is judged by what each step reports:
//! the device's allocated and reserved bytes, the Rust heap the command counts
//! (`plimsoll_trainer::host_memory`: Plimsoll's allocations and wgpu's; the driver allocates
//! through C and is seen only in the resident set) and the resident set.
//!
//! After a warm-up (the first tenth of the steps), a run fails when
//!
//! - the heap's live bytes after a step reach more in the last tenth of the steps than in the
//!   tenth after warm-up, by more than [`HEAP_SLACK_BYTES`], rising in both halves of the run
//!   by more than a quarter of it each (a table that doubles once rises in one), or the
//!   device's allocated or reserved bytes do at all (the counts are exact: a leak of a few
//!   dozen bytes a step shows);
//! - the heap's high-water mark rises after warm-up by more than [`PEAK_SLACK_BYTES`] (a copy
//!   made again where one should be reused: the run's snapshots of its training state are taken
//!   every sixteenth of the run, the first that holds the optimizer's state in warm-up);
//! - the resident set grows by more than 1 MiB from the end of warm-up to the last step (not
//!   judged where a run names the driver's growth: the Llama on lavapipe, [`LAVAPIPE_LLAMA`]).
//!
//! The paths: the digits MLP and CNN (an evaluation every epoch), the GPT with the reference
//! and the fused attention, with checkpointing, in f16, with evaluations between steps, with
//! the optimizer, the activations and the parameters offloaded, the Llama, and a GPT reading a
//! token folder (`plimsoll prepare`). `--quick` (in `cargo xtask ci`) runs each on a tiny model
//! for a few hundred steps in the dev build; without it, in release, the models are the
//! workloads' own and the runs longer (10,000 digits steps, 1,000 of the GPT).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// One training path: `plimsoll train <args>`, run for `steps` steps.
struct SoakRun {
    name: &'static str,
    args: Vec<String>,
    steps: u64,
    /// Why this path's resident growth is not judged, when it is a driver's and not
    /// Plimsoll's (its counted heap still is).
    driver_growth: Option<&'static str>,
}

/// What one step reported (a line of `--metrics-out`).
#[derive(Clone, Copy, Default)]
struct Sample {
    allocated: u64,
    reserved: u64,
    heap_live: u64,
    heap_peak: u64,
    heap_allocations: u64,
    heap_allocated: u64,
    resident: u64,
    step_ms: f64,
}

/// The longest a run may take before the soak stops it and fails.
const RUN_DEADLINE: Duration = Duration::from_secs(1800);

/// Where the Llama's resident memory goes on lavapipe. Its counted heap is flat to the byte; the
/// resident set grows by about 400 KB a step in anonymous mappings of 4 and 16 KiB that
/// LLVM's JIT (`SectionMemoryManager`, from `LLVMGetPointerToGlobal` on lavapipe's queue
/// thread) maps while the queue runs the step: Mesa 22.3's lavapipe compiles shader code during
/// the Llama's steps, never during the GPT's, though no pipeline is created after the first
/// step (docs/soak.md).
const LAVAPIPE_LLAMA: &str = "lavapipe's JIT compiles shader code on its queue thread during \
    each step (docs/soak.md)";

/// Live heap bytes a run may gain after warm-up: log lines of a later step are a digit longer
/// than an earlier one's, and a quick digits run's log is still filling its 16 lines
/// (docs/soak.md). A leak of 25 bytes a step passes it within a quick run's 180 steps.
const HEAP_SLACK_BYTES: i128 = 4 << 10;

/// How far the heap's high-water mark may rise after warm-up: the transient strings and
/// buffers of an evaluation or a save move it by a few KiB from one to the next (8 KiB over the
/// long fused-attention run); a copy of the model's state made again would move it by the
/// state's size.
const PEAK_SLACK_BYTES: i128 = 64 << 10;

/// Resident growth a run may show (the C allocator's and the driver's bookkeeping moves by
/// pages).
const RESIDENT_SLACK_BYTES: i128 = 1 << 20;

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// The runs, each with the flags that make its path; `tokens` is the token folder.
fn runs(quick: bool, tokens: &Path) -> Vec<SoakRun> {
    let gpt_steps = if quick { 200 } else { 1000 };
    let path_steps = if quick { 200 } else { 300 };
    // A GPT small enough for hundreds of steps in CI, or the workload's own, evaluated every
    // fortieth of the run: in warm-up, an evaluation follows the first snapshot that holds
    // the optimizer's state (every sixteenth), and the host memory both take is reached.
    let gpt = if quick {
        "--layers 1 --heads 2 --width 32 --context 16 --batch 4".to_string()
    } else {
        format!("--eval-every {} --eval-windows 16", path_steps / 40)
    };
    let tokens = tokens.display();
    let shakespeare = |name, flags: &str, steps| SoakRun {
        name,
        args: words(&format!("shakespeare {gpt} {flags}")),
        steps,
        driver_growth: None,
    };
    // 1,437 training images in batches of 64: 23 steps an epoch.
    let (digit_epochs, cnn_epochs) = if quick { (9, 9) } else { (435, 14) };
    let cnn_width = if quick { "--channels 4" } else { "" };
    vec![
        SoakRun {
            name: "digits",
            args: words(&format!("digits --epochs {digit_epochs}")),
            steps: digit_epochs * 23,
            driver_growth: None,
        },
        SoakRun {
            name: "digits cnn",
            args: words(&format!(
                "digits --model cnn {cnn_width} --epochs {cnn_epochs}"
            )),
            steps: cnn_epochs * 23,
            driver_growth: None,
        },
        shakespeare(
            "gpt",
            &match quick {
                true => "--attention reference".to_string(),
                false => format!("--attention reference --eval-every {}", gpt_steps / 40),
            },
            gpt_steps,
        ),
        shakespeare("gpt fused attention", "--attention fused", path_steps),
        shakespeare(
            "gpt checkpointing",
            "--attention reference --checkpointing 1",
            path_steps,
        ),
        shakespeare("gpt f16", "--precision f16", path_steps),
        shakespeare(
            "gpt evaluating",
            "--eval-every 7 --eval-windows 8",
            path_steps,
        ),
        shakespeare("gpt offload optimizer", "--offload optimizer", path_steps),
        shakespeare(
            "gpt offload activations",
            "--offload activations",
            path_steps,
        ),
        shakespeare("gpt offload parameters", "--offload parameters", path_steps),
        SoakRun {
            driver_growth: Some(LAVAPIPE_LLAMA),
            ..shakespeare("llama", "--arch llama", path_steps)
        },
        SoakRun {
            name: "gpt token folder",
            args: words(&format!("gpt --data {tokens} {gpt}")),
            steps: path_steps,
            driver_growth: None,
        },
    ]
}

/// `cargo xtask soak [--quick] [--release] [--only NAME] [--binary PATH]`: see the module
/// docs. Without `--quick` (or with `--release`) it builds and runs the release command;
/// `--binary` runs a `plimsoll` built elsewhere (another commit's) instead.
pub fn run(args: &[String]) -> Result<()> {
    let mut quick = false;
    let mut release = false;
    let mut only = None;
    let mut given = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--release" => release = true,
            "--only" => only = Some(rest.next().context("--only needs a run's name")?.clone()),
            "--binary" => {
                given = Some(PathBuf::from(rest.next().context("--binary needs a path")?));
            }
            other => bail!(
                "soak: unknown argument `{other}` (--quick, --release, --only NAME, --binary PATH)"
            ),
        }
    }
    let release = release || !quick;
    let profile = if release { "release" } else { "debug" };
    let mut build = vec!["build", "--quiet", "--package", "plimsoll-trainer"];
    build.extend(["--bin", "plimsoll"]);
    if release {
        build.push("--release");
    }
    let root = crate::workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or(root.join("target"), PathBuf::from);
    let binary = match given {
        Some(path) => path,
        None => {
            crate::cargo(&build)?;
            target.join(profile).join("plimsoll")
        }
    };
    let work = target.join("soak");
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
    }
    std::fs::create_dir_all(&work)?;
    let tokens = work.join("tokens");
    let prepared = Command::new(&binary)
        .args(["prepare", "shakespeare", "--tokenizer", "char", "--out"])
        .arg(&tokens)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .context("running plimsoll prepare")?;
    if !prepared.success() {
        bail!("`plimsoll prepare shakespeare` failed ({prepared})");
    }
    let started = Instant::now();
    let mut failed = Vec::new();
    let selected: Vec<SoakRun> = runs(quick, &tokens)
        .into_iter()
        .filter(|r| only.as_deref().is_none_or(|o| o == r.name))
        .collect();
    if selected.is_empty() {
        bail!("soak: no run named {only:?}");
    }
    for soak in &selected {
        let dir = work.join(soak.name.replace(' ', "-"));
        if !one(&binary, soak, &dir)? {
            failed.push(soak.name);
        }
    }
    println!(
        "soak: {} runs in {:.0} s",
        selected.len(),
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        bail!("memory grew after warm-up in: {}", failed.join(", "));
    }
    Ok(())
}

/// Runs one path and judges it; prints its line.
fn one(binary: &Path, soak: &SoakRun, dir: &Path) -> Result<bool> {
    let metrics = dir.join("metrics.jsonl");
    // A snapshot of the training state every sixteenth of the run: the first one that holds
    // the optimizer's state (made by the first update) falls in warm-up, many after it.
    let snapshot_every = (soak.steps / 16).max(1);
    let mut command = Command::new(binary);
    command
        .arg("train")
        .args(&soak.args)
        .args(["--lr", "1e-3", "--leak-check", "error"])
        .arg("--snapshot-every")
        .arg(snapshot_every.to_string())
        .arg("--run-dir")
        .arg(dir.join("run"))
        .arg("--metrics-out")
        .arg(&metrics)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if !soak.args.iter().any(|a| a == "digits") {
        command.arg("--steps").arg(soak.steps.to_string());
    }
    let started = Instant::now();
    let output = run_within(command, RUN_DEADLINE)
        .with_context(|| format!("{}: running plimsoll train", soak.name))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!(
            "{}: `plimsoll train {}` failed ({}):\n{stderr}",
            soak.name,
            soak.args.join(" "),
            output.status
        );
    }
    let samples = read_samples(&metrics)?;
    let steps = samples.len();
    let warmup = (steps / 10).max(1);
    if steps < warmup + 2 {
        bail!("{}: only {steps} steps reported", soak.name);
    }
    let tenth = (steps / 10).max(1);
    let early = &samples[warmup..(warmup + tenth).min(steps)];
    let middle_at = (warmup + steps - tenth) / 2;
    let middle = &samples[middle_at..(middle_at + tenth).min(steps)];
    let late = &samples[steps - tenth..];
    let max = |s: &[Sample], f: fn(&Sample) -> u64| s.iter().map(f).max().unwrap_or(0);
    let between = |a: &[Sample], b: &[Sample], f: fn(&Sample) -> u64| {
        i128::from(max(b, f)) - i128::from(max(a, f))
    };
    let growth = |f: fn(&Sample) -> u64| between(early, late, f);
    let allocated = growth(|s| s.allocated);
    let reserved = growth(|s| s.reserved);
    let heap = growth(|s| s.heap_live);
    // A growth rises in both halves after warm-up, by more than a quarter of the slack each; a
    // structure that grows once (a table doubling its capacity) rises in one, and log lines a
    // digit longer by a few bytes.
    let half = HEAP_SLACK_BYTES / 4;
    let heap_grows = heap > HEAP_SLACK_BYTES
        && between(early, middle, |s| s.heap_live) > half
        && between(middle, late, |s| s.heap_live) > half;
    let first = samples[warmup - 1];
    let last = samples[steps - 1];
    let peak = i128::from(last.heap_peak) - i128::from(first.heap_peak);
    let resident = i128::from(last.resident) - i128::from(first.resident);
    let per_step = |a: u64, b: u64| (b - a) as f64 / (steps - warmup) as f64;
    let median = |s: &[Sample]| {
        let mut v: Vec<f64> = s.iter().map(|s| s.step_ms).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let counted = first.heap_peak > 0;
    println!(
        "{}: {steps} steps in {:.0} s; after step {warmup}: device allocated growth {allocated} \
         B, reserved {reserved} B; heap live {} -> {} B (growth {heap}), peak {} -> {} (growth \
         {peak}), {:.0} allocations and {:.0} B allocated a step; resident {} -> {} B (growth \
         {resident}); step {:.2} -> {:.2} ms",
        soak.name,
        started.elapsed().as_secs_f64(),
        first.heap_live,
        last.heap_live,
        first.heap_peak,
        last.heap_peak,
        per_step(first.heap_allocations, last.heap_allocations),
        per_step(first.heap_allocated, last.heap_allocated),
        first.resident,
        last.resident,
        median(early),
        median(late),
    );
    if !counted {
        println!("{}: the command did not count its heap", soak.name);
    }
    let resident_held = match soak.driver_growth {
        Some(why) if resident > RESIDENT_SLACK_BYTES => {
            println!("{}: resident growth not judged: {why}", soak.name);
            true
        }
        _ => resident <= RESIDENT_SLACK_BYTES,
    };
    Ok(counted
        && allocated <= 0
        && reserved <= 0
        && !heap_grows
        && peak <= PEAK_SLACK_BYTES
        && resident_held)
}

/// The step lines of a `--metrics-out` file.
fn read_samples(path: &Path) -> Result<Vec<Sample>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut samples = Vec::new();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: not JSON: {line}", path.display()))?;
        if value.get("step").is_none() || value.get("loss").is_none() {
            continue;
        }
        let n = |v: &serde_json::Value, key: &str| v.get(key).and_then(|x| x.as_u64()).unwrap_or(0);
        let heap = value.get("host_heap").cloned().unwrap_or_default();
        samples.push(Sample {
            allocated: n(&value, "allocated_bytes"),
            reserved: n(&value, "reserved_bytes"),
            heap_live: n(&heap, "live_bytes"),
            heap_peak: n(&heap, "peak_bytes"),
            heap_allocations: n(&heap, "allocations"),
            heap_allocated: n(&heap, "allocated_bytes"),
            resident: n(&value, "resident_bytes"),
            step_ms: value
                .get("step_ms")
                .and_then(|x| x.as_f64())
                .unwrap_or(f64::NAN),
        });
    }
    Ok(samples)
}

/// Runs `command` to its end, or kills it past `deadline`.
fn run_within(mut command: Command, deadline: Duration) -> Result<std::process::Output> {
    let mut child = command.spawn()?;
    let start = Instant::now();
    // Read stderr on a thread, so a chatty child never blocks on a full pipe.
    let mut stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = std::io::Read::read_to_end(s, &mut text);
        }
        text
    });
    loop {
        if let Some(status) = child.try_wait()? {
            let stderr = reader.join().unwrap_or_default();
            return Ok(std::process::Output {
                status,
                stdout: Vec::new(),
                stderr,
            });
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("still running after {} s; stopped", deadline.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
