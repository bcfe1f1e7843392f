//! `plimsoll prepare`: texts (UTF-8, gzip-compressed or not) to a token folder in nanoGPT's
//! format ([`crate::token_files`]), streaming, with host memory bounded by
//! [`PrepareOptions::memory_limit_bytes`] whatever the texts' size.
//!
//! Each text is read in pieces of at most [`PrepareOptions::piece_bytes`], cut after a newline
//! between two characters that are not whitespace: GPT-2's pre-tokenizer never joins text
//! across such a newline, so the tokens are those of the whole text at once (a piece with no
//! such newline is cut at its last character boundary, where a token may differ). Pieces are
//! tokenized on [`PrepareOptions::threads`] threads, a round of one piece per thread at a time,
//! and written in order, as `u16`, to a temporary file. When every text is read the last
//! `val_fraction` of the tokens are copied to `val.bin`, the temporary file is cut to the rest
//! and renamed `train.bin`, and `meta.json` is written last. GPT-2's `<|endoftext|>` separates
//! two texts (nanoGPT's OpenWebText files end each document with it).
//!
//! A character vocabulary is the characters of every text: one pass reads them all first.

use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::text::SHAKESPEARE_GZ;
use crate::token_files::{Meta, MetaSource};
use crate::tokenizer::{GPT2_END_OF_TEXT, Tokenizer};

/// The least [`PrepareOptions::memory_limit_bytes`]: the reader's and writer's buffers and a
/// few pieces of text.
pub const MIN_MEMORY_LIMIT: u64 = 1 << 20;

/// A text to prepare.
#[derive(Debug, Clone)]
pub enum TextSource {
    /// A file, gzip-compressed or not.
    File(PathBuf),
    /// The plays compiled into the binary (`data/shakespeare.txt.gz`).
    BundledShakespeare,
}

impl TextSource {
    /// The name `meta.json` and errors give it.
    pub fn name(&self) -> String {
        match self {
            TextSource::File(p) => p.display().to_string(),
            TextSource::BundledShakespeare => "bundled data/shakespeare.txt.gz".to_string(),
        }
    }

    /// Its size on disk (compressed), for the progress bar.
    pub fn bytes(&self) -> Result<u64> {
        match self {
            TextSource::File(p) => {
                std::fs::metadata(p)
                    .map(|m| m.len())
                    .map_err(|source| Error::Io {
                        path: p.clone(),
                        source,
                    })
            }
            TextSource::BundledShakespeare => Ok(SHAKESPEARE_GZ.len() as u64),
        }
    }

    /// A reader of its text (decompressed), which adds the bytes it reads from disk to
    /// `counter`.
    fn open<'a>(&self, counter: &'a std::cell::Cell<u64>) -> Result<Box<dyn Read + 'a>> {
        let raw: Box<dyn Read> = match self {
            TextSource::File(p) => {
                Box::new(std::fs::File::open(p).map_err(|source| Error::Io {
                    path: p.clone(),
                    source,
                })?)
            }
            TextSource::BundledShakespeare => Box::new(SHAKESPEARE_GZ),
        };
        let mut reader = BufReader::with_capacity(
            64 << 10,
            Counting {
                inner: raw,
                counter,
            },
        );
        let gz = {
            use std::io::BufRead;
            let head = reader.fill_buf().map_err(|e| self.read_error(e))?;
            head.starts_with(&[0x1f, 0x8b])
        };
        Ok(match gz {
            true => Box::new(flate2::bufread::MultiGzDecoder::new(reader)),
            false => Box::new(reader),
        })
    }

    fn read_error(&self, e: std::io::Error) -> Error {
        match self {
            TextSource::File(p) => Error::Io {
                path: p.clone(),
                source: e,
            },
            TextSource::BundledShakespeare => Error::invalid(self.name(), e.to_string()),
        }
    }
}

