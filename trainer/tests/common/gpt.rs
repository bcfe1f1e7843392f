//! The tiny GPT the GPT tests train (2 layers, width 32, 13 tokens, context 8), and its data.

use std::sync::Arc;

use plimsoll_kernels_wgsl::random::SplitMix64;
use plimsoll_nn::{GptConfig, SgdConfig};
use plimsoll_trainer::{GptSpec, OptimizerSpec, TokenData};

/// The tiny GPT's vocabulary.
pub const VOCAB: usize = 13;
/// The tiny GPT's context.
pub const CONTEXT: usize = 8;

/// The tiny GPT (2 layers, 2 heads, width 32) with `optimizer`, seed 11.
pub fn spec(optimizer: OptimizerSpec) -> GptSpec {
    GptSpec::new(
        GptConfig {
            vocab_size: VOCAB,
            block_size: CONTEXT,
            n_layer: 2,
            n_head: 2,
            n_embd: 32,
        },
        11,
        optimizer,
    )
}

/// SGD with momentum. (With Adam the same comparison differs by about 3e-6 relative on
/// embedding rows whose gradients are tiny: Adam's `m / sqrt(v)` magnifies the f32 summation
/// order of micro-batches there, as the MLP's out-of-memory test notes.)
pub fn sgd() -> OptimizerSpec {
    OptimizerSpec::Sgd(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..SgdConfig::default()
    })
}

/// `len` seeded tokens with some structure (a token often repeats the one two back), so the
/// model has something to learn.
pub fn tokens(len: usize, seed: u64) -> Arc<Vec<u32>> {
    let mut rng = SplitMix64::new(seed);
    let mut t: Vec<u32> = Vec::with_capacity(len);
    for i in 0..len {
        let v = if i >= 2 && rng.below(3) > 0 {
            t[i - 2]
        } else {
            rng.below(VOCAB as u64) as u32
        };
        t.push(v);
    }
    Arc::new(t)
}

/// The tiny GPT's context windows over `len` seeded tokens (seed 5).
pub fn windows(len: usize) -> TokenData {
    TokenData::windows(tokens(len, 5), CONTEXT, VOCAB).unwrap()
}
