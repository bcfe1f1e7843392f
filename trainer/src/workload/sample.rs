//! Text from a trained GPT: autoregressive sampling with temperature and top-k, as nanoGPT's
//! `generate` (the context cropped to the block size, the last position's logits divided by the
//! temperature, all but the `k` largest set aside, a draw from the softmax). Runs under
//! `no_grad`; every forward's read-back waits within the device's deadline. Before the first
//! token, a forward over the longest context measures the peak ([`SamplePlan`]): a budget that
//! cannot hold it fails at once with the numbers, not halfway through the text.
//!
//! A temperature of 0 is greedy decoding: the most likely token every time, no draw.
//! [`sample_each`] hands each token to a callback as soon as it is drawn, so that a caller can
//! show the text as it is made and stop between two tokens; [`sample`] keeps them all.

use std::ops::ControlFlow;

use plimsoll_autograd::{Gpu, Tensor, no_grad};
use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::random::SplitMix64;
use plimsoll_nn::CausalLm;

use crate::error::{Error, Result};

/// How to sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleOptions {
    /// Tokens to generate after the prompt.
    pub tokens: usize,
    /// Divides the logits: below 1 sharper, above 1 flatter; 0 is greedy (the arg-max, see
    /// [`pick`]).
    pub temperature: f32,
    /// Draw only among the `k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Seed of the draws.
    pub seed: u64,
    /// Draw only among the first `n` tokens: the tokenizer's, when the model's vocabulary is
    /// padded past it (`None`: every token of the model).
    pub vocab: Option<usize>,
}

impl SampleOptions {
    /// Checks the figures: a temperature that is negative or not finite, or a top-k of 0, is
    /// an [`Error::Invalid`] naming the flag.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::invalid(
                "--temperature",
                format!(
                    "{} must be 0 or above and finite (0: greedy, the most likely token every \
                     time; 1.0: the model's own distribution)",
                    self.temperature
                ),
            ));
        }
        if self.top_k == Some(0) {
            return Err(Error::invalid("--top-k", "0 leaves nothing to draw from"));
        }
        Ok(())
    }
}

/// The token drawn from `logits` with `options`' temperature and top-k, `u` uniform in
/// `[0, 1)`. Ties keep the lower token; a row with no finite logit gives token 0.
///
/// A temperature of 0 (or below) is greedy: the token of the largest finite logit, whatever
/// `top_k` and `u` are (the limit of the softmax as the temperature goes to 0, without its
/// division by zero).
pub fn pick(logits: &[f32], temperature: f32, top_k: Option<usize>, u: f64) -> u32 {
    if temperature <= 0.0 {
        return greedy(logits);
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(top_k.unwrap_or(logits.len()).max(1));
    let max = f64::from(logits[order[0]]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(logits[i]) - max) / f64::from(temperature)).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    if !(total.is_finite() && total > 0.0) {
        return 0;
    }
    let mut target = u * total;
    for (&i, w) in order.iter().zip(&weights) {
        if target < *w {
            return i as u32;
        }
        target -= w;
    }
    order.last().map_or(0, |&i| i as u32)
}

/// The token of the largest finite logit, the lower on ties; 0 when none is finite.
fn greedy(logits: &[f32]) -> u32 {
    let mut best: Option<usize> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|b| l > logits[b]) {
            best = Some(i);
        }
    }
    best.map_or(0, |i| i as u32)
}

/// What sampling needs, measured before its first token: one forward over the longest context
/// the sampling will use (batch 1, under `no_grad`), so that a budget too small fails before any
/// work, and sampling's forwards, each no longer, fit what it measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplePlan {
    /// Tokens in the longest forward: the prompt plus the tokens to generate less one, at most
    /// the model's block size.
    pub context: usize,
    /// Peak allocated bytes of that forward (parameters included).
    pub peak_allocated_bytes: u64,
    /// The budget it ran under.
    pub budget_bytes: u64,
}

impl std::fmt::Display for SamplePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sampling plan: a forward over {} tokens peaks at {} of the {} budget",
            self.context,
            plimsoll_allocator::format_bytes(self.peak_allocated_bytes),
            plimsoll_allocator::format_bytes(self.budget_bytes)
        )
    }
}

