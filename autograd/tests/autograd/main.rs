//! The autograd test suite (one binary: one link on two shared cores).
#![allow(clippy::unwrap_used)] // tests may unwrap, helpers included

mod checkpoint;
mod common;
mod errors;
mod gradcheck;
mod half;
mod hand_worked;
mod memory;
mod pieces;
mod residual;
mod slices_in_place;
