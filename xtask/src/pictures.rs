//! `cargo xtask pictures`: makes every picture of a short GPT run and opens each in its consumer.
//!
//! 1. `plimsoll train shakespeare --layers 2 --width 64` (the workload's GPT made smaller: its
//!    pictures are the same kinds, in a quarter of the time) for a few steps with
//!    `--memory-timeline 2 --profile-steps 4-5` into `target/pictures/run`, then `plimsoll
//!    report` on it.
//! 2. Headless Chromium loads `report.html` and `memory_timeline.html` (`--dump-dom`): each page
//!    must set `data-status="ok..."` on its body (its scripts ran without an error and drew);
//!    a screenshot of the report goes to `target/pictures/report.png`.
//! 3. Python reads `memory_snapshot.pickle` (`trainer/tests/memory_viz_check.py`) and parses
//!    `trace.json` (a GPU and a CPU track) and `profile.json`.
//!
//! It prints the kernel table's total against the profiled steps' wall time (a figure, not a
//! check: timings are never asserted). Chromium is Debian's `chromium` (`.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Longest wait for one Chromium or Python process.
const PROCESS_DEADLINE: Duration = Duration::from_secs(180);

fn target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| "target".into());
    crate::workspace_root().join(target)
}

/// Runs `command` to completion within [`PROCESS_DEADLINE`] (killed past it); returns stdout.
fn run(what: &str, command: &mut Command) -> Result<String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start {what}"))?;
    let start = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if start.elapsed() > PROCESS_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{what} did not finish within {} s",
                PROCESS_DEADLINE.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        bail!(
            "{what} failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(stdout)
}

fn chromium() -> Result<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()?;
        if found.status.success() {
            return Ok(PathBuf::from(
                String::from_utf8_lossy(&found.stdout).trim().to_string(),
            ));
        }
    }
    bail!("no Chromium found (apt-get install chromium; .ci/run installs it)")
}

fn headless(browser: &Path) -> Command {
    let mut c = Command::new(browser);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--virtual-time-budget=10000",
    ]);
    c
}

/// Loads `page` in headless Chromium; fails unless its scripts reported success.
fn check_page(browser: &Path, page: &Path) -> Result<String> {
    let url = format!("file://{}", page.display());
    let dom = run(
        &format!("chromium on {}", page.display()),
        headless(browser).args(["--dump-dom", &url]),
    )?;
    // The attribute on the body element (the page's scripts set it; their text is elsewhere).
    let body = dom
        .split("<body")
        .nth(1)
        .and_then(|rest| rest.split('>').next())
        .unwrap_or("");
    let status = body
        .split("data-status=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("no status: the page's script did not run to the end");
    if !status.starts_with("ok") {
        bail!("{}: {status}", page.display());
    }
    Ok(status.to_string())
}

/// The task.
pub fn run_task(args: &[String]) -> Result<()> {
    if let Some(extra) = args.first() {
        bail!("pictures takes no arguments (got {extra:?})");
    }
    // The workspace's features (xtask turns fault injection on), so the libraries that
    // `cargo xtask` itself was built with are reused and only the binary is linked.
    crate::cargo(&["build", "--quiet", "--workspace", "--bins"])?;
    let exe = target_dir().join("debug").join("plimsoll");
    let out = target_dir().join("pictures");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let run_dir = out.join("run");
    let started = Instant::now();
    run(
        "plimsoll train shakespeare",
        Command::new(&exe)
            .current_dir(&out)
            .args([
                "train",
                "shakespeare",
                "--layers",
                "2",
                "--width",
                "64",
                "--steps",
                "8",
                "--memory-timeline",
                "2",
                "--profile-steps",
                "4-5",
                "--log-every",
                "4",
                "--run-dir",
            ])
            .arg(&run_dir),
    )?;
    run(
        "plimsoll report",
        Command::new(&exe).arg("report").arg(&run_dir),
    )?;
    eprintln!(
        "pictures: trained 8 GPT steps and wrote the report in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let browser = chromium()?;
    for page in ["report.html", "memory_timeline.html"] {
        let status = check_page(&browser, &run_dir.join(page))?;
        eprintln!("pictures: Chromium loaded {page}: {status}");
    }
    let shot = out.join("report.png");
    run(
        "chromium screenshot",
        headless(&browser)
            .arg(format!("--screenshot={}", shot.display()))
            .arg("--window-size=1300,1900")
            .arg(format!("file://{}", run_dir.join("report.html").display())),
    )?;
    if !shot.is_file() {
        bail!("Chromium wrote no screenshot at {}", shot.display());
    }
    eprintln!("pictures: screenshot {}", shot.display());
    let check = crate::workspace_root().join("trainer/tests/memory_viz_check.py");
    let said = run(
        "python3 memory_viz_check.py",
        Command::new("python3")
            .arg(&check)
            .arg(run_dir.join("memory_snapshot.pickle"))
            .arg(run_dir.join("memory_timeline.json")),
    )?;
    eprint!("pictures: {said}");
    let said = run(
        "python3 (trace.json)",
        Command::new("python3").arg("-c").arg(
            "import json, sys\n\
             t = json.load(open(sys.argv[1]))\n\
             ev = t['traceEvents']\n\
             names = {e['args']['name'] for e in ev if e.get('ph') == 'M' and e['name'] == 'thread_name'}\n\
             assert names == {'GPU', 'CPU'}, names\n\
             gpu = [e for e in ev if e.get('ph') == 'X' and e['tid'] == 1]\n\
             cpu = [e for e in ev if e.get('ph') == 'X' and e['tid'] == 2]\n\
             assert gpu and cpu and all(e['dur'] >= 0 for e in gpu + cpu)\n\
             p = json.load(open(sys.argv[2]))['table']\n\
             print('trace.json ok: %d GPU slices, %d CPU slices; kernel table total %.1f ms of \
             the profiled steps %.1f ms (%.0f%%)' % (len(gpu), len(cpu), p['kernels_ms'], \
             p['steps_ms'], 100 * p['kernels_ms'] / p['steps_ms']))",
        )
        .arg(run_dir.join("trace.json"))
        .arg(run_dir.join("profile.json")),
    )?;
    eprint!("pictures: {said}");
    Ok(())
}
