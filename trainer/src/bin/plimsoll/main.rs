//! `plimsoll`: train the digits MLP or the peer benchmark workload, or print the memory plan.
//!
//! `plimsoll train digits` trains a 64-128-10 ReLU MLP on the bundled digits data (1,797 8x8
//! images; 20% held out) and prints test accuracy each epoch and the memory summary at the end.
//! `plimsoll train mlp-bench` is the peer workload (MLP 784-1024-1024-1024-10, ReLU,
//! cross-entropy, Adam, batch 128, synthetic data). `plimsoll plan <workload>` prints the
//! memory plan without training. `plimsoll sample` prints text from a trained `shakespeare` run
//! as it is made. Errors are one message with the numbers and a hint, and a non-zero exit code;
//! SIGINT and SIGTERM stop `train` and `sample` cleanly with 130 and 143 (`signals.rs`).

mod flags;
mod inspect;
mod out;
mod prepare;
mod progress;
mod ranks;
mod records;
mod sampling;
mod signals;
mod train;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use plimsoll_autograd::Gpu;
use plimsoll_kernels_wgsl::GpuOptions;
use plimsoll_kernels_wgsl::kernels::TensorLaunches;
use plimsoll_trainer::{
    AllocatorMode, CheckpointPolicy, Error, LeakPolicy, Offload, Precision, Result, Shard,
    TrainConfig,
};

use workloads::job;

/// Counts the Rust heap, so every step's metrics say how much host memory the run holds.
#[global_allocator]
static HEAP: plimsoll_trainer::host_memory::CountingAllocator =
    plimsoll_trainer::host_memory::CountingAllocator;

#[derive(Parser)]
#[command(
    name = "plimsoll",
    version,
    about = "Train neural networks on wgpu with memory and deadlines first",
    args_override_self = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Train a workload.
    ///
    /// Data-parallel over MPI: build with `--features mpi`, then
    /// `mpirun --enable-recovery -np N plimsoll train ...` (each rank takes its shard of every
    /// batch; rank 0 writes the run; see the README).
    Train {
        #[command(subcommand)]
        workload: Workload,
    },
    /// Print the memory plan (dry run of one micro-batch) without training.
    Plan {
        /// Plan one rank of a data-parallel run of this many ranks (`mpirun -np N`): its shard
        /// of every batch and, with `--shard`, its part of the optimizer state (rank 0's, the
        /// largest).
        #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
        ranks: u32,
        #[command(subcommand)]
        workload: Workload,
    },
    /// Generate text from a trained `shakespeare` or `gpt` run.
    Sample(sampling::SampleArgs),
    /// Tokenize texts into a token folder (train.bin, val.bin: little-endian u16, nanoGPT's
    /// format; meta.json) for `plimsoll train gpt --data DIR`.
    Prepare(prepare::PrepareArgs),
    /// Test accuracy or validation loss of a run's best or latest checkpoint.
    Eval(inspect::EvalArgs),
    /// The runs in a directory, with their step, best evaluation loss and status.
    Runs(inspect::RunsArgs),
    /// Write a run's report.html: loss, learning rate, throughput and memory over steps (with the
    /// plan's prediction), the memory timeline, the kernel table and the configuration.
    Report(inspect::ReportArgs),
}

#[derive(Subcommand, Clone)]
pub(crate) enum Workload {
    /// An MLP on the bundled digits data (8x8 images, 10 classes).
    Digits(DigitsArgs),
    /// The peer benchmark: MLP 784-1024-1024-1024-10, ReLU, Adam, batch 128, synthetic data.
    MlpBench(BenchArgs),
    /// torchvision's ResNet-18 on synthetic images (--image, --classes): a plan at scale.
    Resnet18(ResNetArgs),
    /// torchvision's ResNet-34 on synthetic images.
    Resnet34(ResNetArgs),
    /// torchvision's ResNet-50 on synthetic images.
    Resnet50(ResNetArgs),
    /// torchvision's ResNet-101 on synthetic images.
    Resnet101(ResNetArgs),
    /// torchvision's ResNet-152 on synthetic images.
    Resnet152(ResNetArgs),
    /// A character-level GPT (nanoGPT's CPU configuration) on the bundled Shakespeare plays
    /// (--tokenizer gpt2: over GPT-2's tokens).
    Shakespeare(ShakespeareArgs),
    /// A GPT (nanoGPT's) on a token folder made by `plimsoll prepare` or nanoGPT's
    /// `prepare.py` (--data DIR), or on a text file; the bundled plays without --data.
    Gpt(ShakespeareArgs),
}