/// A reader that counts the bytes read through it.
struct Counting<'a, R> {
    inner: R,
    counter: &'a std::cell::Cell<u64>,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.counter.set(self.counter.get() + n as u64);
        Ok(n)
    }
}

/// How to prepare.
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// `gpt2` or `char`.
    pub tokenizer: String,
    /// The share of the tokens (the last ones) for `val.bin`, in `(0, 1)`.
    pub val_fraction: f64,
    /// Threads that tokenize.
    pub threads: usize,
    /// Host memory the pieces in flight may take, in bytes; the piece size follows from it.
    pub memory_limit_bytes: u64,
    /// Replace `train.bin`, `val.bin` and `meta.json` where the folder has them.
    pub overwrite: bool,
}

impl PrepareOptions {
    /// Host bytes one byte of a piece can take while it is tokenized: the text, its tokens as
    /// `u32` (GPT-2 makes one per 3 to 4 bytes; the character tokenizer up to one per byte, 4
    /// bytes each) and as `u16`, with room to spare.
    const BYTES_PER_PIECE_BYTE: u64 = 10;

    /// Host bytes that do not grow with the pieces: the reader's and the writer's buffers.
    const FIXED_BYTES: u64 = 128 << 10;

    /// Bytes of text per piece: the memory limit shared by the pieces of one round (one per
    /// thread) and the text read ahead of the next (up to two pieces).
    pub fn piece_bytes(&self) -> usize {
        let per_piece = self.threads.max(1) as u64 * Self::BYTES_PER_PIECE_BYTE + 2;
        let room = self.memory_limit_bytes.saturating_sub(Self::FIXED_BYTES);
        (room / per_piece).clamp(4 << 10, 64 << 20) as usize
    }
}

/// Progress of a preparation.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Bytes read from disk so far (compressed, for gzip).
    pub read_bytes: u64,
    /// Bytes on disk in all (of every text).
    pub total_bytes: u64,
    /// Tokens written so far.
    pub tokens: u64,
    /// Which pass: 1 of 2 reads the characters of a character vocabulary, otherwise 1 of 1.
    pub pass: (u8, u8),
}

/// Prepares `sources` into the folder `out` (see the module's documentation); `progress` is
/// called after every round, and stops the preparation when it breaks. Returns what `meta.json` says. On an error nothing is left in
/// `out` but what was there before (temporary files are removed).
pub fn prepare(
    sources: &[TextSource],
    out: &Path,
    options: &PrepareOptions,
    progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
) -> Result<Meta> {
    if sources.is_empty() {
        return Err(Error::invalid(
            "prepare",
            "no text given: name one or more text files (or shakespeare, the bundled plays)",
        ));
    }
    if !(options.val_fraction > 0.0 && options.val_fraction < 1.0) {
        return Err(Error::invalid(
            "--val-fraction",
            format!(
                "{} is not between 0 and 1 (both splits need tokens)",
                options.val_fraction
            ),
        ));
    }
    if options.memory_limit_bytes < MIN_MEMORY_LIMIT {
        return Err(Error::invalid(
            "--max-host-memory",
            format!(
                "{} bytes is below the {} bytes (1 MiB) prepare needs for its buffers and one \
                 piece of text per thread; give at least 1MiB",
                options.memory_limit_bytes, MIN_MEMORY_LIMIT
            ),
        ));
    }
    std::fs::create_dir_all(out).map_err(|source| Error::Io {
        path: out.to_path_buf(),
        source,
    })?;
    // One preparation at a time per folder: two would interleave their files.
    let lock_path = out.join(".prepare.lock");
    let lock = std::fs::File::create(&lock_path).map_err(|source| Error::Io {
        path: lock_path.clone(),
        source,
    })?;
    if lock.try_lock().is_err() {
        return Err(Error::invalid(
            out.display().to_string(),
            "another plimsoll prepare is writing this folder; wait for it, or give another --out",
        ));
    }
    for name in ["train.bin", "val.bin", "meta.json"] {
        if !options.overwrite && out.join(name).exists() {
            return Err(Error::invalid(
                out.display().to_string(),
                format!(
                    "already holds {name}; give another --out, or --force to replace the folder's \
                     token files"
                ),
            ));
        }
    }
    let total_bytes = sources.iter().map(TextSource::bytes).sum::<Result<u64>>()?;
    let tokenizer = match options.tokenizer.as_str() {
        "char" => {
            let chars = collect_chars(sources, options, total_bytes, progress)?;
            Tokenizer::Char(chars)
        }
        name => Tokenizer::named(name)?,
    };
    let passes = if matches!(tokenizer, Tokenizer::Char(_)) {
        (2, 2)
    } else {
        (1, 1)
    };
    let tmp = out.join(format!(".tokens.{}.partial", std::process::id()));
    let result = write_tokens(
        sources,
        &tokenizer,
        &tmp,
        options,
        total_bytes,
        passes,
        progress,
    )
    .and_then(|(tokens, max_id)| split(&tmp, out, tokens, max_id, options, &tokenizer))
    .and_then(|meta| {
        let meta = Meta {
            sources: sources
                .iter()
                .map(|s| {
                    Ok(MetaSource {
                        path: s.name(),
                        bytes: s.bytes()?,
                    })
                })
                .collect::<Result<_>>()?,
            ..meta
        };
        write_meta(out, &meta)?;
        Ok(meta)
    });
    let _ = std::fs::remove_file(&tmp);
    drop(lock);
    let _ = std::fs::remove_file(&lock_path);
    result
}

