//! A run's records at its edges, driven through the `plimsoll` command: a checkpoint that cannot
//! be written leaves a failed run (its records, no temporary file); so does a run stopped by the
//! deadline before step 1; a refused resume writes nothing; a resumed run keeps one record
//! (each step once in `metrics.jsonl`, the first part's timeline kept); a resume after the
//! run's data changed is refused unless `--data` is given again.

#![allow(clippy::unwrap_used)]

mod common;

use common::cli::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A fresh, empty folder for one test.
fn folder(name: &str) -> PathBuf {
    common::cli::folder("records", name)
}

/// The files of `dir` whose names end in `.tmp`.
fn temporary_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

/// The step numbers of `metrics.jsonl`'s step lines (not evaluations, not events).
fn metric_steps(run: &Path) -> Vec<u64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some() && v.get("eval_loss").is_none())
        .map(|v| v["step"].as_u64().unwrap())
        .collect()
}

/// `plimsoll` under a file-size limit of `limit_kb` KiB (`RLIMIT_FSIZE`, set by the shell's
/// `ulimit -f`), with `SIGXFSZ` ignored: a write past the limit fails with `EFBIG` (File too
/// large), as a full disk fails one with `ENOSPC`, without needing root for a small tmpfs.
fn run_with_file_limit(dir: &Path, limit_kb: u64, args: &[&str]) -> Output {
    // POSIX (and dash, Debian's sh) counts `ulimit -f` in 512-byte blocks; bash outside its
    // POSIX mode in KiB, doubling the limit. The caller checks that the limit did bite.
    let script = format!(
        "trap '' XFSZ; ulimit -f {} || exit 99; exec \"$0\" \"$@\"",
        2 * limit_kb
    );
    Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_plimsoll"))
        .args(args)
        .current_dir(dir)
        // Mesa's shader cache is no part of the run; keep its files out of the limit.
        .env("MESA_SHADER_CACHE_DISABLE", "true")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A checkpoint write that fails (the file-size limit is below the checkpoint's size, above
/// the records'): the run fails with a message naming the figures and what is safe, and leaves
/// a run: run.json, metrics.jsonl up to the step, summary.json saying `failed` and why, and no
/// temporary file. `plimsoll runs` lists it.
#[test]
fn a_checkpoint_that_cannot_be_written_leaves_a_failed_run_and_no_temporary_file() {
    let dir = folder("write-fails");
    let o = run_with_file_limit(
        &dir,
        40,
        &[
            "train",
            "digits",
            "--epochs",
            "1",
            "--checkpoint-every",
            "2",
            "--run-dir",
            "r",
        ],
    );
    let said = text(&o);
    assert_ne!(
        o.status.code(),
        Some(99),
        "the shell could not set the limit: {said}"
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "the file-size limit did not make the checkpoint write fail (was it set?): {said}"
    );
    assert!(
        said.contains("latest.safetensors") && said.contains("File too large"),
        "{said}"
    );
    assert!(
        said.contains("no checkpoint"),
        "the message does not say what is safe: {said}"
    );
    let r = dir.join("r");
    for file in ["run.json", "metrics.jsonl", "summary.json"] {
        assert!(r.join(file).is_file(), "{file} is missing: {said}");
    }
    assert_eq!(metric_steps(&r), vec![1, 2]);
    let summary = json(&r.join("summary.json"));
    assert_eq!(summary["status"], "failed", "{summary}");
    assert!(
        summary["error"]
            .as_str()
            .is_some_and(|e| e.contains("latest.safetensors")),
        "{summary}"
    );
    assert_eq!(temporary_files(&r), Vec::<String>::new());
    assert!(!r.join("latest.safetensors").exists());
    let runs = run(&dir, &["runs", "."]);
    assert!(
        text(&runs).contains("r ") && text(&runs).contains("failed"),
        "{}",
        text(&runs)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A deadline no step can meet: step 1 gives up before any checkpoint exists, and the
/// directory is still a run (run.json, summary.json `failed` with the reason) that `runs` lists.
#[test]
fn a_run_stopped_by_the_deadline_before_step_1_is_a_failed_run() {
    let dir = folder("deadline");
    let o = run(
        &dir,
        &words("train digits --epochs 1 --deadline-ms 1 --run-dir r"),
    );
    let said = text(&o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "step 1 met a 1 ms deadline: {said}"
    );
    let r = dir.join("r");
    assert!(r.join("run.json").is_file(), "{said}");
    let summary = json(&r.join("summary.json"));
    assert_eq!(summary["status"], "failed", "{summary}");
    assert!(
        summary["error"]
            .as_str()
            .is_some_and(|e| e.contains("deadline")),
        "{summary}"
    );
    let runs = run(&dir, &["runs", "."]);
    assert!(text(&runs).contains("failed"), "{}", text(&runs));
    let _ = std::fs::remove_dir_all(dir);
}

/// Sets element 0 of the tensor `name` of the safetensors file at `path` to NaN, in place.
fn poison(path: &Path, name: &str) {
    let mut bytes = std::fs::read(path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let start = 8 + header_len;
    let at = header[name]["data_offsets"][0].as_u64().unwrap() as usize + start;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    // As a run that saved a NaN would have written it: the tensors' digest stamped anew (an
    // altered file is refused before its values are looked at; the same length, in place).
    let key = plimsoll_trainer::nn::state::DIGEST_KEY;
    let old = header["__metadata__"][key].as_str().unwrap().to_string();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .map(|(k, v)| {
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let [a, b] = [0, 1].map(|i| v["data_offsets"][i].as_u64().unwrap() as usize + start);
            (k.clone(), shape, bytes[a..b].to_vec())
        })
        .collect();
    let new = plimsoll_trainer::nn::state::tensor_digest(
        tensors
            .iter()
            .map(|(n, s, d)| (n.as_str(), s.as_slice(), d.as_slice())),
    );
    let head = String::from_utf8(bytes[8..start].to_vec())
        .unwrap()
        .replace(&old, &new);
    bytes[8..start].copy_from_slice(head.as_bytes());
    std::fs::write(path, bytes).unwrap();
}

/// A refused resume (a NaN weight) writes nothing: run.json, metrics.jsonl and summary.json
/// are byte for byte as they were, and the next plain `--resume` does not take the refused
/// flags.
#[test]
fn a_refused_resume_writes_nothing() {
    let dir = folder("refused");
    let first = run(
        &dir,
        &["train", "digits", "--epochs", "1", "--run-dir", "r"],
    );
    assert!(first.status.success(), "{}", text(&first));
    let r = dir.join("r");
    let files = ["run.json", "metrics.jsonl", "summary.json"];
    let before: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(r.join(f)).unwrap())
        .collect();
    let latest = r.join("latest.safetensors");
    let good = std::fs::read(&latest).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&good[8..8 + header_len]).unwrap();
    let weight = header
        .as_object()
        .unwrap()
        .keys()
        .find(|k| k.starts_with("param."))
        .unwrap()
        .clone();
    poison(&latest, &weight);
    let refused = run(&dir, &words("train digits --resume r --epochs 2 --lr 0.5"));
    let said = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("Nothing was loaded"), "{said}");
    for (file, bytes) in files.iter().zip(&before) {
        assert!(
            std::fs::read(r.join(file)).unwrap() == *bytes,
            "the refused resume changed {file}: {said}"
        );
    }
    assert_eq!(temporary_files(&r), Vec::<String>::new());
    // The checkpoint mended, a plain resume goes on with the run's own settings.
    std::fs::write(&latest, &good).unwrap();
    let plain = run(&dir, &["train", "digits", "--resume", "r", "--epochs", "2"]);
    assert!(plain.status.success(), "{}", text(&plain));
    let record = json(&r.join("run.json"));
    let args = record["args"].as_array().unwrap();
    assert!(
        !args.iter().any(|a| a == "--lr" || a == "0.5"),
        "the plain resume took the refused flags: {record}"
    );
    assert_eq!(record["resumes"].as_array().unwrap().len(), 1, "{record}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A run killed after its last checkpoint replays the steps since (here: a resumed part runs
/// steps 24-46, then its checkpoint is put back to the one of step 23, as a kill before the
/// final save leaves it). Resumed again, `metrics.jsonl` reads as one run: every step once.
/// The first part's memory timeline (steps 20-23) is kept, not overwritten by the later parts'.
#[test]
fn a_resumed_run_keeps_one_record() {
    let dir = folder("one-record");
    let first = run(
        &dir,
        &words("train digits --epochs 1 --checkpoint-every 5 --memory-timeline 20-30 --run-dir r"),
    );
    assert!(first.status.success(), "{}", text(&first));
    let r = dir.join("r");
    let step_23 = std::fs::read(r.join("latest.safetensors")).unwrap();
    let second = run(&dir, &["train", "digits", "--resume", "r", "--epochs", "2"]);
    assert!(second.status.success(), "{}", text(&second));
    assert_eq!(metric_steps(&r), (1..=46).collect::<Vec<_>>());
    std::fs::write(r.join("latest.safetensors"), step_23).unwrap();
    let third = run(&dir, &["train", "digits", "--resume", "r", "--epochs", "2"]);
    assert!(third.status.success(), "{}", text(&third));
    assert_eq!(
        metric_steps(&r),
        (1..=46).collect::<Vec<_>>(),
        "steps 24-46 were replayed: each must appear once"
    );
    let timeline = json(&r.join("memory_timeline.json"));
    assert_eq!(
        timeline["span"],
        serde_json::json!({"first": 20, "last": 23}),
        "the first part's timeline was overwritten"
    );
    let later = std::fs::read_dir(&r)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("memory_timeline") && n.ends_with(".json"))
        .count();
    assert_eq!(later, 3, "one timeline per part");
    let _ = std::fs::remove_dir_all(dir);
}

/// The run's data file changed: a resume without `--data` is refused (as `eval` refuses) and
/// writes nothing; with `--data` given again it goes on, and run.json records the change.
#[test]
fn resuming_after_the_data_changed_needs_data_again() {
    use std::io::{Read, Write};
    let dir = folder("data-changed");
    let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/digits.csv.gz");
    let data = dir.join("d.csv.gz");
    std::fs::copy(&bundled, &data).unwrap();
    let first = run(
        &dir,
        &words("train digits --epochs 1 --data d.csv.gz --run-dir r"),
    );
    assert!(first.status.success(), "{}", text(&first));
    // The same digits less the last 100 rows.
    let mut csv = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&bundled).unwrap())
        .read_to_string(&mut csv)
        .unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all((lines[..lines.len() - 100].join("\n") + "\n").as_bytes())
        .unwrap();
    std::fs::write(&data, gz.finish().unwrap()).unwrap();
    let r = dir.join("r");
    let record = std::fs::read(r.join("run.json")).unwrap();
    let refused = run(&dir, &["train", "digits", "--resume", "r", "--epochs", "2"]);
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("data changed"), "{said}");
    assert!(std::fs::read(r.join("run.json")).unwrap() == record);
    let eval = run(&dir, &["eval", "r"]);
    assert!(text(&eval).contains("data changed"), "{}", text(&eval));
    let accepted = run(
        &dir,
        &words("train digits --resume r --epochs 2 --data d.csv.gz"),
    );
    assert!(accepted.status.success(), "{}", text(&accepted));
    let record = json(&r.join("run.json"));
    assert!(
        record["resumes"][0]["changes"].get("data").is_some(),
        "{record}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