/// The device options every command that opens a device takes.
#[derive(Args, Clone)]
pub(crate) struct DeviceArgs {
    /// Memory budget, e.g. `64MiB`, `1.5GB`, `100000000` (default: the adapter's).
    #[arg(long, value_parser = flags::bytes)]
    memory_budget: Option<u64>,
    /// Adapter: backend (`vulkan`), type (`cpu`, `discrete`) or name substring (default:
    /// `PLIMSOLL_ADAPTER`, else the best one).
    #[arg(long)]
    adapter: Option<String>,
    /// Deadline of every GPU wait (and, under mpirun, of every wait for the other ranks), in
    /// milliseconds.
    #[arg(long, default_value_t = 30_000, value_parser = flags::count_u64)]
    deadline_ms: u64,
    /// The most GPU time one submission may take, in milliseconds, so a slow device never
    /// meets the deadline but for a stall, a GPU that drives a display keeps drawing it and no
    /// watchdog (Windows' TDR, about 2 s) resets it: `auto` (an eighth of --deadline-ms, at
    /// most 100 on a GPU), `off` or a number. Batches are submitted early and one long kernel
    /// is split to stay within it; the values computed are the same.
    #[arg(long, default_value = "auto", value_name = "MS", value_parser = flags::max_submission)]
    max_submission_ms: flags::MaxSubmission,
    /// How AdamW's update and the gradient norm's sums of squares go out over many tensors:
    /// `auto` (a few multi-tensor dispatches on a GPU, one launch per tensor on a CPU adapter),
    /// `multi` or `one-per-tensor`. The values computed are the same.
    #[arg(long, default_value = "auto", value_name = "HOW")]
    tensor_launches: TensorLaunchesArg,
}

/// `--tensor-launches`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TensorLaunchesArg {
    /// The device's choice.
    Auto,
    /// A few multi-tensor dispatches.
    Multi,
    /// One launch per tensor.
    OnePerTensor,
}

impl DeviceArgs {
    /// Opens the device these options name (the adapter from `PLIMSOLL_ADAPTER` when none).
    pub(crate) fn open(&self) -> Result<Gpu> {
        let from_env = GpuOptions::from_env();
        let options = GpuOptions {
            adapter: self
                .adapter
                .clone()
                .filter(|s| !s.trim().is_empty())
                .or(from_env.adapter),
            memory_budget_bytes: self.memory_budget,
            default_deadline: Some(self.deadline()),
            tensor_launches: match self.tensor_launches {
                TensorLaunchesArg::Auto => None,
                TensorLaunchesArg::Multi => Some(TensorLaunches::Multi),
                TensorLaunchesArg::OnePerTensor => Some(TensorLaunches::OnePerTensor),
            },
            ..GpuOptions::default()
        };
        let gpu = Gpu::with_options(options)?;
        match self.max_submission_ms {
            flags::MaxSubmission::Auto => {}
            flags::MaxSubmission::Off => gpu.set_max_submission(None),
            flags::MaxSubmission::Ms(ms) => {
                gpu.set_max_submission(Some(Duration::from_secs_f64(ms / 1e3)));
            }
        }
        Ok(gpu)
    }

    /// The deadline of every GPU wait.
    pub(crate) fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms.max(1))
    }
}

