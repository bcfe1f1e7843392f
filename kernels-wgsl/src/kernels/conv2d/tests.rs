//! Kernel tests of `conv2d`: every entry point against the CPU reference, on tensors at offsets
//! inside guarded buffers; the reference's gradients against finite differences of its forward;
//! the weight and bias sums in ranges of images; refused shapes.

use super::{Conv2dDims, ConvPath, reference};
use crate::testing::{Guarded, Rng, gpu_and_rng, numeric_gradient, scratch};
use crate::{Error, Result};

/// A small convolution of `c` to `o` channels over `h x w` images.
fn dims(batch: u64, c: u64, hw: [u64; 2], o: u64, kernel: [u64; 2]) -> Conv2dDims {
    Conv2dDims {
        batch,
        in_channels: c,
        in_size: hw,
        out_channels: o,
        kernel,
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        groups: 1,
    }
}

/// The shapes the tests visit: plain, padded, strided, dilated, grouped, depthwise, 1x1,
/// non-square, and a stride past the kernel.
fn shapes() -> Vec<(&'static str, Conv2dDims)> {
    let base = dims(2, 3, [7, 6], 4, [3, 3]);
    vec![
        ("3x3", base),
        ("padding 1", Conv2dDims { padding: [1, 1], ..base }),
        ("stride 2, padding 1", Conv2dDims { stride: [2, 2], padding: [1, 1], ..base }),
        ("dilation 2", Conv2dDims { dilation: [2, 2], padding: [2, 1], ..base }),
        (
            "groups 2",
            Conv2dDims { in_channels: 4, out_channels: 6, groups: 2, padding: [1, 1], ..base },
        ),
        (
            "depthwise",
            Conv2dDims { in_channels: 5, out_channels: 5, groups: 5, padding: [1, 1], ..base },
        ),
        ("1x1 stride 2", Conv2dDims { kernel: [1, 1], stride: [2, 2], ..base }),
        (
            "2x5 kernel, stride (1, 3)",
            Conv2dDims { kernel: [2, 5], stride: [1, 3], padding: [0, 2], ..base },
        ),
        ("stride past the kernel", Conv2dDims { kernel: [2, 2], stride: [3, 3], ..base }),
    ]
}

/// Random inputs of `dims`: x, weight, bias, and an output gradient.
fn inputs(rng: &mut Rng, dims: &Conv2dDims) -> [Vec<f32>; 4] {
    [
        rng.vec_f32(dims.input_len() as usize, -2.0, 2.0),
        rng.vec_f32(dims.weight_len() as usize, -1.0, 1.0),
        rng.vec_f32(dims.out_channels as usize, -1.0, 1.0),
        rng.vec_f32(dims.output_len() as usize, -1.0, 1.0),
    ]
}

