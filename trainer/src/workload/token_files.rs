//! Token files on disk, in nanoGPT's format: a folder with `train.bin` and `val.bin` (token
//! ids as little-endian `u16`, one after another) and a `meta.json` saying how they were made
//! ([`Meta`], written by `plimsoll prepare`). A folder made by nanoGPT's own `prepare.py` has no
//! `meta.json`: its `meta.pkl` (character level) gives the characters, and without one the
//! tokens are GPT-2's, as nanoGPT assumes.
//!
//! [`TokenFile`] reads a file through a memory map (`memmap2`): the operating system pages in
//! the windows a batch reads, and nothing holds the whole file. Everything a folder can say
//! wrong is refused when it is opened, naming the file and the numbers: an odd length (a
//! truncated file), an empty split, a `meta.json` that contradicts the files, a token id at or
//! above the vocabulary (every file of at most [`FULL_SCAN_TOKENS`] tokens is scanned whole;
//! larger ones are checked window by window as batches read them).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// Files of at most this many tokens (2 GiB on disk) are scanned whole for token ids outside
/// the vocabulary when opened; a larger file is checked a window at a time as it is read.
pub const FULL_SCAN_TOKENS: usize = 1 << 30;

/// What `meta.json` records about a prepared folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// `gpt2` or `char`.
    pub tokenizer: String,
    /// Distinct token ids (50,257 for GPT-2; the characters for `char`).
    pub vocab_size: usize,
    /// The characters of a `char` vocabulary, in id order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chars: Option<String>,
    /// The element type of the `.bin` files (`uint16`, little-endian).
    pub dtype: String,
    /// Tokens in `train.bin`.
    pub train_tokens: u64,
    /// Tokens in `val.bin`.
    pub val_tokens: u64,
    /// The largest token id in either file.
    pub max_token_id: u32,
    /// The share of the tokens in `val.bin` (the last tokens of the text).
    pub val_fraction: f64,
    /// The texts, in the order they were read, with their sizes in bytes.
    pub sources: Vec<MetaSource>,
    /// What wrote the folder (`plimsoll prepare`, its version).
    pub made_by: String,
}

/// One text `plimsoll prepare` read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaSource {
    /// Its path as given (or `bundled data/shakespeare.txt.gz`).
    pub path: String,
    /// Its size on disk in bytes (compressed, for a gzip file).
    pub bytes: u64,
}

impl Meta {
    /// The tokenizer this folder's tokens were made with. Errors name `path`.
    pub fn tokenizer(&self, path: &Path) -> Result<Tokenizer> {
        let bad = |message: String| Error::invalid(path.display().to_string(), message);
        match self.tokenizer.as_str() {
            "char" => {
                let chars = self.chars.as_deref().ok_or_else(|| {
                    bad("a char tokenizer, but no \"chars\": the vocabulary is missing".into())
                })?;
                let vocab: Vec<char> = chars.chars().collect();
                let tokenizer = Tokenizer::Char(vocab.clone());
                if tokenizer != Tokenizer::chars(vocab.iter().copied()) {
                    return Err(bad(
                        "\"chars\" is not sorted and distinct: it was not written by plimsoll \
                         prepare"
                            .into(),
                    ));
                }
                Ok(tokenizer)
            }
            name => Tokenizer::named(name).map_err(|_| {
                bad(format!(
                    "tokenizer {name:?} is not one this build knows (gpt2, char); prepare the \
                     text again with plimsoll prepare --tokenizer gpt2|char"
                ))
            }),
        }
    }
}

/// One `.bin` file of little-endian `u16` token ids, memory-mapped.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    map: memmap2::Mmap,
    tokens: usize,
}

