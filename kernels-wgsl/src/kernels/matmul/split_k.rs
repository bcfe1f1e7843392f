//! Split-K: a product whose C has too few 128×128 blocks to keep a GPU busy and whose k is long
//! runs as several products over slices of k, summed. The case is a weight gradient `Xᵀ·dY`
//! (`trans_a`, B not transposed): C is `in × out` (384 × 1536 in nanoGPT's GPU configuration:
//! 36 blocks on a card of 132 multiprocessors) while k is batch × context (16,384), so each
//! block's workgroup walks all of k alone; on an H200 such a product took 1.84 ms whatever its
//! size (`plimsoll train ... --profile-steps`).
//!
//! With `S` slices: slices `1..S` of k (`ks` rows of A and B each) run as one batched product
//! into scratch parts, the parts (and C's old value when accumulating) are summed into C
//! ([`reduce::sum_axis`]), and slice 0 (the first `k - (S-1)·ks` rows) runs last, accumulating
//! into C with the launch's squares: C and its squares are those of the whole product, the sums
//! in another order (f32 rounding). Only where A's and B's slices of k are contiguous
//! (`trans_a`, not `trans_b`), for one product (`batch` 1), `alpha` 1, an f32 C, no bias
//! epilogue, on `main`; and below [`Gpu::split_k_below`] blocks (0 on a CPU adapter: never).

use std::sync::atomic::Ordering;

use super::{Dims64, Extra, MatmulDims, MatmulEntry, Operand, TILE_MAIN, launch_entry};
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{copy, reduce};
use crate::pipeline::Kernel;
use crate::{Category, DeviceSlice};

/// The default of [`Gpu::split_k_below`] on a GPU: about one block per multiprocessor of a
/// large card.
pub const SPLIT_K_BELOW: u64 = 128;
/// The shortest k that is split.
const MIN_K: u64 = 1024;
/// The shortest slice of k.
const MIN_SLICE: u64 = 256;

impl Gpu {
    /// Products of fewer 128×128 blocks of C than this split their k across workgroups
    /// ([`crate::kernels::matmul`]'s split-K: a weight gradient's short C and long k). 0: never.
    /// [`SPLIT_K_BELOW`] on a GPU, 0 on a CPU adapter.
    pub fn split_k_below(&self) -> u64 {
        self.shared.split_k_below.load(Ordering::Relaxed)
    }

    /// Sets [`Gpu::split_k_below`] for this device, its clones and the planning twins made
    /// afterwards (benchmarks compare; tests turn it on where it is off).
    pub fn set_split_k_below(&self, blocks: u64) {
        self.shared.split_k_below.store(blocks, Ordering::Relaxed);
    }
}