/// Text sampled from a model, with what it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sampled {
    /// The prompt followed by the sampled tokens (fewer than asked for when the caller of
    /// [`sample_each`] stopped it).
    pub tokens: Vec<u32>,
    /// Whether the caller of [`sample_each`] stopped it before the tokens asked for.
    pub stopped: bool,
    /// The measured plan.
    pub plan: SamplePlan,
    /// Forwards that ran out of memory and succeeded after the allocator's cache was emptied.
    pub recoveries: usize,
}

/// The logits of the last position of `context` (batch 1), as a host vector. Out of memory is
/// met once by emptying the allocator's cache (segments a longer earlier forward left reserved,
/// or a fragmented layout) and trying again; a second failure is
/// [`Error::SampleOutOfMemory`].
fn last_logits(
    gpt: &dyn CausalLm,
    gpu: &Gpu,
    context: &[u32],
    recoveries: &mut usize,
) -> Result<Vec<f32>> {
    let vocab = gpt.vocab_size();
    let forward = || -> Result<Vec<f32>> {
        let t = context.len();
        let ids = Tensor::from_indices(gpu, context, &[1, t])?;
        let logits = gpt.forward(&ids)?;
        Ok(logits.reshape(&[t, vocab])?.slice(0, t - 1, 1)?.to_vec()?)
    };
    match forward() {
        Err(e) if e.is_out_of_memory() => {
            gpu.flush("sampling out-of-memory recovery")?;
            gpu.empty_cache();
            *recoveries += 1;
            forward().map_err(|source| {
                if source.is_out_of_memory() {
                    Error::SampleOutOfMemory {
                        context: context.len(),
                        budget_bytes: gpu.memory_budget_bytes(),
                        parameter_bytes: gpu.with_allocator(|a| {
                            a.stats().category(Category::Parameter).allocated_bytes
                        }),
                        source: Box::new(source),
                    }
                } else {
                    source
                }
            })
        }
        other => other,
    }
}

/// `prompt` (at least one token) followed by `options.tokens` sampled tokens. Plans first: a
/// forward over the longest context it will use, whose peak is [`Sampled::plan`].
pub fn sample(gpt: &dyn CausalLm, prompt: &[u32], options: &SampleOptions) -> Result<Sampled> {
    sample_each(gpt, prompt, options, |_| ControlFlow::Continue(()))
}

