//! [`Dataset`]: samples kept in host memory (features `(N, D)` f32 row-major, class labels `(N)`),
//! seeded shuffling ([`epoch_order`]) and micro-batch upload ([`Dataset::upload`]). Only the
//! samples of the current micro-batch are ever on the device (as `Category::Input`); the whole
//! dataset is never one device tensor.
//!
//! The order of epoch `e` is a pure function of `(seed, e)`, so a resumed run needs only the
//! epoch and the step within it to see exactly the batches the uninterrupted run would have.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::random::SplitMix64;

use crate::error::{Error, Result};
use crate::task::{Batch, Data, HostBatch, HostInputs};
use crate::text::TokenWindows;
use crate::token_files::TokenFile;

/// An in-memory classification dataset. Invariant: `features.len() == labels.len() *
/// feature_dim` and every label is `< num_classes`.
#[derive(Debug, Clone)]
pub struct Dataset {
    features: Vec<f32>,
    labels: Vec<u32>,
    feature_dim: usize,
    num_classes: usize,
}

/// The permutation of `0..len` used in epoch `epoch` of a run seeded with `seed` (Fisher-Yates).
pub fn epoch_order(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
    shuffled(len, &mut rng)
}

/// Training sets up to this many samples are shuffled by [`epoch_order`] (a vector of their
/// indices, 32 MiB at this size); larger ones (windows of a token file of billions of tokens)
/// by a keyed permutation that computes each position's sample and holds nothing.
pub const SHUFFLE_LIMIT: usize = 1 << 22;

/// The order of one epoch's samples: [`epoch_order`]'s shuffle, or a keyed permutation above
/// [`SHUFFLE_LIMIT`] samples. Both are pure functions of `(len, seed, epoch)`.
#[derive(Debug, Clone)]
pub enum EpochOrder {
    /// The indices, shuffled.
    Shuffled(Vec<usize>),
    /// A permutation computed position by position.
    Keyed(KeyedPermutation),
}

impl EpochOrder {
    /// The order of epoch `epoch` of `len` samples seeded with `seed`.
    pub fn new(len: usize, seed: u64, epoch: u64) -> EpochOrder {
        match len <= SHUFFLE_LIMIT {
            true => EpochOrder::Shuffled(epoch_order(len, seed, epoch)),
            false => EpochOrder::Keyed(KeyedPermutation::new(
                len as u64,
                seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03),
            )),
        }
    }

    /// Samples in the epoch.
    pub fn len(&self) -> usize {
        match self {
            EpochOrder::Shuffled(v) => v.len(),
            EpochOrder::Keyed(p) => p.len as usize,
        }
    }

    /// Whether the epoch has no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The samples at positions `first..first + count` of the epoch (fewer at its end, none
    /// past it).
    pub fn range(&self, first: usize, count: usize) -> Vec<usize> {
        let end = first.saturating_add(count).min(self.len());
        match self {
            EpochOrder::Shuffled(v) => v.get(first..end).map(<[usize]>::to_vec).unwrap_or_default(),
            EpochOrder::Keyed(p) => (first..end).map(|i| p.apply(i as u64) as usize).collect(),
        }
    }
}

