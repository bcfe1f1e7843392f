//! The `softmax` launchers against [`reference`](super::reference) (softmax and log-softmax,
//! forward and backward, both row layouts, the causal form), their argument and loop-limit
//! checks, and the reference itself against hand-worked values and finite differences.

use super::reference;
use super::{RowLayout, SoftmaxKind};
use crate::kernels::largest_within;
use crate::testing::{DEADLINE, assert_close, assert_loop_limit, dot, gpu_and_rng, gpu_and_temporaries, Guarded, largest_at_the_loop_limit, with_loop_limit, numeric_gradient, Rng};
use crate::{Category, Error, Gpu, Result};

// Tolerances. The GPU accumulates in f32 and lavapipe's exp/log are accurate to a few ulp; the
// reference works in f64. Softmax values are <= 1 and their row sum has at most 1000 terms
// <= 1, so the relative error stays below ~1e-5 (rtol 1e-4 leaves margin). Log-softmax has
// absolute error ~ulp(|x - max| + log(cols)) <= ~1e-6 for |x| <= 4 (atol 1e-5). The backwards
// take the reference forward's output as input and differ only in the f32 dot/sum of <= 1000
// terms of magnitude <= 1: absolute error <= ~1e-5 (atol 2e-5 where terms cancel).
const FORWARD_TOL: (f64, f64) = (1e-6, 1e-4);
const LOG_FORWARD_TOL: (f64, f64) = (1e-5, 1e-5);
const BACKWARD_TOL: (f64, f64) = (2e-5, 1e-4);

/// `tol_scale` multiplies every tolerance (1 up to 1000 columns, the rows the tolerances are
/// derived for; the f32 row sums' error grows at most linearly with the row).
fn check_case(
    gpu: &Gpu,
    rng: &mut Rng,
    layout: RowLayout,
    (rows, cols): (usize, usize),
    (x_lo, x_hi): (f32, f32),
    tol_scale: f64,
) -> Result<()> {
    let n = rows * cols;
    let (r, c) = (rows as u64, cols as u64);
    let name = |what: &str| format!("{what} {layout:?} [{rows}, {cols}] x in [{x_lo}, {x_hi})");
    let x = rng.vec_f32(n, x_lo, x_hi);
    let dy = rng.vec_f32(n, -1.0, 1.0);
    let want_y = reference::softmax(&x, rows, cols);
    let want_log_y = reference::log_softmax(&x, rows, cols);

    let x_gpu = Guarded::upload(gpu, rng, &x, 3, "x")?;
    let y_gpu = Guarded::random(gpu, rng, n, 7, "y")?;
    let log_y_gpu = Guarded::random(gpu, rng, n, 1, "log y")?;
    let (y_s, log_y_s, x_s) = (
        y_gpu.slice()?,
        log_y_gpu.slice()?,
        x_gpu.slice()?,
    );
    super::forward_in(gpu, layout, SoftmaxKind::Softmax, y_s, x_s, r, c)?;
    super::forward_in(gpu, layout, SoftmaxKind::LogSoftmax, log_y_s, x_s, r, c)?;

    // Backwards from the reference forward outputs, so they are checked on their own.
    let dy_gpu = Guarded::upload(gpu, rng, &dy, 2, "dy")?;
    let saved_y = Guarded::upload(gpu, rng, &want_y, 4, "saved y")?;
    let saved_log_y = Guarded::upload(gpu, rng, &want_log_y, 6, "saved log y")?;
    let dx_gpu = Guarded::random(gpu, rng, n, 9, "dx")?;
    let log_dx_gpu = Guarded::random(gpu, rng, n, 11, "log dx")?;
    let (dx_s, y_s, dy_s) = (
        dx_gpu.slice()?,
        saved_y.slice()?,
        dy_gpu.slice()?,
    );
    super::backward_in(gpu, layout, SoftmaxKind::Softmax, [dx_s, y_s, dy_s], r, c)?;
    let (log_dx_s, log_y_s) = (log_dx_gpu.slice()?, saved_log_y.slice()?);
    let log_slices = [log_dx_s, log_y_s, dy_s];
    super::backward_in(gpu, layout, SoftmaxKind::LogSoftmax, log_slices, r, c)?;

    let scaled = |(atol, rtol): (f64, f64)| (atol * tol_scale, rtol * tol_scale);
    let (atol, rtol) = scaled(FORWARD_TOL);
    y_gpu
        .check(gpu, &name("softmax"), &want_y, atol, rtol)?;
    let (atol, rtol) = scaled(LOG_FORWARD_TOL);
    log_y_gpu
        .check(gpu, &name("log_softmax"), &want_log_y, atol, rtol)?;
    let (atol, rtol) = scaled(BACKWARD_TOL);
    let want_dx = reference::softmax_backward(&want_y, &dy, rows, cols);
    dx_gpu
        .check(gpu, &name("softmax_backward"), &want_dx, atol, rtol)?;
    let want_log_dx = reference::log_softmax_backward(&want_log_y, &dy, rows, cols);
    log_dx_gpu
        .check(gpu, &name("log_softmax_backward"), &want_log_dx, atol, rtol)?;
    // Inputs are read only.
    x_gpu
        .check(gpu, &name("x unchanged"), &x, 0.0, 0.0)?;
    dy_gpu
        .check(gpu, &name("dy unchanged"), &dy, 0.0, 0.0)?;
    Ok(())
}

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(41);
    for layout in RowLayout::available(&gpu) {
        for rows in [1usize, 3, 37, 129] {
            for cols in [1usize, 10, 33, 257, 1000] {
                check_case(&gpu, &mut rng, layout, (rows, cols), (-4.0, 4.0), 1.0)?;
            }
        }
        // Stability: exp(90) overflows f32 unless the row max is subtracted first.
        check_case(&gpu, &mut rng, layout, (3, 257), (50.0, 90.0), 1.0)?;
    }
    // The launchers' choice (measured on lavapipe): on a CPU adapter a subgroup per row for
    // rows of 256 columns or more where it has subgroups, else an invocation per row; on a GPU
    // few long rows get a workgroup each, and many rows a subgroup each where the device has
    // subgroups.
    let cpu = gpu.adapter().device_type == wgpu::DeviceType::Cpu;
    let subgroups = crate::kernels::subgroup_rows(&gpu).is_some();
    let sub_or = |other| if subgroups { RowLayout::SubgroupPerRow } else { other };
    let few_long = match cpu {
        true => sub_or(RowLayout::InvocationPerRow),
        false => RowLayout::WorkgroupPerRow,
    };
    assert_eq!(super::row_layout(&gpu, 8, 4096), few_long);
    assert_eq!(
        super::row_layout(&gpu, 8, 10),
        RowLayout::InvocationPerRow
    );
    assert_eq!(
        super::row_layout(&gpu, 4096, 4096),
        sub_or(RowLayout::InvocationPerRow)
    );
    let short = match cpu {
        true => RowLayout::InvocationPerRow,
        false => sub_or(RowLayout::InvocationPerRow),
    };
    assert_eq!(super::row_layout(&gpu, 4096, 64), short);
    Ok(())
}

