//! `plimsoll-nn` tests: modules against f64 CPU references (forward, and parameter and input
//! gradients by central differences of the reference), losses, one hand-computed step of each
//! optimizer, clipping, schedules, and the safetensors state files (round trip, independent
//! reader, corrupt and hostile files).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod clipping;
mod common;
mod conv;
mod gpt;
mod host_and_sharded;
mod llama;
mod losses;
mod modules;
mod optimizers;
mod resnet;
mod state_files;
