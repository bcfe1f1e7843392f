//! `plimsoll sample` as a user meets it without a terminal: the text arrives on the pipe as it
//! is made, not at the end; SIGINT and SIGTERM stop it with 130 and 143 and keep what was
//! printed; `--temperature 0` is greedy (the same text whatever the seed: the arg-max, as
//! `--top-k 1`); a negative temperature is a usage error.
//!
//! One tiny `shakespeare` run (1 layer, width 16, context 8, one step) is trained once and
//! shared by the tests that sample.

#![allow(clippy::unwrap_used)]

mod common;

use common::cli::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

/// How long the command may take to print its first line (opening the device, loading the
/// checkpoint, the plan and the first forwards: seconds on lavapipe) or to stop once asked.
const DEADLINE: Duration = Duration::from_secs(180);

/// Characters asked for when the test stops the command itself: far more than it makes in the
/// test's time.
const ENDLESS: &str = "10000000";

/// The folder of the shared run (`ck` inside it), trained on first use.
fn trained() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("plimsoll-cli-sample-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        output_ok(
            plimsoll(&dir)
                .args(["train", "shakespeare", "--steps", "1", "--batch", "2"])
                .args(words("--context 8 --layers 1 --heads 1 --width 16"))
                .args(words("--eval-every 1 --eval-windows 1 --micro-batch 2"))
                .args(["--checkpointing", "none", "--memory-timeline", "off"])
                .args(["--run-dir", "ck"]),
        );
        dir
    })
}

/// `plimsoll sample --run ck <args>` in the shared run's folder, stdout and stderr piped.
fn sample(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_plimsoll"));
    c.args(["sample", "--run", "ck"])
        .args(args)
        .current_dir(trained())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Reads `stdout` on a thread: each line as it arrives, then `None` at its end.
fn lines_of(stdout: ChildStdout) -> mpsc::Receiver<Option<String>> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(n) if n > 0 => {
                    if send.send(Some(line)).is_err() {
                        return;
                    }
                }
                _ => {
                    let _ = send.send(None);
                    return;
                }
            }
        }
    });
    receive
}

/// The next line, within [`DEADLINE`]; fails (killing `child`) when the output ended or
/// nothing came.
fn next_line(child: &mut Child, lines: &mpsc::Receiver<Option<String>>) -> String {
    match lines.recv_timeout(DEADLINE) {
        Ok(Some(line)) => line,
        Ok(None) => {
            let status = child.wait().unwrap();
            panic!(
                "the output ended before a line came ({status}):\n{}",
                stderr_of(child)
            );
        }
        Err(_) => {
            let _ = child.kill();
            panic!("no line within {DEADLINE:?}: the text is not printed as it is made");
        }
    }
}

/// Sends `signal` (`INT`, `TERM`) to `child`.
fn send(signal: &str, child: &Child) {
    let kill = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
}

/// With far more characters asked for than it can make in the test's time, the first lines
/// (the prompt's, then one made wholly of sampled characters) arrive while the command is
/// still running.
#[test]
fn the_text_arrives_while_it_is_made() {
    let mut child = sample(&["--tokens", ENDLESS, "--prompt", "KING"])
        .spawn()
        .unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    let first = next_line(&mut child, &lines);
    let second = next_line(&mut child, &lines);
    let running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(first.starts_with("KING"), "{first:?}");
    assert!(second.ends_with('\n'), "{second:?}");
    assert!(running, "the command had ended: the lines came at its end");
}

/// SIGTERM and SIGINT while sampling: exit 143 and 130, the text printed so far kept (the
/// prompt and at least a line of sampled characters), ending with a newline, and a note on
/// standard error saying after how many characters.
#[test]
fn sigterm_and_sigint_stop_sampling_with_143_and_130_and_keep_the_text() {
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let mut child = sample(&["--tokens", ENDLESS, "--prompt", "KING"])
            .spawn()
            .unwrap();
        let lines = lines_of(child.stdout.take().unwrap());
        let mut text = next_line(&mut child, &lines);
        text += &next_line(&mut child, &lines);
        send(signal, &child);
        let status = wait_with_deadline(&mut child, DEADLINE);
        let stderr = stderr_of(&mut child);
        while let Ok(Some(line)) = lines.recv_timeout(DEADLINE) {
            text += &line;
        }
        assert_eq!(status.code(), Some(code), "SIG{signal}:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            stderr.contains(" characters") && stderr.contains(" after "),
            "it says how much it made:\n{stderr}"
        );
        assert!(text.starts_with("KING"), "{text:?}");
        assert!(text.chars().count() > "KING\n".len(), "{text:?}");
        assert!(text.ends_with('\n'), "the text ends cleanly: {text:?}");
    }
}

/// Runs `plimsoll sample` to its end.
fn sampled(args: &[&str]) -> Output {
    let out = sample(args).output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `--temperature 0` is greedy: the same text with any seed, and the text `--top-k 1` gives
/// (the arg-max through the softmax path, at temperature 1).
#[test]
fn temperature_zero_is_greedy_and_ignores_the_seed() {
    let tokens = ["--tokens", "24", "--prompt", "KING"];
    let greedy = |seed: &str| {
        let args = [&tokens[..], &["--temperature", "0", "--seed", seed]].concat();
        sampled(&args).stdout
    };
    let one = greedy("1");
    let two = greedy("2");
    let top_one = sampled(&[&tokens[..], &["--top-k", "1", "--temperature", "1"]].concat()).stdout;
    let text = String::from_utf8_lossy(&one);
    assert!(
        text.starts_with("KING") && text.chars().count() == 4 + 24 + 1,
        "{text:?}"
    );
    assert_eq!(one, two, "two seeds, one greedy text");
    assert_eq!(one, top_one, "greedy is the arg-max");
}

/// A negative temperature is a usage error naming the flag, before any run is looked for.
#[test]
fn a_negative_temperature_is_a_usage_error() {
    for value in [["--temperature", "-1"], ["--temperature=-0.5", "--seed=1"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_plimsoll"))
            .arg("sample")
            .args(value)
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value:?}: {stderr}");
        assert!(stderr.contains("--temperature"), "{stderr}");
        assert!(stderr.contains("0 or above"), "{stderr}");
    }
}
