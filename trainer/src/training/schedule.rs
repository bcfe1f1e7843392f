//! What a run does, in order: its steps (a whole batch, or an epoch's last partial batch) and
//! its evaluations (in chunks). The trainer's loop and the memory plan's dry run both follow
//! this one definition, so the plan replays the run the trainer will make.

use crate::config::{RunLength, TrainConfig};

/// Whether an evaluation follows step `step`: every `eval_interval_steps` steps (else at the
/// end of every epoch, `epoch_done`), and always after the run's last step (`finished`), so a
/// run of any length ends evaluated.
pub(crate) fn eval_due(
    eval_interval_steps: Option<u64>,
    step: u64,
    epoch_done: bool,
    finished: bool,
) -> bool {
    let due = match eval_interval_steps {
        Some(k) => step.is_multiple_of(k.max(1)),
        None => epoch_done,
    };
    due || finished
}

/// One thing a run does that allocates device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Event {
    /// An optimizer step over this many samples.
    Step(usize),
    /// One chunk of an evaluation, of this many samples.
    EvalChunk(usize),
}

/// The events of a run from its start, in the trainer's order: a step takes the next
/// `effective_batch` samples of the epoch (fewer at its end), and after a step that is due one,
/// an evaluation runs over the evaluation set in chunks of the micro-batch.
#[derive(Clone, Debug)]
pub(crate) struct RunEvents {
    config_length: RunLength,
    eval_interval_steps: Option<u64>,
    train_len: usize,
    effective_batch: usize,
    /// Samples in the evaluation set (0: none).
    eval_len: usize,
    eval_chunk: usize,
    step: u64,
    epoch: u64,
    sample_in_epoch: usize,
    /// Samples of the evaluation under way still to come (0: none under way).
    eval_left: usize,
}

impl RunEvents {
    /// The events of `config`'s run over `train_len` training samples and `eval_len`
    /// evaluation samples, evaluated in chunks of `micro_batch`.
    pub(crate) fn new(
        config: &TrainConfig,
        train_len: usize,
        eval_len: usize,
        micro_batch: usize,
    ) -> RunEvents {
        RunEvents {
            config_length: config.length,
            eval_interval_steps: config.eval_interval_steps,
            train_len: train_len.max(1),
            effective_batch: config.effective_batch.max(1),
            eval_len,
            eval_chunk: micro_batch.max(1),
            step: 0,
            epoch: 0,
            sample_in_epoch: 0,
            eval_left: 0,
        }
    }

    /// The events from `at` on, as a resumed run goes on.
    pub(crate) fn start_at(&mut self, at: crate::config::ResumePoint) {
        self.step = at.step;
        self.epoch = at.epoch;
        self.sample_in_epoch = at.sample_in_epoch;
        self.eval_left = 0;
    }

    /// Every distinct event the run can produce (the step sizes and the chunk sizes).
    pub(crate) fn kinds(&self) -> Vec<Event> {
        let mut kinds = vec![Event::Step(self.effective_batch.min(self.train_len))];
        let partial = self.train_len % self.effective_batch;
        if partial != 0 && self.effective_batch < self.train_len {
            kinds.push(Event::Step(partial));
        }
        if self.eval_len > 0 {
            kinds.push(Event::EvalChunk(self.eval_chunk.min(self.eval_len)));
            let last = self.eval_len % self.eval_chunk;
            if last != 0 && self.eval_chunk < self.eval_len {
                kinds.push(Event::EvalChunk(last));
            }
        }
        kinds
    }

    fn finished(&self) -> bool {
        match self.config_length {
            RunLength::Epochs(e) => self.epoch >= e,
            RunLength::Steps(s) => self.step >= s,
        }
    }
}

impl Iterator for RunEvents {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if self.eval_left > 0 {
            let chunk = self.eval_chunk.min(self.eval_left);
            self.eval_left -= chunk;
            return Some(Event::EvalChunk(chunk));
        }
        if self.finished() {
            return None;
        }
        let samples = self
            .effective_batch
            .min(self.train_len - self.sample_in_epoch);
        self.step += 1;
        self.sample_in_epoch += samples;
        let epoch_done = self.sample_in_epoch >= self.train_len;
        if epoch_done {
            self.epoch += 1;
            self.sample_in_epoch = 0;
        }
        if eval_due(
            self.eval_interval_steps,
            self.step,
            epoch_done,
            self.finished(),
        ) {
            self.eval_left = self.eval_len;
        }
        Some(Event::Step(samples))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(length: RunLength, interval: Option<u64>, train: usize, eval: usize) -> Vec<Event> {
        let config = TrainConfig {
            effective_batch: 4,
            length,
            eval_interval_steps: interval,
            ..TrainConfig::default()
        };
        RunEvents::new(&config, train, eval, 3).collect()
    }

    /// 10 samples in batches of 4: steps of 4, 4, 2 per epoch, an evaluation of 5 samples in
    /// chunks of 3 (3, 2) after each epoch.
    #[test]
    fn epochs_end_with_a_partial_step_and_an_evaluation() {
        use Event::{EvalChunk as E, Step as S};
        let epoch = [S(4), S(4), S(2), E(3), E(2)];
        let all = events(RunLength::Epochs(2), None, 10, 5);
        assert_eq!(all, [epoch, epoch].concat());
        assert_eq!(
            RunEvents::new(
                &TrainConfig {
                    effective_batch: 4,
                    ..TrainConfig::default()
                },
                10,
                5,
                3
            )
            .kinds(),
            [S(4), S(2), E(3), E(2)]
        );
    }

    /// Every 2 steps, and after the last step (5) though 5 is not a multiple of 2.
    #[test]
    fn a_run_of_steps_evaluates_at_its_end() {
        use Event::{EvalChunk as E, Step as S};
        let all = events(RunLength::Steps(5), Some(2), 100, 3);
        assert_eq!(all, [S(4), S(4), E(3), S(4), S(4), E(3), S(4), E(3)]);
        assert!(eval_due(Some(2), 7, false, true));
        assert!(!eval_due(Some(2), 7, false, false));
    }
}