/// Each entry point against the reference, with and without a bias, on both paths (the matmul
/// path for one group), every tensor at an odd offset of a guarded buffer (so an ignored offset
/// or a write outside the range fails).
#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(61);
    for (name, dims) in shapes() {
        let [x, w, b, gy] = inputs(&mut rng, &dims);
        let x_gpu = Guarded::upload(&gpu, &mut rng, &x, 3, "x")?;
        let w_gpu = Guarded::upload(&gpu, &mut rng, &w, 5, "weight")?;
        let b_gpu = Guarded::upload(&gpu, &mut rng, &b, 7, "bias")?;
        let gy_gpu = Guarded::upload(&gpu, &mut rng, &gy, 2, "gy")?;
        let paths: &[ConvPath] = match dims.groups {
            1 => &[ConvPath::Direct, ConvPath::Matmul],
            _ => &[ConvPath::Direct],
        };
        for &path in paths {
            let name = format!("{name} [{path:?}]");
            for bias in [true, false] {
                let y = Guarded::random(&gpu, &mut rng, dims.output_len() as usize, 9, "y")?;
                let b_slice = bias.then(|| b_gpu.slice()).transpose()?;
                let (ys, xs, ws) = (y.slice()?, x_gpu.slice()?, w_gpu.slice()?);
                match path {
                    ConvPath::Direct => super::forward_direct(&gpu, &dims, ys, xs, ws, b_slice)?,
                    ConvPath::Matmul => super::forward_matmul(&gpu, &dims, ys, xs, ws, b_slice, None)?,
                }
                let want = reference::forward(&dims, &x, &w, bias.then_some(&b[..]));
                y.check(&gpu, &format!("{name} forward, bias {bias}"), &want, 1e-5, 1e-5)?;
            }
            let dx = Guarded::random(&gpu, &mut rng, dims.input_len() as usize, 4, "dx")?;
            let (dxs, gys, ws) = (dx.slice()?, gy_gpu.slice()?, w_gpu.slice()?);
            match path {
                ConvPath::Direct => super::backward_input_direct(&gpu, &dims, dxs, gys, ws)?,
                ConvPath::Matmul => super::backward_input_matmul(&gpu, &dims, dxs, gys, ws, None)?,
            }
            let want = reference::backward_input(&dims, &gy, &w);
            dx.check(&gpu, &format!("{name} dx"), &want, 1e-5, 1e-5)?;
            let dw = Guarded::random(&gpu, &mut rng, dims.weight_len() as usize, 6, "dweight")?;
            let (dws, xs, gys) = (dw.slice()?, x_gpu.slice()?, gy_gpu.slice()?);
            match path {
                ConvPath::Direct => super::backward_weight_direct(&gpu, &dims, dws, xs, gys)?,
                ConvPath::Matmul => super::backward_weight_matmul(&gpu, &dims, dws, xs, gys, None)?,
            }
            let want = reference::backward_weight(&dims, &x, &gy);
            dw.check(&gpu, &format!("{name} dweight"), &want, 1e-5, 1e-5)?;
        }
        let db = Guarded::random(&gpu, &mut rng, dims.out_channels as usize, 1, "dbias")?;
        super::backward_bias(&gpu, &dims, db.slice()?, gy_gpu.slice()?)?;
        let want = reference::backward_bias(&dims, &gy);
        db.check(&gpu, &format!("{name} dbias"), &want, 1e-5, 1e-5)?;
        // The launchers take the matmul path for one group, the direct one for more.
        let want_path = if dims.groups == 1 { ConvPath::Matmul } else { ConvPath::Direct };
        assert_eq!(super::path(&gpu, &dims), want_path, "{name}");
    }
    Ok(())
}

/// The matmul path over chunks of images, and the direct weight and bias gradients summed one
/// image a dispatch (each range added to the last, as on lavapipe for a large batch), give the
/// results of the whole batch at once.
#[test]
fn sums_in_ranges_of_images_match_the_whole_batch() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(62);
    let dims = Conv2dDims { batch: 5, padding: [1, 1], ..dims(5, 2, [5, 4], 3, [3, 3]) };
    let [x, _, _, gy] = inputs(&mut rng, &dims);
    let x_gpu = Guarded::upload(&gpu, &mut rng, &x, 1, "x")?;
    let gy_gpu = Guarded::upload(&gpu, &mut rng, &gy, 2, "gy")?;
    // The matmul path in chunks of 1, 2 and all 5 images: the same three results.
    let w = rng.vec_f32(dims.weight_len() as usize, -1.0, 1.0);
    let w_gpu = Guarded::upload(&gpu, &mut rng, &w, 4, "weight")?;
    for images in [1, 2, 5] {
        let chunk = Some(images);
        let y = Guarded::random(&gpu, &mut rng, dims.output_len() as usize, 2, "y")?;
        let (ys, xs, ws) = (y.slice()?, x_gpu.slice()?, w_gpu.slice()?);
        super::forward_matmul(&gpu, &dims, ys, xs, ws, None, chunk)?;
        let want = reference::forward(&dims, &x, &w, None);
        y.check(&gpu, &format!("matmul y, {images} images a chunk"), &want, 1e-5, 1e-5)?;
        let dx = Guarded::random(&gpu, &mut rng, dims.input_len() as usize, 1, "dx")?;
        let (dxs, gys) = (dx.slice()?, gy_gpu.slice()?);
        super::backward_input_matmul(&gpu, &dims, dxs, gys, ws, chunk)?;
        let want = reference::backward_input(&dims, &gy, &w);
        dx.check(&gpu, &format!("matmul dx, {images} images a chunk"), &want, 1e-5, 1e-5)?;
        let dw = Guarded::random(&gpu, &mut rng, dims.weight_len() as usize, 3, "dweight")?;
        super::backward_weight_matmul(&gpu, &dims, dw.slice()?, xs, gys, chunk)?;
        let want = reference::backward_weight(&dims, &x, &gy);
        dw.check(&gpu, &format!("matmul dweight, {images} images a chunk"), &want, 1e-5, 1e-5)?;
    }
    for images in [1, 2, 5] {
        let dw = Guarded::random(&gpu, &mut rng, dims.weight_len() as usize, 3, "dweight")?;
        let (dws, xs, gys) = (dw.slice()?, x_gpu.slice()?, gy_gpu.slice()?);
        super::backward_weight_in_ranges(&gpu, &dims, dws, xs, gys, images)?;
        let want = reference::backward_weight(&dims, &x, &gy);
        dw.check(&gpu, &format!("dweight, {images} images a range"), &want, 1e-5, 1e-5)?;
        let db = Guarded::random(&gpu, &mut rng, dims.out_channels as usize, 3, "dbias")?;
        super::backward_bias_in_ranges(&gpu, &dims, db.slice()?, gy_gpu.slice()?, images)?;
        let want = reference::backward_bias(&dims, &gy);
        db.check(&gpu, &format!("dbias, {images} images a range"), &want, 1e-5, 1e-5)?;
    }
    Ok(())
}