/// A bijection of `0..len` from a key: a four-round Feistel network over the smallest even
/// number of bits that holds `len`, with cycle walking (a value at or past `len` is permuted
/// again until it falls inside, at most about four times on average).
#[derive(Debug, Clone)]
pub struct KeyedPermutation {
    len: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl KeyedPermutation {
    /// The permutation of `0..len` keyed by `key`.
    pub fn new(len: u64, key: u64) -> KeyedPermutation {
        let bits = (64 - len.saturating_sub(1).leading_zeros()).max(2);
        let mut rng = SplitMix64::new(key);
        KeyedPermutation {
            len,
            half_bits: bits.div_ceil(2),
            keys: std::array::from_fn(|_| rng.next_u64()),
        }
    }

    /// Where position `i` (below `len`) goes.
    pub fn apply(&self, i: u64) -> u64 {
        let mut x = i;
        loop {
            x = self.round_trip(x);
            if x < self.len {
                return x;
            }
        }
    }

    fn round_trip(&self, x: u64) -> u64 {
        let h = self.half_bits;
        let mask = (1u64 << h) - 1;
        let (mut left, mut right) = (x >> h, x & mask);
        for key in self.keys {
            let mut z = right ^ key;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (left, right) = (right, left ^ (z & mask));
        }
        (left << h) | right
    }
}

fn shuffled(len: usize, rng: &mut SplitMix64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

impl Dataset {
    /// A dataset from row-major features and labels; checks the invariant.
    pub fn new(
        features: Vec<f32>,
        labels: Vec<u32>,
        feature_dim: usize,
        num_classes: usize,
    ) -> Result<Self> {
        if feature_dim == 0 || features.len() != labels.len() * feature_dim {
            return Err(Error::invalid(
                "dataset",
                format!(
                    "{} feature values for {} labels of dimension {feature_dim}",
                    features.len(),
                    labels.len()
                ),
            ));
        }
        if let Some(bad) = labels.iter().find(|&&l| l as usize >= num_classes) {
            return Err(Error::invalid(
                "dataset",
                format!("label {bad} is not below the number of classes {num_classes}"),
            ));
        }
        Ok(Dataset {
            features,
            labels,
            feature_dim,
            num_classes,
        })
    }

    /// `len` samples of `feature_dim` standard-normal features and uniform labels, from `seed`.
    pub fn synthetic(
        len: usize,
        feature_dim: usize,
        num_classes: usize,
        seed: u64,
    ) -> Result<Self> {
        let elements = crate::host::product(len, feature_dim);
        crate::host::check(
            &format!("{len} synthetic samples of {feature_dim} features"),
            elements,
            4,
        )?;
        let mut rng = SplitMix64::new(seed);
        let mut features = Vec::with_capacity(elements as usize);
        for _ in 0..elements {
            let u1 = 1.0 - rng.unit_f64();
            let u2 = rng.unit_f64();
            features.push(((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32);
        }
        let labels = (0..len)
            .map(|_| (rng.unit_f64() * num_classes as f64) as u32 % num_classes.max(1) as u32)
            .collect();
        Dataset::new(features, labels, feature_dim, num_classes)
    }

    /// Reads a CSV (gzip-compressed or plain) of rows `f_1, ..., f_D, label` (integers or
    /// floats), e.g. the digits data: 64 pixels in `0..=16`, then the digit. `num_classes` is
    /// the largest label + 1. A ragged row, a non-number or a label that is not a whole number
    /// from 0 is an error naming the file and line.
    pub fn from_csv_gz(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_csv_gz_bytes(&path.display().to_string(), &bytes)
    }

    /// [`Dataset::from_csv_gz`] of a file already in memory (gzip or plain); `what` names it in
    /// errors.
    pub fn from_csv_gz_bytes(what: &str, bytes: &[u8]) -> Result<Self> {
        let mut text = String::new();
        if bytes.starts_with(&[0x1f, 0x8b]) {
            flate2::read::GzDecoder::new(bytes)
                .read_to_string(&mut text)
                .map_err(|e| Error::invalid(what, format!("damaged gzip: {e}")))?;
        } else {
            text = String::from_utf8(bytes.to_vec())
                .map_err(|e| Error::invalid(what, format!("neither gzip nor UTF-8 text: {e}")))?;
        }
        let mut features = Vec::new();
        let mut labels = Vec::new();
        let mut lines = Vec::new();
        let mut feature_dim = None;
        for (line_no, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let bad = |message: String| Error::invalid(format!("{what}:{}", line_no + 1), message);
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let Some((label, pixels)) = fields.split_last() else {
                continue;
            };
            if *feature_dim.get_or_insert(pixels.len()) != pixels.len() {
                return Err(bad(format!(
                    "{} features, but the first row has {} (every row needs the same count)",
                    pixels.len(),
                    feature_dim.unwrap_or(0)
                )));
            }
            for (column, p) in pixels.iter().enumerate() {
                let value = p.parse::<f32>().map_err(|e| bad(format!("{p:?}: {e}")))?;
                // "nan", "inf" and numbers past f32's range parse, and would train to NaN.
                if !value.is_finite() {
                    return Err(bad(format!(
                        "feature {} is {p:?}, not a finite number (every feature must be one, \
                         at most {:e} in magnitude); fix or drop that row",
                        column + 1,
                        f32::MAX
                    )));
                }
                features.push(value);
            }
            labels.push(
                label
                    .parse::<u32>()
                    .map_err(|e| bad(format!("label {label:?}: {e}")))?,
            );
            lines.push(line_no + 1);
        }
        if labels.is_empty() {
            return Err(Error::invalid(what, "no samples (an empty file?)"));
        }
        let num_classes = labels.iter().max().map_or(0, |&m| m as usize + 1);
        // The classes are 0..N-1: a label past a class no row has is outside them (a typo
        // such as 57 among digits would otherwise add 48 empty classes silently).
        let mut seen = vec![false; num_classes.min(1 << 20)];
        for &l in &labels {
            if let Some(s) = seen.get_mut(l as usize) {
                *s = true;
            }
        }
        if let Some(missing) = seen.iter().position(|s| !s)
            && let Some(at) = labels.iter().position(|&l| l as usize > missing)
        {
            return Err(Error::invalid(
                format!("{what}:{}", lines[at]),
                format!(
                    "label {} is outside the classes: no row has label {missing}, and labels \
                     must be 0 to N-1",
                    labels[at]
                ),
            ));
        }
        Dataset::new(features, labels, feature_dim.unwrap_or(0), num_classes)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Features per sample.
    pub fn feature_dim(&self) -> usize {
        self.feature_dim
    }

    /// Number of classes.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// The labels.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    /// The features, row-major `(N, D)`.
    pub fn features(&self) -> &[f32] {
        &self.features
    }

    /// The features, row-major `(N, D)` (mutable, e.g. to inject a NaN in a test).
    pub fn features_mut(&mut self) -> &mut [f32] {
        &mut self.features
    }

    /// Multiplies every feature by `factor` (e.g. 1/16 for digits' pixels).
    pub fn scale(&mut self, factor: f32) {
        self.features.iter_mut().for_each(|f| *f *= factor);
    }

    /// Splits off a test set of `round(len * test_fraction)` samples, chosen by a shuffle with
    /// `seed`; returns `(train, test)`.
    pub fn split(&self, test_fraction: f64, seed: u64) -> (Dataset, Dataset) {
        let order = shuffled(self.len(), &mut SplitMix64::new(seed));
        let test_len = ((self.len() as f64) * test_fraction).round() as usize;
        let (test, train) = order.split_at(test_len.min(self.len()));
        (self.subset(train), self.subset(test))
    }

    fn subset(&self, indices: &[usize]) -> Dataset {
        let d = self.feature_dim;
        let mut features = Vec::with_capacity(indices.len() * d);
        for &i in indices {
            features.extend_from_slice(&self.features[i * d..(i + 1) * d]);
        }
        Dataset {
            features,
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            feature_dim: d,
            num_classes: self.num_classes,
        }
    }
}

impl Dataset {
    /// The rows `indices` in host memory. Errors: an index out of range.
    fn rows(&self, indices: &[usize]) -> Result<HostBatch> {
        let d = self.feature_dim;
        let mut features = Vec::with_capacity(indices.len() * d);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            let row = self.features.get(i * d..(i + 1) * d).ok_or_else(|| {
                Error::invalid(
                    "batch",
                    format!("sample {i} of a dataset of {}", self.labels.len()),
                )
            })?;
            features.extend_from_slice(row);
            labels.push(self.labels[i]);
        }
        Ok(HostBatch {
            rows: indices.len(),
            input_width: d,
            inputs: HostInputs::Features(features),
            targets: labels,
            targets_per_row: None,
        })
    }
}

impl Data for Dataset {
    fn len(&self) -> usize {
        self.labels.len()
    }

    /// The rows `indices` as features `[n, d]` f32 (`Category::Input`) and labels `[n]` u32.
    /// Indices out of range are an error.
    fn upload(&self, gpu: &Gpu, indices: &[usize]) -> Result<Batch> {
        self.rows(indices)?.upload_rows(gpu, 0..indices.len())
    }

    fn gather(&self, indices: &[usize]) -> Result<Option<HostBatch>> {
        self.rows(indices).map(Some)
    }

    fn input_width(&self) -> usize {
        self.feature_dim
    }

    fn classes(&self) -> usize {
        self.num_classes
    }

    fn describe(&self) -> String {
        format!(
            "{} rows of {} features, {} classes",
            self.labels.len(),
            self.feature_dim,
            self.num_classes
        )
    }
}

/// `data/digits.csv.gz`, compiled in so that the command works from any directory.
pub const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../../data/digits.csv.gz");

/// A token sequence: in host memory, or a token file read through its memory map.
#[derive(Debug, Clone)]
pub enum Tokens {
    /// Ids in host memory.
    Host(Arc<Vec<u32>>),
    /// A `.bin` file of `u16` ids ([`TokenFile`]).
    File(Arc<TokenFile>),
}

impl Tokens {
    /// Tokens in the sequence.
    pub fn len(&self) -> usize {
        match self {
            Tokens::Host(t) => t.len(),
            Tokens::File(f) => f.len(),
        }
    }

    /// Whether the sequence is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the tokens come from, for messages.
    fn what(&self) -> String {
        match self {
            Tokens::Host(_) => "the token sequence".to_string(),
            Tokens::File(f) => f.path().display().to_string(),
        }
    }
}

/// Windows of `context` tokens of a token sequence, each paired with the next `context` tokens:
/// every window (training, drawn in a seeded order) or `count` evenly spaced ones (a fixed
/// validation set).
#[derive(Debug, Clone)]
pub struct TokenData {
    tokens: Tokens,
    context: usize,
    vocab: usize,
    /// Start of sample `i`: `starts[i]`, or `i` when `None` (every window).
    starts: Option<Vec<usize>>,
}

impl TokenData {
    /// Every window of `tokens` (ids below `vocab`). Errors: a context the sequence cannot
    /// hold.
    pub fn windows(tokens: Arc<Vec<u32>>, context: usize, vocab: usize) -> Result<TokenData> {
        Self::windows_of(Tokens::Host(tokens), context, vocab)
    }

    /// Every window of `tokens`, in memory or in a file. Errors: a context the sequence cannot
    /// hold, named with the file.
    pub fn windows_of(tokens: Tokens, context: usize, vocab: usize) -> Result<TokenData> {
        Self::check_context(&tokens, context)?;
        Ok(TokenData {
            tokens,
            context,
            vocab,
            starts: None,
        })
    }

    /// `count` windows evenly spaced over `tokens` (all of them if there are fewer).
    pub fn evenly_spaced(
        tokens: Arc<Vec<u32>>,
        context: usize,
        vocab: usize,
        count: usize,
    ) -> Result<TokenData> {
        Self::evenly_spaced_of(Tokens::Host(tokens), context, vocab, count)
    }

    /// [`TokenData::evenly_spaced`] over tokens in memory or in a file.
    pub fn evenly_spaced_of(
        tokens: Tokens,
        context: usize,
        vocab: usize,
        count: usize,
    ) -> Result<TokenData> {
        Self::check_context(&tokens, context)?;
        let all = tokens.len() - context;
        let count = count.clamp(1, all);
        let starts = (0..count).map(|i| i * all / count).collect();
        Ok(TokenData {
            tokens,
            context,
            vocab,
            starts: Some(starts),
        })
    }

    fn check_context(tokens: &Tokens, context: usize) -> Result<()> {
        if context == 0 || context >= tokens.len() {
            return Err(Error::invalid(
                "--context",
                format!(
                    "a context of {context} tokens needs between 1 and {} ({} has {} tokens, and \
                     a window is context + 1); give a smaller --context or more text",
                    tokens.len().saturating_sub(1),
                    tokens.what(),
                    tokens.len()
                ),
            ));
        }
        Ok(())
    }

    fn start(&self, i: usize) -> usize {
        match &self.starts {
            Some(s) => s.get(i).copied().unwrap_or(usize::MAX),
            None => i,
        }
    }

    /// The windows `indices` in host memory. Errors: an index past the last window, or (from a
    /// file) a token id at or above the vocabulary, named with its offset.
    fn windows_at(&self, indices: &[usize]) -> Result<HostBatch> {
        let windows = self.len();
        if let Some(&i) = indices.iter().find(|&&i| i >= windows) {
            return Err(Error::invalid(
                "window",
                format!("window {i} is past the last of {windows} windows"),
            ));
        }
        let t = self.context;
        let starts: Vec<usize> = indices.iter().map(|&i| self.start(i)).collect();
        let (inputs, targets) = match &self.tokens {
            Tokens::Host(tokens) => TokenWindows::new(tokens, t)?.gather(&starts)?,
            Tokens::File(file) => {
                let mut inputs = Vec::with_capacity(starts.len() * t);
                let mut targets = Vec::with_capacity(starts.len() * t);
                let mut window = Vec::with_capacity(t + 1);
                for &s in &starts {
                    window.clear();
                    file.read_into(s, t + 1, self.vocab, &mut window)?;
                    inputs.extend_from_slice(&window[..t]);
                    targets.extend_from_slice(&window[1..]);
                }
                (inputs, targets)
            }
        };
        Ok(HostBatch {
            rows: indices.len(),
            input_width: t,
            inputs: HostInputs::Tokens(inputs),
            targets,
            targets_per_row: Some(t),
        })
    }
}

impl Data for TokenData {
    fn len(&self) -> usize {
        match &self.starts {
            Some(s) => s.len(),
            None => self.tokens.len() - self.context,
        }
    }

    /// The windows `indices` as inputs and targets, `[n, context]` u32 each.
    fn upload(&self, gpu: &Gpu, indices: &[usize]) -> Result<Batch> {
        self.windows_at(indices)?.upload_rows(gpu, 0..indices.len())
    }

    fn gather(&self, indices: &[usize]) -> Result<Option<HostBatch>> {
        self.windows_at(indices).map(Some)
    }

    fn input_width(&self) -> usize {
        self.context
    }

    fn classes(&self) -> usize {
        self.vocab
    }

    fn describe(&self) -> String {
        let from = match &self.tokens {
            Tokens::Host(_) => String::new(),
            Tokens::File(f) => format!(" of {}", f.path().display()),
        };
        format!(
            "{} windows of {} tokens{from} over a vocabulary of {}",
            self.len(),
            self.context,
            self.vocab
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_order_is_a_seeded_permutation() {
        let a = epoch_order(100, 7, 3);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_eq!(a, epoch_order(100, 7, 3));
        assert_ne!(a, epoch_order(100, 7, 4));
        assert_ne!(a, epoch_order(100, 8, 3));
    }

    /// The keyed permutation is a seeded bijection of `0..len` for lengths around powers of
    /// two and odd bit counts, and spreads a run of positions over the whole range.
    #[test]
    fn the_keyed_permutation_is_a_seeded_bijection() {
        for len in [1u64, 2, 3, 5, 64, 1000, 4097, 65_537] {
            let p = KeyedPermutation::new(len, 11);
            let mut seen: Vec<u64> = (0..len).map(|i| p.apply(i)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..len).collect::<Vec<_>>(), "len {len}");
        }
        let (a, b) = (
            KeyedPermutation::new(1000, 1),
            KeyedPermutation::new(1000, 2),
        );
        assert!((0..1000).any(|i| a.apply(i) != b.apply(i)));
        let big = EpochOrder::new(SHUFFLE_LIMIT * 3 + 7, 5, 0);
        let first = big.range(0, 1000);
        assert_eq!(
            first,
            EpochOrder::new(SHUFFLE_LIMIT * 3 + 7, 5, 0).range(0, 1000)
        );
        assert_ne!(
            first,
            EpochOrder::new(SHUFFLE_LIMIT * 3 + 7, 5, 1).range(0, 1000)
        );
        let in_last_quarter = first.iter().filter(|&&i| i > SHUFFLE_LIMIT * 9 / 4).count();
        assert!(
            (150..350).contains(&in_last_quarter),
            "{in_last_quarter} of 1000"
        );
        assert_eq!(big.range(SHUFFLE_LIMIT * 3 + 5, 10).len(), 2);
        assert_eq!(
            EpochOrder::new(100, 7, 3).range(0, 100),
            epoch_order(100, 7, 3)
        );
    }

    #[test]
    fn split_partitions_the_samples() -> Result<()> {
        let data = Dataset::synthetic(50, 3, 4, 1)?;
        let (train, test) = data.split(0.2, 5);
        assert_eq!((train.len(), test.len()), (40, 10));
        let err = Dataset::new(vec![0.0; 3], vec![9], 3, 4).expect_err("label 9 of 4 classes");
        assert!(
            err.to_string()
                .contains("label 9 is not below the number of classes 4"),
            "{err}"
        );
        Ok(())
    }

    /// "nan", "inf" and a number beyond f32's range parse as floats; each is refused with its
    /// line and column, and finite rows still load.
    #[test]
    fn a_feature_that_is_not_finite_is_refused_with_its_line() {
        for bad in ["nan", "inf", "-inf", "1e39"] {
            let text = format!("1,2,0\n3,{bad},1\n");
            match Dataset::from_csv_gz_bytes("t.csv", text.as_bytes()) {
                Err(Error::Invalid { what, message: why }) => {
                    assert_eq!(what, "t.csv:2", "{bad}");
                    assert!(why.contains("feature 2") && why.contains("finite"), "{why}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        let ok = Dataset::from_csv_gz_bytes("t.csv", b"1,2,0\n3,-4.5e3,1\n");
        assert_eq!(ok.map(|d| d.len()).ok(), Some(2));
    }
}
