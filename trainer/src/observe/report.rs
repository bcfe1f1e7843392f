//! `report.html`: one self-contained page per run (no network, no external script), from the
//! files in its directory: `metrics.jsonl` (loss, validation loss, learning rate, throughput,
//! memory per step; a classifier's test accuracy per evaluation), `plan.json` (the memory plan's predicted peak), `memory_timeline.json`,
//! `profile.json` (the kernel table) and `run.json` (the configuration). Parts whose file is
//! missing say how to get them.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::plan::MemoryPlan;
use crate::profiling::PROFILE_JSON;
use crate::run_dir::{METRICS_FILE, RUN_FILE, SUMMARY_FILE};
use crate::timeline::{CHARTS_JS, STYLE_CSS, TIMELINE_JSON, html_escape, script_json};

/// The report's file name.
pub const REPORT_HTML: &str = "report.html";
/// The memory plan of a run, as the trainer made it.
pub const PLAN_JSON: &str = "plan.json";

const TEMPLATE: &str = include_str!("../../assets/report.html");

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            Error::invalid(
                path.display().to_string(),
                format!("not JSON ({e}); was it written by another program?"),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `plan` into `dir` as `plan.json` (for the report).
///
/// # Errors
/// [`Error::Io`] when it cannot be written.
pub fn write_plan(dir: &Path, plan: &MemoryPlan) -> Result<()> {
    let path = dir.join(PLAN_JSON);
    let text = serde_json::to_string(plan).unwrap_or_default();
    std::fs::write(&path, text).map_err(|source| Error::Io { path, source })
}

/// The data the page draws, from the run directory `dir`.
///
/// # Errors
/// [`Error::Invalid`] when `dir` holds no run (no `run.json`) or a file is not JSON;
/// [`Error::Io`] when a file cannot be read.
pub fn report_data(dir: &Path) -> Result<Value> {
    let config = read_json(&dir.join(RUN_FILE))?.ok_or_else(|| {
        Error::invalid(
            dir.display().to_string(),
            "holds no run.json: not a run directory (plimsoll runs lists them)",
        )
    })?;
    let mut steps = Vec::new();
    let mut evals = Vec::new();
    // A classifier's evaluations: [step, epoch (1-based), accuracy].
    let mut accuracy = Vec::new();
    let metrics = dir.join(METRICS_FILE);
    let text = match std::fs::read_to_string(&metrics) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(Error::Io {
                path: metrics,
                source,
            });
        }
    };
    // A line cut short by a crash is skipped, not fatal.
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        match (f("step"), f("loss"), f("eval_loss")) {
            (Some(step), Some(loss), _) => steps.push(json!([
                step,
                loss,
                f("loss_mean"),
                f("lr"),
                f("samples_per_s"),
                f("peak_allocated_bytes"),
                f("peak_reserved_bytes"),
                f("step_ms")
            ])),
            (Some(step), None, Some(eval)) => {
                evals.push(json!([step, eval, f("eval_accuracy")]));
                if let Some(a) = f("eval_accuracy") {
                    accuracy.push(json!([step, f("epoch").map(|e| e + 1.0), a]));
                }
            }
            _ => {}
        }
    }
    let plan = read_json(&dir.join(PLAN_JSON))?;
    let summary = read_json(&dir.join(SUMMARY_FILE))?;
    let name = dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let text_of = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("?").to_string();
    let overview = format!(
        "{}; {}; on {}; {} steps recorded, {} evaluations{}",
        text_of(config.get("model")),
        text_of(config.get("eval_data")),
        text_of(config.get("adapter")),
        steps.len(),
        evals.len(),
        summary
            .as_ref()
            .and_then(|s| s.get("status"))
            .and_then(Value::as_str)
            .map(|s| format!("; status: {s}"))
            .unwrap_or_else(|| "; still running or stopped without a summary".to_string())
    );
    Ok(json!({
        "title": name,
        "overview": overview,
        "steps": steps,
        "evals": evals,
        "accuracy": accuracy,
        "predicted_peak": plan.as_ref().and_then(|p| p.get("predicted_peak_bytes")).cloned(),
        "timeline": read_json(&dir.join(TIMELINE_JSON))?,
        "kernels": read_json(&dir.join(PROFILE_JSON))?,
        "config": config,
    }))
}

/// Writes `report.html` into the run directory `dir`; returns its path.
///
/// # Errors
/// As [`report_data`], and [`Error::Io`] when the page cannot be written.
pub fn write_report(dir: &Path) -> Result<PathBuf> {
    let data = report_data(dir)?;
    let title = data["title"].as_str().unwrap_or("run").to_string();
    let html = TEMPLATE
        .replace("{{STYLE}}", STYLE_CSS)
        .replace("{{CHARTS}}", CHARTS_JS)
        .replace("{{TITLE}}", &html_escape(&title))
        .replace("{{DATA}}", &script_json(&data));
    let path = dir.join(REPORT_HTML);
    std::fs::write(&path, html).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}