/// Reads every text once for its characters.
fn collect_chars(
    sources: &[TextSource],
    options: &PrepareOptions,
    total_bytes: u64,
    progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
) -> Result<Vec<char>> {
    let mut seen = std::collections::BTreeSet::new();
    let read = std::cell::Cell::new(0);
    for source in sources {
        let mut pieces = Pieces::new(source, &read, options.piece_bytes(), false)?;
        while let Some(piece) = pieces.next_piece()? {
            seen.extend(piece.chars());
            let report = Progress {
                read_bytes: read.get(),
                total_bytes,
                tokens: 0,
                pass: (1, 2),
            };
            if progress(report).is_break() {
                return Err(interrupted());
            }
        }
    }
    Ok(seen.into_iter().collect())
}

/// Tokenizes every text into `tmp` (`u16` little-endian); returns the tokens written and the
/// largest id.
fn write_tokens(
    sources: &[TextSource],
    tokenizer: &Tokenizer,
    tmp: &Path,
    options: &PrepareOptions,
    total_bytes: u64,
    passes: (u8, u8),
    progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
) -> Result<(u64, u32)> {
    let io = |source| Error::Io {
        path: tmp.to_path_buf(),
        source,
    };
    let mut file = std::io::BufWriter::new(std::fs::File::create(tmp).map_err(io)?);
    let threads = options.threads.max(1);
    let byte_level = matches!(tokenizer, Tokenizer::Gpt2);
    let read = std::cell::Cell::new(0);
    let (mut tokens, mut max_id) = (0u64, 0u32);
    for (i, source) in sources.iter().enumerate() {
        if i > 0 && byte_level {
            file.write_all(&(GPT2_END_OF_TEXT as u16).to_le_bytes())
                .map_err(io)?;
            tokens += 1;
            max_id = max_id.max(GPT2_END_OF_TEXT);
        }
        let what = source.name();
        let mut pieces = Pieces::new(source, &read, options.piece_bytes(), byte_level)?;
        loop {
            let mut round = Vec::with_capacity(threads);
            while round.len() < threads {
                match pieces.next_piece()? {
                    Some(p) => round.push(p),
                    None => break,
                }
            }
            if round.is_empty() {
                break;
            }
            let encoded: Vec<Result<Vec<u8>>> = std::thread::scope(|scope| {
                let handles: Vec<_> = round
                    .iter()
                    .map(|piece| scope.spawn(|| encode_u16(tokenizer, &what, piece)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::invalid(&what, "a tokenizing thread panicked"))
                        })
                    })
                    .collect()
            });
            drop(round);
            for bytes in encoded {
                let bytes = bytes?;
                for b in bytes.chunks_exact(2) {
                    max_id = max_id.max(u32::from(u16::from_le_bytes([b[0], b[1]])));
                }
                tokens += bytes.len() as u64 / 2;
                file.write_all(&bytes).map_err(io)?;
            }
            let report = Progress {
                read_bytes: read.get(),
                total_bytes,
                tokens,
                pass: passes,
            };
            if progress(report).is_break() {
                return Err(interrupted());
            }
        }
    }
    file.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    Ok((tokens, max_id))
}

