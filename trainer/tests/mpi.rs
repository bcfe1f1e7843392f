//! Data-parallel training over MPI, through `mpirun` and the `plimsoll` command as a user runs
//! them (feature `mpi`; needs Open MPI's `mpirun` on the path, which `.ci/run` installs).
//!
//! - 2 ranks on a batch equal 1 process on the same batch (parameters within 1e-5 relative,
//!   per tensor) after 5 steps, for the MLP and a tiny GPT, with even and uneven shards;
//! - a killed rank: the survivor names it within the deadline, saves the last good state and
//!   exits non-zero.

#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

mod common;

use common::cli::{ONE_BLOCK_GPT_ARGS, words};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use plimsoll_kernels_wgsl::testing::fresh_dir;

const BIN: &str = env!("CARGO_BIN_EXE_plimsoll");

/// A fresh, empty folder for one test.
fn folder(name: &str) -> PathBuf {
    fresh_dir("mpi", name)
}

/// `mpirun` with what a test machine needs: running as root allowed (CI runs as root), more
/// ranks than cores allowed, and a dead rank reported by the others (`--enable-recovery`).
fn mpirun(ranks: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--enable-recovery", "--oversubscribe", "-np"])
        .arg(ranks.to_string())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null());
    c
}

/// The binary on one process, or under `mpirun` on `ranks` of them.
fn plimsoll_on(ranks: usize) -> Command {
    match ranks {
        1 => Command::new(BIN),
        n => {
            let mut c = mpirun(n);
            c.arg(BIN);
            c
        }
    }
}