/// [`sample`], handing each sampled token to `on_token` as soon as it is drawn (before the
/// forward for the next one): a caller prints it, and returns [`ControlFlow::Break`] to stop
/// there (an interrupt, a reader gone), which ends the sampling with the tokens so far and
/// [`Sampled::stopped`] set. The plan runs before the first token, so the first call comes one
/// planning forward and one sampling forward after the start.
///
/// # Errors
/// Bad options or an empty prompt ([`Error::Invalid`]), a forward that does not fit the
/// budget ([`Error::SampleOutOfMemory`]), or a device error; the tokens already handed out
/// stay the caller's.
pub fn sample_each(
    gpt: &dyn CausalLm,
    prompt: &[u32],
    options: &SampleOptions,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Sampled> {
    options.validate()?;
    if prompt.is_empty() {
        return Err(Error::invalid(
            "prompt",
            "give at least one character to start from",
        ));
    }
    let gpu = gpt
        .parameters()
        .first()
        .map(|(_, t)| t.gpu().clone())
        .ok_or_else(|| Error::invalid("model", "a GPT without parameters"))?;
    let _no_grad = no_grad();
    let block = gpt.context();
    let mut recoveries = 0;
    // The plan: the longest forward, over the prompt repeated as needed (its values do not
    // change its memory).
    let context = (prompt.len() + options.tokens.saturating_sub(1)).min(block);
    let probe: Vec<u32> = prompt.iter().copied().cycle().take(context).collect();
    gpu.flush("sampling plan")?;
    gpu.with_allocator(|a| a.reset_peaks());
    last_logits(gpt, &gpu, &probe, &mut recoveries)?;
    gpu.flush("sampling plan")?;
    let plan = SamplePlan {
        context,
        peak_allocated_bytes: gpu.with_allocator(|a| a.stats().peak_allocated_bytes),
        budget_bytes: gpu.memory_budget_bytes(),
    };
    let mut rng = SplitMix64::new(options.seed);
    let mut out = prompt.to_vec();
    let mut stopped = false;
    for _ in 0..options.tokens {
        let context = &out[out.len().saturating_sub(block)..];
        let mut last = last_logits(gpt, &gpu, context, &mut recoveries)?;
        if let Some(n) = options.vocab {
            last.truncate(n.max(1));
        }
        let token = pick(&last, options.temperature, options.top_k, rng.unit_f64());
        out.push(token);
        if on_token(token).is_break() {
            stopped = out.len() - prompt.len() < options.tokens;
            break;
        }
    }
    Ok(Sampled {
        tokens: out,
        stopped,
        plan,
        recoveries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_one_is_the_arg_max_and_ties_keep_the_lower_token() {
        let logits = [0.5, 3.0, -1.0, 3.0];
        for u in [0.0, 0.5, 0.999] {
            assert_eq!(pick(&logits, 1.0, Some(1), u), 1);
        }
    }

    /// With two equal logits and everything else far below, the draw splits at `u = 0.5`; a low
    /// temperature pushes all the mass onto the largest.
    #[test]
    fn draws_follow_the_softmax() {
        let logits = [1.0, 1.0, -50.0];
        assert_eq!(pick(&logits, 1.0, None, 0.49), 0);
        assert_eq!(pick(&logits, 1.0, None, 0.51), 1);
        let skewed = [1.0, 2.0];
        // softmax([1, 2] / 0.01): token 1 with probability 1 - e^-100.
        assert_eq!(pick(&skewed, 0.01, None, 0.999_999), 1);
        // softmax([1, 2]): token 1 with probability e / (1 + e) = 0.7311, drawn first (the
        // candidates are taken most likely first).
        assert_eq!(pick(&skewed, 1.0, None, 0.72), 1);
        assert_eq!(pick(&skewed, 1.0, None, 0.74), 0);
    }

    /// Temperature 0 is the arg-max whatever the draw and the top-k: no division by zero, no
    /// NaN; ties keep the lower token and non-finite logits are passed over.
    #[test]
    fn temperature_zero_is_the_arg_max() {
        let logits = [0.5, 3.0, -1.0, 3.0];
        for u in [0.0, 0.5, 0.999] {
            for top_k in [None, Some(1), Some(3)] {
                assert_eq!(pick(&logits, 0.0, top_k, u), 1);
            }
        }
        assert_eq!(
            pick(&[f32::NAN, 1.0, f32::INFINITY, 2.0], 0.0, None, 0.5),
            3
        );
        assert_eq!(pick(&[f32::NAN, f32::NEG_INFINITY], 0.0, None, 0.5), 0);
        assert_eq!(pick(&[-2.0, -1.0], -0.0, None, 0.5), 1);
    }

    #[test]
    fn bad_options_are_errors() {
        let ok = SampleOptions {
            vocab: None,
            tokens: 1,
            temperature: 1.0,
            top_k: None,
            seed: 0,
        };
        assert!(ok.validate().is_ok());
        assert!(
            SampleOptions {
                vocab: None,
                temperature: 0.0,
                ..ok
            }
            .validate()
            .is_ok(),
            "0 is greedy"
        );
        assert!(
            SampleOptions {
                vocab: None,
                temperature: -0.5,
                ..ok
            }
            .validate()
            .is_err()
        );
        assert!(
            SampleOptions {
                vocab: None,
                temperature: f32::INFINITY,
                ..ok
            }
            .validate()
            .is_err()
        );
        assert!(
            SampleOptions {
                vocab: None,
                temperature: f32::NAN,
                ..ok
            }
            .validate()
            .is_err()
        );
        assert!(
            SampleOptions {
                vocab: None,
                top_k: Some(0),
                ..ok
            }
            .validate()
            .is_err()
        );
    }
}
