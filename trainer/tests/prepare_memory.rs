//! `prepare` streams: a text many times larger than the host memory it is allowed is prepared
//! without the heap ever growing past that limit (counted by this test binary's allocator).

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;

use plimsoll_trainer::host_memory::{self, CountingAllocator};
use plimsoll_trainer::prepare::{PrepareOptions, TextSource, prepare};
use plimsoll_trainer::{TokenFolder, Tokenizer};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Writes `bytes` bytes of text lines to `path` a line at a time (never held whole).
fn write_text(path: &Path, bytes: u64) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let words = [
        "Before", "we", "proceed", "any", "further,", "hear", "me", "speak.", "ÆØ",
    ];
    let (mut written, mut i) = (0u64, 0usize);
    while written < bytes {
        let n = 4 + i % 9;
        let mut line: String = (0..n)
            .map(|j| words[(i * 7 + j * 3) % words.len()])
            .collect::<Vec<_>>()
            .join(" ");
        line.push('\n');
        if i % 11 == 0 {
            line.push('\n');
        }
        out.write_all(line.as_bytes()).unwrap();
        written += line.len() as u64;
        i += 1;
    }
    out.flush().unwrap();
}

/// Prepares a text of `text_bytes` with `limit` bytes of host memory; returns the heap's peak
/// growth during the preparation and the tokens written.
fn peak_growth(dir: &Path, tokenizer: &str, text_bytes: u64, limit: u64) -> (u64, u64) {
    let src = dir.join(format!("{tokenizer}.txt"));
    write_text(&src, text_bytes);
    let out = dir.join(tokenizer);
    // GPT-2's tables are built once per process, outside any preparation's budget.
    Tokenizer::Gpt2.encode("warm-up", "hello").unwrap();
    let options = PrepareOptions {
        tokenizer: tokenizer.to_string(),
        val_fraction: 0.1,
        threads: 2,
        memory_limit_bytes: limit,
        overwrite: false,
    };
    let sources = [TextSource::File(src)];
    host_memory::reset_peak();
    let before = host_memory::heap().unwrap().live_bytes;
    let meta = prepare(&sources, &out, &options, &mut |_| ControlFlow::Continue(())).unwrap();
    let growth = host_memory::heap().unwrap().peak_bytes - before;
    TokenFolder::open(&out).unwrap();
    (growth, meta.train_tokens + meta.val_tokens)
}

#[test]
fn a_text_many_times_the_memory_limit_is_prepared_within_it() {
    let dir = plimsoll_kernels_wgsl::testing::fresh_dir("trainer", "prepare-memory");
    for (tokenizer, text_bytes, limit) in [
        ("char", 48u64 << 20, 2u64 << 20),
        ("gpt2", 6 << 20, 1 << 20),
    ] {
        let (growth, tokens) = peak_growth(&dir, tokenizer, text_bytes, limit);
        eprintln!(
            "{tokenizer}: {text_bytes} bytes of text, {tokens} tokens, heap peak +{growth} \
             bytes (limit {limit})"
        );
        assert!(tokens > 0);
        assert!(
            growth <= limit,
            "{tokenizer}: the heap grew by {growth} bytes, over the limit of {limit}"
        );
        assert!(text_bytes >= 6 * limit, "the text is larger than the limit");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