#[test]
fn softmax_rejects_bad_ranges() -> Result<()> {
    let (gpu, [x, y]) = gpu_and_temporaries([(100, "x"), (100, "y")])?;
    // [10, 10] from offset 1 needs elements 1..101 of a 100-element buffer: no such slice ...
    let err = x.slice(1, 100).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the launchers refuse a slice of 99.
    let x99 = x.slice(1, 99)?;
    let err = super::forward(&gpu, SoftmaxKind::Softmax, y.whole(), x99, 10, 10).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::forward(
        &gpu,
        SoftmaxKind::Softmax,
        y.slice(0, 99)?,
        x99,
        10,
        10,
    ).expect_err("must be refused");
    assert!(err.to_string().contains("x: 99 elements given"), "{err}");
    // dx at offset 50 of x: elements 50..150.
    let err = x.slice(50, 100).expect_err("must be refused");
    assert!(err.to_string().contains("elements 50..150"), "{err}");
    let dx = x.slice(50, 50)?;
    let err = super::backward(
        &gpu,
        SoftmaxKind::LogSoftmax,
        dx,
        y.whole(),
        x.whole(),
        10,
        10,
    ).expect_err("must be refused");
    // (Named as the launcher's length check does: by the first slice that differs from dx.)
    assert!(err.to_string().contains("50 needed"), "{err}");
    let err = super::backward(&gpu, SoftmaxKind::Softmax, x.whole(), y.whole(), dx, 10, 10).expect_err("must be refused");
    assert!(err.to_string().contains("dy: 50 elements given"), "{err}");
    let (x50, y50) = (x.slice(0, 50)?, y.slice(0, 50)?);
    let err = super::backward(&gpu, SoftmaxKind::Softmax, dx, y50, x50, 10, 10).expect_err("must be refused");
    assert!(err.to_string().contains("y: 50 elements given"), "{err}");
    let err = super::forward(
        &gpu,
        SoftmaxKind::Softmax,
        y.whole(),
        x.whole(),
        u64::MAX,
        2,
    ).expect_err("must be refused");
    assert!(
        matches!(err, Error::InvalidArgument { .. })
            && err.to_string().contains("has more than u64::MAX elements"),
        "{err}"
    );
    // Empty work records nothing and succeeds.
    let (x_end, y_end) = (x.slice(100, 0)?, y.slice(100, 0)?);
    super::forward(&gpu, SoftmaxKind::Softmax, y_end, x_end, 0, 7)?;
    super::backward(&gpu, SoftmaxKind::Softmax, x_end, y_end, x_end, 5, 0)?;
    Ok(())
}