#[derive(Args, Clone)]
pub(crate) struct CommonArgs {
    #[command(flatten)]
    device: DeviceArgs,
    /// Samples per forward/backward (default: the largest the memory plan allows).
    #[arg(long, value_parser = flags::count)]
    micro_batch: Option<usize>,
    /// Never split a batch of a model whose step depends on its micro-batches (BatchNorm's
    /// statistics): a forward takes the whole batch, or the run is refused.
    #[arg(long)]
    micro_batch_invariant: bool,
    /// Activation checkpointing: `none`, `auto`, or N (checkpoint every N modules).
    #[arg(long, default_value = "auto", value_parser = flags::checkpointing)]
    checkpointing: CheckpointPolicy,
    /// Peak learning rate (AdamW) [default: the workload's].
    #[arg(long, value_parser = flags::learning_rate)]
    lr: Option<f32>,
    /// Seed of the data order and the model's initialisation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write the metrics (one JSON line per step and per evaluation) to this file; the
    /// run directory always has them in metrics.jsonl.
    #[arg(long)]
    metrics_out: Option<PathBuf>,
    /// The run's directory [default: a new runs/<workload>-<date>-<time>]. It must not hold
    /// another run.
    #[arg(long, alias = "checkpoint-dir", value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Save a checkpoint every N steps (always at the end, on Ctrl-C, SIGTERM and on timeout).
    #[arg(long, value_parser = flags::count_u64)]
    checkpoint_every: Option<u64>,
    /// Continue a run: its directory, or with no value the newest run of this workload under
    /// runs/. Its settings are kept; a flag given with --resume changes one (recorded in
    /// run.json), except the model and the seed.
    #[arg(long, value_name = "RUN")]
    resume: Option<Option<PathBuf>>,
    /// Start from the weights in FILE: a model.safetensors a run exported (nanoGPT's or
    /// Hugging Face's layout, as --export wrote it) or a run's checkpoint. Every name and shape
    /// is checked before anything is loaded; the optimizer and the step count start afresh.
    #[arg(long, value_name = "FILE", conflicts_with = "resume")]
    init_from: Option<PathBuf>,
    /// With --resume: start the optimizer afresh (its moments and step count), e.g. from a
    /// checkpoint that holds none.
    #[arg(long, requires = "resume")]
    reset_optimizer: bool,
    /// Where each step's device memory goes: `caching` (the best-fitting free block of cached
    /// segments) or `planned` (once a step repeats the one before, every allocation of the next
    /// steps is placed offline from the recorded lifetimes: no fragmentation, and reserved memory
    /// close to the most bytes live at once; a step that differs falls back to best fit).
    #[arg(long, default_value = "caching", value_parser = flags::allocator)]
    allocator: AllocatorMode,
    /// What activations are stored in: `f32`, or `f16`, which about halves activation memory
    /// (as PyTorch's autocast: the outputs of layers and what backward keeps are 16-bit;
    /// matmuls read 16-bit inputs, weights through f16 copies made once per update, and sum in
    /// f32; adds, multiplies and activation functions run in 16 bits; layer norm, softmax, the
    /// loss, gradients, parameters and optimizer state stay f32). f16 scales the loss as
    /// PyTorch's GradScaler (from 65536; halved and the step skipped when the loss or a
    /// gradient is not finite, doubled after 2000 steps without, up to 2^24). Use it when many
    /// activations are kept (deep models, attention, long sequences, big batches): a larger
    /// micro-batch fits; `plimsoll plan` shows both. On a CPU adapter steps take longer (the
    /// conversions around layer norm, softmax and the loss).
    #[arg(long, default_value = "f32", value_parser = flags::precision)]
    precision: Precision,
    /// What lives in host memory instead of on the device: `optimizer`: AdamW's moments in
    /// host memory and its update on the host (ZeRO-Offload's optimizer side), 8 bytes per
    /// parameter less on the device for 12 per parameter moved each step (the gradient and the
    /// value read back, the value written; the update is the device's); `activations`: that,
    /// and the inputs checkpointed segments keep (read back after their forward, written back
    /// for their backward); `parameters`: that, and the parameters of the model's blocks
    /// streamed (in host memory, brought up for their segment's forward and recomputation,
    /// their gradients read back and accumulated on the host; checkpointing every block at
    /// least); `none`; or `auto`: the plan offloads only when no choice fits with everything
    /// on the device, the optimizer first, then the activations, then the parameters.
    #[arg(long, default_value = "auto", value_parser = flags::offload)]
    offload: Offload,
    /// Host memory the run may keep on purpose (the loader's batches, an offloaded optimizer's
    /// state, the snapshot of the training state), e.g. `8GiB` (default: 80% of what the host
    /// has available when the run starts). A run that needs more is refused before step 1,
    /// and `--offload auto` does not offload past it.
    #[arg(long, value_parser = flags::bytes)]
    host_memory_budget: Option<u64>,
    /// Under mpirun, what the ranks divide between them (ZeRO): `optimizer` (stage 1): each
    /// rank keeps AdamW's moments for about 1/N of the parameters and updates those, then
    /// every rank gets the others' updated parameters; `gradients` (stage 2): also the summed
    /// gradients (a reduce-scatter instead of the all-reduce; the whole gradients are freed
    /// before the update); `none`. The update is the same as without; checkpoints hold the
    /// whole state. Nothing to divide with one process.
    #[arg(long, default_value = "none", value_parser = flags::shard)]
    shard: Shard,
    /// What the after-step leak check does: `off`, `warn` or `error`.
    #[arg(long, default_value = "warn", value_parser = flags::leak)]
    leak_check: LeakPolicy,
    /// Linear warm-up steps of the learning rate, then cosine decay to --min-lr over the run
    /// (default: the workload's; 0 with no --min-lr: a constant rate).
    #[arg(long)]
    warmup_steps: Option<u64>,
    /// The learning rate the cosine decay ends at (default: the workload's).
    #[arg(long, value_parser = flags::non_negative)]
    min_lr: Option<f32>,
    /// Clip the global gradient norm to this (default: the workload's; 0: no clipping).
    #[arg(long, value_parser = flags::non_negative)]
    clip_grad_norm: Option<f32>,
    /// AdamW weight decay, on weights and embeddings only (default: the workload's).
    #[arg(long, value_parser = flags::non_negative)]
    weight_decay: Option<f32>,
    /// Without a terminal, print one plain line every N steps [default: about 20 a run].
    #[arg(long, value_parser = flags::count_u64)]
    log_every: Option<u64>,
    /// Record every allocation of these steps (`N`, `A-B` or `off`) as a memory timeline in
    /// the run directory: memory_timeline.html (open it in a browser), memory_timeline.json and
    /// memory_snapshot.pickle (for PyTorch's memory_viz). A failing step's timeline is written
    /// too.
    #[arg(long, default_value = "1-3", value_name = "STEPS", value_parser = flags::timeline)]
    memory_timeline: flags::TimelineSteps,
    /// Training batches a loader thread builds in host memory ahead of the step (0: each step
    /// builds its own when it starts). Each step's data wait is in metrics.jsonl.
    #[arg(long, default_value_t = 2, value_parser = flags::count_or_zero)]
    prefetch: usize,
    /// Time every kernel of these steps (`N`, `A-B` or `off`): prints the time per kernel
    /// (calls, total, share of the step, GFLOP/s, GB/s) and the measured overhead, and writes
    /// profile.json and trace.json (Perfetto, chrome://tracing) into the run directory. Leave
    /// step 1 out: it includes one-off work such as compiling pipelines.
    #[arg(long, default_value = "off", value_name = "STEPS", value_parser = flags::profile_steps)]
    profile_steps: flags::TimelineSteps,
    /// Keep the training state in host memory every N steps (`50`), every so long (`90s`,
    /// `5m`) or never (`off`). A lost device (driver reset, watchdog) goes on from it on a new
    /// device, running the steps since again; the finished run is the same bit for bit.
    #[arg(long, default_value = "120s", value_name = "WHEN", value_parser = flags::snapshot_every)]
    snapshot_every: plimsoll_trainer::SnapshotEvery,
    /// Device losses in a row (no new step finished between them) that the run goes on from;
    /// the next one ends it (0: a lost device ends the run).
    #[arg(long, default_value_t = 3, value_name = "N")]
    max_device_losses: u32,
}

