//! `report.html` from a run directory's files: the steps, evaluations and plan it was given (a
//! line cut short by a crash skipped), parts without a file left out, and a directory that is
//! not a run refused with a typed error. (`cargo xtask pictures` loads a real one in Chromium.)

#![allow(clippy::unwrap_used)]

mod common;

use common::temp_dir;
use plimsoll_trainer::Error;
use plimsoll_trainer::report::{report_data, write_report};

#[test]
fn the_report_holds_the_runs_steps_evaluations_and_plan() {
    let dir = temp_dir("report");
    std::fs::write(
        dir.join("run.json"),
        r#"{"model": "MLP 64-10", "adapter": "test"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("metrics.jsonl"),
        concat!(
            "{\"event\":\"start\"}\n",
            "{\"step\":1,\"loss\":2.5,\"loss_mean\":2.5,\"lr\":0.01,\"samples_per_s\":100.0,",
            "\"peak_allocated_bytes\":1000,\"peak_reserved_bytes\":2048,\"step_ms\":3.0}\n",
            "{\"step\":2,\"loss\":2.0,\"loss_mean\":2.25,\"lr\":0.01,\"samples_per_s\":120.0,",
            "\"peak_allocated_bytes\":1100,\"peak_reserved_bytes\":2048,\"step_ms\":2.5}\n",
            "{\"step\":2,\"epoch\":0,\"eval_loss\":2.1,\"eval_samples\":10}\n",
            "{\"step\":3,\"loss\":1.9,\"lo"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("plan.json"), r#"{"predicted_peak_bytes": 1234}"#).unwrap();
    let data = report_data(&dir).unwrap();
    let steps = data["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "the cut line is skipped");
    assert_eq!(steps[1][0], 2.0);
    assert_eq!(steps[1][1], 2.0);
    assert_eq!(steps[1][5], 1100.0);
    assert_eq!(data["evals"].as_array().unwrap().len(), 1);
    assert_eq!(data["evals"][0][1], 2.1);
    assert_eq!(data["predicted_peak"], 1234);
    assert!(data["timeline"].is_null() && data["kernels"].is_null());
    let path = write_report(&dir).unwrap();
    let html = std::fs::read_to_string(path).unwrap();
    assert!(html.contains("\"predicted_peak\":1234") && !html.contains("{{"));
    assert!(!html.contains("http://") && !html.contains("https://"));

    // A regression run has no accuracy: no accuracy data, the chart stays hidden.
    assert_eq!(data["accuracy"], serde_json::json!([]));

    let empty = temp_dir("report-empty");
    let err = write_report(&empty).unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("not a run directory"), "{err}");
}

/// A classifier's evaluations (digits: `eval_accuracy` per epoch) give the accuracy chart its
/// data, `[step, epoch (1-based), accuracy]`, and its canvas; the configuration is a table of
/// settings whose values wrap within the page.
#[test]
fn a_classifiers_report_has_an_accuracy_chart_and_a_wrapped_configuration() {
    let dir = temp_dir("report-digits");
    let long = "x".repeat(400);
    std::fs::write(
        dir.join("run.json"),
        serde_json::json!({
            "model": "MLP 64-128-10, ReLU, seed 0; AdamW lr 0.002",
            "command": [long],
            "optimizer": {"name": "AdamW", "lr": 0.002},
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("metrics.jsonl"),
        concat!(
            "{\"step\":1,\"loss\":2.3,\"loss_mean\":2.3,\"lr\":0.002}\n",
            "{\"step\":23,\"epoch\":0,\"eval_loss\":0.4,\"eval_accuracy\":0.9,",
            "\"eval_samples\":359}\n",
            "{\"step\":46,\"epoch\":1,\"eval_loss\":0.2,\"eval_accuracy\":0.95,",
            "\"eval_samples\":359}\n",
        ),
    )
    .unwrap();
    let data = report_data(&dir).unwrap();
    assert_eq!(
        data["accuracy"],
        serde_json::json!([[23.0, 1.0, 0.9], [46.0, 2.0, 0.95]])
    );
    let html = std::fs::read_to_string(write_report(&dir).unwrap()).unwrap();
    assert!(html.contains("\"accuracy\":[[23.0,1.0,0.9],[46.0,2.0,0.95]]"));
    assert!(
        html.contains("<canvas id=\"accuracy\""),
        "the chart's canvas"
    );
    assert!(html.contains("REPORT.accuracy"), "the page draws it");
    // The configuration: a table of rows, whose values wrap (a 400-character value stays on
    // the page).
    assert!(html.contains("<table class=\"config\" id=\"config\">"));
    assert!(!html.contains("<pre id=\"config\">"));
    let rule = html
        .find("table.config td")
        .map(|i| &html[i..i + html[i..].find('}').unwrap()])
        .expect("a style for the configuration's values");
    assert!(
        rule.contains("white-space: pre-wrap") && rule.contains("overflow-wrap: anywhere"),
        "{rule}"
    );
}
