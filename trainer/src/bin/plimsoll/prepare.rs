//! `plimsoll prepare TEXT... --tokenizer gpt2|char --out DIR`: texts to a token folder
//! (`plimsoll_trainer::prepare`), with a progress bar on a terminal and a plain line about
//! every 10% without one. SIGINT and SIGTERM stop it between two rounds of pieces and leave the
//! folder as it was (exit 130 / 143).

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use plimsoll_allocator::format_bytes;
use plimsoll_trainer::prepare::{PrepareOptions, Progress, TextSource, prepare};
use plimsoll_trainer::{Error, Result};

use crate::TokenizerArg;
use crate::workloads::tokenizer_name;

/// The options of `plimsoll prepare`.
#[derive(Args)]
pub struct PrepareArgs {
    /// Text files (UTF-8, gzip-compressed or not), read in this order; `shakespeare` is the
    /// bundled plays (unless a file of that name exists here).
    #[arg(required = true, value_name = "TEXT")]
    texts: Vec<PathBuf>,
    /// `gpt2` (GPT-2's byte-level BPE, 50,257 tokens; texts are separated by <|endoftext|>)
    /// or `char` (the texts' distinct characters; read twice).
    #[arg(long, value_enum)]
    tokenizer: TokenizerArg,
    /// The folder to write train.bin, val.bin and meta.json into (made if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The share of the tokens, the last ones, that go to val.bin.
    #[arg(long, default_value_t = 0.1, value_parser = crate::flags::positive)]
    val_fraction: f32,
    /// Threads that tokenize [default: the machine's cores].
    #[arg(long, value_parser = crate::flags::count)]
    threads: Option<usize>,
    /// Host memory the text in flight may take, e.g. 256MiB; the rest streams from disk.
    #[arg(long, default_value = "256MiB", value_parser = crate::flags::bytes)]
    max_host_memory: u64,
    /// Replace the token files the folder already holds.
    #[arg(long)]
    force: bool,
}

/// Runs `plimsoll prepare`; the exit code is 0, or 130 / 143 after SIGINT / SIGTERM.
pub fn run(args: &PrepareArgs) -> Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    let signal = crate::signals::watch(Arc::clone(&stop))?;
    let sources: Vec<TextSource> = args
        .texts
        .iter()
        .map(|p| match p.to_str() {
            Some("shakespeare") if !p.exists() => TextSource::BundledShakespeare,
            _ => TextSource::File(p.clone()),
        })
        .collect();
    for source in &sources {
        if let TextSource::File(p) = source
            && !p.is_file()
        {
            return Err(Error::invalid(
                p.display().to_string(),
                "is not a file; name text files (UTF-8 or .gz), or shakespeare for the bundled \
                 plays",
            ));
        }
    }
    let options = PrepareOptions {
        tokenizer: tokenizer_name(args.tokenizer).to_string(),
        val_fraction: f64::from(args.val_fraction),
        threads: args.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
        memory_limit_bytes: args.max_host_memory,
        overwrite: args.force,
    };
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let bar = terminal.then(|| {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {msg} (eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar
    });
    let mut next_line = 0.1;
    let mut said_all = false;
    let mut pass_seen = (0, 0);
    let mut report = |p: Progress| {
        if p.pass != pass_seen {
            // A new pass reads the texts from the start again.
            pass_seen = p.pass;
            next_line = 0.1;
            said_all = false;
        }
        let done = p.read_bytes as f64 / p.total_bytes.max(1) as f64;
        let pass = match p.pass {
            (1, 1) => String::new(),
            (i, n) => format!("pass {i}/{n} "),
        };
        match &bar {
            Some(bar) => {
                bar.set_length(p.total_bytes);
                bar.set_position(p.read_bytes);
                bar.set_prefix(format!("{pass}tokenizing"));
                bar.set_message(format!("{} tokens", p.tokens));
            }
            None if done >= next_line && !said_all => {
                said_all = done >= 1.0;
                crate::out::say(format_args!(
                    "prepare: {pass}{:.0}% of {} read, {} tokens, {:.1} s",
                    100.0 * done.min(1.0),
                    format_bytes(p.total_bytes),
                    p.tokens,
                    started.elapsed().as_secs_f64()
                ));
                next_line = (done + 0.1).min(1.0);
            }
            None => {}
        }
        match stop.load(Ordering::SeqCst) {
            true => ControlFlow::Break(()),
            false => ControlFlow::Continue(()),
        }
    };
    let result = prepare(&sources, &args.out, &options, &mut report);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    if stop.load(Ordering::SeqCst) {
        crate::out::warn(format_args!(
            "{}: prepare stopped; {} was left as it was",
            signal.name(),
            args.out.display()
        ));
        return Ok(signal.exit_code());
    }
    let meta = result?;
    let seconds = started.elapsed().as_secs_f64();
    crate::out::say(format_args!(
        "prepared {} ({} tokenizer, vocabulary {}): train.bin {} tokens, val.bin {} tokens, \
         largest id {}, in {seconds:.1} s ({} of text read)",
        args.out.display(),
        meta.tokenizer,
        meta.vocab_size,
        meta.train_tokens,
        meta.val_tokens,
        meta.max_token_id,
        format_bytes(meta.sources.iter().map(|s| s.bytes).sum()),
    ));
    crate::out::say(format_args!(
        "train on it: plimsoll train gpt --data {}",
        args.out.display()
    ));
    Ok(ExitCode::SUCCESS)
}
