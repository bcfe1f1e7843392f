//! Evaluation: the evaluation set's mean loss in evaluation mode, without a graph, in chunks of
//! the micro-batch that split in two when they run out of memory, summed over the ranks of a
//! data-parallel run.

use plimsoll_allocator::Phase;
use plimsoll_autograd::no_grad;

use crate::collective::shard;
use crate::error::Result;
use crate::step::set_phase;
use crate::task::{EvalSums, Evaluation};
use crate::trainer::Trainer;

impl Trainer {
    /// The evaluation set's mean loss (and accuracy, for classifiers), forward in evaluation
    /// mode without a graph, or `None` without an evaluation set. A chunk that runs out of
    /// memory is split in two and the evaluation goes on (logged); only a single sample that
    /// does not fit is an error.
    pub fn evaluate(&mut self) -> Result<Option<Evaluation>> {
        let Some(test) = &self.test else {
            return Ok(None);
        };
        let _no_grad = no_grad();
        self.model.set_training(false);
        let step = self.position.step;
        set_phase(&self.gpu, step, Phase::Evaluation);
        // Each rank of a data-parallel run evaluates its shard; the sums are added up below.
        let all: Vec<usize> = (0..test.len()).collect();
        let (rank, ranks) = (self.collective.rank(), self.collective.ranks());
        let indices = shard(&all, rank, ranks).to_vec();
        let mut chunk = self.micro_batch.max(1);
        let mut sums = EvalSums::default();
        let mut at = 0;
        let mut notes = Vec::new();
        let outcome = loop {
            let Some(part) = indices.get(at..(at + chunk).min(indices.len())) else {
                break Ok(());
            };
            if part.is_empty() {
                break Ok(());
            }
            let result = test
                .upload(&self.gpu, part)
                .and_then(|batch| self.model.evaluate(&batch));
            match result {
                Ok(s) => {
                    sums = sums + s;
                    at += part.len();
                }
                Err(e) if e.is_out_of_memory() && chunk > 1 => {
                    self.gpu.flush("evaluation out-of-memory recovery")?;
                    let smaller = chunk.div_ceil(2);
                    let line = format!(
                        "evaluation: out of memory at {chunk} samples per chunk; going on with \
                         {smaller}"
                    );
                    self.gpu.with_allocator(|a| a.mark(&line));
                    notes.push(line);
                    chunk = smaller;
                }
                Err(e) => break Err(e),
            }
        };
        self.model.set_training(true);
        set_phase(&self.gpu, step, Phase::Other);
        self.log.extend(notes);
        outcome?;
        if ranks > 1 {
            let local = [
                sums.count as f64,
                sums.loss_sum,
                sums.correct.unwrap_or(0) as f64,
                f64::from(u8::from(sums.correct.is_some())),
            ];
            let deadline = self.gpu.default_deadline();
            let total = self
                .collective
                .all_reduce_sum_f64(local.to_vec(), deadline)?;
            if let [count, loss_sum, correct, classifier] = total[..] {
                sums = EvalSums {
                    count: count as u64,
                    loss_sum,
                    correct: (classifier > 0.0).then_some(correct as u64),
                };
            }
        }
        let peaks = self
            .gpu
            .with_allocator(|a| *a.stats().phase(Phase::Evaluation));
        Ok(Some(Evaluation {
            peak_allocated_bytes: peaks.peak_allocated_bytes,
            peak_reserved_bytes: peaks.peak_reserved_bytes,
            ..sums.into()
        }))
    }
}