// Loop limit ("Loop limit on lavapipe" in kernels/mod.rs): checked before the ranges, so
// one-element buffers show the refusal without allocating a row over the limit.
#[test]
fn softmax_refuses_rows_over_the_loop_limit() -> Result<()> {
    with_loop_limit("softmax_refuses_rows_over_the_loop_limit", |gpu, limit, tiny| {
        let t = tiny.whole();
        let mut layouts: Vec<(RowLayout, crate::testing::Passes)> = vec![
            (RowLayout::InvocationPerRow, Box::new(super::loop_iterations)),
            (RowLayout::WorkgroupPerRow, Box::new(super::loop_iterations_rows)),
        ];
        // A subgroup per row loops over a subgroup's share of the columns.
        if let Some((lanes, _)) = crate::kernels::subgroup_rows(gpu) {
            let lanes = u64::from(lanes);
            layouts.push((
                RowLayout::SubgroupPerRow,
                Box::new(move |c| super::loop_iterations_subgroup(c, lanes)),
            ));
        }
        for (layout, passes) in layouts {
            let largest = largest_within(limit, passes);
            let over = largest + 1;
            for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
                assert_loop_limit(
                    super::forward_in(gpu, layout, kind, t, t, 3, over),
                    "cols",
                    largest,
                );
                assert_loop_limit(
                    super::backward_in(gpu, layout, kind, [t, t, t], 1, over),
                    "cols",
                    largest,
                );
            }
        }
        Ok(())
    })
}

#[test]
fn softmax_at_the_loop_limit_matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(43);
    let cols = largest_at_the_loop_limit(&gpu, super::loop_iterations) as usize;
    // Measured: log_softmax off by 1.7e-4 at 262_071 columns (f32 sum); a truncated row would be
    // off by O(1).
    let layout = RowLayout::InvocationPerRow;
    check_case(
        &gpu,
        &mut rng,
        layout,
        (2, cols),
        (-4.0, 4.0),
        cols as f64 / 1000.0,
    )?;
    // A subgroup per row at its own limit (each lane loops over a subgroup's share of the row).
    if let Some((lanes, _)) = crate::kernels::subgroup_rows(&gpu) {
        let lanes = u64::from(lanes);
        let cols =
            largest_at_the_loop_limit(&gpu, |c| super::loop_iterations_subgroup(c, lanes)) as usize;
        let layout = RowLayout::SubgroupPerRow;
        check_case(&gpu, &mut rng, layout, (2, cols), (-4.0, 4.0), cols as f64 / 1000.0)?;
    }
    // A masked row (leading -inf, as a causal mask gives) through the online max/sum recurrence.
    let mut x = rng.vec_f32(21, -4.0, 4.0);
    x[..10].fill(f32::NEG_INFINITY);
    let x_gpu = Guarded::upload(&gpu, &mut rng, &x, 2, "x")?;
    for layout in RowLayout::available(&gpu) {
        let y_gpu = Guarded::random(&gpu, &mut rng, x.len(), 3, "y")?;
        let (y_s, x_s) = (y_gpu.slice()?, x_gpu.slice()?);
        super::forward_in(&gpu, layout, SoftmaxKind::Softmax, y_s, x_s, 1, 21)?;
        let want = reference::softmax(&x, 1, 21);
        let (atol, rtol) = FORWARD_TOL;
        y_gpu
            .check(
                &gpu,
                &format!("softmax of a masked row {layout:?}"),
                &want,
                atol,
                rtol,
            )?;
    }
    Ok(())
}

