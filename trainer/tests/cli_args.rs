//! Arguments that are not UTF-8 (a file name in another encoding) never panic the `plimsoll`
//! command: a path flag takes them as they are; a run that would have to record one in its
//! `run.json` refuses it, before writing anything, with a message that says what to do; any
//! other flag answers with clap's usage error.

#![allow(clippy::unwrap_used)]

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// A name that is not UTF-8: `run-\xff`.
fn not_utf8() -> OsString {
    OsStr::from_bytes(b"run-\xff").to_os_string()
}

/// A fresh, empty folder for one test.
fn folder(name: &str) -> PathBuf {
    plimsoll_kernels_wgsl::testing::fresh_dir("args", name)
}

/// `plimsoll <args>` in `dir`, to its end (none of these gets as far as opening a device).
fn plimsoll(dir: &PathBuf, args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plimsoll"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The command failed with `code` (not 101, a panic) and said `words` on standard error.
fn assert_refused(out: &Output, codes: &[i32], words: &[&str], what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    assert!(
        code.is_some_and(|c| codes.contains(&c)),
        "{what}: exit {code:?}, not one of {codes:?}:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{what}:\n{stderr}");
    for word in words {
        assert!(stderr.contains(word), "{what}: no {word:?} in:\n{stderr}");
    }
}

#[test]
fn runs_takes_a_path_that_is_not_utf8() {
    let dir = folder("runs");
    let name = not_utf8();
    let missing = plimsoll(&dir, &["runs".as_ref(), &name]);
    assert_refused(&missing, &[1], &["is not a directory"], "runs (missing)");
    // The folder exists: it is listed like any other.
    std::fs::create_dir(dir.join(&name)).unwrap();
    let empty = plimsoll(&dir, &["runs".as_ref(), &name]);
    assert!(
        empty.status.success(),
        "{}",
        String::from_utf8_lossy(&empty.stderr)
    );
    assert!(String::from_utf8_lossy(&empty.stdout).starts_with("no runs in run-"));
    let _ = std::fs::remove_dir_all(dir);
}

/// `--run-dir` and `--data` are recorded in `run.json` (the data's path, to resume the run):
/// a name that is not UTF-8 is refused with what to do, and no run directory is left behind.
#[test]
fn train_refuses_a_run_dir_or_data_that_run_json_cannot_record() {
    let dir = folder("train");
    let name = not_utf8();
    // The data file exists: only its name is the problem.
    std::fs::write(dir.join(&name), b"").unwrap();
    let mut inline = OsString::from("--run-dir=");
    inline.push(&name);
    let cases: [(&[&OsStr], &str); 3] = [
        (&["--run-dir".as_ref(), &name], "--run-dir"),
        (&[&inline], "--run-dir"),
        (&["--data".as_ref(), &name], "--data"),
    ];
    for (args, flag) in cases {
        let argv = [&["train".as_ref(), "digits".as_ref()], args].concat();
        let out = plimsoll(&dir, &argv);
        assert_refused(&out, &[1, 2], &[flag, "not valid UTF-8", "rename"], flag);
        assert!(!dir.join("runs").exists(), "{flag}: nothing is written");
        assert!(!dir.join(&name).is_dir(), "{flag}: no run directory");
    }
    // A UTF-8 `--data` whose absolute path is not (the working directory's name): the same.
    let inside = dir.join(OsStr::from_bytes(b"cwd-\xfe")).join("work");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::write(inside.join("data.csv.gz"), b"").unwrap();
    let out = plimsoll(
        &inside,
        &["train", "digits", "--data", "data.csv.gz"].map(OsStr::new),
    );
    assert_refused(
        &out,
        &[1, 2],
        &["--data", "not valid UTF-8"],
        "relative --data",
    );
    assert!(
        !inside.join("runs").exists(),
        "relative --data: nothing is written"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Flags that take text, and the command's own words, answer with clap's usage error; a
/// command that records nothing takes the path (here a data file that is not there).
#[test]
fn other_arguments_that_are_not_utf8_are_usage_errors() {
    let dir = folder("usage");
    let name = not_utf8();
    // (arguments, what clap says): an unknown subcommand, or a value that is not UTF-8.
    let cases: [(&[&OsStr], &str); 4] = [
        (&[&name], "unrecognized subcommand"),
        (&["train".as_ref(), &name], "unrecognized subcommand"),
        (&["sample".as_ref(), "--prompt".as_ref(), &name], "UTF-8"),
        (
            &[
                "train".as_ref(),
                "digits".as_ref(),
                "--adapter".as_ref(),
                &name,
            ],
            "UTF-8",
        ),
    ];
    for (args, says) in cases {
        let out = plimsoll(&dir, args);
        assert_refused(&out, &[2], &[says], &format!("{args:?}"));
    }
    let plan = plimsoll(
        &dir,
        &["plan".as_ref(), "digits".as_ref(), "--data".as_ref(), &name],
    );
    assert_refused(&plan, &[1, 2], &["run-"], "plan --data");
    let _ = std::fs::remove_dir_all(dir);
}