#[derive(Args, Clone)]
struct DigitsArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Passes over the training set.
    #[arg(long, default_value_t = 30, value_parser = flags::count_u64)]
    epochs: u64,
    /// Effective batch (samples per optimizer step).
    #[arg(long, default_value_t = 64, value_parser = flags::count)]
    batch: usize,
    /// The network: an MLP (`mlp`, widths from --hidden) or a small CNN over the 8x8 images
    /// (`cnn`: 3x3 convolutions of --channels, ReLU and 2x2 max pooling, a linear head).
    #[arg(long, value_enum, default_value_t = DigitsModel::Mlp)]
    model: DigitsModel,
    /// Hidden widths of the MLP, comma-separated [default: 128].
    #[arg(long, value_delimiter = ',', value_parser = flags::count)]
    hidden: Option<Vec<usize>>,
    /// Output channels of the CNN's convolutions, comma-separated [default: 32,64].
    #[arg(long, value_delimiter = ',', value_parser = flags::count)]
    channels: Option<Vec<usize>>,
    /// The CNN's training images are cropped back to 8x8 at a random place after this many
    /// zero pixels are added around them (torchvision's RandomCrop padding); 0 crops nothing.
    /// The images stay u8 in host memory and are cropped on the device.
    #[arg(long, default_value_t = 0)]
    crop_padding: usize,
    /// The CNN's training images are flipped left to right at random, half of them (a digit
    /// is not symmetric: this is for data whose classes are).
    #[arg(long)]
    flip: bool,
    /// The data (gzip CSV: 64 pixels then the label per line).
    #[arg(long)]
    data: Option<PathBuf>,
}

