//! Character-level text: [`CharCorpus`] (a vocabulary of the sorted distinct characters of a
//! text, the text as token ids, split into a training head and a validation tail) and
//! [`TokenWindows`] (the windows of `context + 1` tokens a language model trains on: inputs
//! `t[i..i+T]`, targets `t[i+1..i+T+1]`). The bundled corpus is eleven of Shakespeare's plays
//! (`data/shakespeare.txt.gz`, inside the binary).

use std::io::Read;

use plimsoll_autograd::{Gpu, Tensor};

use crate::error::{Error, Result};

/// `data/shakespeare.txt.gz`, compiled in so that the command works from any directory.
pub const SHAKESPEARE_GZ: &[u8] = include_bytes!("../../../data/shakespeare.txt.gz");

/// A text as token ids over its own character vocabulary, split in two.
#[derive(Debug, Clone, PartialEq)]
pub struct CharCorpus {
    /// The distinct characters, sorted; token `i` is `vocab[i]`.
    vocab: Vec<char>,
    /// The first part of the text (training).
    train: Vec<u32>,
    /// The rest (validation).
    val: Vec<u32>,
}

impl CharCorpus {
    /// `text` with the first `1 - val_fraction` of its characters for training and the rest for
    /// validation (nanoGPT's `shakespeare_char` split is 0.1). `what` names the text in errors.
    /// Errors: an empty text, a fraction outside `(0, 1)`, or a split with no characters.
    pub fn from_text(what: &str, text: &str, val_fraction: f64) -> Result<CharCorpus> {
        if !(val_fraction > 0.0 && val_fraction < 1.0) {
            return Err(Error::invalid(
                what,
                format!("validation fraction {val_fraction} is not between 0 and 1"),
            ));
        }
        let chars: Vec<char> = text.chars().collect();
        let mut vocab = chars.clone();
        vocab.sort_unstable();
        vocab.dedup();
        let split = ((chars.len() as f64) * (1.0 - val_fraction)) as usize;
        if split == 0 || split == chars.len() {
            return Err(Error::invalid(
                what,
                format!(
                    "{} character{} cannot be split {:.0}% / {:.0}% with both parts \
                     non-empty; give more text",
                    chars.len(),
                    if chars.len() == 1 { "" } else { "s" },
                    100.0 * (1.0 - val_fraction),
                    100.0 * val_fraction
                ),
            ));
        }
        let ids: Vec<u32> = chars
            .iter()
            .map(|c| vocab.binary_search(c).unwrap_or(0) as u32)
            .collect();
        let (train, val) = ids.split_at(split);
        Ok(CharCorpus {
            vocab,
            train: train.to_vec(),
            val: val.to_vec(),
        })
    }

    /// A gzip-compressed UTF-8 text, split as [`CharCorpus::from_text`] does.
    pub fn from_gz(what: &str, bytes: &[u8], val_fraction: f64) -> Result<CharCorpus> {
        Self::from_text(what, &read_text(what, bytes)?, val_fraction)
    }

    /// The text in the file at `path` (UTF-8, gzip-compressed or not), split as
    /// [`CharCorpus::from_text`] does. Errors name the file.
    pub fn from_file(path: &std::path::Path, val_fraction: f64) -> Result<CharCorpus> {
        let what = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_text(&what, &read_text(&what, &bytes)?, val_fraction)
    }

    /// The bundled plays, 90% for training and the last 10% for validation.
    pub fn shakespeare() -> Result<CharCorpus> {
        Self::from_gz("data/shakespeare.txt.gz", SHAKESPEARE_GZ, 0.1)
    }

    /// Number of distinct characters.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The characters, sorted (token `i` is the `i`-th).
    pub fn vocab(&self) -> &[char] {
        &self.vocab
    }

    /// The training tokens.
    pub fn train(&self) -> &[u32] {
        &self.train
    }

    /// The validation tokens.
    pub fn val(&self) -> &[u32] {
        &self.val
    }

    /// `text` as token ids. Errors: a character outside the vocabulary, named with its position.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        text.chars()
            .enumerate()
            .map(|(i, c)| match self.vocab.binary_search(&c) {
                Ok(id) => Ok(id as u32),
                Err(_) => Err(Error::invalid(
                    "prompt",
                    format!(
                        "character {c:?} at position {i} is not in the model's vocabulary of {} \
                         characters",
                        self.vocab.len()
                    ),
                )),
            })
            .collect()
    }

    /// Token ids as text (an id outside the vocabulary becomes U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| self.vocab.get(i as usize).copied().unwrap_or('\u{fffd}'))
            .collect()
    }
}

/// `bytes` (gzip-compressed or not) as UTF-8 text; errors name `what`.
pub fn read_text(what: &str, bytes: &[u8]) -> Result<String> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut text = String::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_string(&mut text)
            .map_err(|e| Error::invalid(what, format!("not gzip-compressed UTF-8 text: {e}")))?;
        Ok(text)
    } else {
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            Error::invalid(
                what,
                format!(
                    "not UTF-8 text (byte {}): convert it to UTF-8, or prepare it with plimsoll \
                     prepare, which names the line",
                    e.utf8_error().valid_up_to()
                ),
            )
        })
    }
}

/// The windows of `context + 1` consecutive tokens of a token sequence.
#[derive(Debug, Clone, Copy)]
pub struct TokenWindows<'a> {
    tokens: &'a [u32],
    context: usize,
}

