//! [`Tokenizer`]: text to token ids and back, by character (a vocabulary of the distinct
//! characters, sorted, as nanoGPT's `shakespeare_char`) or by GPT-2's byte-level BPE (the
//! 50,257 tokens of OpenAI's `r50k_base`, through the `tiktoken-rs` crate, whose merges are
//! compiled into the binary: nothing is fetched at run time).
//!
//! A BPE token may end inside a character (a multi-byte UTF-8 sequence spans tokens), so text is
//! decoded a token at a time through a [`TextDecoder`], which holds back an incomplete
//! character until the token that completes it.

use tiktoken_rs::CoreBPE;

use crate::error::{Error, Result};

/// GPT-2's vocabulary: 50,000 merges, 256 bytes and `<|endoftext|>` (id 50,256).
pub const GPT2_VOCAB: usize = 50_257;

/// GPT-2's `<|endoftext|>` token, which separates documents in nanoGPT's OpenWebText files.
pub const GPT2_END_OF_TEXT: u32 = 50_256;

/// How text becomes token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Tokenizer {
    /// One token per character; token `i` is `chars[i]` (sorted, distinct).
    Char(Vec<char>),
    /// GPT-2's byte-level BPE.
    Gpt2,
}

/// GPT-2's encoder, built once per process (parsing its 50,000 merges takes a moment).
fn gpt2() -> &'static CoreBPE {
    tiktoken_rs::r50k_base_singleton()
}

impl Tokenizer {
    /// The tokenizer named `name` (`gpt2`; `char` needs its characters: [`Tokenizer::chars`]).
    pub fn named(name: &str) -> Result<Tokenizer> {
        match name {
            "gpt2" => Ok(Tokenizer::Gpt2),
            other => Err(Error::invalid(
                "tokenizer",
                format!("{other:?} is not a tokenizer this build knows; use gpt2 or char"),
            )),
        }
    }

    /// The character vocabulary of the distinct characters of `chars` (sorted).
    pub fn chars(chars: impl IntoIterator<Item = char>) -> Tokenizer {
        let mut vocab: Vec<char> = chars.into_iter().collect();
        vocab.sort_unstable();
        vocab.dedup();
        Tokenizer::Char(vocab)
    }

    /// `char` or `gpt2`, as `meta.json` and `--tokenizer` name it.
    pub fn name(&self) -> &'static str {
        match self {
            Tokenizer::Char(_) => "char",
            Tokenizer::Gpt2 => "gpt2",
        }
    }

    /// Distinct token ids: every id is below this.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Char(v) => v.len(),
            Tokenizer::Gpt2 => GPT2_VOCAB,
        }
    }

    /// `text` as token ids (GPT-2: `encode_ordinary`, so `<|endoftext|>` in the text is
    /// ordinary text, as nanoGPT's `prepare.py` treats it). `what` names the text in errors.
    /// Errors: a character outside a character vocabulary, with its position.
    pub fn encode(&self, what: &str, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Gpt2 => Ok(gpt2().encode_ordinary(text)),
            Tokenizer::Char(vocab) => text
                .chars()
                .enumerate()
                .map(|(i, c)| match vocab.binary_search(&c) {
                    Ok(id) => Ok(id as u32),
                    Err(_) => Err(Error::invalid(
                        what,
                        format!(
                            "character {c:?} at position {i} is not in the vocabulary of {} \
                             characters",
                            vocab.len()
                        ),
                    )),
                })
                .collect(),
        }
    }

    /// Token ids as text: ids outside the vocabulary, and bytes that do not form UTF-8, become
    /// U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut decoder = self.decoder();
        let mut text = String::new();
        for &id in ids {
            text.push_str(&decoder.push(id));
        }
        text.push_str(&decoder.finish());
        text
    }

    /// A decoder for text made a token at a time.
    pub fn decoder(&self) -> TextDecoder<'_> {
        TextDecoder {
            tokenizer: self,
            pending: Vec::new(),
        }
    }

    /// The bytes of token `id` (`None` outside the vocabulary).
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        match self {
            Tokenizer::Char(vocab) => vocab.get(id as usize).map(|c| c.to_string().into_bytes()),
            Tokenizer::Gpt2 => {
                if id as usize >= GPT2_VOCAB {
                    return None;
                }
                gpt2().decode_bytes(&[id]).ok()
            }
        }
    }
}

/// Text from tokens pushed one at a time: [`TextDecoder::push`] returns the characters that the
/// tokens so far complete and keeps the bytes of a character not yet complete.
#[derive(Debug)]
pub struct TextDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes of an incomplete UTF-8 sequence (at most 3).
    pending: Vec<u8>,
}

impl TextDecoder<'_> {
    /// The text token `id` completes (empty while a character is incomplete).
    pub fn push(&mut self, id: u32) -> String {
        match self.tokenizer.token_bytes(id) {
            Some(bytes) => self.pending.extend_from_slice(&bytes),
            None => {
                let mut text = self.finish();
                text.push('\u{fffd}');
                return text;
            }
        }
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    text.push_str(s);
                    self.pending.clear();
                    return text;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The valid prefix is UTF-8 by `valid_up_to`.
                    text.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // An incomplete sequence at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return text;
                        }
                        // Bytes that can never be UTF-8: one U+FFFD, then go on.
                        Some(bad) => {
                            text.push('\u{fffd}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// What is left at the end (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2's ids for known text (from OpenAI's tokenizer), and the round trip.
    #[test]
    fn gpt2_encodes_as_openai_s_tokenizer_and_round_trips() -> Result<()> {
        let t = Tokenizer::Gpt2;
        assert_eq!(t.encode("t", "Hello world")?, [15496, 995]);
        let special = t.encode("t", "<|endoftext|>")?;
        assert!(
            special.len() > 1 && !special.contains(&GPT2_END_OF_TEXT),
            "ordinary text: {special:?}"
        );
        let text = "First Citizen:\nBefore we proceed any further, hear me speak. — café 日本";
        let ids = t.encode("t", text)?;
        assert!(ids.iter().all(|&i| (i as usize) < GPT2_VOCAB));
        assert_eq!(t.decode(&ids), text);
        Ok(())
    }

    /// A character split over tokens comes out whole, once its last byte arrives.
    #[test]
    fn a_character_split_across_tokens_is_held_until_complete() -> Result<()> {
        let t = Tokenizer::Gpt2;
        let ids = t.encode("t", "日本")?;
        let mut decoder = t.decoder();
        let pieces: Vec<String> = ids.iter().map(|&i| decoder.push(i)).collect();
        assert!(pieces.len() > 2, "{ids:?}: each kanji spans tokens");
        assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')), "{pieces:?}");
        assert_eq!(pieces.concat(), "日本");
        assert_eq!(decoder.push(GPT2_VOCAB as u32), "\u{fffd}");
        Ok(())
    }

    #[test]
    fn the_character_vocabulary_is_sorted_and_refuses_strangers() -> Result<()> {
        let t = Tokenizer::chars("hello".chars());
        assert_eq!(t.vocab_size(), 4);
        assert_eq!(t.encode("t", "hole")?, [1, 3, 2, 0]);
        assert_eq!(t.decode(&[1, 3, 2, 0, 9]), "hole\u{fffd}");
        let err = t.encode("prompt", "hex").err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("'x' at position 2")),
            "{err:?}"
        );
        let err = Tokenizer::named("gpt3").expect_err("no such tokenizer");
        assert!(
            matches!(&err, Error::Invalid { what, .. } if what == "tokenizer")
                && err.to_string().contains("use gpt2 or char"),
            "{err}"
        );
        Ok(())
    }
}
