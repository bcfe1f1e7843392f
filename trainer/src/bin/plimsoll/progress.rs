//! The command's [`Observer`]. On a terminal: an indicatif bar within 80 columns (epoch, step,
//! running-mean loss, learning rate, throughput over recent steps, memory, ETA). Without one:
//! a plain line every N steps on standard output, flushed, so `tee` and log files get the run.
//! Evaluation and log lines either way, and the metrics JSON lines.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use plimsoll_allocator::format_bytes;
use plimsoll_trainer::{EvalRecord, Evaluation, JsonLines, Observer, StepReport};

/// Steps the throughput and the ETA are averaged over.
const RECENT: usize = 20;

/// How progress is shown.
pub enum Mode {
    /// A bar on standard error (both streams are terminals).
    Bar,
    /// A plain line every N steps on standard output.
    Lines(u64),
}

impl Mode {
    /// The bar when standard output and standard error are terminals, else a line every
    /// `every` steps (default: about 20 lines over `total` steps).
    pub fn detect(every: Option<u64>, total: u64) -> Mode {
        if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
            Mode::Bar
        } else {
            Mode::Lines(every.unwrap_or((total / 20).max(1)))
        }
    }
}

/// Progress display and metrics files.
pub struct Progress {
    bar: Option<ProgressBar>,
    every: u64,
    total: u64,
    metrics: Vec<JsonLines>,
    /// The first error writing metrics (reported at the end; the run goes on).
    pub metrics_error: Option<plimsoll_trainer::Error>,
    /// When the first step finished, since the process started.
    pub first_step_done: Option<std::time::Duration>,
    started: Instant,
    /// (milliseconds, samples) of the recent steps.
    recent: VecDeque<(f64, usize)>,
}

impl Progress {
    /// Progress over `total` steps of which `done` are done, shown as `mode` says.
    pub fn new(
        mode: Mode,
        total: u64,
        done: u64,
        metrics: Vec<JsonLines>,
        started: Instant,
    ) -> Self {
        let (bar, every) = match mode {
            Mode::Bar => {
                let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
                let style = ProgressStyle::with_template("[{bar:14}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
                bar.set_style(style);
                bar.set_position(done);
                bar.set_message(format!("step {done}/{total}"));
                (Some(bar), 0)
            }
            Mode::Lines(every) => (None, every.max(1)),
        };
        Progress {
            bar,
            every,
            total,
            metrics,
            metrics_error: None,
            first_step_done: None,
            started,
            recent: VecDeque::with_capacity(RECENT),
        }
    }

    /// Prints a line (or several) above the bar, or plainly on standard output: each ended
    /// by a newline either way. (indicatif's `println` would pad each line with spaces to the
    /// terminal's width instead, so a captured log would run them into one line; `suspend`
    /// clears the bar, lets the line through, and draws the bar again below it.)
    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) => bar.suspend(|| crate::out::say(text)),
            None => crate::out::say(text),
        }
    }

    /// Writes one line to every metrics file; a failure is reported at once on standard error,
    /// that file is dropped, and the run goes on.
    fn record(&mut self, record: &impl serde::Serialize) {
        let mut failed = Vec::new();
        for (i, m) in self.metrics.iter_mut().enumerate() {
            if let Err(e) = m.write(record) {
                let warn = || {
                    crate::out::warn(format_args!(
                        "warning: {e}; no more metrics go to that file (training goes on)"
                    ))
                };
                match &self.bar {
                    Some(bar) => bar.suspend(warn),
                    None => warn(),
                }
                self.metrics_error.get_or_insert(e);
                failed.push(i);
            }
        }
        for i in failed.into_iter().rev() {
            self.metrics.remove(i);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// `e2 140/690 loss 0.1234 lr 2.0e-3 1530/s 1.2 MB ETA 35s` (at most about 64 columns).
    fn status(&self, r: &StepReport) -> String {
        let (ms, samples) = self
            .recent
            .iter()
            .fold((0.0, 0usize), |(m, s), &(dm, ds)| (m + dm, s + ds));
        let rate = samples as f64 / (ms / 1e3).max(1e-9);
        let eta = self.total.saturating_sub(r.step) as f64 * ms / self.recent.len().max(1) as f64;
        format!(
            "e{} {}/{} loss {:.4} lr {:.1e} {rate:.0}/s {} ETA {}",
            r.epoch + 1,
            r.step,
            self.total,
            r.loss_mean,
            r.lr,
            format_bytes(r.allocated_bytes),
            duration(eta / 1e3)
        )
    }
}

/// `1h02m`, `12m30s`, `45s`.
fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl Observer for Progress {
    fn on_step(&mut self, r: &StepReport) {
        self.first_step_done
            .get_or_insert_with(|| self.started.elapsed());
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((r.step_ms, r.samples));
        let status = self.status(r);
        match &self.bar {
            Some(bar) => {
                bar.set_position(r.step);
                bar.set_message(status);
            }
            None if r.step.is_multiple_of(self.every) || r.step == self.total => {
                crate::out::say(format!("step {status}"));
            }
            None => {}
        }
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
