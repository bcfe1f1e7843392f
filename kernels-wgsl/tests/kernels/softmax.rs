use plimsoll_kernels_wgsl::kernels::largest_within;
use plimsoll_kernels_wgsl::kernels::softmax::{self, RowLayout, SoftmaxKind};
use plimsoll_kernels_wgsl::testing::{Guarded, Rng, assert_loop_limit, gpu, loop_limit_or_skip};
use plimsoll_kernels_wgsl::{Category, Error, Gpu, reference};

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
) {
    let n = rows * cols;
    let (r, c) = (rows as u64, cols as u64);
    let name = |what: &str| format!("{what} {layout:?} [{rows}, {cols}] x in [{x_lo}, {x_hi})");
    let x = rng.vec_f32(n, x_lo, x_hi);
    let dy = rng.vec_f32(n, -1.0, 1.0);
    let want_y = reference::softmax::softmax(&x, rows, cols);
    let want_log_y = reference::softmax::log_softmax(&x, rows, cols);

    let x_gpu = Guarded::upload(gpu, rng, &x, 3, "x").unwrap();
    let y_gpu = Guarded::random(gpu, rng, n, 7, "y").unwrap();
    let log_y_gpu = Guarded::random(gpu, rng, n, 1, "log y").unwrap();
    let (y_s, log_y_s, x_s) = (
        y_gpu.slice().unwrap(),
        log_y_gpu.slice().unwrap(),
        x_gpu.slice().unwrap(),
    );
    softmax::forward_in(gpu, layout, SoftmaxKind::Softmax, y_s, x_s, r, c).unwrap();
    softmax::forward_in(gpu, layout, SoftmaxKind::LogSoftmax, log_y_s, x_s, r, c).unwrap();

    // Backwards from the reference forward outputs, so they are checked on their own.
    let dy_gpu = Guarded::upload(gpu, rng, &dy, 2, "dy").unwrap();
    let saved_y = Guarded::upload(gpu, rng, &want_y, 4, "saved y").unwrap();
    let saved_log_y = Guarded::upload(gpu, rng, &want_log_y, 6, "saved log y").unwrap();
    let dx_gpu = Guarded::random(gpu, rng, n, 9, "dx").unwrap();
    let log_dx_gpu = Guarded::random(gpu, rng, n, 11, "log dx").unwrap();
    let (dx_s, y_s, dy_s) = (
        dx_gpu.slice().unwrap(),
        saved_y.slice().unwrap(),
        dy_gpu.slice().unwrap(),
    );
    softmax::backward_in(gpu, layout, SoftmaxKind::Softmax, [dx_s, y_s, dy_s], r, c).unwrap();
    let (log_dx_s, log_y_s) = (log_dx_gpu.slice().unwrap(), saved_log_y.slice().unwrap());
    let log_slices = [log_dx_s, log_y_s, dy_s];
    softmax::backward_in(gpu, layout, SoftmaxKind::LogSoftmax, log_slices, r, c).unwrap();

    let scaled = |(atol, rtol): (f64, f64)| (atol * tol_scale, rtol * tol_scale);
    let (atol, rtol) = scaled(FORWARD_TOL);
    y_gpu
        .check(gpu, &name("softmax"), &want_y, atol, rtol)
        .unwrap();
    let (atol, rtol) = scaled(LOG_FORWARD_TOL);
    log_y_gpu
        .check(gpu, &name("log_softmax"), &want_log_y, atol, rtol)
        .unwrap();
    let (atol, rtol) = scaled(BACKWARD_TOL);
    let want_dx = reference::softmax::softmax_backward(&want_y, &dy, rows, cols);
    dx_gpu
        .check(gpu, &name("softmax_backward"), &want_dx, atol, rtol)
        .unwrap();
    let want_log_dx = reference::softmax::log_softmax_backward(&want_log_y, &dy, rows, cols);
    log_dx_gpu
        .check(gpu, &name("log_softmax_backward"), &want_log_dx, atol, rtol)
        .unwrap();
    // Inputs are read only.
    x_gpu
        .check(gpu, &name("x unchanged"), &x, 0.0, 0.0)
        .unwrap();
    dy_gpu
        .check(gpu, &name("dy unchanged"), &dy, 0.0, 0.0)
        .unwrap();
}

