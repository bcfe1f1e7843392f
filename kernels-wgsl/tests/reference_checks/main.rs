//! Sanity checks of the CPU references against independent oracles, so that a wrong reference
//! never becomes a wrong oracle for the GPU kernels: central finite differences (in `f64`) of
//! each forward reference for every backward, hand-worked small cases (derivations in the
//! comments), and identities.
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plimsoll_kernels_wgsl::kernels::nonfinite::reference as nonfinite;
use plimsoll_kernels_wgsl::reference::cross_entropy;
// The types the references take live with their launchers.
use plimsoll_kernels_wgsl::kernels::binary::BinaryOp;
use plimsoll_kernels_wgsl::kernels::unary::UnaryOp;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, dot, numeric_gradient};

mod elementwise;
mod rows;
mod state_and_storage;
