//! Token folders through the command, as a user meets them: `plimsoll prepare` makes one,
//! `plimsoll train gpt --data DIR` trains on it and `sample` decodes with its tokenizer; a
//! folder whose files changed is refused at resume unless `--data` is given again; a
//! `--tokenizer` that contradicts the folder, and a context longer than a split, are refused
//! before the device opens.

#![allow(clippy::unwrap_used)]

mod common;

use common::cli::*;
use std::path::Path;

/// A tiny GPT on `data`, `steps` steps, in run directory `run`.
fn tiny_gpt_args<'a>(data: &'a str, steps: &'a str, run: &'a str) -> Vec<&'a str> {
    let mut args = vec![
        "train", "gpt", "--data", data, "--steps", steps, "--batch", "2",
    ];
    args.extend(["--context", "8", "--eval-every", "1", "--eval-windows", "2"]);
    args.extend(["--micro-batch", "2", "--checkpointing", "none"]);
    args.extend(["--memory-timeline", "off", "--run-dir", run]);
    args.extend(ONE_BLOCK_GPT_ARGS);
    args
}

fn write_text(dir: &Path) {
    let text: String = (0..400)
        .map(|i| format!("line {i}: the quick brown fox, said she.\n"))
        .collect();
    std::fs::write(dir.join("text.txt"), text).unwrap();
}

#[test]
fn a_prepared_folder_trains_samples_and_is_refused_once_changed() {
    let dir = folder("cli-data", "folder");
    write_text(&dir);
    let o = run(
        &dir,
        &["prepare", "text.txt", "--tokenizer", "char", "--out", "tok"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("train on it: plimsoll train gpt --data tok"),
        "{}",
        text(&o)
    );
    let o = run(&dir, &tiny_gpt_args("tok", "2", "r"));
    assert!(o.status.success(), "{}", text(&o));
    let record = json(&dir.join("r/run.json"));
    assert_eq!(record["tokenizer"]["name"], "char", "{record}");
    assert!(
        text(&o).contains("host memory: the data loader's batches took at most"),
        "{}",
        text(&o)
    );
    // Sample decodes with the folder's characters.
    let o = run(
        &dir,
        &["sample", "--run", "r", "--tokens", "20", "--prompt", "line"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let sampled = String::from_utf8_lossy(&o.stdout);
    let vocab = "line0123456789: thequickbrownfox,saids.\n";
    assert!(sampled.starts_with("line"), "{sampled:?}");
    assert!(sampled.chars().all(|c| vocab.contains(c)), "{sampled:?}");
    // The same size, other tokens: the fingerprint changes, and resuming is refused.
    let val = dir.join("tok/val.bin");
    let mut bytes = std::fs::read(&val).unwrap();
    bytes.swap(0, 2);
    bytes.swap(1, 3);
    if bytes == std::fs::read(&val).unwrap() {
        bytes.swap(0, 4);
    }
    std::fs::write(&val, bytes).unwrap();
    let o = run(&dir, &["train", "gpt", "--resume", "r", "--steps", "3"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("data changed"), "{}", text(&o));
    assert!(text(&o).contains("--data"), "{}", text(&o));
    let o = run(&dir, &words("train gpt --resume r --steps 3 --data tok"));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(json(&dir.join("r/summary.json"))["steps"], 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn contradicting_flags_and_short_splits_are_refused_before_the_device_opens() {
    let dir = folder("cli-data", "refusals");
    write_text(&dir);
    let o = run(
        &dir,
        &["prepare", "text.txt", "--tokenizer", "char", "--out", "tok"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let mut args = tiny_gpt_args("tok", "1", "r");
    args.extend(["--tokenizer", "gpt2"]);
    let o = run(&dir, &args);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let said = text(&o);
    assert!(
        said.contains("holds char tokens") && said.contains("--tokenizer"),
        "{said}"
    );
    // A context longer than val.bin (10% of about 16,000 tokens).
    let mut args = tiny_gpt_args("tok", "1", "r");
    let at = args.iter().position(|a| *a == "8").unwrap();
    args[at] = "5000";
    let o = run(&dir, &args);
    assert!(!o.status.success());
    let said = text(&o);
    assert!(
        said.contains("--context") && said.contains("val.bin"),
        "{said}"
    );
    assert!(!dir.join("r").exists(), "nothing written for a refused run");
    // Preparing into a folder that has token files is refused without --force.
    let o = run(
        &dir,
        &["prepare", "text.txt", "--tokenizer", "gpt2", "--out", "tok"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--force"), "{}", text(&o));
    // A text past 1 GiB is not read whole by --data FILE (a sparse file: nothing is written).
    let huge = std::fs::File::create(dir.join("huge.txt")).unwrap();
    huge.set_len((1 << 30) + 1).unwrap();
    let o = run(&dir, &tiny_gpt_args("huge.txt", "1", "r"));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("plimsoll prepare huge.txt --tokenizer char"),
        "{}",
        text(&o)
    );
    assert!(!dir.join("r").exists(), "nothing written for a refused run");
    let o = run(
        &dir,
        &["prepare", "nope.txt", "--tokenizer", "gpt2", "--out", "x"],
    );
    assert!(
        !o.status.success() && text(&o).contains("nope.txt"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