/// The number of slices to split `dims`' k into on `gpu`, or `None` to run it whole.
pub(super) fn slices(
    gpu: &Gpu,
    dims: &MatmulDims,
    operands: [Operand<'_>; 3],
    (kernels, forced, extra): (&[Kernel; 2], Option<MatmulEntry>, &Extra<'_>),
) -> Option<u64> {
    let d = Dims64::new(dims);
    let below = gpu.split_k_below();
    let blocks = d.m.div_ceil(TILE_MAIN) * d.n.div_ceil(TILE_MAIN);
    let plain = kernels[0].stem == super::MAIN.stem
        && kernels[0].runtime_checks == super::MAIN.runtime_checks
        && forced.is_none()
        && !matches!(extra, Extra::Bias(..));
    let shape = d.batch == 1
        && dims.trans_a
        && !dims.trans_b
        && dims.alpha == 1.0
        && !operands[0].is_f16()
        && d.k >= MIN_K
        && blocks > 0
        && blocks < below;
    if !plain || !shape || launch_entry(dims, operands) != MatmulEntry::Main {
        return None;
    }
    let slices = (2 * below).div_ceil(blocks).min(d.k / MIN_SLICE);
    (slices >= 2).then_some(slices)
}

/// Runs `dims` in `slices` slices of k (module docs); `launch` runs each product whole.
pub(super) fn launch_sliced(
    gpu: &Gpu,
    dims: &MatmulDims,
    [out, lhs, rhs]: [Operand<'_>; 3],
    extra: Extra<'_>,
    slices: u64,
    launch: impl Fn(&MatmulDims, [Operand<'_>; 3], Extra<'_>) -> Result<()>,
) -> Result<()> {
    let d = Dims64::new(dims);
    // `launch_one`'s check, before C is written: the parts go to scratch, so the first launch
    // that would see C is the last.
    for (name, operand) in [("lhs (A)", lhs), ("rhs (B)", rhs)] {
        if out.overlaps(&operand) {
            return Err(Error::InvalidArgument {
                op: "matmul",
                message: format!(
                    "out (C) {out:?} overlaps {name} {operand:?} in the same segment (or shares \
                     a word with it); write the product to a separate buffer"
                ),
            });
        }
    }
    let Operand::F32(c) = out else {
        // `slices` refuses a 16-bit C.
        return launch(dims, [out, lhs, rhs], extra);
    };
    let mn = d.m * d.n;
    let c = c.slice(0, mn)?;
    let ks = d.k / slices;
    let k0 = d.k - (slices - 1) * ks;
    let kept = u64::from(dims.accumulate);
    let parts = slices - 1 + kept;
    let scratch = gpu.alloc_elements(parts * mn, Category::Temporary, "matmul split-k parts")?;
    let whole: DeviceSlice<'_> = scratch.whole();
    if dims.accumulate {
        copy::copy(gpu, whole.slice(0, mn)?, c)?;
    }
    let to = |x: u64| x as usize;
    let sliced = MatmulDims {
        batch: to(slices - 1),
        k: to(ks),
        batch_stride_a: to(ks * d.m),
        batch_stride_b: to(ks * d.n),
        batch_stride_c: to(mn),
        accumulate: false,
        ..*dims
    };
    let parts_out = Operand::F32(whole.slice(kept * mn, (slices - 1) * mn)?);
    let operands = [parts_out, lhs.skip(k0 * d.m)?, rhs.skip(k0 * d.n)?];
    launch(&sliced, operands, Extra::None)?;
    reduce::sum_axis(gpu, c, whole, &[to(parts), to(mn)], 0)?;
    let first = MatmulDims {
        k: to(k0),
        accumulate: true,
        ..*dims
    };
    launch(&first, [out, lhs, rhs], extra)
}

#[cfg(test)]
mod tests {
    use super::super::f16_tests::Host;
    use super::super::{MatmulDims, MatmulEntry, matmul_squares, reference, squares_len};
    use crate::kernels::convert::reference as cpu;
    use crate::testing::{DEADLINE, Rng, assert_close, fresh_gpu, to_f64};
    use crate::{Category, Result};

    /// A weight gradient's shape (`trans_a`; C 64×72, k 1100), split in slices on lavapipe
    /// (where splitting is off by default) and whole, with an f32 and a 16-bit A, accumulating
    /// and not: both against the f64 reference, the squares summing to C's norm, and the
    /// recorded shapes say it split (a batched product of slices) or not.
    #[test]
    fn a_split_k_product_matches_the_reference_and_its_squares() -> Result<()> {
        let gpu = fresh_gpu();
        let mut rng = Rng::new(0x5b1f);
        let (m, n, k) = (64, 72, 1100);
        // f16-exact values: a 16-bit A holds them as they are, and the cooperative path (where
        // the adapter has it, with a 16-bit A) rounds an f32 B to f16 without changing them.
        let a = cpu::round_to_f16(&rng.vec_f32(k * m, -1.0, 1.0));
        let b = cpu::round_to_f16(&rng.vec_f32(k * n, -1.0, 1.0));
        let c0 = rng.vec_f32(m * n, -1.0, 1.0);
        let b_gpu = gpu.upload(&b, Category::Temporary, "b")?;
        for a_half in [false, true] {
            let a_host = Host::new(&a, 4, a_half);
            let a_gpu = a_host.upload(&gpu, "a")?;
            for accumulate in [false, true] {
                let dims = MatmulDims {
                    trans_a: true,
                    accumulate,
                    ..MatmulDims::dense(1, m, n, k)
                };
                let mut want = to_f64(&c0);
                reference::matmul_into_f64(&to_f64(&a), &to_f64(&b), &mut want, &dims);
                for below in [1000, 0] {
                    gpu.set_split_k_below(below);
                    let c_gpu = gpu.upload(&c0, Category::Temporary, "c")?;
                    let len = squares_len(&dims, MatmulEntry::Main) as usize;
                    let sq = gpu.upload(&vec![f32::NAN; len], Category::Temporary, "sq")?;
                    gpu.record_matmuls();
                    let a_op = a_host.operand(&a_gpu)?;
                    matmul_squares(&gpu, &dims, c_gpu.whole(), a_op, b_gpu.whole(), sq.whole())?;
                    let shapes = gpu.take_matmuls();
                    let name = format!("A 16-bit {a_half}, accumulate {accumulate}, below {below}");
                    let split = shapes.iter().any(|s| s.batch > 1);
                    assert_eq!(split, below > 0, "{name}: {shapes:?}");
                    let c: Vec<f32> = gpu.read_all(&c_gpu, DEADLINE)?;
                    let atol = 8.0 * f64::from(f32::EPSILON) * k as f64;
                    assert_close(&name, &c, &want, atol, 1e-5);
                    let squares: Vec<f32> = gpu.read_all(&sq, DEADLINE)?;
                    let norm: f64 = c.iter().map(|&x| f64::from(x).powi(2)).sum();
                    let summed: f64 = squares.iter().map(|&x| f64::from(x)).sum();
                    assert!((norm - summed).abs() <= 1e-5 * norm, "{name}: {summed} vs {norm}");
                }
            }
        }
        // C overlapping A is refused before anything is written.
        gpu.set_split_k_below(1000);
        let a_gpu = gpu.upload(&a, Category::Temporary, "a")?;
        let dims = MatmulDims {
            trans_a: true,
            ..MatmulDims::dense(1, m, n, k)
        };
        let out = a_gpu.slice(0, (m * n) as u64)?;
        let refused = super::super::matmul(&gpu, &dims, out, a_gpu.whole(), b_gpu.whole());
        assert!(
            matches!(refused, Err(crate::Error::InvalidArgument { .. })),
            "{refused:?}"
        );
        let kept: Vec<f32> = gpu.read_all(&a_gpu, DEADLINE)?;
        assert!(kept == a, "A changed");
        Ok(())
    }
}
