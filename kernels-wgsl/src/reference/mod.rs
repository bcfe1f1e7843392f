//! CPU references, one module per kernel family (the same stem as `shaders/<stem>.wgsl` and
//! `src/kernels/<stem>.rs`). Plain, obviously-correct loops over `f32` slices, row-major, used as
//! the oracle in every kernel test. Where accumulation order matters they accumulate in `f64`.

pub mod binary;
pub mod convert;
pub mod copy;
pub mod cross_entropy;
pub mod dropout;
pub mod embedding;
pub mod fill;
pub mod layer_norm;
pub mod matmul;
pub mod nonfinite;
pub mod optimizer;
pub mod reduce;
pub mod softmax;
pub mod unary;