/// The error of a preparation stopped by its caller.
fn interrupted() -> Error {
    Error::invalid(
        "prepare",
        "interrupted; the folder was left as it was (the partial files are removed)",
    )
}

/// `piece`'s tokens as little-endian `u16` bytes.
fn encode_u16(tokenizer: &Tokenizer, what: &str, piece: &str) -> Result<Vec<u8>> {
    let ids = tokenizer.encode(what, piece)?;
    let mut bytes = Vec::with_capacity(ids.len() * 2);
    for id in ids {
        let id = u16::try_from(id).map_err(|_| {
            Error::invalid(
                what,
                format!("token id {id} does not fit the u16 token files"),
            )
        })?;
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    Ok(bytes)
}

/// Copies the last tokens of `tmp` to `val.bin`, cuts `tmp` to the rest and renames it
/// `train.bin` (each written under a temporary name first).
fn split(
    tmp: &Path,
    out: &Path,
    tokens: u64,
    max_id: u32,
    options: &PrepareOptions,
    tokenizer: &Tokenizer,
) -> Result<Meta> {
    let train_tokens = ((tokens as f64) * (1.0 - options.val_fraction)).round() as u64;
    let train_tokens = train_tokens.min(tokens);
    let val_tokens = tokens - train_tokens;
    if train_tokens < 2 || val_tokens < 2 {
        return Err(Error::invalid(
            "prepare",
            format!(
                "{tokens} tokens split {train_tokens} for training and {val_tokens} for \
                 validation (--val-fraction {}): each split needs at least 2 tokens (one window \
                 of context 1); give more text or another --val-fraction",
                options.val_fraction
            ),
        ));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io {
            path: path.clone(),
            source,
        }
    };
    let val_tmp = out.join(format!(".val.bin.{}.partial", std::process::id()));
    let copy = (|| {
        let mut from = std::fs::File::open(tmp)?;
        from.seek(SeekFrom::Start(train_tokens * 2))?;
        let mut to = std::fs::File::create(&val_tmp)?;
        std::io::copy(&mut from.take(val_tokens * 2), &mut to)?;
        to.sync_all()?;
        let train = std::fs::OpenOptions::new().write(true).open(tmp)?;
        train.set_len(train_tokens * 2)?;
        train.sync_all()
    })();
    if let Err(e) = copy {
        let _ = std::fs::remove_file(&val_tmp);
        return Err(io(tmp)(e));
    }
    let renamed = std::fs::rename(&val_tmp, out.join("val.bin"))
        .map_err(io(&out.join("val.bin")))
        .and_then(|()| std::fs::rename(tmp, out.join("train.bin")).map_err(io(tmp)));
    let _ = std::fs::remove_file(&val_tmp);
    renamed?;
    Ok(Meta {
        tokenizer: tokenizer.name().to_string(),
        vocab_size: tokenizer.vocab_size(),
        chars: match tokenizer {
            Tokenizer::Char(c) => Some(c.iter().collect()),
            Tokenizer::Gpt2 => None,
        },
        dtype: "uint16".to_string(),
        train_tokens,
        val_tokens,
        max_token_id: max_id,
        val_fraction: options.val_fraction,
        sources: Vec::new(),
        made_by: format!("plimsoll prepare {}", env!("CARGO_PKG_VERSION")),
    })
}

/// Writes `meta.json` atomically.
fn write_meta(out: &Path, meta: &Meta) -> Result<()> {
    let path = out.join("meta.json");
    let text = serde_json::to_string_pretty(meta)
        .map_err(|e| Error::invalid("meta.json", e.to_string()))?;
    let tmp = out.join(format!(".meta.json.{}.partial", std::process::id()));
    let written = std::fs::write(&tmp, text + "\n").and_then(|()| std::fs::rename(&tmp, &path));
    let _ = std::fs::remove_file(&tmp);
    written.map_err(|source| Error::Io { path, source })
}

/// A text read as pieces of whole characters (see the module's documentation).
struct Pieces<'a> {
    source: &'a TextSource,
    reader: Box<dyn Read + 'a>,
    /// Bytes read and not yet handed out (a piece's tail that waits for its cut).
    carry: Vec<u8>,
    piece_bytes: usize,
    /// Cut only after a newline between non-whitespace (GPT-2); else at any newline.
    byte_level: bool,
    /// Bytes handed out so far, and the lines in them: where the next piece starts.
    offset: u64,
    line: u64,
    done: bool,
}