/// The reference's three gradients are the finite differences of its forward (`loss = sum(y ·
/// r)`), on the grouped, strided and dilated shapes: the oracle the kernels are held to is
/// itself right.
#[test]
fn reference_gradients_match_finite_differences() {
    let mut rng = Rng::new(63);
    for (name, dims) in shapes() {
        let [x, w, b, r] = inputs(&mut rng, &dims);
        let loss = |x: &[f32], w: &[f32], b: &[f32]| -> f64 {
            let y = reference::forward(&dims, x, w, Some(b));
            y.iter().zip(&r).map(|(&y, &r)| f64::from(y) * f64::from(r)).sum()
        };
        let h = 1e-2;
        let checks = [
            ("dx", reference::backward_input(&dims, &r, &w), numeric_gradient(&x, h, |x| loss(x, &w, &b))),
            ("dweight", reference::backward_weight(&dims, &x, &r), numeric_gradient(&w, h, |w| loss(&x, w, &b))),
            ("dbias", reference::backward_bias(&dims, &r), numeric_gradient(&b, h, |b| loss(&x, &w, b))),
        ];
        for (what, got, want) in checks {
            crate::testing::assert_close(&format!("{name} {what}"), &got, &want, 2e-3, 2e-3);
        }
    }
}

/// Bad shapes are refused before anything is recorded, each naming what is wrong.
#[test]
fn refuses_bad_shapes_with_the_figures() -> Result<()> {
    let (gpu, _) = gpu_and_rng(64);
    let buffer = scratch(&gpu, 4096, "conv2d");
    let good = dims(1, 4, [6, 6], 4, [3, 3]);
    for (dims, needle) in [
        (Conv2dDims { groups: 3, ..good }, "3 groups must divide both in_channels 4"),
        (Conv2dDims { stride: [0, 1], ..good }, "stride height is 0"),
        (Conv2dDims { kernel: [7, 3], ..good }, "the window spans 7 pixels of height"),
        (Conv2dDims { dilation: [1, 3], ..good }, "the window spans 7 pixels of width"),
        (Conv2dDims { out_channels: 0, ..good }, "out_channels is 0"),
    ] {
        let s = buffer.slice(0, 16)?;
        let err = super::forward(&gpu, &dims, s, s, s, None).expect_err("must be refused");
        assert!(
            matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains(needle),
            "{needle}: {err}"
        );
    }
    // A good shape with a slice of the wrong length: the slice is named with its lengths.
    let s = buffer.slice(0, 10)?;
    let y = buffer.slice(0, good.output_len())?;
    let err = super::forward(&gpu, &good, y, s, s, None).expect_err("must be refused");
    assert!(err.to_string().contains("x: 10 elements given"), "{err}");
    Ok(())
}