/// The shape of a character-level GPT: `train shakespeare` builds it (these defaults when a flag
/// is absent) and records it in `run.json`; `sample` reads it from there.
#[derive(Args, Clone)]
pub(crate) struct GptShape {
    /// A GPT-2 shape under nanoGPT's names: layers, heads and width of GPT-2 small (gpt2:
    /// 12 x 12 x 768), medium (24 x 16 x 1024), large (36 x 20 x 1280) or XL (48 x 25 x 1600),
    /// context 1024. --context, --layers, --heads and --width override it. The vocabulary stays
    /// the data's (characters for the bundled plays).
    #[arg(long, value_enum)]
    model: Option<Preset>,
    /// Tokens per window, the model's block size [default: 64].
    #[arg(long, value_parser = flags::count)]
    context: Option<usize>,
    /// Transformer blocks [default: 4].
    #[arg(long, value_parser = flags::count)]
    layers: Option<usize>,
    /// Attention heads, dividing --width [default: 4].
    #[arg(long, value_parser = flags::count)]
    heads: Option<usize>,
    /// Model width [default: 128].
    #[arg(long, value_parser = flags::count)]
    width: Option<usize>,
}

/// The model family and what a Llama adds to the shape (`train shakespeare`, `train gpt` and
/// `plan`).
#[derive(Args, Clone)]
pub(crate) struct ArchArgs {
    /// The model family: `gpt` (nanoGPT's: learned positions, layer norms, a GELU MLP, biases,
    /// a tied head) or `llama` (rotary positions, RMSNorm, a SwiGLU MLP, grouped-query heads,
    /// no biases, its own head) [default: gpt; llama for a Llama --model].
    #[arg(long, value_enum)]
    arch: Option<ArchArg>,
    /// A Llama's key/value heads, dividing --heads (grouped-query attention) [default: the
    /// preset's, else --heads].
    #[arg(long, value_parser = flags::count)]
    kv_heads: Option<usize>,
    /// A Llama's SwiGLU width [default: the preset's, else 8 x width / 3 rounded up to 32,
    /// about the parameters of the GPT's 4 x width MLP].
    #[arg(long, value_parser = flags::count)]
    mlp_width: Option<usize>,
    /// A Llama's rotary base, Hugging Face's rope_theta [default: the preset's, else 10000].
    #[arg(long, value_parser = flags::positive)]
    rope_theta: Option<f32>,
    /// A Llama's output head is the token embedding (tie_word_embeddings; `--tie-embeddings
    /// false` unties a preset's) [default: the preset's, else its own table].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    tie_embeddings: Option<bool>,
    /// Whose names and layouts the exported model.safetensors has: `nanogpt` (a GPT's default:
    /// nanoGPT's GPT) or `hf` (Hugging Face's GPT2LMHeadModel or LlamaForCausalLM, with a
    /// config.json beside it, for from_pretrained on the run's folder; a Llama's default).
    #[arg(long, value_enum)]
    export: Option<ExportArg>,
    /// The model's vocabulary, at least the data's (a larger one pads it, as nanoGPT pads
    /// GPT-2's 50,257 to 50,304; for planning a model's real size) [default: the data's].
    #[arg(long, value_parser = flags::count)]
    vocab_size: Option<usize>,
}

/// `--export`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ExportArg {
    /// nanoGPT's layout.
    Nanogpt,
    /// Hugging Face's layout and config.json.
    Hf,
}

/// `--arch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ArchArg {
    /// nanoGPT's GPT.
    Gpt,
    /// A Llama-family model.
    Llama,
}

/// The digits network (`train digits --model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DigitsModel {
    /// A multi-layer perceptron over the 64 pixels.
    Mlp,
    /// A small convolutional network over the 8x8 images.
    Cnn,
}

/// GPT-2's sizes under nanoGPT's names, and SmolLM2's Llama sizes (`--model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Preset {
    /// GPT-2 small: 12 layers, 12 heads, width 768 (124M parameters with GPT-2's vocabulary).
    Gpt2,
    /// GPT-2 medium: 24 layers, 16 heads, width 1024 (350M).
    Gpt2Medium,
    /// GPT-2 large: 36 layers, 20 heads, width 1280 (774M).
    Gpt2Large,
    /// GPT-2 XL: 48 layers, 25 heads, width 1600 (1.56B).
    Gpt2Xl,
    /// SmolLM2-135M, a Llama: 30 layers, 9 heads (3 key/value), width 576, SwiGLU 1536, tied
    /// head, context 2048 (135M parameters with its vocabulary of 49,152: --vocab-size 49152).
    #[value(name = "smollm2-135m")]
    Smollm2_135m,
    /// SmolLM2-360M, a Llama: 32 layers, 15 heads (5 key/value), width 960, SwiGLU 2560, tied
    /// head, context 2048 (362M with --vocab-size 49152).
    #[value(name = "smollm2-360m")]
    Smollm2_360m,
}

