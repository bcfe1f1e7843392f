//! `plimsoll sample`: text from a trained GPT, decoded with the run's tokenizer (characters or
//! GPT-2's BPE), printed as it is made.
//!
//! Each character is written and flushed as soon as it is drawn: a terminal shows it at once,
//! a pipe receives it without waiting for the end. SIGINT and SIGTERM (`signals.rs`, as for
//! `train`) stop between two characters: the text so far stays printed, a note on standard
//! error says how many characters were made, and the exit code is 130 or 143. A reader that
//! goes away (`plimsoll sample | head -c 100`) ends the sampling quietly: nobody reads the rest.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;
use plimsoll_nn::{AdamW, AdamWConfig};
use plimsoll_trainer::checkpoint_io;
use plimsoll_trainer::sample::sample_each;
use plimsoll_trainer::{
    Arch, CharCorpus, Error, GptSpec, Result, SampleOptions, TokenFolder, Tokenizer,
};

use crate::GptShape;
use crate::inspect::{Which, run_or_newest};
use crate::records::{read_record, recorded_args};
use crate::signals;

/// The options of `plimsoll sample`. The model's shape comes from the run's `run.json`; a shape
/// flag must agree with it.
#[derive(Args)]
pub struct SampleArgs {
    /// The run's directory [default: the newest shakespeare or gpt run under runs/].
    #[arg(long, alias = "checkpoint-dir", value_name = "RUN")]
    run: Option<PathBuf>,
    /// Which checkpoint of the run.
    #[arg(long, value_enum, default_value_t = Which::Auto)]
    checkpoint: Which,
    /// The text to continue.
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Tokens to generate (characters, for a character-level run).
    #[arg(long, default_value_t = 500)]
    tokens: usize,
    /// Below 1 sharper, above 1 more random (nanoGPT's default: 0.8). 0 is greedy: the most
    /// likely character every time (--top-k and --seed then change nothing). Negative is an
    /// error.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    temperature: f32,
    /// Draw among the k most likely characters only (0: all).
    #[arg(long, default_value_t = 200)]
    top_k: usize,
    /// Seed of the draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The training text or token folder (it gives the vocabulary) [default: the run's].
    #[arg(long)]
    data: Option<PathBuf>,
    #[command(flatten)]
    shape: GptShape,
    #[command(flatten)]
    device: crate::DeviceArgs,
}

/// The GPT shape the run in `dir` recorded in its `run.json` (`None` without one, for a run
/// saved before runs recorded themselves); a file that exists but does not say is an error.
fn recorded_shape(dir: &std::path::Path) -> Result<Option<[usize; 4]>> {
    let path = dir.join("run.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path, source }),
    };
    let bad = |why: &str| Error::invalid(path.display().to_string(), why.to_string());
    let record: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(&format!("not JSON: {e}")))?;
    let gpt = record
        .get("gpt")
        .filter(|g| g.is_object())
        .ok_or_else(|| bad("records no GPT shape; is this a shakespeare run?"))?;
    let mut shape = [0; 4];
    for (value, name) in shape.iter_mut().zip(GptShape::NAMES) {
        *value = gpt
            .get(name)
            .and_then(serde_json::Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| bad(&format!("the GPT shape lacks a valid {name:?}")))?;
    }
    Ok(Some(shape))
}

/// The value of `flag` the run at `dir` recorded among its arguments, if any.
fn recorded_flag(dir: &std::path::Path, flag: &str) -> Result<Option<String>> {
    let args = recorded_args(&read_record(dir)?, dir)?;
    let inline = format!("{flag}=");
    Ok(args.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            args.get(i + 1).cloned()
        } else {
            a.strip_prefix(&inline).map(str::to_string)
        }
    }))
}

/// The tokenizer the run trained with: its token folder's, or its text's (`--tokenizer`, by
/// default the characters of the text, the bundled plays without `--data`).
fn run_tokenizer(data: Option<&std::path::Path>, tokenizer: Option<&str>) -> Result<Tokenizer> {
    if let Some(dir) = data.filter(|d| d.is_dir()) {
        return TokenFolder::tokenizer_of(dir);
    }
    match tokenizer {
        Some("gpt2") => Ok(Tokenizer::Gpt2),
        Some("char") | None => {
            let corpus = match data {
                None => CharCorpus::shakespeare()?,
                Some(path) => CharCorpus::from_file(path, 0.1)?,
            };
            Ok(Tokenizer::Char(corpus.vocab().to_vec()))
        }
        Some(other) => Tokenizer::named(other),
    }
}