impl<'a> TokenWindows<'a> {
    /// Windows of `tokens` with `context` inputs each. Errors: `context` 0 or not shorter than
    /// the sequence.
    pub fn new(tokens: &'a [u32], context: usize) -> Result<TokenWindows<'a>> {
        if context == 0 || context >= tokens.len() {
            return Err(Error::invalid(
                "--context",
                format!(
                    "a context of {context} tokens needs between 1 and {} (the sequence has {} \
                     tokens)",
                    tokens.len().saturating_sub(1),
                    tokens.len()
                ),
            ));
        }
        Ok(TokenWindows { tokens, context })
    }

    /// Number of windows (start positions).
    pub fn len(&self) -> usize {
        self.tokens.len() - self.context
    }

    /// Whether there is no window (never: [`TokenWindows::new`] refuses it).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens per input.
    pub fn context(&self) -> usize {
        self.context
    }

    /// The host ids of the windows starting at `starts`: inputs and targets, `[n, context]` each
    /// (row-major). Errors: a start past the last window.
    pub fn gather(&self, starts: &[usize]) -> Result<(Vec<u32>, Vec<u32>)> {
        let t = self.context;
        let mut inputs = Vec::with_capacity(starts.len() * t);
        let mut targets = Vec::with_capacity(starts.len() * t);
        for &s in starts {
            let window = self.tokens.get(s..s + t + 1).ok_or_else(|| {
                Error::invalid(
                    "window",
                    format!("start {s} is past the last of {} windows", self.len()),
                )
            })?;
            inputs.extend_from_slice(&window[..t]);
            targets.extend_from_slice(&window[1..]);
        }
        Ok((inputs, targets))
    }

    /// The windows starting at `starts` on the device: u32 inputs and targets `[n, context]`.
    pub fn upload(&self, gpu: &Gpu, starts: &[usize]) -> Result<(Tensor, Tensor)> {
        let (inputs, targets) = self.gather(starts)?;
        let shape = [starts.len(), self.context];
        Ok((
            Tensor::from_indices(gpu, &inputs, &shape)?,
            Tensor::from_indices(gpu, &targets, &shape)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_is_the_sorted_characters_and_encoding_round_trips() -> Result<()> {
        let corpus = CharCorpus::from_text("t", "hello world\n", 0.25)?;
        assert_eq!(
            corpus.vocab(),
            ['\n', ' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w']
        );
        assert_eq!(corpus.train().len(), 9);
        assert_eq!(corpus.val().len(), 3);
        assert_eq!(corpus.decode(corpus.train()), "hello wor");
        assert_eq!(corpus.decode(corpus.val()), "ld\n");
        assert_eq!(corpus.decode(&corpus.encode("world")?), "world");
        let err = corpus.encode("hex").unwrap_err().to_string();
        assert!(err.contains("'x' at position 2"), "{err}");
        Ok(())
    }

    #[test]
    fn bad_splits_and_contexts_are_errors() -> Result<()> {
        let says = |result: Result<()>, words: &str| {
            let err = result.expect_err(words);
            assert!(
                matches!(err, Error::Invalid { .. }) && err.to_string().contains(words),
                "{err}"
            );
        };
        let corpus =
            |text: &str, fraction: f64| CharCorpus::from_text("t", text, fraction).map(drop);
        says(corpus("", 0.1), "0 characters cannot be split 90% / 10%");
        // No character to validate on.
        says(corpus("a", 0.1), "1 character cannot be split 90% / 10%");
        says(
            corpus("abcd", 1.0),
            "validation fraction 1 is not between 0 and 1",
        );
        let tokens = [0, 1, 2, 3];
        says(
            TokenWindows::new(&tokens, 0).map(drop),
            "a context of 0 tokens needs between 1 and 3",
        );
        says(
            TokenWindows::new(&tokens, 4).map(drop),
            "a context of 4 tokens needs between 1 and 3",
        );
        let windows = TokenWindows::new(&tokens, 3)?;
        assert_eq!(windows.len(), 1);
        says(
            windows.gather(&[1]).map(drop),
            "start 1 is past the last of 1 windows",
        );
        Ok(())
    }

    #[test]
    fn windows_pair_each_input_with_the_next_token() -> Result<()> {
        let tokens: Vec<u32> = (10..20).collect();
        let windows = TokenWindows::new(&tokens, 3)?;
        assert_eq!(windows.len(), 7);
        let (x, y) = windows.gather(&[0, 6])?;
        assert_eq!(x, [10, 11, 12, 16, 17, 18]);
        assert_eq!(y, [11, 12, 13, 17, 18, 19]);
        Ok(())
    }

    #[test]
    fn shakespeare_is_bundled_and_split_ninety_ten() -> Result<()> {
        let corpus = CharCorpus::shakespeare()?;
        let total = corpus.train().len() + corpus.val().len();
        assert_eq!(
            total, 1_423_258,
            "the README's figure: ASCII, one byte a character"
        );
        assert_eq!(corpus.train().len(), total * 9 / 10);
        assert!(corpus.vocab_size() > 60 && corpus.vocab_size() < 100);
        assert!(corpus.decode(&corpus.train()[..2000]).contains('\n'));
        Ok(())
    }
}
