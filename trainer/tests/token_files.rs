//! Token folders: `prepare` writes nanoGPT's format with the tokens of the whole text, a file
//! gives the windows the same tokens in memory give, every bad input is a typed error naming
//! the file and the numbers, and a run from a token file resumes (and prefetches) the exact
//! stream.

#![allow(clippy::unwrap_used)]

mod common;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::data::Tokens;
use plimsoll_trainer::prepare::{PrepareOptions, TextSource, prepare};
use plimsoll_trainer::token_files::Meta;
use plimsoll_trainer::{
    Data, RunLength, Silent, TokenData, TokenFile, TokenFolder, Tokenizer, Trainer,
};

fn options(tokenizer: &str, memory_limit_bytes: u64) -> PrepareOptions {
    PrepareOptions {
        tokenizer: tokenizer.to_string(),
        val_fraction: 0.1,
        threads: 2,
        memory_limit_bytes,
        overwrite: false,
    }
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

fn u16s(ids: &[u16]) -> Vec<u8> {
    ids.iter().flat_map(|i| i.to_le_bytes()).collect()
}

fn read_u16s(path: &Path) -> Vec<u32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(2)
        .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
        .collect()
}

/// Lines of words, some indented, some blank, with a few non-ASCII characters.
fn some_text(lines: usize) -> String {
    let words = [
        "the", "king", "  shall", "Ægir", "speak,", "日本", "now.", "\n",
    ];
    (0..lines)
        .map(|i| {
            let n = 3 + i % 5;
            let line: Vec<&str> = (0..n)
                .map(|j| words[(i * 3 + j * 5) % words.len()])
                .collect();
            line.join(" ") + "\n"
        })
        .collect()
}

fn prepared(dir: &Path, text: &str, opts: &PrepareOptions) -> Meta {
    let src = dir.join("text.txt");
    write(&src, text.as_bytes());
    prepare(
        &[TextSource::File(src)],
        &dir.join("out"),
        opts,
        &mut |_| ControlFlow::Continue(()),
    )
    .unwrap()
}