impl TokenFile {
    /// Maps the file at `path`. Errors: it cannot be opened, it is empty, or its length is odd
    /// (a truncated file: every token is two bytes).
    pub fn open(path: &Path) -> Result<TokenFile> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let bytes = file.metadata().map_err(io)?.len();
        let what = path.display().to_string();
        if bytes == 0 {
            return Err(Error::invalid(
                what,
                "is empty: a split needs tokens; prepare the text again with a --val-fraction \
                 that leaves both splits some, or give more text",
            ));
        }
        if bytes % 2 == 1 {
            return Err(Error::invalid(
                what,
                format!(
                    "has {bytes} bytes, an odd number: tokens are 2 bytes each (u16), so the \
                     file is truncated or not a token file; prepare it again"
                ),
            ));
        }
        let map = map_read_only(&file).map_err(io)?;
        Ok(TokenFile {
            path: path.to_path_buf(),
            tokens: map.len() / 2,
            map,
        })
    }

    /// Tokens in the file.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// Whether the file holds no token (never: [`TokenFile::open`] refuses it).
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends tokens `start..start + count` to `out`. Errors: the range passes the end, or a
    /// token is at or above `vocab` (named with its offset).
    pub fn read_into(
        &self,
        start: usize,
        count: usize,
        vocab: usize,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let bytes = start
            .checked_add(count)
            .and_then(|end| self.map.get(start * 2..end * 2))
            .ok_or_else(|| {
                Error::invalid(
                    self.path.display().to_string(),
                    format!(
                        "tokens {start}..{} are past its end ({} tokens); was the file \
                         truncated while the run read it?",
                        start.saturating_add(count),
                        self.tokens
                    ),
                )
            })?;
        let at = out.len();
        out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]))),
        );
        if let Some(i) = out[at..].iter().position(|&id| id as usize >= vocab) {
            return Err(self.out_of_vocab(start + i, out[at + i], vocab));
        }
        Ok(())
    }

    /// The first token at or above `vocab`, scanning the whole file: `Err` naming it.
    pub fn check_ids(&self, vocab: usize) -> Result<()> {
        if vocab > usize::from(u16::MAX) {
            return Ok(());
        }
        let bad = self
            .map
            .chunks_exact(2)
            .position(|b| usize::from(u16::from_le_bytes([b[0], b[1]])) >= vocab);
        match bad {
            None => Ok(()),
            Some(i) => {
                let id = u16::from_le_bytes([self.map[2 * i], self.map[2 * i + 1]]);
                Err(self.out_of_vocab(i, u32::from(id), vocab))
            }
        }
    }

    fn out_of_vocab(&self, token: usize, id: u32, vocab: usize) -> Error {
        Error::invalid(
            format!(
                "{}: token {token} (byte {})",
                self.path.display(),
                token * 2
            ),
            format!(
                "id {id} is not below the vocabulary of {vocab}: the file was made with another \
                 tokenizer than its meta.json names, or is damaged; prepare it again"
            ),
        )
    }

    /// A checksum of the file that costs little for a large one: SHA-256 of its length and of
    /// 64 blocks of 64 KiB spread over it (the whole file when it is smaller).
    pub fn fingerprint(&self, hasher: &mut sha2::Sha256) {
        use sha2::Digest;
        const BLOCK: usize = 64 << 10;
        const BLOCKS: usize = 64;
        let bytes = &self.map[..];
        hasher.update((bytes.len() as u64).to_le_bytes());
        if bytes.len() <= BLOCK * BLOCKS {
            hasher.update(bytes);
            return;
        }
        let stride = (bytes.len() - BLOCK) / (BLOCKS - 1);
        for i in 0..BLOCKS {
            hasher.update(&bytes[i * stride..i * stride + BLOCK]);
        }
    }
}

/// Maps `file` read-only.
#[allow(unsafe_code)]
fn map_read_only(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and lives inside `TokenFile`, which hands out copies of its
    // bytes, never references past its own borrow. Another process that truncates the file while
    // it is mapped would make a read fault (as for nanoGPT's `np.memmap`); a run refuses to
    // resume on a file whose fingerprint changed, and `plimsoll prepare` writes new files under
    // temporary names and renames them, which leaves mapped files intact.
    unsafe { memmap2::Mmap::map(file) }
}

/// A prepared folder: its two splits, mapped, and its tokenizer.
#[derive(Debug, Clone)]
pub struct TokenFolder {
    /// The folder.
    pub dir: PathBuf,
    /// `train.bin`.
    pub train: Arc<TokenFile>,
    /// `val.bin`.
    pub val: Arc<TokenFile>,
    /// How the tokens were made.
    pub tokenizer: Tokenizer,
    /// Where the tokenizer came from, in words (`meta.json`, nanoGPT's `meta.pkl`, or the
    /// GPT-2 default of a folder with neither).
    pub tokenizer_source: String,
    /// `meta.json`'s bytes (empty without one), part of the fingerprint.
    meta_bytes: Vec<u8>,
}

impl TokenFolder {
    /// Whether `path` is a folder that holds a `train.bin`.
    pub fn looks_like(path: &Path) -> bool {
        path.is_dir() && path.join("train.bin").is_file()
    }

    /// Opens the folder `dir` and checks it (see the module's documentation).
    pub fn open(dir: &Path) -> Result<TokenFolder> {
        let what = dir.display().to_string();
        if !dir.is_dir() {
            return Err(Error::invalid(
                what,
                "is not a folder of token files; make one with plimsoll prepare TEXT --out DIR",
            ));
        }
        for name in ["train.bin", "val.bin"] {
            if !dir.join(name).is_file() {
                return Err(Error::invalid(
                    what,
                    format!(
                        "has no {name}: a token folder holds train.bin and val.bin (make one \
                         with plimsoll prepare TEXT --out DIR)"
                    ),
                ));
            }
        }
        let train = Arc::new(TokenFile::open(&dir.join("train.bin"))?);
        let val = Arc::new(TokenFile::open(&dir.join("val.bin"))?);
        let meta_path = dir.join("meta.json");
        let pkl_path = dir.join("meta.pkl");
        let (tokenizer, tokenizer_source, meta_bytes) = if meta_path.is_file() {
            let (meta, bytes) = read_meta(&meta_path)?;
            let tokenizer = check_meta(&meta, &meta_path, &train, &val)?;
            (tokenizer, "meta.json".to_string(), bytes)
        } else if pkl_path.is_file() {
            (
                nanogpt_meta_pkl(&pkl_path)?,
                "nanoGPT's meta.pkl".to_string(),
                Vec::new(),
            )
        } else {
            (
                Tokenizer::Gpt2,
                "GPT-2's (no meta.json or meta.pkl, as nanoGPT assumes)".to_string(),
                Vec::new(),
            )
        };
        let vocab = tokenizer.vocab_size();
        for file in [&train, &val] {
            if file.len() <= FULL_SCAN_TOKENS {
                file.check_ids(vocab)?;
            }
        }
        Ok(TokenFolder {
            dir: dir.to_path_buf(),
            train,
            val,
            tokenizer,
            tokenizer_source,
            meta_bytes,
        })
    }