impl<'a> Pieces<'a> {
    fn new(
        source: &'a TextSource,
        counter: &'a std::cell::Cell<u64>,
        piece_bytes: usize,
        byte_level: bool,
    ) -> Result<Pieces<'a>> {
        Ok(Pieces {
            reader: source.open(counter)?,
            source,
            carry: Vec::new(),
            piece_bytes: piece_bytes.max(16),
            byte_level,
            offset: 0,
            line: 1,
            done: false,
        })
    }

    /// The next piece of text, or `None` at the end. Errors: a read that fails, and text that
    /// is not UTF-8 (named with its byte offset and line).
    fn next_piece(&mut self) -> Result<Option<String>> {
        // A piece with no place to cut reads on, up to twice its size, before it is cut after
        // its last whole character.
        let mut target = self.piece_bytes;
        let cut = loop {
            self.fill(target)?;
            if self.carry.is_empty() {
                return Ok(None);
            }
            if self.done {
                break self.carry.len();
            }
            match self.cut() {
                Some(c) => break c,
                None if target < 2 * self.piece_bytes => target = 2 * self.piece_bytes,
                None => break last_char_boundary(&self.carry),
            }
        };
        let rest = self.carry.split_off(cut);
        let piece = std::mem::replace(&mut self.carry, rest);
        match String::from_utf8(piece) {
            Ok(text) => {
                self.offset += text.len() as u64;
                self.line += text.bytes().filter(|&b| b == b'\n').count() as u64;
                Ok(Some(text))
            }
            Err(e) => {
                let valid = e.utf8_error().valid_up_to();
                let bytes = e.as_bytes();
                let line =
                    self.line + bytes[..valid].iter().filter(|&&b| b == b'\n').count() as u64;
                Err(Error::invalid(
                    format!(
                        "{}: line {line}, byte {}",
                        self.source.name(),
                        self.offset + valid as u64
                    ),
                    format!(
                        "is not UTF-8 text (bytes {:02x?} there); convert the file to UTF-8 \
                         (iconv -t UTF-8) or leave it out",
                        &bytes[valid..(valid + 4).min(bytes.len())]
                    ),
                ))
            }
        }
    }

    /// Reads until `target` bytes wait (or the text ends).
    fn fill(&mut self, target: usize) -> Result<()> {
        while !self.done && self.carry.len() < target {
            let at = self.carry.len();
            self.carry.resize(target, 0);
            let n = loop {
                match self.reader.read(&mut self.carry[at..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.carry.truncate(at);
                        return Err(self.source.read_error(e));
                    }
                }
            };
            self.carry.truncate(at + n);
            self.done = n == 0;
        }
        Ok(())
    }

    /// Where to cut the buffer: after its last newline with non-whitespace on both sides (any
    /// newline, for characters); `None` without one.
    fn cut(&self) -> Option<usize> {
        let buf = &self.carry;
        let mut at = buf.len();
        while let Some(nl) = buf[..at].iter().rposition(|&b| b == b'\n') {
            at = nl;
            if !self.byte_level {
                return Some(nl + 1);
            }
            let before = nl.checked_sub(1).and_then(|i| char_ending_at(buf, i));
            let after = char_starting_at(buf, nl + 1);
            let solid = |c: Option<char>| c.is_some_and(|c| !c.is_whitespace());
            if solid(before) && solid(after) {
                return Some(nl + 1);
            }
        }
        None
    }
}