/// GPT-2 tokens in pieces of about 40 KiB (the least limit, 1 MiB, over 2 threads) are those
/// of the whole text at once, split 90/10 into nanoGPT's little-endian u16 files.
#[test]
fn prepare_writes_the_tokens_of_the_whole_text_in_nanogpt_s_format() {
    let dir = temp_dir("prepare-gpt2");
    let text = some_text(40_000);
    let meta = prepared(&dir, &text, &options("gpt2", 1 << 20));
    let out = dir.join("out");
    let whole = Tokenizer::Gpt2.encode("t", &text).unwrap();
    let mut written = read_u16s(&out.join("train.bin"));
    assert_eq!(written.len() as u64, meta.train_tokens);
    written.extend(read_u16s(&out.join("val.bin")));
    let piece = options("gpt2", 1 << 20).piece_bytes();
    assert!(
        text.len() > 20 * piece,
        "{} bytes in pieces of {piece}",
        text.len()
    );
    assert_eq!(written, whole);
    let n = whole.len() as u64;
    assert_eq!(meta.train_tokens, (n as f64 * 0.9).round() as u64);
    assert_eq!(meta.train_tokens + meta.val_tokens, n);
    assert_eq!(meta.max_token_id, *whole.iter().max().unwrap());
    let folder = TokenFolder::open(&out).unwrap();
    assert_eq!(folder.tokenizer, Tokenizer::Gpt2);
    assert_eq!(Tokenizer::Gpt2.decode(&written), text);
    // A second prepare into the same folder is refused unless asked to replace it.
    let again = prepare(
        &[TextSource::File(dir.join("text.txt"))],
        &out,
        &options("gpt2", 1 << 20),
        &mut |_| ControlFlow::Continue(()),
    );
    let err = again.unwrap_err().to_string();
    assert!(
        err.contains("already holds") && err.contains("--force"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Windows read from the mapped file are those of the same tokens in memory.
#[test]
fn a_token_file_gives_the_windows_its_tokens_in_memory_give() {
    let dir = temp_dir("windows");
    let meta = prepared(&dir, &some_text(400), &options("char", 1 << 20));
    let folder = TokenFolder::open(&dir.join("out")).unwrap();
    let vocab = meta.vocab_size;
    let in_memory = Arc::new(read_u16s(&dir.join("out/train.bin")));
    let from_file = TokenData::windows_of(Tokens::File(folder.train.clone()), 16, vocab).unwrap();
    let from_memory = TokenData::windows(in_memory, 16, vocab).unwrap();
    assert_eq!(from_file.len(), from_memory.len());
    let indices = [0, 5, from_file.len() - 1, 77, 3];
    assert_eq!(
        from_file.gather(&indices).unwrap(),
        from_memory.gather(&indices).unwrap()
    );
    // Past the last window: said so, not taken for a truncated file.
    let err = from_file
        .gather(&[from_file.len()])
        .expect_err("past the last window");
    let expected = format!(
        "window {} is past the last of {} windows",
        from_file.len(),
        from_file.len()
    );
    assert!(err.to_string().contains(&expected), "{err}");
    // The same for evenly spaced windows (an evaluation set), from the file and from memory.
    let spaced_file =
        TokenData::evenly_spaced_of(Tokens::File(folder.train.clone()), 16, vocab, 24).unwrap();
    let spaced_memory = TokenData::evenly_spaced(
        Arc::new(read_u16s(&dir.join("out/train.bin"))),
        16,
        vocab,
        24,
    )
    .unwrap();
    for spaced in [&spaced_file, &spaced_memory] {
        assert_eq!(spaced.len(), 24);
        let err = spaced.gather(&[24]).expect_err("past the last window");
        assert!(
            err.to_string()
                .contains("window 24 is past the last of 24 windows"),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn folder_with(dir: &Path, train: &[u8], val: &[u8], meta: Option<serde_json::Value>) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    write(&dir.join("train.bin"), train);
    write(&dir.join("val.bin"), val);
    if let Some(meta) = meta {
        write(&dir.join("meta.json"), meta.to_string().as_bytes());
    }
    dir.to_path_buf()
}

fn char_meta(chars: &str, train: u64, val: u64, max: u32) -> serde_json::Value {
    serde_json::json!({
        "tokenizer": "char", "vocab_size": chars.chars().count(), "chars": chars,
        "dtype": "uint16", "train_tokens": train, "val_tokens": val, "max_token_id": max,
        "val_fraction": 0.1, "sources": [], "made_by": "test",
    })
}

fn open_err(dir: &Path) -> String {
    TokenFolder::open(dir).unwrap_err().to_string()
}

/// Each thing a folder can say wrong is refused when it is opened, naming the file and the
/// numbers.
#[test]
fn a_bad_token_folder_is_refused_naming_the_file_and_the_numbers() {
    let root = temp_dir("bad-folders");
    // A token id at or above the vocabulary: its file, token and byte offset.
    let d = folder_with(
        &root.join("id"),
        &u16s(&[0, 1, 2, 7, 1]),
        &u16s(&[1, 2]),
        Some(char_meta("abc", 5, 2, 2)),
    );
    let err = open_err(&d);
    assert!(
        err.contains("train.bin: token 3 (byte 6)") && err.contains("id 7") && err.contains("3"),
        "{err}"
    );
    // A truncated file: an odd length.
    let d = folder_with(&root.join("odd"), &[0, 0, 1], &u16s(&[1]), None);
    let err = open_err(&d);
    assert!(
        err.contains("train.bin") && err.contains("3 bytes, an odd number"),
        "{err}"
    );
    // An empty split.
    let d = folder_with(&root.join("empty"), &u16s(&[1, 2]), &[], None);
    let err = open_err(&d);
    assert!(err.contains("val.bin") && err.contains("is empty"), "{err}");
    // meta.json contradicts the files: a token count, and a vocabulary its tokenizer lacks.
    let d = folder_with(
        &root.join("count"),
        &u16s(&[0, 1, 2]),
        &u16s(&[1, 2]),
        Some(char_meta("abc", 999, 2, 2)),
    );
    let err = open_err(&d);
    assert!(
        err.contains("records 999 tokens") && err.contains("holds 3"),
        "{err}"
    );
    let mut meta = char_meta("abc", 3, 2, 2);
    meta["vocab_size"] = 50257.into();
    let d = folder_with(
        &root.join("vocab"),
        &u16s(&[0, 1, 2]),
        &u16s(&[1, 2]),
        Some(meta),
    );
    let err = open_err(&d);
    assert!(
        err.contains("vocab_size 50257") && err.contains("has 3"),
        "{err}"
    );
    let mut meta = char_meta("abc", 3, 2, 2);
    meta["tokenizer"] = "llama3".into();
    let d = folder_with(
        &root.join("name"),
        &u16s(&[0, 1, 2]),
        &u16s(&[1, 2]),
        Some(meta),
    );
    assert!(open_err(&d).contains("\"llama3\""));
    // No train.bin at all.
    std::fs::create_dir_all(root.join("none")).unwrap();
    assert!(open_err(&root.join("none")).contains("has no train.bin"));
    // A context longer than a split: named with the file.
    let d = folder_with(&root.join("short"), &u16s(&[0; 40]), &u16s(&[0; 9]), None);
    let folder = TokenFolder::open(&d).unwrap();
    assert_eq!(
        folder.tokenizer,
        Tokenizer::Gpt2,
        "no meta: GPT-2, as nanoGPT"
    );
    let err = TokenData::windows_of(Tokens::File(folder.val), 9, 50257)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--context") && err.contains("val.bin has 9 tokens"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Text that is not UTF-8 is refused with its line and byte; a text too short to give both
/// splits tokens is refused with the counts; nothing is left in the folder either way.
#[test]
fn prepare_refuses_text_that_is_not_utf8_and_splits_that_are_empty() {
    let dir = temp_dir("prepare-bad");
    let src = dir.join("latin1.txt");
    write(&src, b"first line\nsecond caf\xe9 line\n");
    let out = dir.join("out");
    let err = prepare(
        &[TextSource::File(src)],
        &out,
        &options("gpt2", 1 << 20),
        &mut |_| ControlFlow::Continue(()),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("latin1.txt: line 2, byte 21") && err.contains("not UTF-8"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    let short = dir.join("short.txt");
    write(&short, b"hi");
    let err = prepare(
        &[TextSource::File(short)],
        &out,
        &options("char", 1 << 20),
        &mut |_| ControlFlow::Continue(()),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("2 tokens split") && err.contains("at least 2"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    // A folder another preparation holds (its lock taken) is refused.
    let held = std::fs::File::create(out.join(".prepare.lock")).unwrap();
    held.lock().unwrap();
    write(&dir.join("ok.txt"), some_text(50).as_bytes());
    let err = prepare(
        &[TextSource::File(dir.join("ok.txt"))],
        &out,
        &options("char", 1 << 20),
        &mut |_| ControlFlow::Continue(()),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("another plimsoll prepare"), "{err}");
    drop(held);
    let _ = std::fs::remove_dir_all(&dir);
}

/// nanoGPT's character-level `meta.pkl` gives the vocabulary of a folder it prepared.
#[test]
fn nanogpt_s_character_meta_pkl_gives_the_vocabulary() {
    use serde_pickle::{HashableValue, Value};
    let dir = folder_with(&temp_dir("pkl"), &u16s(&[0, 1, 2, 1]), &u16s(&[2, 0]), None);
    let itos = ['\n', 'a', 'b']
        .iter()
        .enumerate()
        .map(|(i, c)| (HashableValue::I64(i as i64), Value::String(c.to_string())))
        .collect();
    let meta = Value::Dict(
        [
            (HashableValue::String("vocab_size".into()), Value::I64(3)),
            (HashableValue::String("itos".into()), Value::Dict(itos)),
        ]
        .into_iter()
        .collect(),
    );
    let bytes = serde_pickle::value_to_vec(&meta, serde_pickle::SerOptions::new()).unwrap();
    write(&dir.join("meta.pkl"), &bytes);
    let folder = TokenFolder::open(&dir).unwrap();
    assert_eq!(folder.tokenizer, Tokenizer::Char(vec!['\n', 'a', 'b']));
    assert_eq!(folder.tokenizer.decode(&[1, 2, 0]), "ab\n");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run on a mapped token file stopped and resumed ends as the run that never stopped, and
/// the loader thread (2 batches ahead) trains exactly as batches built by the step itself.
#[test]
fn a_run_from_a_token_file_resumes_and_prefetches_the_same_stream() {
    let (spec, tokens) = tiny_gpt(600);
    let dir = temp_dir("token-resume");
    let ids: Vec<u16> = tokens.iter().map(|&t| t as u16).collect();
    write(&dir.join("train.bin"), &u16s(&ids));
    let file = Arc::new(TokenFile::open(&dir.join("train.bin")).unwrap());
    let data = || TokenData::windows_of(Tokens::File(file.clone()), 8, 13).unwrap();
    let run = |prefetch: usize, steps: u64, resume: Option<&Path>, save: Option<&Path>| {
        let gpu = fresh_gpu();
        let mut c = config(16, 8, steps, 1e-2);
        c.prefetch = prefetch;
        c.checkpoint_dir = save.map(Path::to_path_buf);
        let mut t = Trainer::new(&gpu, c, &spec, data(), None).unwrap();
        if let Some(r) = resume {
            t.resume(&latest_path(r)).unwrap();
        }
        t.run(&mut Silent).unwrap();
        let from_queue = t.loader().prefetched_batches();
        assert_eq!(
            from_queue,
            if prefetch > 0 {
                steps - if resume.is_some() { 3 } else { 0 }
            } else {
                0
            },
            "every step's batch came from the loader thread"
        );
        values(t.parameters())
    };
    let straight = run(2, 6, None, None);
    assert_eq!(
        run(0, 6, None, None),
        straight,
        "prefetching changes nothing"
    );
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    run(2, 3, None, Some(&ckpt));
    assert_eq!(run(2, 6, Some(&ckpt), None), straight, "resumed");
    // The same windows from memory train the same model.
    let gpu = fresh_gpu();
    let mut c = config(16, 8, 6, 1e-2);
    c.length = RunLength::Steps(6);
    let in_memory = TokenData::windows(tokens, 8, 13).unwrap();
    let mut t = Trainer::new(&gpu, c, &spec, in_memory, None).unwrap();
    t.run(&mut Silent).unwrap();
    assert_eq!(values(t.parameters()), straight, "memory and file");
    let _ = std::fs::remove_dir_all(&dir);
}
