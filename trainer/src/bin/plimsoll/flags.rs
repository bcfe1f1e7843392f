//! Flag parsers: every value is checked when it is parsed, so a bad one is a usage error
//! (exit code 2, clap's message naming the flag) before anything runs.

use plimsoll_trainer::{
    AllocatorMode, CheckpointPolicy, LeakPolicy, Offload, Precision, Shard, StepSpan,
};

type Parsed<T> = std::result::Result<T, String>;

/// A byte count: `64MiB`, `1.5GB`, `100000000`. Negative, non-finite and out-of-range sizes
/// are refused.
pub fn bytes(s: &str) -> Parsed<u64> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a size: {e}"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} (use B, KB, KiB, MB, MiB, GB, GiB)"
            ));
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(format!(
            "{s:?} is not a usable size: give a positive size such as 64MiB"
        ));
    }
    Ok(bytes as u64)
}

/// `none`, `auto`, or a positive number of modules per checkpointed segment.
pub fn checkpointing(s: &str) -> Parsed<CheckpointPolicy> {
    match s {
        "none" | "off" => Ok(CheckpointPolicy::None),
        "auto" => Ok(CheckpointPolicy::Automatic),
        n => match n.parse::<usize>() {
            Ok(k) if k > 0 => Ok(CheckpointPolicy::EveryBlocks(k)),
            _ => Err(format!(
                "{s:?}: use none, auto, or a positive number of modules"
            )),
        },
    }
}

/// `off`, `warn` or `error`.
pub fn leak(s: &str) -> Parsed<LeakPolicy> {
    match s {
        "off" => Ok(LeakPolicy::Off),
        "warn" => Ok(LeakPolicy::Warn),
        "error" => Ok(LeakPolicy::Error),
        _ => Err(format!("{s:?}: use off, warn or error")),
    }
}

/// `--allocator`: `caching` or `planned`.
pub fn allocator(s: &str) -> Parsed<AllocatorMode> {
    match s {
        "caching" => Ok(AllocatorMode::Caching),
        "planned" => Ok(AllocatorMode::Planned),
        _ => Err(format!("{s:?}: use caching or planned")),
    }
}

/// `--precision`: `f32` or `f16`.
pub fn precision(s: &str) -> Parsed<Precision> {
    match s {
        "f32" => Ok(Precision::F32),
        "f16" => Ok(Precision::F16),
        _ => Err(format!("{s:?}: use f32 or f16")),
    }
}

/// `--offload`: `auto`, `none`, `optimizer`, `activations` or `parameters`.
pub fn offload(s: &str) -> Parsed<Offload> {
    match s {
        "none" => Ok(Offload::None),
        "auto" => Ok(Offload::Auto),
        "optimizer" => Ok(Offload::OptimizerState),
        "activations" => Ok(Offload::Activations),
        "parameters" => Ok(Offload::Parameters),
        _ => Err(format!(
            "{s:?}: use auto, none, optimizer, activations or parameters"
        )),
    }
}

/// `--shard`: `none`, `optimizer` or `gradients`.
pub fn shard(s: &str) -> Parsed<Shard> {
    match s {
        "none" => Ok(Shard::None),
        "optimizer" => Ok(Shard::OptimizerState),
        "gradients" => Ok(Shard::Gradients),
        _ => Err(format!("{s:?}: use none, optimizer or gradients")),
    }
}

/// `--memory-timeline`: the steps to record, or none (`off`).
#[derive(Clone, Copy, Debug)]
pub struct TimelineSteps(pub Option<StepSpan>);

/// Steps to record as a memory timeline: `off`, `N` or `A-B`.
pub fn timeline(s: &str) -> Parsed<TimelineSteps> {
    if s == "off" {
        return Ok(TimelineSteps(None));
    }
    StepSpan::parse(s)
        .map(|span| TimelineSteps(Some(span)))
        .map_err(|e| {
            let text = e.to_string();
            text.split_once(": ")
                .map_or(text.clone(), |(_, why)| why.to_string())
        })
}

/// Steps to profile: `off`, `N` or `A-B`.
pub fn profile_steps(s: &str) -> Parsed<TimelineSteps> {
    timeline(s).map_err(|e| e.replace("--memory-timeline", "--profile-steps"))
}

fn float(s: &str) -> Parsed<f32> {
    let v: f32 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{s:?} is not finite"))
    }
}

/// A learning rate: a finite number above 0.
pub fn learning_rate(s: &str) -> Parsed<f32> {
    positive(s).map_err(|e| format!("{e} (1e-3 is usual)"))
}

/// A finite number above 0.
pub fn positive(s: &str) -> Parsed<f32> {
    let v = float(s)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err(format!("{v} must be above 0"))
    }
}

/// A finite number, 0 or above.
pub fn non_negative(s: &str) -> Parsed<f32> {
    let v = float(s)?;
    if v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("{v} must be 0 or above"))
    }
}

/// A count of at least 1 that fits the machine's `usize` and is at most `2^40` (larger counts
/// of samples, widths or tokens cannot be held anyway).
pub fn count(s: &str) -> Parsed<usize> {
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a whole number: {e}"))?;
    if v == 0 {
        return Err("must be at least 1".to_string());
    }
    if v > 1 << 40 {
        return Err(format!("{v} is beyond any machine (at most 2^40)"));
    }
    usize::try_from(v).map_err(|e| e.to_string())
}

