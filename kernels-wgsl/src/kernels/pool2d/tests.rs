//! Kernel tests of `pool2d`: forward and backward of every pooling against the CPU reference, on
//! tensors at offsets inside guarded buffers; NaN in a max window; refused shapes.

use super::{Pool, Pool2dDims, PoolWindow, reference};
use crate::testing::{DEADLINE, Guarded, assert_exact, gpu_and_rng, scratch, upload_u32_at};
use crate::{Error, Result};

/// The poolings the tests visit, over 3 planes of 7 x 6.
fn cases() -> Vec<(&'static str, Pool2dDims)> {
    let dims = |pool| Pool2dDims {
        planes: 3,
        in_size: [7, 6],
        pool,
    };
    let window = PoolWindow::square(2);
    let padded = PoolWindow {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
        dilation: [1, 1],
    };
    vec![
        ("max 2x2", dims(Pool::Max(window))),
        ("max 3x3 stride 2 pad 1", dims(Pool::Max(padded))),
        (
            "max 3x2 dilated, stride 1",
            dims(Pool::Max(PoolWindow {
                kernel: [3, 2],
                stride: [1, 1],
                padding: [1, 0],
                dilation: [2, 2],
            })),
        ),
        (
            "avg 2x2",
            dims(Pool::Avg {
                window,
                count_include_pad: true,
            }),
        ),
        (
            "avg 3x3 pad 1 counting padding",
            dims(Pool::Avg {
                window: padded,
                count_include_pad: true,
            }),
        ),
        (
            "avg 3x3 pad 1 not counting padding",
            dims(Pool::Avg {
                window: padded,
                count_include_pad: false,
            }),
        ),
        ("adaptive 1x1", dims(Pool::AdaptiveAvg { out_size: [1, 1] })),
        ("adaptive 3x4", dims(Pool::AdaptiveAvg { out_size: [3, 4] })),
        ("adaptive 9x8 (upsampling)", dims(Pool::AdaptiveAvg { out_size: [9, 8] })),
    ]
}

/// Forward (values and arg-max) and backward of each pooling against the reference, every
/// tensor at an offset of a guarded buffer.
#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(71);
    for (name, dims) in cases() {
        let max = matches!(dims.pool, Pool::Max(_));
        let x = rng.vec_f32(dims.input_len() as usize, -2.0, 2.0);
        let gy = rng.vec_f32(dims.output_len() as usize, -1.0, 1.0);
        let x_gpu = Guarded::upload(&gpu, &mut rng, &x, 3, "x")?;
        let gy_gpu = Guarded::upload(&gpu, &mut rng, &gy, 2, "gy")?;
        let (want_y, want_idx) = reference::forward(&dims, &x);
        let y = Guarded::random(&gpu, &mut rng, want_y.len(), 5, "y")?;
        let idx_buffer = upload_u32_at(&gpu, &vec![7; want_idx.len()], 4, "idx")?;
        let idx = max
            .then(|| idx_buffer.slice(4, want_idx.len() as u64))
            .transpose()?;
        super::forward(&gpu, &dims, y.slice()?, idx, x_gpu.slice()?)?;
        y.check(&gpu, &format!("{name} y"), &want_y, 1e-6, 1e-6)?;
        if max {
            let got: Vec<u32> = gpu.read(&idx_buffer, 4, want_idx.len() as u64, DEADLINE)?;
            assert_eq!(got, want_idx, "{name} arg-max");
        }
        let dx = Guarded::random(&gpu, &mut rng, x.len(), 6, "dx")?;
        super::backward(&gpu, &dims, dx.slice()?, gy_gpu.slice()?, idx)?;
        let want = reference::backward(&dims, &x, &gy);
        dx.check(&gpu, &format!("{name} dx"), &want, 1e-6, 1e-6)?;
    }
    Ok(())
}

/// A NaN in a max window wins it (as PyTorch), and its gradient goes to the NaN's position.
#[test]
fn max_pooling_propagates_nan() -> Result<()> {
    let (gpu, _) = gpu_and_rng(72);
    let dims = Pool2dDims {
        planes: 1,
        in_size: [2, 4],
        pool: Pool::Max(PoolWindow::square(2)),
    };
    let x = [1.0, f32::NAN, 3.0, 4.0, 5.0, 0.5, -1.0, 2.0];
    let x_gpu = gpu.upload(&x, crate::Category::Temporary, "x")?;
    let (y, idx) = (scratch(&gpu, 2, "y"), scratch(&gpu, 2, "idx"));
    let (ys, is) = (y.slice(0, 2)?, idx.slice(0, 2)?);
    super::forward(&gpu, &dims, ys, Some(is), x_gpu.whole())?;
    let got: Vec<f32> = gpu.read_all(&y, DEADLINE)?;
    assert!(got[0].is_nan() && got[1] == 4.0, "{got:?}");
    let at: Vec<u32> = gpu.read_all(&idx, DEADLINE)?;
    assert_eq!(at, [1, 3]);
    let gy = gpu.upload(&[10.0f32, 20.0], crate::Category::Temporary, "gy")?;
    let dx = scratch(&gpu, 8, "dx");
    super::backward(&gpu, &dims, dx.whole(), gy.whole(), Some(is))?;
    let got: Vec<f32> = gpu.read_all(&dx, DEADLINE)?;
    assert_exact("dx", &got, &[0.0, 10.0, 0.0, 20.0, 0.0, 0.0, 0.0, 0.0]);
    Ok(())
}

/// Bad shapes are refused before anything is recorded, each naming what is wrong.
#[test]
fn refuses_bad_shapes_with_the_figures() -> Result<()> {
    let (gpu, _) = gpu_and_rng(73);
    let buffer = scratch(&gpu, 1024, "pool2d");
    let dims = |pool| Pool2dDims {
        planes: 1,
        in_size: [4, 4],
        pool,
    };
    let w = PoolWindow::square(2);
    for (dims, needle) in [
        (dims(Pool::Max(PoolWindow { padding: [2, 0], ..w })), "more than half"),
        (dims(Pool::Max(PoolWindow { stride: [0, 1], ..w })), "stride [0, 1] has a 0"),
        (dims(Pool::Max(PoolWindow::square(5))), "the window spans 5 pixels"),
        (
            dims(Pool::Avg {
                window: PoolWindow { dilation: [2, 2], ..w },
                count_include_pad: true,
            }),
            "no dilation",
        ),
        (dims(Pool::AdaptiveAvg { out_size: [0, 2] }), "at least 1x1"),
    ] {
        let s = buffer.slice(0, 16)?;
        let err = super::forward(&gpu, &dims, s, Some(s), s).expect_err("must be refused");
        assert!(
            matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains(needle),
            "{needle}: {err}"
        );
    }
    // Max pooling without its arg-max slice, and an average given one.
    let (s, y) = (buffer.slice(0, 16)?, buffer.slice(16, 4)?);
    let err = super::forward(&gpu, &dims(Pool::Max(w)), y, None, s).expect_err("refused");
    assert!(err.to_string().contains("arg-max"), "{err}");
    let avg = Pool::Avg {
        window: w,
        count_include_pad: true,
    };
    let err = super::forward(&gpu, &dims(avg), y, Some(y), s).expect_err("refused");
    assert!(err.to_string().contains("arg-max"), "{err}");
    Ok(())
}