    /// The tokenizer of the folder `dir` from its `meta.json` or `meta.pkl` alone (GPT-2's
    /// with neither), without opening the token files: what `plimsoll sample` decodes with.
    pub fn tokenizer_of(dir: &Path) -> Result<Tokenizer> {
        let meta_path = dir.join("meta.json");
        let pkl_path = dir.join("meta.pkl");
        if meta_path.is_file() {
            read_meta(&meta_path)?.0.tokenizer(&meta_path)
        } else if pkl_path.is_file() {
            nanogpt_meta_pkl(&pkl_path)
        } else {
            Ok(Tokenizer::Gpt2)
        }
    }

    /// SHA-256 (hex) of `meta.json` and both files' fingerprints ([`TokenFile::fingerprint`]):
    /// what a resumed run compares.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        hasher.update((self.meta_bytes.len() as u64).to_le_bytes());
        hasher.update(&self.meta_bytes);
        self.train.fingerprint(&mut hasher);
        self.val.fingerprint(&mut hasher);
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// The `meta.json` at `path` and its bytes.
fn read_meta(path: &Path) -> Result<(Meta, Vec<u8>)> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let meta = serde_json::from_slice(&bytes).map_err(|e| {
        Error::invalid(
            path.display().to_string(),
            format!("is not the meta.json plimsoll prepare writes: {e}"),
        )
    })?;
    Ok((meta, bytes))
}

/// The tokenizer `meta` names, once it agrees with the files.
fn check_meta(meta: &Meta, path: &Path, train: &TokenFile, val: &TokenFile) -> Result<Tokenizer> {
    let bad = |message: String| Error::invalid(path.display().to_string(), message);
    let tokenizer = meta.tokenizer(path)?;
    if tokenizer.vocab_size() != meta.vocab_size {
        return Err(bad(format!(
            "says vocab_size {}, but its {} tokenizer has {}; prepare the text again",
            meta.vocab_size,
            meta.tokenizer,
            tokenizer.vocab_size()
        )));
    }
    if meta.dtype != "uint16" {
        return Err(bad(format!(
            "says dtype {:?}; only uint16 token files are read",
            meta.dtype
        )));
    }
    for (file, recorded) in [(train, meta.train_tokens), (val, meta.val_tokens)] {
        if file.len() as u64 != recorded {
            return Err(bad(format!(
                "records {recorded} tokens for {}, which holds {}: the files changed after \
                 they were prepared; prepare the text again",
                file.path().display(),
                file.len()
            )));
        }
    }
    if meta.max_token_id as usize >= meta.vocab_size {
        return Err(bad(format!(
            "records a largest token id of {}, not below its vocab_size {}",
            meta.max_token_id, meta.vocab_size
        )));
    }
    Ok(tokenizer)
}

/// The characters of nanoGPT's `meta.pkl` (`{'vocab_size': n, 'itos': {i: ch}, 'stoi': ...}`).
fn nanogpt_meta_pkl(path: &Path) -> Result<Tokenizer> {
    use serde_pickle::{HashableValue, Value};
    let what = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |why: &str| {
        Error::invalid(
            what.clone(),
            format!("is not nanoGPT's character meta.pkl ({why})"),
        )
    };
    let value = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new())
        .map_err(|e| bad(&e.to_string()))?;
    let Value::Dict(dict) = value else {
        return Err(bad("not a dict"));
    };
    let itos = match dict.get(&HashableValue::String("itos".into())) {
        Some(Value::Dict(itos)) => itos,
        _ => return Err(bad("no itos dict")),
    };
    let mut chars = vec![None; itos.len()];
    for (k, v) in itos {
        let (HashableValue::I64(i), Value::String(s)) = (k, v) else {
            return Err(bad("an itos entry is not int: str"));
        };
        let mut it = s.chars();
        let (Some(c), None) = (it.next(), it.next()) else {
            return Err(bad("an itos entry is not one character"));
        };
        let slot = usize::try_from(*i)
            .ok()
            .and_then(|i| chars.get_mut(i))
            .ok_or_else(|| bad("itos ids are not 0..vocab_size"))?;
        *slot = Some(c);
    }
    let chars: Vec<char> = chars
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| bad("itos ids are not 0..vocab_size"))?;
    // nanoGPT's ids are the sorted characters, as ours.
    let tokenizer = Tokenizer::chars(chars.iter().copied());
    if tokenizer != Tokenizer::Char(chars) {
        return Err(bad("its characters are not sorted by id"));
    }
    Ok(tokenizer)
}
