//! The cooperative-matrix matmul (`main_coop`) against the f64 reference on the same f16
//! inputs, and against the SIMT path, on adapters that have it; elsewhere, that the launchers
//! keep off it and say why (lavapipe has no cooperative matrices: docs/wgpu.md).

use super::f16_tests::{Host, check, lens};
use super::{Epilogue, MatmulDims, MatmulEntry, MatmulPath};
use crate::kernels::convert::F16Path;
use crate::testing::{DEADLINE, Rng, assert_close, fresh_gpu, skip};
use crate::{Category, Gpu, Result};

/// A device on the native 16-bit path with the cooperative matmul on, or `None` (and the
/// checks that hold without it) where the adapter lacks it.
fn coop_gpu(test: &str) -> Option<Gpu> {
    let gpu = fresh_gpu();
    if !gpu.adapter().cooperative_matmul {
        assert_eq!(gpu.matmul_path(), MatmulPath::Simt);
        let refused = gpu.set_cooperative_matmul(true);
        assert!(
            matches!(refused, Err(crate::Error::InvalidArgument { .. })),
            "turning on cooperative matrices the adapter lacks: {refused:?}"
        );
        skip(
            test,
            &format!("adapter {:?} has no usable cooperative matrices", gpu.adapter().name),
        );
        return None;
    }
    gpu.set_f16_path(F16Path::Native).ok()?;
    assert_eq!(gpu.matmul_path(), MatmulPath::Cooperative);
    Some(gpu)
}

/// The widths `[a, b, c]` (true: 16-bit) that run on cooperative matrices: A or B 16-bit.
const WIDTHS: [[bool; 3]; 6] = [
    [true, false, false],
    [false, true, false],
    [true, true, false],
    [true, false, true],
    [false, true, true],
    [true, true, true],
];

/// Every layout, shapes that are not multiples of the 16×16 tiles or of the 128×128 blocks,
/// batches with strides, accumulate, alpha, both widths of C and the epilogue.
#[test]
fn coop_matmul_matches_the_reference() -> Result<()> {
    let Some(gpu) = coop_gpu("coop_matmul_matches_the_reference") else {
        return Ok(());
    };
    let mut rng = Rng::new(0xc00b);
    let layouts = [(false, false), (false, true), (true, false), (true, true)];
    for (t, (trans_a, trans_b)) in layouts.into_iter().enumerate() {
        for (m, n, k) in [(128, 128, 128), (200, 132, 36), (20, 24, 4), (260, 384, 520)] {
            let dims = MatmulDims {
                trans_a,
                trans_b,
                accumulate: t % 2 == 1,
                alpha: if t == 2 { 0.5 } else { 1.0 },
                ..MatmulDims::dense(2, m, n, k)
            };
            for widths in WIDTHS {
                let offsets = [4, 8, 12];
                let launch = (MatmulEntry::Main, &dims);
                check(&gpu, &mut rng, launch, widths, offsets, Epilogue::None, true)?;
            }
        }
    }
    let big = MatmulDims {
        trans_b: true,
        ..MatmulDims::dense(1, 256, 512, 768)
    };
    for widths in WIDTHS {
        let launch = (MatmulEntry::Main, &big);
        check(&gpu, &mut rng, launch, widths, [0; 3], Epilogue::BiasRelu, true)?;
    }
    Ok(())
}

/// The same product on cooperative matrices and on the SIMT path agree within f32 rounding
/// (both sum exact products of halves in f32, in other orders), and the squares of C per
/// 16×16 block sum to C's squared norm.
#[test]
fn coop_and_simt_agree_and_the_squares_add_up() -> Result<()> {
    let Some(gpu) = coop_gpu("coop_and_simt_agree_and_the_squares_add_up") else {
        return Ok(());
    };
    let mut rng = Rng::new(0x5eed);
    let dims = MatmulDims {
        trans_a: true,
        ..MatmulDims::dense(3, 136, 264, 300)
    };
    let (a_len, b_len) = lens(&dims);
    let a = Host::new(&rng.vec_f32(a_len, -1.0, 1.0), 0, true);
    let b = Host::new(&rng.vec_f32(b_len, -1.0, 1.0), 4, true);
    let (a_gpu, b_gpu) = (a.upload(&gpu, "a")?, b.upload(&gpu, "b")?);
    let mut results = Vec::new();
    for on in [true, false] {
        gpu.set_cooperative_matmul(on)?;
        let c_gpu = gpu.upload(&vec![0.0f32; dims.c_len()], Category::Temporary, "c")?;
        let len = super::squares_len(&dims, MatmulEntry::Main);
        let squares = gpu.upload(&vec![f32::NAN; len as usize], Category::Temporary, "sq")?;
        let (a_op, b_op) = (a.operand(&a_gpu)?, b.operand(&b_gpu)?);
        super::matmul_squares(&gpu, &dims, c_gpu.whole(), a_op, b_op, squares.whole())?;
        let c: Vec<f32> = gpu.read_all(&c_gpu, DEADLINE)?;
        let sq: Vec<f32> = gpu.read_all(&squares, DEADLINE)?;
        let norm: f64 = c.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        let summed: f64 = sq.iter().map(|&x| f64::from(x)).sum();
        assert!(
            (norm - summed).abs() <= 1e-5 * norm,
            "cooperative {on}: squares sum to {summed}, C's squared norm is {norm}"
        );
        results.push(c);
    }
    let want: Vec<f64> = results[1].iter().map(|&x| f64::from(x)).collect();
    let atol = 4.0 * f64::from(f32::EPSILON) * dims.k as f64;
    assert_close("cooperative against SIMT", &results[0], &want, atol, 1e-6);
    Ok(())
}
