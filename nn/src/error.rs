//! The one error type of `plimsoll-nn`: structured variants with the names and the numbers, and a
//! hint of what to do next.

use std::path::PathBuf;

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in `plimsoll-nn`. Bad input (a bad width, a corrupt file) is
/// always one of these, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor op failed (shapes, dtypes, out of memory, timeout, ...).
    #[error(transparent)]
    Autograd(#[from] plimsoll_autograd::Error),
    /// A kernel launch made directly by this crate (the fused optimizers) failed.
    #[error(transparent)]
    Kernel(#[from] plimsoll_kernels_wgsl::Error),
    /// A module or optimizer built with arguments outside their domain.
    #[error("{what}: {message}")]
    InvalidConfig {
        /// The module, function or optimizer.
        what: &'static str,
        /// What is wrong, with the numbers and a hint.
        message: String,
    },
    /// A module given an input of a shape it cannot take.
    #[error("{module}: input of shape {found:?}, expected {expected}")]
    InputShape {
        /// The module.
        module: &'static str,
        /// What it takes, in words (`[batch, time, 64]`).
        expected: String,
        /// What it got.
        found: Vec<usize>,
    },
    /// Optimizer state that does not fit the optimizer or the parameters.
    #[error("optimizer state {name:?}: {message}")]
    OptimizerState {
        /// The state entry (`exp_avg.0.weight`) or parameter name.
        name: String,
        /// What is wrong, with a hint.
        message: String,
    },
    /// Reading, writing, syncing or renaming a state file failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done (`write`, `rename`, ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A state file whose header length exceeds the cap (a corrupt or hostile file).
    #[error(
        "{path}: header claims {header_bytes} bytes, more than the {max_bytes}-byte cap; the file \
         is corrupt or not a safetensors file"
    )]
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// What the first 8 bytes claim.
        header_bytes: u64,
        /// The cap.
        max_bytes: u64,
    },
    /// A state file shorter than its own header says.
    #[error(
        "{path}: file has {file_bytes} bytes but needs at least {needed_bytes}; it is truncated \
         (an interrupted copy?) — use an earlier checkpoint"
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        file_bytes: u64,
        /// What the header needs.
        needed_bytes: u64,
    },
    /// A state file that is not valid safetensors (bad JSON, offsets past the end, byte counts
    /// that do not match the shapes, ...).
    #[error("{path}: not a valid safetensors file: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the parser found.
        reason: String,
    },
    /// A saved tensor whose element type is not F32 (the only one parameters and optimizer
    /// state use).
    #[error("{name:?}: stored as {found}, expected F32; convert the file to float32")]
    DType {
        /// The entry.
        name: String,
        /// Its safetensors dtype.
        found: String,
    },
    /// Parameters with no entry in the loaded state.
    #[error(
        "{} parameter(s) missing from the saved state: {}; was it saved from another model?",
        names.len(),
        some_names(names)
    )]
    Missing {
        /// The missing names.
        names: Vec<String>,
    },
    /// Loaded entries that match no parameter.
    #[error(
        "{} saved entr(y/ies) match no parameter: {}; was it saved from another model?",
        names.len(),
        some_names(names)
    )]
    Unexpected {
        /// The extra names.
        names: Vec<String>,
    },
    /// A saved tensor whose shape differs from the parameter's.
    #[error("{name:?}: parameter has shape {expected:?}, saved tensor has {found:?}")]
    ShapeMismatch {
        /// The entry.
        name: String,
        /// The parameter's shape.
        expected: Vec<usize>,
        /// The saved shape.
        found: Vec<usize>,
    },
}

/// The first few of `names`, quoted, and how many more there are: a list a reader can take in.
fn some_names(names: &[String]) -> String {
    const SHOWN: usize = 6;
    let shown: Vec<String> = names.iter().take(SHOWN).map(|n| format!("{n:?}")).collect();
    match names.len().saturating_sub(SHOWN) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}
