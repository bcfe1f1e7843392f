//! The op families' shader codes against their WGSL declarations. (The sanity checks of each
//! CPU reference against independent oracles, so that a wrong reference never becomes a wrong
//! oracle for the GPU kernels: central finite differences of each forward reference for every
//! backward, hand-worked small cases and identities, are in each family's
//! `kernels::<stem>::tests`, next to the reference.)
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The op families the checks below declare codes for.
use plimsoll_kernels_wgsl::kernels::binary::BinaryOp;
use plimsoll_kernels_wgsl::kernels::unary::UnaryOp;

mod elementwise;
