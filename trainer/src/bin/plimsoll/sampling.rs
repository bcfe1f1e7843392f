//! `plimsoll sample`: text from a trained character-level GPT.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::GpuOptions;
use plimsoll_nn::{AdamW, AdamWConfig, Gpt, GptConfig, Module};
use plimsoll_trainer::checkpoint_io::{self, latest_path};
use plimsoll_trainer::{CharCorpus, Error, Result, SampleOptions, sample};

/// The options of `plimsoll sample` (the model flags must match the training run's).
#[derive(Args)]
pub struct SampleArgs {
    /// The run's checkpoint directory.
    #[arg(long, default_value = "target/plimsoll/shakespeare")]
    checkpoint_dir: PathBuf,
    /// The text to continue.
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Characters to generate.
    #[arg(long, default_value_t = 500)]
    tokens: usize,
    /// Below 1 sharper, above 1 more random (nanoGPT's default: 0.8).
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Draw among the k most likely characters only (0: all).
    #[arg(long, default_value_t = 200)]
    top_k: usize,
    /// Seed of the draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The training text, if it was not the bundled plays (it gives the vocabulary).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Tokens per window the model was trained with.
    #[arg(long, default_value_t = 64)]
    context: usize,
    /// Transformer blocks of the model.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Attention heads of the model.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Width of the model.
    #[arg(long, default_value_t = 128)]
    width: usize,
    /// Adapter: backend, type or name substring (default: `PLIMSOLL_ADAPTER`, else the best).
    #[arg(long)]
    adapter: Option<String>,
    /// Memory budget in bytes (default: the adapter's).
    #[arg(long)]
    memory_budget: Option<u64>,
    /// Deadline of every GPU wait, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    deadline_ms: u64,
}

/// Loads the latest checkpoint and prints the prompt and its continuation.
pub fn run(args: &SampleArgs) -> Result<()> {
    let options = SampleOptions {
        tokens: args.tokens,
        temperature: args.temperature,
        top_k: (args.top_k > 0).then_some(args.top_k),
        seed: args.seed,
    };
    options.validate()?;
    let corpus = match &args.data {
        None => CharCorpus::shakespeare()?,
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            let what = path.display().to_string();
            if bytes.starts_with(&[0x1f, 0x8b]) {
                CharCorpus::from_gz(&what, &bytes, 0.1)?
            } else {
                let text = String::from_utf8(bytes)
                    .map_err(|e| Error::invalid(&what, format!("not UTF-8 text: {e}")))?;
                CharCorpus::from_text(&what, &text, 0.1)?
            }
        }
    };
    let prompt = corpus.encode(&args.prompt)?;
    let path = latest_path(&args.checkpoint_dir);
    if !path.exists() {
        return Err(Error::invalid(
            "sample",
            format!(
                "no checkpoint at {}; train first (plimsoll train shakespeare) or pass \
                 --checkpoint-dir",
                path.display()
            ),
        ));
    }
    let from_env = GpuOptions::from_env();
    let gpu = Gpu::with_options(GpuOptions {
        adapter: args.adapter.clone().or(from_env.adapter),
        memory_budget_bytes: args.memory_budget,
        default_deadline: Some(Duration::from_millis(args.deadline_ms.max(1))),
        ..GpuOptions::default()
    })?;
    let config = GptConfig {
        vocab_size: corpus.vocab_size(),
        block_size: args.context,
        n_layer: args.layers,
        n_head: args.heads,
        n_embd: args.width,
    };
    let gpt = Gpt::new(&gpu, config, 0)?;
    // The checkpoint holds optimizer state too; it is loaded and dropped.
    let mut optimizer = AdamW::new(AdamWConfig::default());
    checkpoint_io::load(&gpu, &path, &gpt.parameters(), &mut optimizer, None)?;
    drop(optimizer);
    let ids = sample(&gpt, &prompt, &options)?;
    crate::out::say(corpus.decode(&ids));
    Ok(())
}
