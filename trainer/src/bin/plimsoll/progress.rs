//! The command's [`Observer`]: an indicatif progress bar (step, loss, samples/s, allocated and
//! reserved memory, ETA), test accuracy lines, log lines, and the `--metrics-out` JSON lines.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use plimsoll_allocator::format_bytes;
use plimsoll_trainer::{EvalRecord, Evaluation, JsonLines, Observer, StepReport};

/// Progress bar and metrics file.
pub struct Progress {
    bar: ProgressBar,
    metrics: Option<JsonLines>,
    /// The first error writing metrics (reported once at the end).
    pub metrics_error: Option<plimsoll_trainer::Error>,
    /// When the first step finished, since the process started.
    pub first_step_done: Option<std::time::Duration>,
    started: Instant,
}

impl Progress {
    /// A bar for `total` steps, starting at `done`.
    pub fn new(total: u64, done: u64, metrics: Option<JsonLines>, started: Instant) -> Self {
        let bar = ProgressBar::new(total);
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] step {pos}/{len} {msg} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_position(done);
        Progress {
            bar,
            metrics,
            metrics_error: None,
            first_step_done: None,
            started,
        }
    }

    /// Prints a line above the bar (or plainly when the bar is hidden: output is not a terminal).
    fn line(&self, text: String) {
        if self.bar.is_hidden() {
            crate::out::say(text);
        } else {
            self.bar.println(text);
        }
    }

    /// Writes one line of the metrics file; the first failure stops the file (reported at the end).
    fn record(&mut self, record: &impl serde::Serialize) {
        if let Some(m) = &mut self.metrics
            && let Err(e) = m.write(record)
        {
            self.metrics_error.get_or_insert(e);
            self.metrics = None;
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Observer for Progress {
    fn on_step(&mut self, r: &StepReport) {
        self.first_step_done
            .get_or_insert_with(|| self.started.elapsed());
        self.bar.set_position(r.step);
        self.bar.set_message(format!(
            "loss {:.4} (mean of {} steps) | {:.0} samples/s | alloc {} | reserved {}",
            r.loss_mean,
            r.step.min(plimsoll_trainer::LOSS_WINDOW as u64),
            r.samples_per_s,
            format_bytes(r.allocated_bytes),
            format_bytes(r.reserved_bytes)
        ));
        self.record(r);
    }

    fn on_eval(&mut self, epoch: u64, step: u64, evaluation: &Evaluation) {
        self.record(&EvalRecord::new(epoch, step, evaluation));
        self.line(format!(
            "epoch {:>3} (step {step:>5}): {}",
            epoch + 1,
            describe(evaluation)
        ));
    }

    fn on_log(&mut self, line: &str) {
        self.line(line.to_string());
    }
}

/// `test accuracy 97.49%` for a classifier, `validation loss 1.9876` otherwise.
pub fn describe(evaluation: &Evaluation) -> String {
    match evaluation.accuracy {
        Some(a) => format!("test accuracy {:.2}%", 100.0 * a),
        None => format!("validation loss {:.4}", evaluation.loss),
    }
}