/// A dropout probability (`--dropout`): in `[0, 1)`.
pub fn dropout(s: &str) -> Parsed<f32> {
    let v: f32 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if !(0.0..1.0).contains(&v) {
        return Err(format!(
            "{v} is not a probability in [0, 1) (1 would drop everything; nanoGPT uses 0.0 to 0.2)"
        ));
    }
    Ok(v)
}

/// A count of batches ahead (`--prefetch`): 0 to 64.
pub fn count_or_zero(s: &str) -> Parsed<usize> {
    match s.trim() {
        "0" => Ok(0),
        v => match count(v)? {
            n if n > 64 => Err(format!(
                "{n} batches ahead would only hold host memory: a step uses one; give 0 to 64"
            )),
            n => Ok(n),
        },
    }
}

/// `--snapshot-every`: a number of steps (`50`), a time (`90s`, `5m`) or `off`.
pub fn snapshot_every(s: &str) -> Parsed<plimsoll_trainer::SnapshotEvery> {
    use plimsoll_trainer::SnapshotEvery;
    let t = s.trim();
    let hint = |e: String| format!("{e}; give steps (50), a time (90s, 5m) or off");
    let seconds = |n: &str, unit: u64| -> Parsed<SnapshotEvery> {
        let n = match n.parse::<u64>() {
            Ok(_) => count(n).map_err(|e| hint(format!("{s:?}: {e}")))?,
            Err(_) => return Err(hint(format!("{s:?} is not a number of steps or a time"))),
        };
        Ok(SnapshotEvery::Interval(std::time::Duration::from_secs(
            (n as u64).saturating_mul(unit),
        )))
    };
    if t == "off" {
        Ok(SnapshotEvery::Off)
    } else if let Some(n) = t.strip_suffix('s') {
        seconds(n, 1)
    } else if let Some(n) = t.strip_suffix('m') {
        seconds(n, 60)
    } else {
        count(t)
            .map(|n| SnapshotEvery::Steps(n as u64))
            .map_err(hint)
    }
}

/// `--max-submission-ms`: the adapter's default, none, or milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaxSubmission {
    /// The adapter's default ([`plimsoll_kernels_wgsl::pacing::DEFAULT_MAX_SUBMISSION`] on a
    /// GPU, none on a CPU adapter).
    Auto,
    /// No bound.
    Off,
    /// This many milliseconds.
    Ms(f64),
}

/// `--max-submission-ms`: `auto`, `off` or a number of milliseconds (0.1 to 60000).
pub fn max_submission(s: &str) -> Parsed<MaxSubmission> {
    match s.trim() {
        "auto" => Ok(MaxSubmission::Auto),
        "off" => Ok(MaxSubmission::Off),
        v => {
            let ms: f64 = v.parse().map_err(|e| {
                format!("{v:?} is not a number: {e}; give auto, off or milliseconds")
            })?;
            if !(0.1..=60_000.0).contains(&ms) {
                return Err(format!(
                    "{ms} ms is outside 0.1 to 60000 (a watchdog resets a GPU after about \
                     2000 ms; 100 keeps a display drawing); give auto, off or milliseconds"
                ));
            }
            Ok(MaxSubmission::Ms(ms))
        }
    }
}

/// A count of at least 1 (steps, epochs, milliseconds), at most `2^40`.
pub fn count_u64(s: &str) -> Parsed<u64> {
    count(s).map(|v| v as u64)
}

/// `--loss-chunk`: `auto` (the plan decides), `off` (the whole logits) or a row count.
pub fn loss_chunk(s: &str) -> Parsed<plimsoll_trainer::LossHead> {
    match s.trim() {
        "auto" => Ok(plimsoll_trainer::LossHead::Auto),
        "off" => Ok(plimsoll_trainer::LossHead::Reference),
        rows => count(rows)
            .map(plimsoll_trainer::LossHead::Chunked)
            .map_err(|e| format!("{e}; give `auto`, `off` or a number of rows")),
    }
}

/// `argv` with `--flag -1` given as `--flag=-1` where `--flag` takes a value in `command` (the
/// command's clap tree): clap reads a token that starts with `-` as a flag of its own, so a
/// negative number apart from its flag was "unexpected argument '-1'" where the joined form
/// gets the flag's own message.
pub fn join_negative_values(
    mut command: clap::Command,
    argv: &[std::ffi::OsString],
) -> Vec<std::ffi::OsString> {
    let looks_negative = |s: &str| {
        s.strip_prefix('-').is_some_and(|rest| {
            rest.starts_with(|c: char| c.is_ascii_digit() || c == '.')
                || rest.eq_ignore_ascii_case("inf")
                || rest.eq_ignore_ascii_case("nan")
        })
    };
    let mut out = Vec::with_capacity(argv.len());
    let mut rest = argv.iter().peekable();
    while let Some(arg) = rest.next() {
        let text = arg.to_str().unwrap_or_default();
        if let Some(sub) = command.find_subcommand(text).cloned() {
            command = sub;
        } else if let Some(name) = text.strip_prefix("--").filter(|n| !n.contains('=')) {
            let takes_value = command
                .get_arguments()
                .any(|a| a.get_long() == Some(name) && a.get_action().takes_values());
            let value = rest
                .peek()
                .and_then(|v| v.to_str())
                .filter(|v| looks_negative(v));
            if let Some(value) = value.filter(|_| takes_value) {
                out.push(format!("{text}={value}").into());
                rest.next();
                continue;
            }
        }
        out.push(arg.clone());
    }
    out
}
