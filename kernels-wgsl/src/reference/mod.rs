//! CPU references, one module per kernel family (the same stem as `shaders/<stem>.wgsl` and
//! `src/kernels/<stem>.rs`; a family in the one-place layout, `src/kernels/<stem>/`, keeps its
//! reference there, as `kernels::<stem>::reference`). Plain, obviously-correct loops, row-major: the one oracle of each op
//! for every test in the workspace. Where an op is differentiated by finite differences
//! (autograd's gradient checks, nn's module tests) the reference computes in `f64` (`*_f64`
//! entry points) and the `f32` entry points the kernel tests call are thin wrappers that widen
//! their inputs and round each output once; elsewhere they accumulate in `f64` where order
//! matters.

pub mod matmul;

/// `v` widened to `f64` (what the `f32` wrappers hand to the `f64` references).
pub(crate) fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// `v` rounded to `f32` (what the `f32` wrappers return).
pub(crate) fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}