impl Preset {
    /// Context, layers, heads and width.
    fn shape(self) -> [usize; 4] {
        match self {
            Preset::Gpt2 => [1024, 12, 12, 768],
            Preset::Gpt2Medium => [1024, 24, 16, 1024],
            Preset::Gpt2Large => [1024, 36, 20, 1280],
            Preset::Gpt2Xl => [1024, 48, 25, 1600],
            Preset::Smollm2_135m => [2048, 30, 9, 576],
            Preset::Smollm2_360m => [2048, 32, 15, 960],
        }
    }

    /// A Llama preset's key/value heads, SwiGLU width, rope theta and tied head.
    pub(crate) fn llama(self) -> Option<plimsoll_trainer::LlamaShape> {
        let shape = |kv_heads, mlp_width| plimsoll_trainer::LlamaShape {
            kv_heads,
            mlp_width,
            rope_theta: 100_000.0,
            tie_embeddings: true,
        };
        match self {
            Preset::Smollm2_135m => Some(shape(3, 1536)),
            Preset::Smollm2_360m => Some(shape(5, 2560)),
            _ => None,
        }
    }

    /// The flag's value.
    fn name(self) -> &'static str {
        match self {
            Preset::Gpt2 => "gpt2",
            Preset::Gpt2Medium => "gpt2-medium",
            Preset::Gpt2Large => "gpt2-large",
            Preset::Gpt2Xl => "gpt2-xl",
            Preset::Smollm2_135m => "smollm2-135m",
            Preset::Smollm2_360m => "smollm2-360m",
        }
    }
}

impl GptShape {
    /// The defaults: nanoGPT's CPU configuration.
    const DEFAULT: [usize; 4] = [64, 4, 4, 128];
    /// The names in `run.json` (and of the flags).
    const NAMES: [&str; 4] = ["context", "layers", "heads", "width"];

    fn given(&self) -> [Option<usize>; 4] {
        let preset = self.model.map(Preset::shape);
        let from_preset = |i: usize| preset.map(|p| p[i]);
        [
            self.context.or(from_preset(0)),
            self.layers.or(from_preset(1)),
            self.heads.or(from_preset(2)),
            self.width.or(from_preset(3)),
        ]
    }

    /// The note a preset earns in the log: its name, the resolved `shape` (context, layers,
    /// heads, width) and the vocabulary it gets.
    fn preset_note(&self, shape: [usize; 4], vocab: usize) -> Option<String> {
        let preset = self.model?;
        let [context, layers, heads, width] = shape;
        let family = match preset.llama() {
            Some(_) => "SmolLM2",
            None => "GPT-2",
        };
        let whose = match shape == preset.shape() {
            true => format!("{family}'s shape"),
            false => format!("{family}'s shape with the flags' changes"),
        };
        let vocabulary = match (preset.llama(), vocab) {
            (None, plimsoll_trainer::tokenizer::GPT2_VOCAB) => {
                "GPT-2's vocabulary of 50,257 BPE tokens".to_string()
            }
            (None, _) => format!(
                "the data's vocabulary of {vocab} tokens, not GPT-2's 50,257 (--tokenizer gpt2, \
                 or a folder from plimsoll prepare --tokenizer gpt2, gives GPT-2's)"
            ),
            (Some(_), 49_152) => "SmolLM2's vocabulary size of 49,152".to_string(),
            (Some(_), _) => format!(
                "a vocabulary of {vocab} tokens, not SmolLM2's 49,152 (--vocab-size 49152 \
                 gives its size)"
            ),
        };
        Some(format!(
            "--model {}: {layers} layers x {heads} heads x {width} wide, context {context} \
             ({whose}), over {vocabulary}",
            preset.name()
        ))
    }