#[test]
fn softmax_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(41);
    for layout in [RowLayout::InvocationPerRow, RowLayout::WorkgroupPerRow] {
        for rows in [1usize, 3, 37, 129] {
            for cols in [1usize, 10, 33, 257, 1000] {
                check_case(&gpu, &mut rng, layout, (rows, cols), (-4.0, 4.0), 1.0);
            }
        }
        // Stability: exp(90) overflows f32 unless the row max is subtracted first.
        check_case(&gpu, &mut rng, layout, (3, 257), (50.0, 90.0), 1.0);
    }
    // The launchers' choice: an invocation per row on a CPU adapter (measured faster there);
    // on a GPU few long rows get a workgroup each.
    let cpu = gpu.adapter().device_type == wgpu::DeviceType::Cpu;
    let few_long = softmax::row_layout(&gpu, 8, 4096);
    assert_eq!(few_long == RowLayout::WorkgroupPerRow, !cpu);
    assert_eq!(
        softmax::row_layout(&gpu, 8, 10),
        RowLayout::InvocationPerRow
    );
    assert_eq!(
        softmax::row_layout(&gpu, 4096, 4096),
        RowLayout::InvocationPerRow
    );
}

#[test]
fn softmax_rejects_bad_ranges() {
    let gpu = gpu();
    let x = gpu.alloc_elements(100, Category::Temporary, "x").unwrap();
    let y = gpu.alloc_elements(100, Category::Temporary, "y").unwrap();
    // [10, 10] from offset 1 needs elements 1..101 of a 100-element buffer: no such slice ...
    let err = x.slice(1, 100).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the launchers refuse a slice of 99.
    let x99 = x.slice(1, 99).unwrap();
    let err = softmax::forward(&gpu, SoftmaxKind::Softmax, y.whole(), x99, 10, 10).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = softmax::forward(
        &gpu,
        SoftmaxKind::Softmax,
        y.slice(0, 99).unwrap(),
        x99,
        10,
        10,
    )
    .unwrap_err();
    assert!(err.to_string().contains("x: 99 elements given"), "{err}");
    // dx at offset 50 of x: elements 50..150.
    let err = x.slice(50, 100).unwrap_err();
    assert!(err.to_string().contains("elements 50..150"), "{err}");
    let dx = x.slice(50, 50).unwrap();
    let err = softmax::backward(
        &gpu,
        SoftmaxKind::LogSoftmax,
        dx,
        y.whole(),
        x.whole(),
        10,
        10,
    )
    .unwrap_err();
    // (Named as the launcher's length check does: by the first slice that differs from dx.)
    assert!(err.to_string().contains("50 needed"), "{err}");
    let err = softmax::backward(&gpu, SoftmaxKind::Softmax, x.whole(), y.whole(), dx, 10, 10)
        .unwrap_err();
    assert!(err.to_string().contains("dy: 50 elements given"), "{err}");
    let (x50, y50) = (x.slice(0, 50).unwrap(), y.slice(0, 50).unwrap());
    let err = softmax::backward(&gpu, SoftmaxKind::Softmax, dx, y50, x50, 10, 10).unwrap_err();
    assert!(err.to_string().contains("y: 50 elements given"), "{err}");
    let err = softmax::forward(
        &gpu,
        SoftmaxKind::Softmax,
        y.whole(),
        x.whole(),
        u64::MAX,
        2,
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. })
            && err.to_string().contains("has more than u64::MAX elements"),
        "{err}"
    );
    // Empty work records nothing and succeeds.
    let (x_end, y_end) = (x.slice(100, 0).unwrap(), y.slice(100, 0).unwrap());
    softmax::forward(&gpu, SoftmaxKind::Softmax, y_end, x_end, 0, 7).unwrap();
    softmax::backward(&gpu, SoftmaxKind::Softmax, x_end, y_end, x_end, 5, 0).unwrap();
}

