//! Helpers of the tests that drive the `plimsoll` command as a user would: from a folder of its
//! own, with no terminal on stdin, every wait bounded.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one command may take (a refused one takes well under a second; a digits run a few
/// seconds on lavapipe): past it, it is killed and the test fails.
pub const DEADLINE: Duration = Duration::from_secs(300);

/// A fresh, empty folder for one test of `suite`.
pub fn folder(suite: &str, name: &str) -> PathBuf {
    plimsoll_kernels_wgsl::testing::fresh_dir(suite, name)
}

/// A command line's words (split at spaces), as a user types them: `words("train digits
/// --epochs 1")`. For arguments without spaces; build others as a list.
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// `plimsoll` in `dir`, stdin closed (no terminal).
pub fn plimsoll(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_plimsoll"));
    c.current_dir(dir).stdin(Stdio::null());
    c
}

/// The output of `c`, run to its end, asserting that it succeeded (its stderr the message).
pub fn output_ok(c: &mut Command) -> Output {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// `plimsoll <args>` in `dir`, its output captured; killed, and the test failed, past
/// [`DEADLINE`] (a value that should have been refused may start a long run instead).
pub fn run(dir: &Path, args: &[&str]) -> Output {
    let child = plimsoll(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child, args)
}

/// Waits for `child` (read by [`Child::wait_with_output`] on a helper thread), killing it past
/// [`DEADLINE`].
pub fn finish(child: Child, args: &[&str]) -> Output {
    let id = child.id();
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || send.send(child.wait_with_output()));
    match receive.recv_timeout(DEADLINE) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg(id.to_string()).status();
            panic!("{args:?} still ran after {DEADLINE:?} (killed)");
        }
    }
}

/// Waits for `child` to exit, killing it and failing past `deadline`.
pub fn wait_with_deadline(child: &mut Child, deadline: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            panic!("the command did not stop within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `child` wrote to its (piped) stderr.
pub fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut text);
    }
    text
}

/// Standard output, then standard error, as text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The JSON file at `path`.
pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The `plimsoll train` flags of a GPT of one block of two heads, width 32: the smallest model
/// the CLI tests train on the bundled plays.
pub const ONE_BLOCK_GPT_ARGS: [&str; 6] = ["--layers", "1", "--heads", "2", "--width", "32"];