    /// Context, layers, heads and width: the flags, else `recorded`, else the defaults. A flag
    /// that contradicts `recorded` (the shape a run was trained with) is an error naming both.
    fn resolve(&self, recorded: Option<[usize; 4]>) -> Result<[usize; 4]> {
        let mut shape = recorded.unwrap_or(Self::DEFAULT);
        for (i, given) in self.given().into_iter().enumerate() {
            match (given, recorded) {
                (Some(g), Some(r)) if g != r[i] => {
                    return Err(Error::invalid(
                        format!("--{}", Self::NAMES[i]),
                        format!(
                            "{g}, but the run was trained with {}; leave the flag out to use \
                             the run's",
                            r[i]
                        ),
                    ));
                }
                (Some(g), _) => shape[i] = g,
                (None, _) => {}
            }
        }
        for (value, name) in shape.iter().zip(Self::NAMES) {
            if *value == 0 {
                return Err(Error::invalid(
                    format!("--{name}"),
                    "0; it must be at least 1",
                ));
            }
        }
        let [_, _, heads, width] = shape;
        if !width.is_multiple_of(heads) {
            return Err(Error::invalid(
                "--heads",
                format!(
                    "{heads} does not divide --width {width}; pick a head count that divides the width"
                ),
            ));
        }
        Ok(shape)
    }

    /// The model's configuration over a vocabulary of `vocab_size` characters.
    fn config(shape: [usize; 4], vocab_size: usize) -> plimsoll_nn::GptConfig {
        let [block_size, n_layer, n_head, n_embd] = shape;
        plimsoll_nn::GptConfig {
            vocab_size,
            block_size,
            n_layer,
            n_head,
            n_embd,
        }
    }

    /// The shape as `run.json` records it.
    fn record(shape: [usize; 4]) -> serde_json::Value {
        Self::NAMES
            .iter()
            .zip(shape)
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

#[derive(Args, Clone)]
pub(crate) struct ShakespeareArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Optimizer steps.
    #[arg(long, default_value_t = 2000, value_parser = flags::count_u64)]
    steps: u64,
    /// Windows per optimizer step.
    #[arg(long, default_value_t = 12, value_parser = flags::count)]
    batch: usize,
    #[command(flatten)]
    shape: GptShape,
    #[command(flatten)]
    arch: ArchArgs,
    /// Evaluate the validation loss every N steps (and at the end).
    #[arg(long, default_value_t = 250, value_parser = flags::count_u64)]
    eval_every: u64,
    /// Validation windows, evenly spaced over the last 10% of the text.
    #[arg(long, default_value_t = 240, value_parser = flags::count)]
    eval_windows: usize,
    /// Train on this text file (UTF-8, optionally .gz) instead of the bundled plays, or on a
    /// token folder (train.bin and val.bin, from plimsoll prepare or nanoGPT's prepare.py;
    /// read through a memory map, never whole).
    #[arg(long)]
    data: Option<PathBuf>,
    /// How a text (the bundled plays or a --data file) becomes tokens: `char` (its distinct
    /// characters) or `gpt2` (GPT-2's byte-level BPE, 50,257 tokens). A token folder says its
    /// own (meta.json).
    #[arg(long, value_enum)]
    tokenizer: Option<TokenizerArg>,
    /// How attention runs: `auto` (the memory plan picks the reference path when the step fits
    /// with it at the largest micro-batch without checkpointing, else the fused one), `fused`
    /// (FlashAttention: no `context x context` tensor is kept; slower here) or `reference`
    /// (scores, softmax and product, the probabilities kept for backward).
    #[arg(long, value_enum, default_value_t = AttentionArg::Auto)]
    attention: AttentionArg,
    /// Dropout in training, where nanoGPT's `--dropout` applies: the embeddings' sum, the
    /// attention probabilities (inside the fused kernels too) and each block's two residual
    /// branches. nanoGPT's Shakespeare configuration uses 0.2; 0 (the default) drops nothing.
    #[arg(long, default_value_t = 0.0, value_parser = flags::dropout, allow_negative_numbers = true)]
    dropout: f32,
    /// How the output head and loss run: `auto` (the memory plan keeps the whole logits when
    /// the step fits with them, else runs the head and loss in chunks of rows chosen from the
    /// micro-batch), a number of rows per chunk, or `off` (the whole logits, kept for backward).
    #[arg(long, default_value = "auto", value_parser = flags::loss_chunk)]
    loss_chunk: plimsoll_trainer::LossHead,
}

/// `--tokenizer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TokenizerArg {
    /// One token per distinct character of the text.
    Char,
    /// GPT-2's byte-level BPE (50,257 tokens).
    Gpt2,
}