fn check(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// [`check`], and that the run in `run` ended well: with `--enable-recovery`, `mpirun` exits 0
/// even when a rank fails, but the run's `summary.json` says `failed`.
fn check_run(output: &Output, what: &str, run: &Path) {
    check(output, what);
    let summary = std::fs::read_to_string(run.join("summary.json")).unwrap_or_default();
    assert!(
        !summary.contains("\"failed\""),
        "{what}: {summary}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `plimsoll train <args> --run-dir <dir>/one` on one process; returns the run directory.
fn one_process(dir: &Path, args: &[&str]) -> PathBuf {
    let one = dir.join("one");
    let output = Command::new(BIN)
        .args(["train"])
        .args(args)
        .arg("--run-dir")
        .arg(&one)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    check(&output, "one process");
    one
}

/// `plimsoll train <args> --run-dir <dir>/<name>` on one process and under `mpirun -np
/// ranks`; returns the two run directories.
fn one_and_many(dir: &Path, ranks: usize, args: &[&str]) -> (PathBuf, PathBuf) {
    let one = one_process(dir, args);
    let many = dir.join("many");
    let output = mpirun(ranks)
        .arg(BIN)
        .arg("train")
        .args(args)
        .arg("--run-dir")
        .arg(&many)
        .output()
        .unwrap();
    check_run(&output, "mpirun", &many);
    (one, many)
}

/// Relative differences `|a - b| / |a|` (Euclidean norms) between two exported models, which
/// must hold the same tensors: over all parameters, and the worst tensor with its name.
fn relative_differences(a: &Path, b: &Path) -> (f64, f64, String) {
    let a = plimsoll_trainer::nn::state::load(&a.join("model.safetensors")).unwrap();
    let b = plimsoll_trainer::nn::state::load(&b.join("model.safetensors")).unwrap();
    assert_eq!(
        a.tensors.keys().collect::<Vec<_>>(),
        b.tensors.keys().collect::<Vec<_>>()
    );
    let (mut diff_all, mut norm_all) = (0.0f64, 0.0f64);
    let mut worst = (0.0f64, String::new());
    for (name, x) in &a.tensors {
        let y = &b.tensors[name];
        assert_eq!(x.shape, y.shape, "{name}");
        let diff: f64 = x
            .data
            .iter()
            .zip(&y.data)
            .map(|(p, q)| f64::from(p - q).powi(2))
            .sum();
        let norm: f64 = x.data.iter().map(|p| f64::from(*p).powi(2)).sum();
        (diff_all, norm_all) = (diff_all + diff, norm_all + norm);
        let relative = (diff / norm.max(1e-24)).sqrt();
        if relative >= worst.0 {
            worst = (relative, name.clone());
        }
    }
    ((diff_all / norm_all.max(1e-24)).sqrt(), worst.0, worst.1)
}

/// The step lines of a run's metrics.
fn steps(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .collect()
}

fn assert_same_training(one: &Path, many: &Path, ranks: u64) {
    let (a, b) = (steps(one), steps(many));
    assert_eq!(a.len(), 5);
    assert_eq!(b.len(), 5);
    for (x, y) in a.iter().zip(&b) {
        let (lx, ly) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
        assert!((lx - ly).abs() <= 1e-5 * lx.abs(), "loss {lx} vs {ly}");
        assert_eq!(y["ranks"].as_u64(), Some(ranks));
        assert!(y["allreduce_bytes"].as_u64().unwrap() > 0);
        assert_eq!(x["allreduce_bytes"].as_u64(), Some(0));
    }
    // The model within 1e-5; each tensor within 1e-4. Not every tensor within 1e-5: the GPT's
    // key bias (a third of `c_attn.bias`) has a gradient that is zero in exact arithmetic
    // (softmax ignores a shift shared by every key), so it is rounding noise that AdamW
    // normalises into steps of its own. The order of a sum changes that noise: one process
    // with `--micro-batch 32` against 64 moves that tensor by 2.0e-5 too.
    // Evaluations (the GPT's, at the end): each rank evaluates its shard, the sums are added.
    let evals = |run: &Path| -> Vec<(f64, u64)> {
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|v| {
                Some((
                    v.get("eval_loss")?.as_f64()?,
                    v.get("eval_samples")?.as_u64()?,
                ))
            })
            .collect()
    };
    let (ea, eb) = (evals(one), evals(many));
    assert_eq!(ea.len(), eb.len());
    for ((la, na), (lb, nb)) in ea.iter().zip(&eb) {
        assert_eq!(na, nb, "evaluated samples");
        assert!((la - lb).abs() <= 1e-5 * la.abs(), "eval loss {la} vs {lb}");
    }
    let (all, worst, name) = relative_differences(one, many);
    assert!(all <= 1e-5, "the parameters differ by {all:e} (relative)");
    assert!(worst <= 1e-4, "{name} differs by {worst:e} (relative)");
    // Every rank's memory summary is gathered into rank 0's run directory.
    let summaries = std::fs::read_to_string(many.join("memory_summary.txt")).unwrap();
    for r in 0..ranks {
        assert!(summaries.contains(&format!("rank {r}:\n")), "{summaries}");
    }
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(many.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["ranks"].as_u64(), Some(ranks));
}

const MLP: [&str; 7] = ["mlp-bench", "--steps", "5", "--layers", "1", "--seed", "3"];

/// The one-layer MLP at batch 64, as the kill and resume tests train it.
const MLP_BATCH_64: [&str; 5] = ["mlp-bench", "--layers", "1", "--batch", "64"];

/// Runs `args` in one process and on two ranks in `folder(name)`, runs `check` on the two-rank
/// run's directory, asserts both trained alike ([`assert_same_training`]), then removes the
/// folder.
fn two_ranks_as_one(name: &str, args: &[&str], check: impl FnOnce(&Path)) {
    let dir = folder(name);
    let (one, many) = one_and_many(&dir, 2, args);
    check(&many);
    assert_same_training(&one, &many, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_ranks_train_the_mlp_as_one_process_does() {
    let args: Vec<&str> = MLP.iter().copied().chain(["--batch", "64"]).collect();
    two_ranks_as_one("mlp", &args, |_| {});
}

#[test]
fn uneven_shards_train_the_mlp_as_one_process_does() {
    let args: Vec<&str> = MLP.iter().copied().chain(["--batch", "63"]).collect();
    two_ranks_as_one("mlp-uneven", &args, |_| {});
}

/// A GPT of one block, width 32, on the bundled plays.
fn gpt(batch: &str) -> Vec<&str> {
    let mut args = vec![
        "shakespeare",
        "--steps",
        "5",
        "--batch",
        batch,
        "--context",
        "16",
    ];
    args.extend(ONE_BLOCK_GPT_ARGS);
    args.extend(["--eval-windows", "9", "--eval-every", "5"]);
    args
}

#[test]
fn two_ranks_train_a_tiny_gpt_as_one_process_does() {
    two_ranks_as_one("gpt", &gpt("64"), |many| {
        // The run ends with an evaluation, which `assert_same_training` compares.
        let metrics = std::fs::read_to_string(many.join("metrics.jsonl")).unwrap();
        assert!(metrics.contains("eval_loss"), "{metrics}");
    });
}

#[test]
fn uneven_shards_train_a_tiny_gpt_as_one_process_does() {
    two_ranks_as_one("gpt-uneven", &gpt("63"), |_| {});
}

#[test]
fn a_killed_rank_is_named_by_the_survivor_within_the_deadline_with_a_checkpoint() {
    let dir = folder("killed");
    let deadline_ms = 3000;
    // Each rank's pid and exit status land in files (mpirun's own status is not the ranks').
    let script = r#"R=$OMPI_COMM_WORLD_RANK; "$0" "$@" 2> "stderr.$R" & echo $! > "pid.$R"; wait $!; echo $? > "rc.$R""#;
    let mut child = mpirun(2)
        .args(["sh", "-c", script, BIN, "train"])
        .args(MLP_BATCH_64)
        .args(words("--steps 100000 --checkpoint-every 5 --run-dir run"))
        .args(["--deadline-ms", &deadline_ms.to_string()])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for rank 0 to save at step 10 or later.
    let start = Instant::now();
    loop {
        let saved = plimsoll_trainer::nn::state::metadata(&dir.join("run/latest.safetensors"))
            .ok()
            .and_then(|m| m.get("step").and_then(|s| s.parse::<u64>().ok()));
        if saved.is_some_and(|s| s >= 10) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "no step 10 in 300 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = std::fs::read_to_string(dir.join("pid.1")).unwrap();
    let killed = Instant::now();
    let status = Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap();
    assert!(status.success());
    // The survivor's exit status appears once it has given up.
    let rc = loop {
        if let Ok(rc) = std::fs::read_to_string(dir.join("rc.0"))
            && !rc.trim().is_empty()
        {
            break rc;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(120),
            "rank 0 did not give up"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let gave_up = killed.elapsed();
    let _ = child.wait();
    let stderr = std::fs::read_to_string(dir.join("stderr.0")).unwrap();
    assert_ne!(rc.trim(), "0", "{stderr}");
    // Killed before the step's all-reduce, or inside it.
    assert!(
        stderr.contains("rank 1 (its last call was in step")
            && (stderr.contains("never reached it")
                || stderr.contains("reached it but no longer answers (dead or hung)")),
        "{stderr}"
    );
    // Within the deadline from the kill (the step may have started just before it), plus
    // saving the last good state and ending the job.
    eprintln!("rank 0 gave up {gave_up:?} after the kill");
    assert!(
        gave_up < Duration::from_millis(deadline_ms + 3000),
        "{gave_up:?}\n{stderr}"
    );
    assert!(stderr.contains("the last good state (step"), "{stderr}");
    let summary = std::fs::read_to_string(dir.join("run/summary.json")).unwrap();
    assert!(summary.contains("failed"), "{summary}");
    // The checkpoint holds a finished step (the one before the step that failed).
    let step: u64 = plimsoll_trainer::nn::state::metadata(&dir.join("run/latest.safetensors"))
        .unwrap()["step"]
        .parse()
        .unwrap();
    assert!(step >= 10);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_resumes_with_the_same_ranks_and_says_so_when_they_differ() {
    let dir = folder("resume");
    let args: Vec<&str> = MLP.iter().copied().chain(["--batch", "64"]).collect();
    let run = dir.join("run");
    let resume = |ranks: usize, steps: &str| {
        let output = plimsoll_on(ranks)
            .args(["train", "mlp-bench", "--resume"])
            .arg(&run)
            .args(["--steps", steps])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        check(&output, "resume");
        String::from_utf8_lossy(&output.stdout).to_string()
    };
    // 3 steps on 2 ranks, 1 more on 2 ranks, the last on one process.
    let output = mpirun(2)
        .arg(BIN)
        .arg("train")
        .args(MLP_BATCH_64)
        .args(["--seed", "3"])
        .args(["--steps", "3", "--run-dir"])
        .arg(&run)
        .output()
        .unwrap();
    check(&output, "first");
    let same = resume(2, "4");
    assert!(!same.contains("rank(s); it goes on with"), "{same}");
    let fewer = resume(1, "5");
    assert!(
        fewer.contains("the run was trained on 2 rank(s); it goes on with 1"),
        "{fewer}"
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["ranks"].as_u64(), Some(1));
    let resumes = record["resumes"].as_array().unwrap();
    assert_eq!(resumes.len(), 2);
    assert!(resumes[0]["changes"].get("ranks").is_none());
    assert_eq!(resumes[1]["changes"]["ranks"], serde_json::json!([2, 1]));
    // The same 5 steps as one process trains them in one go.
    let one = one_process(&dir, &args);
    let (all, worst, name) = relative_differences(&one, &run);
    assert!(
        all <= 1e-5 && worst <= 1e-4,
        "{name}: {worst:e}, all {all:e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each rank's optimizer state (the memory summary's `optimizer_state`, current), in rank
/// order, from a run directory's gathered `memory_summary.txt`.
fn optimizer_bytes_per_rank(run: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(run.join("memory_summary.txt")).unwrap();
    text.lines()
        .filter(|l| {
            l.trim_start_matches('|')
                .trim_start()
                .starts_with("optimizer_state ")
        })
        .map(|l| {
            let current = l.split('|').nth(2).unwrap().trim();
            let (number, unit) = current.split_once(' ').unwrap();
            let scale = match unit {
                "B" => 1.0,
                "KiB" => 1024.0,
                "MiB" => 1024.0 * 1024.0,
                other => panic!("unit {other}"),
            };
            number.parse::<f64>().unwrap() * scale
        })
        .collect()
}

/// ZeRO stages 1 and 2 (`--shard optimizer|gradients`) on 2 ranks train the tiny GPT as one
/// process does (the same bounds as without sharding), and each rank keeps about half of the
/// optimizer state (as allocated): together one process's, each at most 53% of it (the cut is
/// at a row; the allocator's blocks may hold a few bytes more than asked).
#[test]
fn sharded_state_on_two_ranks_trains_a_tiny_gpt_as_one_process_with_half_the_state_each() {
    for (shard, batch) in [("optimizer", "64"), ("gradients", "63")] {
        let mut args = gpt(batch);
        args.extend(["--shard", shard]);
        let dir = folder(&format!("shard-{shard}"));
        let (one, many) = one_and_many(&dir, 2, &args);
        assert_same_training(&one, &many, 2);
        let whole = optimizer_bytes_per_rank(&one)[0];
        let each = optimizer_bytes_per_rank(&many);
        assert_eq!(each.len(), 2, "{each:?}");
        let total: f64 = each.iter().sum();
        eprintln!("--shard {shard}: one process {whole} B; per rank {each:?} B allocated");
        // Allocated blocks may hold a few bytes more than asked (a remainder too small to
        // split off stays with its block, which depends on the layout): within 3%.
        assert!(
            (total - whole).abs() <= 0.03 * whole,
            "--shard {shard}: the ranks keep {total} B of {whole} B"
        );
        for (r, bytes) in each.iter().enumerate() {
            assert!(
                *bytes <= 0.53 * whole,
                "--shard {shard}: rank {r} keeps {bytes} B of {whole} B"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A sharded run's checkpoint holds the whole optimizer state: 2 steps on one process (its
/// micro-batch, 64, is more than a rank's 32 samples), then on 2 ranks with `--shard
/// gradients` to 3 and again to 4, the last on one process, equal 5 steps of one process in one
/// go. (Resuming on more ranks had refused the saved micro-batch.)
#[test]
fn a_sharded_run_checkpoints_the_whole_state_and_resumes_on_other_ranks() {
    let dir = folder("shard-resume");
    // A constant learning rate: the schedule does not depend on the run's length.
    let mut args = vec!["shakespeare", "--batch", "64", "--context", "16"];
    args.extend(["--warmup-steps", "0", "--lr", "1e-3", "--min-lr", "1e-3"]);
    args.extend(ONE_BLOCK_GPT_ARGS);
    let run = dir.join("run");
    let output = Command::new(BIN)
        .arg("train")
        .args(&args)
        .args(["--steps", "2", "--run-dir"])
        .arg(&run)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    check(&output, "first");
    let resume = |ranks: usize, steps: &str, shard: &[&str]| {
        let output = plimsoll_on(ranks)
            .args(["train", "shakespeare", "--resume"])
            .arg(&run)
            .args(["--steps", steps])
            .args(shard)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        check_run(&output, "resume", &run);
        // A resume refused before it recorded anything leaves the last summary as it was:
        // the checkpoint's step says whether this one trained.
        let saved = plimsoll_trainer::nn::state::metadata(&run.join("latest.safetensors"));
        assert_eq!(
            saved.unwrap()["step"],
            steps,
            "resume on {ranks} rank(s) to step {steps}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    resume(2, "3", &["--shard", "gradients"]);
    resume(2, "4", &["--shard", "gradients"]);
    resume(1, "5", &["--shard", "none"]);
    args.extend(["--steps", "5"]);
    let one = one_process(&dir, &args);
    let (all, worst, name) = relative_differences(&one, &run);
    assert!(
        all <= 1e-5 && worst <= 1e-4,
        "{name}: {worst:e}, all {all:e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