/// The end of the last whole character of `buf` (all of it when that is 0: bytes that are
/// not UTF-8, which the caller then reports).
fn last_char_boundary(buf: &[u8]) -> usize {
    let mut end = buf.len();
    while end > 0 && (buf[end - 1] & 0xC0) == 0x80 {
        end -= 1;
    }
    match end {
        0 => buf.len(),
        e if (buf[e - 1] & 0x80) == 0 => e,
        e if std::str::from_utf8(&buf[e - 1..]).is_ok() => buf.len(),
        e => e - 1,
    }
}

/// The character whose last byte is `buf[i]` (`None` if those bytes are not UTF-8).
fn char_ending_at(buf: &[u8], i: usize) -> Option<char> {
    let start = (i.saturating_sub(3)..=i).find(|&s| {
        std::str::from_utf8(&buf[s..=i])
            .ok()
            .is_some_and(|t| t.chars().count() == 1)
    })?;
    std::str::from_utf8(&buf[start..=i]).ok()?.chars().next()
}

/// The character starting at `buf[i]` (`None` at the end or where the bytes are not UTF-8).
fn char_starting_at(buf: &[u8], i: usize) -> Option<char> {
    let end = (i + 4).min(buf.len());
    (i + 1..=end)
        .find_map(|e| std::str::from_utf8(&buf[i..e]).ok())
        .and_then(|t| t.chars().next())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces_of(text: &str, piece_bytes: usize, byte_level: bool) -> Result<Vec<String>> {
        let dir = std::env::temp_dir().join(format!("plimsoll-pieces-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        let path = dir.join(format!("{piece_bytes}-{byte_level}.txt"));
        std::fs::write(&path, text).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let source = TextSource::File(path);
        let counter = std::cell::Cell::new(0);
        let mut pieces = Pieces::new(&source, &counter, piece_bytes, byte_level)?;
        let mut out = Vec::new();
        while let Some(p) = pieces.next_piece()? {
            out.push(p);
        }
        Ok(out)
    }

    /// Pieces put back together are the text, each GPT-2 cut is after a newline between
    /// non-whitespace, and GPT-2's tokens of the pieces are those of the whole text.
    #[test]
    fn pieces_are_cut_where_gpt2_tokens_do_not_change() -> Result<()> {
        let text =
            "First Citizen:\nBefore we  proceed.\n\n  All:\nSpeak, speak.\n日本語\ncafé\n \nend";
        let whole = Tokenizer::Gpt2.encode("t", text)?;
        for piece_bytes in [16, 20, 24, 40, 1000] {
            let pieces = pieces_of(text, piece_bytes, true)?;
            assert_eq!(pieces.concat(), text);
            let mut joined = Vec::new();
            for p in &pieces {
                joined.extend(Tokenizer::Gpt2.encode("t", p)?);
            }
            assert_eq!(joined, whole, "pieces of {piece_bytes}: {pieces:?}");
        }
        Ok(())
    }
}
