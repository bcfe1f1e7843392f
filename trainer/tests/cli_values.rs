//! What the `plimsoll` command accepts and what it says of it: values that contradict each
//! other are usage errors (exit 2) naming the flag and the numbers, before any run directory
//! exists; a workload default that does not fit the run is shortened with a printed note; a
//! run records the optimizer that trained (its learning rate after `--lr`, its schedule) and
//! the settings in words, not Rust's `Debug` text; on a terminal, the lines printed above the
//! progress bar are lines (a captured log keeps the memory plan's rows apart); a classifier's
//! report has an accuracy chart.

#![allow(clippy::unwrap_used)]

mod common;

use common::cli::*;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// A fresh, empty folder for one test.
fn folder(name: &str) -> PathBuf {
    common::cli::folder("values", name)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `plimsoll train <args>` from an empty folder: exit code 2, an error naming `flag` and each of
/// `numbers`, and the folder still empty (no run directory, no `runs/`).
fn refused(name: &str, args: &[&str], flag: &str, numbers: &[&str]) {
    let dir = folder(name);
    let mut argv = vec!["train"];
    argv.extend_from_slice(args);
    let o = run(&dir, &argv);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("{args:?}: no error line in {err}"));
    assert!(line.contains(flag), "{args:?}: {line}");
    for n in numbers {
        assert!(line.contains(n), "{args:?}: {n} missing from {line}");
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "{args:?} left {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_floor_above_the_peak_rate_is_refused() {
    // Digits' default rate is 2e-3: a floor of 0.995 would make the rate rise as it "decays".
    refused(
        "min-lr",
        &["digits", "--min-lr", "0.995"],
        "--min-lr",
        &["0.995", "0.002", "at most 0.002"],
    );
    refused(
        "min-lr-explicit",
        &["digits", "--lr", "0.01", "--min-lr", "0.02"],
        "--min-lr",
        &["0.02", "0.01"],
    );
}

#[test]
fn a_warm_up_longer_than_the_run_is_refused() {
    // 2 epochs of ceil(1438 / 64) = 23 steps: 46 steps.
    refused(
        "warmup",
        &["digits", "--epochs", "2", "--warmup-steps", "100"],
        "--warmup-steps",
        &["100", "46"],
    );
    refused(
        "warmup-steps",
        &["shakespeare", "--steps", "10", "--warmup-steps", "11"],
        "--warmup-steps",
        &["11", "10"],
    );
}

#[test]
fn a_batch_beyond_the_data_is_refused() {
    // Digits trains on 1,438 of its 1,797 samples.
    refused(
        "batch",
        &["digits", "--batch", "1000000"],
        "--batch",
        &["1000000", "1438"],
    );
}

#[test]
fn a_micro_batch_above_the_batch_is_refused_with_what_to_do() {
    refused(
        "micro-batch",
        &["digits", "--batch", "64", "--micro-batch", "100"],
        "--micro-batch",
        &["100", "64", "at most 64"],
    );
}

#[test]
fn a_context_or_evaluation_windows_beyond_the_text_are_refused() {
    // The bundled plays' last 10% (the validation text) is 142,326 characters.
    refused(
        "context",
        &["shakespeare", "--context", "200000"],
        "--context",
        &["200000", "142326", "142325"],
    );
    refused(
        "eval-windows",
        &["shakespeare", "--eval-windows", "100000000"],
        "--eval-windows",
        &["100000000", "142262"],
    );
}

#[test]
fn a_default_that_does_not_fit_the_run_is_shortened_and_said() {
    // Shakespeare warms up over 100 steps and decays to 1e-4 by default.
    let dir = folder("notes");
    let o = run(
        &dir,
        &words("plan shakespeare --steps 50 --lr 5e-5 --layers 1"),
    );
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(
        out.contains("100 warm-up steps") && out.contains("takes 50 steps instead"),
        "{out}"
    );
    assert!(
        out.contains("--min-lr 0.0001 is above --lr 0.00005"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run records the optimizer that trained, in numbers, and its settings in words; a resumed
/// run says what changed in words; the report draws the test accuracy.
#[test]
fn a_run_records_what_trained_in_words_and_its_report_draws_the_accuracy() {
    let dir = folder("record");
    let o = run(
        &dir,
        &words(
            "train digits --epochs 1 --lr 0.003 --warmup-steps 5 --min-lr 0.0001 --clip-grad-norm 2 --run-dir r",
        ),
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let record = json(&dir.join("r/run.json"));
    let optimizer = &record["optimizer"];
    assert_eq!(optimizer["name"], "AdamW", "{optimizer}");
    assert_eq!(optimizer["lr"], 0.003, "the rate --lr set: {optimizer}");
    assert_eq!(optimizer["beta1"], 0.9);
    assert_eq!(optimizer["beta2"], 0.999);
    assert_eq!(optimizer["eps"], 1e-8);
    assert_eq!(optimizer["weight_decay"], 0.0);
    assert_eq!(optimizer["warmup_steps"], 5);
    assert_eq!(optimizer["min_lr"], 0.0001);
    assert_eq!(optimizer["clip_grad_norm"], 2.0);
    // The summary's f32 figures as their shortest decimals, not the f64 they widen to
    // (`1.3490835`, never `1.3490835428237915`).
    let summary = json(&dir.join("r/summary.json"));
    for figure in [
        &summary["training_loss"],
        &summary["best_eval_loss"],
        &summary["last_evaluation"]["loss"],
        &summary["last_evaluation"]["accuracy"],
    ] {
        let v = figure.as_f64().unwrap();
        assert_eq!(figure.to_string(), (v as f32).to_string(), "{summary}");
    }
    let config = &record["config"];
    assert_eq!(config["length"], "1 epoch");
    assert_eq!(config["checkpointing"], "auto");
    assert_eq!(config["leak_policy"], "warn");
    assert_eq!(config["allocator"], "caching");
    let text = record.to_string();
    for debug in ["Config {", "Epochs(", "WarmupCosine", "Automatic", "Relu"] {
        assert!(!text.contains(debug), "{debug} in run.json: {text}");
    }
    let model = record["model"].as_str().unwrap();
    assert!(model.contains("AdamW lr 0.003"), "{model}");

    let o = run(&dir, &["train", "digits", "--resume", "r", "--epochs", "2"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let changed = out
        .lines()
        .find(|l| l.starts_with("changed"))
        .unwrap_or_else(|| panic!("no change said: {out}"));
    assert!(changed.contains("length 1 epoch -> 2 epochs"), "{changed}");
    assert!(
        !changed.contains('"') && !changed.contains("{ "),
        "{changed}"
    );

    let o = run(&dir, &["report", "r"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let html = std::fs::read_to_string(dir.join("r/report.html")).unwrap();
    assert!(
        html.contains(r#"<canvas id="accuracy""#),
        "no accuracy chart"
    );
    // Two evaluations (one per epoch) after steps 23 and 46, with their accuracy.
    let start = html
        .find(r#""accuracy":[[23.0,1.0,"#)
        .expect("the accuracy data");
    assert!(
        html[start..].contains("[46.0,2.0,"),
        "the second epoch's accuracy"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Removes terminal escape sequences (`ESC [ ... letter`).
fn strip_escapes(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// On a terminal (a pseudo-terminal from util-linux's `script`), the memory plan printed above
/// the progress bar is lines of its own: each row ended, none padded into the next.
#[test]
fn lines_above_the_progress_bar_are_ended_on_a_terminal() {
    let dir = folder("pty");
    let command = format!(
        "{} train digits --epochs 1 --run-dir r",
        env!("CARGO_BIN_EXE_plimsoll")
    );
    let child = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("`script` (util-linux) runs the command on a pseudo-terminal; install util-linux");
    let o = finish(child, &["script", "-qfec", &command]);
    let raw = stdout(&o);
    assert!(o.status.success(), "{raw}{}", stderr(&o));
    // What a terminal shows of each line: the text after its last carriage return.
    let shown: Vec<String> = strip_escapes(&raw)
        .split('\n')
        .map(|l| {
            l.trim_end_matches('\r')
                .rsplit('\r')
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    let plan = shown
        .iter()
        .position(|l| l.starts_with("memory plan"))
        .unwrap_or_else(|| panic!("no line starts with the memory plan: {shown:#?}"));
    assert!(
        shown[plan + 1].starts_with("  checkpointing"),
        "the plan's table header is not a line of its own: {shown:#?}"
    );
    // The bar's own line is padded to the width (it is redrawn in place), and so are the
    // memory summary's boxed rows (`| ... |`); no other line is.
    for line in shown
        .iter()
        .filter(|l| !l.starts_with('[') && !l.starts_with('|'))
    {
        assert!(
            !line.contains(&" ".repeat(30)),
            "a line padded with spaces instead of ended: {line:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A batch whose sample indices alone would not fit in host memory is a typed error (exit 1,
/// what, how much and what is available), never the allocator's abort (134), in `plan` and in
/// `train`, and a refused `train` leaves no run folder.
#[test]
fn a_batch_too_large_for_host_memory_is_refused_not_aborted() {
    let dir = folder("huge-batch");
    for args in [
        "plan resnet50 --image 224 --batch 100000000000 --memory-budget 24GiB",
        "train resnet18 --image 32 --batch 40000000000 --steps 1",
    ] {
        let o = run(&dir, &words(args));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args}: {err}");
        assert!(
            err.contains("sample indices needs") && err.contains("available"),
            "{args}: {err}"
        );
    }
    assert!(!dir.join("runs").exists());
}

/// A negative number after its flag gets the flag's own message, as `--flag=-1` does (clap took
/// `-1` for an unknown flag: "unexpected argument '-1'"), and a flag's advice is its own
/// (`--val-fraction 0` was told "1e-3 is usual", the learning rate's).
#[test]
fn a_negative_value_gets_its_flags_message_and_advice_is_the_flags_own() {
    let dir = folder("negative");
    for (apart, joined) in [
        ("train digits --lr -1", "train digits --lr=-1"),
        (
            "train shakespeare --width -3",
            "train shakespeare --width=-3",
        ),
        ("train digits --epochs -inf", "train digits --epochs=-inf"),
    ] {
        let (a, j) = (run(&dir, &words(apart)), run(&dir, &words(joined)));
        assert_eq!(a.status.code(), Some(2), "{apart}: {}", stderr(&a));
        assert_eq!(stderr(&a), stderr(&j), "{apart} against {joined}");
        assert!(
            !stderr(&a).contains("unexpected argument"),
            "{}",
            stderr(&a)
        );
    }
    let o = run(
        &dir,
        &words("prepare shakespeare --tokenizer char --out x --val-fraction 0"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--val-fraction"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("1e-3"), "{}", stderr(&o));
    assert!(!dir.join("runs").exists() && !dir.join("x").exists());
}