/// `forward_causal` against the unfused oracle: scores plus a `-1e9` mask above each block's
/// diagonal (what the GPT added before), then `forward`; bit for bit, in both layouts, for
/// `T` below, at and past the 8-column unroll (and 64, the GPT's context), two batches of rows.
/// The masked outputs are exactly 0.
#[test]
fn causal_softmax_equals_mask_then_softmax() -> Result<()> {
    use crate::kernels::binary::{self, BinaryDims, BinaryOp};
    let (gpu, mut rng) = gpu_and_rng(0xca5a);
    for t in [1usize, 5, 8, 13, 64] {
        let rows = 2 * t;
        let x = rng.vec_f32(rows * t, -4.0, 4.0);
        let mask: Vec<f32> = (0..t * t)
            .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
            .collect();
        let x_gpu = gpu.upload(&x, Category::Activation, "x")?;
        let mask_gpu = gpu.upload(&mask, Category::Activation, "mask")?;
        let masked = gpu
            .alloc_elements((rows * t) as u64, Category::Activation, "xm")?;
        let add = BinaryDims {
            op: BinaryOp::Add,
            a_shape: &[2, t, t],
            b_shape: &[t, t],
        };
        binary::broadcast(&gpu, &add, masked.whole(), x_gpu.whole(), mask_gpu.whole())?;
        for layout in RowLayout::available(&gpu) {
            let (r, c) = (rows as u64, t as u64);
            let fused = gpu
                .alloc_elements(r * c, Category::Activation, "y")?;
            let plain = gpu
                .alloc_elements(r * c, Category::Activation, "y")?;
            super::forward_causal_in(&gpu, layout, fused.whole(), x_gpu.whole(), r, c)?;
            let kind = SoftmaxKind::Softmax;
            super::forward_in(&gpu, layout, kind, plain.whole(), masked.whole(), r, c)?;
            let got: Vec<f32> = gpu
                .read_all(&fused, DEADLINE)?;
            let want: Vec<f32> = gpu
                .read_all(&plain, DEADLINE)?;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits(),
                    "T {t} {layout:?}: element {i} is {g} fused, {w} masked"
                );
                if i % t > (i / t) % t {
                    assert_eq!(*g, 0.0, "T {t} {layout:?}: masked element {i}");
                }
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------- reference

#[test]
fn softmax_hand_worked_and_identities() {
    // softmax([1,2,3]) = e^(j-3) / (e^-2 + e^-1 + 1) = [0.09003057, 0.24472847, 0.66524096]
    let y = reference::softmax(&[1.0, 2.0, 3.0], 1, 3);
    assert_close(
        "softmax [1,2,3]",
        &y,
        &[0.090_030_57, 0.244_728_47, 0.665_240_96],
        1e-7,
        1e-6,
    );
    // shift invariance, and no overflow at 1000
    let y_big = reference::softmax(&[1001.0, 1002.0, 1003.0], 1, 3);
    assert_close("softmax shifted", &y_big, &y, 1e-7, 1e-6);
    // log_softmax = log(softmax), rows sum to 1
    let mut rng = Rng::new(0x5eed_0002);
    let (rows, cols) = (3, 7);
    let x = rng.vec_f32(rows * cols, -4.0, 4.0);
    let s = reference::softmax(&x, rows, cols);
    let ls = reference::log_softmax(&x, rows, cols);
    let log_s: Vec<f32> = s.iter().map(|v| v.ln()).collect();
    assert_close("log_softmax = ln softmax", &ls, &log_s, 1e-6, 1e-5);
    for row in s.chunks(cols) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}

#[test]
fn softmax_backwards_match_finite_differences() {
    let mut rng = Rng::new(0x5eed_0003);
    let (rows, cols) = (3, 5);
    let x = rng.vec_f32(rows * cols, -2.0, 2.0);
    let w = rng.vec_f32(rows * cols, -1.0, 1.0);
    let y = reference::softmax(&x, rows, cols);
    let analytic = reference::softmax_backward(&y, &w, rows, cols);
    let numeric = numeric_gradient(&x, 1e-3, |x| dot(&w, &reference::softmax(x, rows, cols)));
    assert_close("softmax backward", &analytic, &numeric, 1e-3, 1e-3);
    let ly = reference::log_softmax(&x, rows, cols);
    let analytic = reference::log_softmax_backward(&ly, &w, rows, cols);
    let numeric = numeric_gradient(&x, 1e-3, |x| dot(&w, &reference::log_softmax(x, rows, cols)));
    assert_close("log_softmax backward", &analytic, &numeric, 1e-3, 1e-3);
}