/// Standard output for text made a character at a time: each piece is written and flushed at
/// once. Once the reader has gone (a write fails: a closed pipe), nothing more is written.
struct TextOut {
    /// A write failed; later ones are skipped.
    closed: bool,
}

impl TextOut {
    /// Writes `text` and flushes it, or nothing once the output has closed.
    fn write(&mut self, text: &str) {
        if self.closed {
            return;
        }
        let mut out = std::io::stdout().lock();
        if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            self.closed = true;
        }
    }
}

/// Loads the run's checkpoint and prints the prompt and its continuation as it is made (see
/// the module's documentation); the exit code is 0, or 130 / 143 after SIGINT / SIGTERM.
pub fn run(args: &SampleArgs) -> Result<ExitCode> {
    // First: a signal while the model loads stops the command too, before its first character.
    let stop = Arc::new(AtomicBool::new(false));
    let signal = signals::watch(Arc::clone(&stop))?;
    let mut options = SampleOptions {
        vocab: None,
        tokens: args.tokens,
        temperature: args.temperature,
        top_k: (args.top_k > 0).then_some(args.top_k),
        seed: args.seed,
    };
    options.validate()?;
    let dir = run_or_newest(args.run.as_deref(), &["shakespeare", "gpt"])?;
    let data = match &args.data {
        Some(d) => Some(d.clone()),
        None => recorded_flag(&dir, "--data")?.map(PathBuf::from),
    };
    let tokenizer = run_tokenizer(
        data.as_deref(),
        recorded_flag(&dir, "--tokenizer")?.as_deref(),
    )?;
    // A model whose vocabulary is padded past the tokenizer's never draws a padding token.
    options.vocab = Some(tokenizer.vocab_size());
    let prompt = tokenizer.encode("--prompt", &args.prompt)?;
    if prompt.is_empty() {
        return Err(Error::invalid(
            "--prompt",
            "makes no token; give some text (the default is a newline)",
        ));
    }
    let path = args.checkpoint.path(&dir)?;
    let gpu = args.device.open()?;
    let shape = args.shape.resolve(recorded_shape(&dir)?)?;
    let (arch, vocab) = match std::fs::metadata(dir.join("run.json")) {
        Ok(_) => crate::records::recorded_lm(&read_record(&dir)?)
            .map_err(|why| Error::invalid(dir.join("run.json").display().to_string(), why))?,
        Err(_) => None,
    }
    .unwrap_or((Arch::Gpt, tokenizer.vocab_size()));
    let spec = GptSpec {
        export: Default::default(),
        config: GptShape::config(shape, vocab),
        arch,
        seed: 0,
        optimizer: plimsoll_trainer::OptimizerSpec::AdamW(AdamWConfig::default()),
        attention: Default::default(),
        loss: Default::default(),
        dropout: 0.0,
    };
    spec.validate()?;
    let parameters = plimsoll_trainer::Recipe::parameter_count(&spec);
    let too_large = || Error::ModelTooLarge {
        budget_bytes: gpu.memory_budget_bytes(),
        parameters,
    };
    if plimsoll_trainer::host::product(parameters, 4) > gpu.memory_budget_bytes() {
        return Err(too_large());
    }
    let gpt = spec
        .build_lm(&gpu)
        .map_err(|e| if e.is_out_of_memory() { too_large() } else { e })?;
    // The checkpoint holds optimizer state too; it is loaded and dropped.
    let mut optimizer = AdamW::new(AdamWConfig::default());
    let checks = checkpoint_io::LoadChecks {
        expected_seed: None,
        reset_optimizer: true,
    };
    checkpoint_io::load(&gpu, &path, &gpt.parameters(), &mut optimizer, checks)?;
    drop(optimizer);
    let mut text = TextOut { closed: false };
    let mut made = 0;
    if !stop.load(Ordering::SeqCst) {
        text.write(&tokenizer.decode(&prompt));
        let mut decoder = tokenizer.decoder();
        let sampled = sample_each(gpt.as_ref(), &prompt, &options, |token| {
            made += 1;
            text.write(&decoder.push(token));
            match text.closed || stop.load(Ordering::SeqCst) {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        });
        // The line ends, also after an interrupt or an error (whose message follows on
        // standard error).
        text.write(&decoder.finish());
        text.write("\n");
        let plan = sampled?.plan;
        if args.device.memory_budget.is_some() {
            crate::out::warn(plan);
        }
    }
    if stop.load(Ordering::SeqCst) && made < options.tokens {
        crate::out::warn(format_args!(
            "{} after {made} of {} characters; the text so far is above",
            signal.name(),
            options.tokens
        ));
        return Ok(signal.exit_code());
    }
    Ok(ExitCode::SUCCESS)
}
