//! The `plimsoll` command as a user meets it without a terminal: plain progress lines on
//! standard output, a reader going away (`plimsoll train | head`) that does not stop training,
//! SIGTERM and SIGINT (also sent twice at once, as `timeout` does) that save the run and exit
//! with 143 and 130, never a panic.

#![allow(clippy::unwrap_used)]

mod common;

use common::cli::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long the command may take to stop once asked.
const STOP_DEADLINE: Duration = Duration::from_secs(120);

/// A fresh, empty folder for one test.
fn folder(name: &str) -> PathBuf {
    common::cli::folder("cli", name)
}

/// `plimsoll train digits --epochs <epochs>` in the run directory `dir/run`, stdout and stderr
/// piped.
fn digits_run(dir: &Path, epochs: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_plimsoll"))
        .args(["train", "digits", "--epochs", epochs, "--run-dir", "run"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads stdout lines until one starts with `epoch` (the first evaluation: steps are running).
fn wait_for_first_epoch(reader: &mut impl BufRead) {
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(
            n > 0,
            "the command closed its output before its first epoch"
        );
        if line.starts_with("epoch") {
            return;
        }
    }
}

/// The run's `summary.json`.
fn summary(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("run/summary.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_closed_output_does_not_stop_training() {
    let dir = folder("closed-output");
    let mut child = digits_run(&dir, "3");
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    wait_for_first_epoch(&mut reader);
    drop(reader); // `| head` exits
    let status = wait_with_deadline(&mut child, STOP_DEADLINE);
    let stderr = stderr_of(&mut child);
    assert!(status.success(), "got {status}:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let s = summary(&dir);
    assert_eq!(s["status"], "finished", "{s}");
    assert_eq!(s["steps"], 69, "all 3 epochs of 23 steps ran: {s}");
    assert!(
        dir.join("run/model.safetensors").exists(),
        "the run is saved"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sigterm_and_sigint_save_the_run_and_exit_143_and_130() {
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let dir = folder(&format!("sig{signal}"));
        let mut child = digits_run(&dir, "100000");
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        wait_for_first_epoch(&mut reader);
        let pid = child.id();
        stop_and_check_saved(&dir, child, reader, &format!("kill -{signal} {pid}"), code);
    }
}

/// Sends signals to `child` with the shell command `kill`, reads its output until it exits
/// (so that it never blocks on a full pipe), and checks that it exited with `code`, said where
/// it stopped and how to go on, saved the run and marked it interrupted; removes `dir`.
fn stop_and_check_saved(
    dir: &Path,
    mut child: Child,
    reader: impl BufRead + Send + 'static,
    kill: &str,
    code: i32,
) {
    let sent = Command::new("sh").args(["-c", kill]).status().unwrap();
    assert!(sent.success(), "{kill}");
    let drain = std::thread::spawn(move || reader.lines().map_while(|l| l.ok()).count());
    let status = wait_with_deadline(&mut child, STOP_DEADLINE);
    let stderr = stderr_of(&mut child);
    let _ = drain.join();
    assert_eq!(status.code(), Some(code), "{kill}:\n{stderr}");
    assert!(
        stderr.contains(" at step ") && stderr.contains("--resume run"),
        "it says where the run stopped and how to go on:\n{stderr}"
    );
    assert!(
        dir.join("run/latest.safetensors").exists(),
        "the run is saved"
    );
    assert_eq!(summary(dir)["status"], "interrupted");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_signal_sent_twice_at_once_as_timeout_does_still_saves_the_run() {
    // `timeout` and a process-group kill deliver SIGTERM twice within microseconds; the
    // second must not be taken for a person's second Ctrl-C that quits at once.
    let dir = folder("double-term");
    let mut child = Command::new(env!("CARGO_BIN_EXE_plimsoll"))
        .args(words("train shakespeare --steps 100000 --log-every 1"))
        .args(["--run-dir", "run"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("step ") {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "the command closed its output before its first step");
    }
    // The second 20 ms after the first: its handler has run, the step is not over.
    let pid = child.id();
    let kill = format!("kill -TERM {pid}; sleep 0.02; kill -TERM {pid}");
    stop_and_check_saved(&dir, child, reader, &kill, 143);
}

#[test]
fn the_metrics_file_has_every_step_and_every_evaluation() {
    let dir = folder("metrics");
    let out = Command::new(env!("CARGO_BIN_EXE_plimsoll"))
        .args(words("train digits --epochs 2 --metrics-out m.jsonl"))
        .args(words("--run-dir ck --clip-grad-norm 0.5 --log-every 5"))
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.join("m.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<_> = lines
        .iter()
        .filter(|l| l.get("loss_mean").is_some())
        .collect();
    let evals: Vec<_> = lines
        .iter()
        .filter(|l| l.get("eval_loss").is_some())
        .collect();
    assert_eq!(lines[0]["event"], "start", "{}", lines[0]);
    assert_eq!(steps.len() + evals.len() + 1, lines.len());
    // The run directory has the same lines.
    assert_eq!(
        std::fs::read_to_string(dir.join("ck/metrics.jsonl")).unwrap(),
        text
    );
    // Without a terminal: a plain line every 5 steps and at the last, flushed to stdout.
    let plain: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step e")).collect();
    let numbers: Vec<u64> = plain
        .iter()
        .map(|l| l.split([' ', '/']).nth(2).unwrap().parse().unwrap())
        .collect();
    assert_eq!(numbers, [5, 10, 15, 20, 25, 30, 35, 40, 45, 46], "{stdout}");
    assert!(
        plain
            .iter()
            .all(|l| l.contains(" loss ") && l.contains(" ETA ")),
        "{stdout}"
    );
    assert_eq!(steps.len(), 46, "23 steps per epoch");
    assert_eq!(evals.len(), 2, "one evaluation per epoch");
    // Each evaluation line carries the accuracy the command printed for that epoch.
    for (e, epoch) in evals.iter().zip(1..) {
        let accuracy = 100.0 * e["eval_accuracy"].as_f64().unwrap();
        let printed = format!(
            "epoch {epoch:>3} (step {:>5}): test accuracy {accuracy:.2}%",
            e["step"].as_u64().unwrap()
        );
        assert!(stdout.contains(&printed), "{printed:?} not in:\n{stdout}");
        assert_eq!(e["eval_samples"], 359);
    }
    // The run keeps a record of what it was told, and its files.
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ck/run.json")).unwrap()).unwrap();
    assert_eq!(record["workload"], "digits");
    assert_eq!(record["parameters"], 9610);
    assert_eq!(record["config"]["length"], "2 epochs");
    assert_eq!(record["config"]["clip_grad_norm"], 0.5);
    assert_eq!(record["args"][1], "2");
    assert!(record["data"]["sha256"].as_str().unwrap().len() == 64);
    for file in ["latest", "best", "model"] {
        assert!(
            dir.join(format!("ck/{file}.safetensors")).exists(),
            "{file}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `sample` takes the model's shape from the run's record: a run trained with 2 heads samples
/// without any shape flag, and `--heads 4` (which loads without a shape error, heads being a
/// reshape) is refused instead of giving garbage.
#[test]
fn sample_uses_the_recorded_shape_and_refuses_a_contradicting_flag() {
    let dir = folder("sample-shape");
    let plimsoll = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_plimsoll"));
        c.current_dir(&dir).stdin(Stdio::null());
        c
    };
    let train = plimsoll()
        .args(words("train shakespeare --steps 2 --batch 2 --context 16"))
        .args(ONE_BLOCK_GPT_ARGS)
        .args(words("--eval-every 2 --eval-windows 4 --run-dir ck"))
        .output()
        .unwrap();
    assert!(
        train.status.success(),
        "{}",
        String::from_utf8_lossy(&train.stderr)
    );
    let ok = plimsoll()
        .args(words("sample --run ck --tokens 20 --prompt KING"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        text.starts_with("KING") && text.chars().count() >= 24,
        "{text:?}"
    );
    let refused = plimsoll()
        .args(["sample", "--run", "ck", "--heads", "4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("--heads") && stderr.contains("trained with 2"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A build without the `mpi` feature, started by `mpirun` as one of several processes (what
/// Open MPI's environment says), refuses instead of training N unrelated models, and leaves no
/// run behind. (With the feature, `tests/mpi.rs` runs the real thing.)
#[cfg(not(feature = "mpi"))]
#[test]
fn a_build_without_mpi_refuses_to_be_one_of_several_mpirun_processes() {
    let dir = folder("no-mpi");
    let output = Command::new(env!("CARGO_BIN_EXE_plimsoll"))
        .args(["train", "digits", "--epochs", "1"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .env("OMPI_COMM_WORLD_RANK", "1")
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("one of 2 that an MPI launcher started")
            && stderr.contains("--features mpi"),
        "{stderr}"
    );
    assert!(!dir.join("runs").exists());
    // Launched alone by mpirun (`-np 1`), it trains.
    output_ok(
        plimsoll(&dir)
            .args(["train", "digits", "--epochs", "1"])
            .env("OMPI_COMM_WORLD_SIZE", "1"),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `train digits --micro-batch 64 --checkpointing none` makes no plan, but compiles only the
/// kernels its run uses before step 1 (a dozen), not every kernel of the crate (260).
#[test]
fn a_run_with_its_micro_batch_given_compiles_only_its_kernels() {
    let dir = folder("compile-own");
    let out = Command::new(env!("CARGO_BIN_EXE_plimsoll"))
        .args(words(
            "train digits --epochs 1 --micro-batch 64 --checkpointing none --run-dir run",
        ))
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("compiled the run's"))
        .unwrap_or_else(|| panic!("no compile line in\n{text}"));
    let count: usize = line.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(count < 40, "{line}");
}