/// `--attention`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum AttentionArg {
    /// The plan decides.
    Auto,
    /// The fused kernels.
    Fused,
    /// The reference path.
    Reference,
}

/// A ResNet on synthetic images (`train resnet50`, `plan resnet50`).
#[derive(Args, Clone)]
pub(crate) struct ResNetArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Optimizer steps.
    #[arg(long, default_value_t = 100, value_parser = flags::count_u64)]
    steps: u64,
    /// Effective batch (images per optimizer step).
    #[arg(long, default_value_t = 256, value_parser = flags::count)]
    batch: usize,
    /// Height and width of the (square, RGB) images.
    #[arg(long, default_value_t = 224, value_parser = flags::count)]
    image: usize,
    /// Classes of the classifier.
    #[arg(long, default_value_t = 1000, value_parser = flags::count)]
    classes: usize,
    /// Synthetic images of a held-out set (another seed) evaluated at each epoch's end and at
    /// the run's end, in evaluation mode (BatchNorm's running statistics); 0 evaluates nothing.
    #[arg(long, default_value_t = 16)]
    eval_images: usize,
}

#[derive(Args, Clone)]
struct BenchArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Optimizer steps.
    #[arg(long, default_value_t = 25, value_parser = flags::count_u64)]
    steps: u64,
    /// Effective batch.
    #[arg(long, default_value_t = 128, value_parser = flags::count)]
    batch: usize,
    /// Hidden layers of width 1024.
    #[arg(long, default_value_t = 3)]
    layers: usize,
}

/// `plimsoll plan`: the plan of one rank of `ranks`.
fn plan_only(workload: Workload, ranks: usize) -> Result<()> {
    let (job, common) = job(workload)?;
    for note in &job.notes {
        out::say(note);
    }
    let gpu = common.device.open()?;
    // The plan searches micro-batches unless given one (mlp-bench's run fixes its own, which
    // a plan leaves open), or --micro-batch-invariant keeps the whole batch.
    let micro_batch = match common.micro_batch_invariant {
        true => job.config.micro_batch,
        false => common.micro_batch,
    };
    let effective_batch =
        plimsoll_trainer::collective::largest_shard(job.config.effective_batch, ranks);
    let config = TrainConfig {
        micro_batch,
        effective_batch,
        rank: (0, ranks),
        ..job.config
    };
    if ranks > 1 {
        out::say(format_args!(
            "rank 0 of {ranks}: its shard of every batch ({effective_batch} of {} samples){}",
            job.config.effective_batch,
            match config.shard {
                plimsoll_trainer::Shard::None => String::new(),
                shard => format!(" and its part of the optimizer state (--shard {shard})"),
            }
        ));
    }
    let plan = plimsoll_trainer::plan::plan(
        &gpu,
        job.spec.as_ref(),
        &job.train,
        job.test.as_deref(),
        &config,
    )?;
    out::say(format_args!("{} on {}", job.name, gpu.adapter()));
    out::say(&plan);
    Ok(())
}

fn main() -> ExitCode {
    let started = Instant::now();
    // As the system gave them: an argument that is not UTF-8 (a path) is no panic; a path
    // flag keeps it as a `PathBuf`, any other flag is clap's usage error.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = <Cli as clap::CommandFactory>::command();
    let cli = Cli::parse_from(flags::join_negative_values(cli, &argv));
    let result = match cli.command {
        Command::Train { workload } => train::train(workload, &argv, started),
        Command::Plan { workload, ranks } => {
            plan_only(workload, ranks as usize).map(|()| ExitCode::SUCCESS)
        }
        Command::Sample(args) => sampling::run(&args),
        Command::Prepare(args) => prepare::run(&args),
        Command::Eval(args) => inspect::eval(&args).map(|()| ExitCode::SUCCESS),
        Command::Runs(args) => inspect::runs(&args).map(|()| ExitCode::SUCCESS),
        Command::Report(args) => inspect::report(&args).map(|()| ExitCode::SUCCESS),
    };
    // A device left to finish its work alone, said once (a timeout's error already says so).
    let timed_out = matches!(&result, Err(e) if e.is_timeout());
    if let Some(leak) = Gpu::last_leak().filter(|_| !timed_out) {
        eprintln!("plimsoll: {leak}");
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            out::error(&e);
            ExitCode::from(if e.is_usage() { 2 } else { 1 })
        }
    }
}
