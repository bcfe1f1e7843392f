//! Every kernel against its CPU reference (one module per family, `<stem>_matches_reference`).
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod matmul;
mod matmul_f16;