// Loop limit ("Loop limit on lavapipe" in kernels/mod.rs): checked before the ranges, so
// one-element buffers show the refusal without allocating a row over the limit.
#[test]
fn softmax_refuses_rows_over_the_loop_limit() {
    let gpu = gpu();
    let Some(limit) = loop_limit_or_skip(&gpu, "softmax_refuses_rows_over_the_loop_limit") else {
        return;
    };
    let t = gpu.alloc_elements(1, Category::Temporary, "tiny").unwrap();
    let t = t.whole();
    for (layout, passes) in [
        (
            RowLayout::InvocationPerRow,
            softmax::loop_iterations as fn(u64) -> u64,
        ),
        (RowLayout::WorkgroupPerRow, softmax::loop_iterations_rows),
    ] {
        let largest = largest_within(limit, passes);
        let over = largest + 1;
        for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
            assert_loop_limit(
                softmax::forward_in(&gpu, layout, kind, t, t, 3, over),
                "cols",
                largest,
            );
            assert_loop_limit(
                softmax::backward_in(&gpu, layout, kind, [t, t, t], 1, over),
                "cols",
                largest,
            );
        }
    }
}

#[test]
fn softmax_at_the_loop_limit_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(43);
    let limit = gpu.loop_iteration_limit().unwrap_or(65_535);
    let cols = largest_within(limit, softmax::loop_iterations) as usize;
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
    );
    // A masked row (leading -inf, as a causal mask gives) through the online max/sum recurrence.
    let mut x = rng.vec_f32(21, -4.0, 4.0);
    x[..10].fill(f32::NEG_INFINITY);
    let x_gpu = Guarded::upload(&gpu, &mut rng, &x, 2, "x").unwrap();
    for layout in [RowLayout::InvocationPerRow, RowLayout::WorkgroupPerRow] {
        let y_gpu = Guarded::random(&gpu, &mut rng, x.len(), 3, "y").unwrap();
        let (y_s, x_s) = (y_gpu.slice().unwrap(), x_gpu.slice().unwrap());
        softmax::forward_in(&gpu, layout, SoftmaxKind::Softmax, y_s, x_s, 1, 21).unwrap();
        let want = reference::softmax::softmax(&x, 1, 21);
        let (atol, rtol) = FORWARD_TOL;
        y_gpu
            .check(
                &gpu,
                &format!("softmax of a masked row {layout:?}"),
                &want,
                atol,
                rtol,
            )
            .unwrap();
    }
}

/// `forward_causal` against the unfused oracle: scores plus a `-1e9` mask above each block's
/// diagonal (what the GPT added before), then `forward`; bit for bit, in both layouts, for
/// `T` below, at and past the 8-column unroll (and 64, the GPT's context), two batches of rows.
/// The masked outputs are exactly 0.
#[test]
fn causal_softmax_equals_mask_then_softmax() {
    use plimsoll_kernels_wgsl::kernels::binary::{self, BinaryDims, BinaryOp};
    let gpu = gpu();
    let mut rng = Rng::new(0xca5a);
    for t in [1usize, 5, 8, 13, 64] {
        let rows = 2 * t;
        let x = rng.vec_f32(rows * t, -4.0, 4.0);
        let mask: Vec<f32> = (0..t * t)
            .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
            .collect();
        let x_gpu = gpu.upload(&x, Category::Activation, "x").unwrap();
        let mask_gpu = gpu.upload(&mask, Category::Activation, "mask").unwrap();
        let masked = gpu
            .alloc_elements((rows * t) as u64, Category::Activation, "xm")
            .unwrap();
        let add = BinaryDims {
            op: BinaryOp::Add,
            a_shape: &[2, t, t],
            b_shape: &[t, t],
        };
        binary::broadcast(&gpu, &add, masked.whole(), x_gpu.whole(), mask_gpu.whole()).unwrap();
        for layout in [RowLayout::InvocationPerRow, RowLayout::WorkgroupPerRow] {
            let (r, c) = (rows as u64, t as u64);
            let fused = gpu
                .alloc_elements(r * c, Category::Activation, "y")
                .unwrap();
            let plain = gpu
                .alloc_elements(r * c, Category::Activation, "y")
                .unwrap();
            softmax::forward_causal_in(&gpu, layout, fused.whole(), x_gpu.whole(), r, c).unwrap();
            let kind = SoftmaxKind::Softmax;
            softmax::forward_in(&gpu, layout, kind, plain.whole(), masked.whole(), r, c).unwrap();
            let got: Vec<f32> = gpu
                .read_all(&fused, plimsoll_kernels_wgsl::testing::DEADLINE)
                .unwrap();
            let want: Vec<f32> = gpu
                .read_all(&plain, plimsoll_kernels_wgsl::testing::DEADLINE)
                .unwrap();
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
}
