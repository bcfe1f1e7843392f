use plimsoll_kernels_wgsl::kernels::cross_entropy::{self, CrossEntropyDims};
use plimsoll_kernels_wgsl::kernels::{RowLayout, largest_within};
use plimsoll_kernels_wgsl::testing::{
    Guarded, Rng, assert_loop_limit, gpu, loop_limit_or_skip, scratch, upload_u32_at,
};
use plimsoll_kernels_wgsl::{Category, Error, Gpu, reference};

// Tolerances. Loss: lse and the row mean are f32 sums of <= 1000 terms on the GPU (f64 in the
// reference) of magnitude <= ~8, so the absolute error of a loss of size ~log(cols) + 8 stays
// near 1e-6 (atol 1e-5, rtol 1e-5). Gradient: softmax_j - q_j with exp(x - lse) accurate to a
// few ulp once lse is (abs error ~1e-6), i.e. relative ~2e-6 of p_j <= 1, times g*scale <= 2:
// atol 4e-6, rtol 1e-4.
const LOSS_TOL: (f64, f64) = (1e-5, 1e-5);
const GRAD_TOL: (f64, f64) = (4e-6, 1e-4);

/// What the backward's `dloss` holds (the launcher tells them apart by its length).
#[derive(Clone, Copy, Debug)]
enum LossGradient {
    /// One value: the gradient of a reduced loss, for every row.
    Broadcast,
    /// `rows` values: one per row loss.
    PerRow,
}

struct Case {
    layout: RowLayout,
    rows: usize,
    cols: usize,
    smoothing: f32,
    dloss: LossGradient,
}

fn check_case(gpu: &Gpu, rng: &mut Rng, case: &Case) {
    let Case {
        layout,
        rows,
        cols,
        smoothing,
        dloss,
    } = *case;
    let name = |what: &str| format!("{what} {layout:?} [{rows}, {cols}] eps {smoothing} {dloss:?}");
    let logits = rng.vec_f32(rows * cols, -4.0, 4.0);
    let mut targets: Vec<u32> = (0..rows).map(|_| rng.below(cols as u64) as u32).collect();
    if rows == 37 {
        targets[5] = cols as u32; // invalid: that row's loss and gradient are NaN, no OOB read
    }
    // Mean reduction (scale 1/rows) of the broadcast gradient of the reduced loss; a per-row
    // gradient with scale 1 (sum / none).
    let (dloss_values, scale) = match dloss {
        LossGradient::Broadcast => (vec![rng.f32_in(0.5, 2.0)], 1.0 / rows as f32),
        LossGradient::PerRow => (rng.vec_f32(rows, -2.0, 2.0), 1.0),
    };

    let logits_gpu = Guarded::upload(gpu, rng, &logits, 3, "logits").unwrap();
    let targets_gpu = upload_u32_at(gpu, &targets, 5, "targets").unwrap();
    let losses_gpu = Guarded::random(gpu, rng, rows, 2, "losses").unwrap();
    let dloss_gpu = Guarded::upload(gpu, rng, &dloss_values, 1, "dloss").unwrap();
    let dlogits_gpu = Guarded::random(gpu, rng, rows * cols, 6, "dlogits").unwrap();
    let dims = CrossEntropyDims {
        rows: rows as u64,
        cols: cols as u64,
        smoothing,
    };
    let targets_s = targets_gpu.slice(5, rows as u64).unwrap();
    let logits_s = logits_gpu.slice().unwrap();
    let losses_s = losses_gpu.slice().unwrap();
    cross_entropy::forward_in(gpu, layout, &dims, losses_s, [logits_s, targets_s]).unwrap();
    let (dlogits_s, dloss_s) = (dlogits_gpu.slice().unwrap(), dloss_gpu.slice().unwrap());
    let inputs = [logits_s, targets_s, dloss_s];
    cross_entropy::backward_in(gpu, layout, &dims, dlogits_s, inputs, scale).unwrap();

    let want = reference::cross_entropy::forward(&logits, &targets, rows, cols, smoothing);
    let (atol, rtol) = LOSS_TOL;
    losses_gpu
        .check(gpu, &name("cross_entropy forward"), &want, atol, rtol)
        .unwrap();
    let want = reference::cross_entropy::backward(
        &logits,
        &targets,
        rows,
        cols,
        smoothing,
        &dloss_values,
        scale,
    );
    let (atol, rtol) = GRAD_TOL;
    dlogits_gpu
        .check(gpu, &name("cross_entropy backward"), &want, atol, rtol)
        .unwrap();
}

#[test]
fn cross_entropy_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(51);
    let layouts = [RowLayout::InvocationPerRow, RowLayout::WorkgroupPerRow];
    let gradients = [(0.0, LossGradient::Broadcast), (0.1, LossGradient::PerRow)];
    for layout in layouts {
        for rows in [1usize, 3, 37, 129] {
            for cols in [1usize, 10, 33, 257, 1000] {
                for (smoothing, dloss) in gradients {
                    let case = Case {
                        layout,
                        rows,
                        cols,
                        smoothing,
                        dloss,
                    };
                    check_case(&gpu, &mut rng, &case);
                }
            }
        }
    }
}

#[test]
fn cross_entropy_rejects_bad_arguments() {
    let gpu = gpu();
    let logits = scratch(&gpu, 100, "logits");
    let targets = upload_u32_at(&gpu, &[0; 10], 0, "targets").unwrap();
    let losses = scratch(&gpu, 10, "losses");
    let dims = |rows, cols, smoothing| CrossEntropyDims {
        rows,
        cols,
        smoothing,
    };
    let (lg, tg, ls) = (logits.whole(), targets.whole(), losses.whole());
    cross_entropy::forward(&gpu, &dims(10, 10, 0.0), ls, lg, tg).unwrap();
    // Zero classes, smoothing outside [0, 1], and each range one element too far.
    let err = cross_entropy::forward(&gpu, &dims(10, 0, 0.0), ls, lg, tg).unwrap_err();
    assert!(err.to_string().contains("0 classes"), "{err}");
    for smoothing in [1.5, f32::NAN] {
        let err = cross_entropy::forward(&gpu, &dims(10, 10, smoothing), ls, lg, tg).unwrap_err();
        let want = format!("label smoothing {smoothing} outside [0, 1]");
        assert!(
            matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains(&want),
            "{err}"
        );
    }
    // Targets from offset 1: elements 1..11 of a 10-element buffer cannot be sliced, and the
    // launcher refuses the 9 that can.
    let err = targets.slice(1, 10).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("elements 1..11"), "{err}");
    let t9 = targets.slice(1, 9).unwrap();
    let err = cross_entropy::forward(&gpu, &dims(10, 10, 0.0), ls, lg, t9).unwrap_err();
    assert!(
        err.to_string().contains("targets: 9 elements given"),
        "{err}"
    );
    // Likewise losses and logits.
    let err = losses.slice(1, 10).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("elements 1..11"),
        "{err}"
    );
    let l9 = losses.slice(1, 9).unwrap();
    let err = cross_entropy::forward(&gpu, &dims(10, 10, 0.0), l9, lg, tg).unwrap_err();
    assert!(
        err.to_string().contains("losses: 9 elements given"),
        "{err}"
    );
    let lg99 = logits.slice(1, 99).unwrap();
    let err = cross_entropy::forward(&gpu, &dims(10, 10, 0.0), ls, lg99, tg).unwrap_err();
    assert!(
        err.to_string().contains("logits: 99 elements given"),
        "{err}"
    );
    // A per-row dloss needs 10 elements from offset 1 of a 10-element buffer (no such slice; the
    // 9 that fit are neither 1 nor rows); a broadcast one needs 1.
    let err = cross_entropy::backward(&gpu, &dims(10, 10, 0.0), lg, lg, tg, l9, 1.0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("dloss"), "{err}");
    let d1 = losses.slice(1, 1).unwrap();
    cross_entropy::backward(&gpu, &dims(10, 10, 0.0), lg, lg, tg, d1, 0.1).unwrap();
    // dlogits of the wrong length.
    let err = cross_entropy::backward(&gpu, &dims(10, 10, 0.0), lg99, lg, tg, d1, 0.1).unwrap_err();
    assert!(
        err.to_string().contains("dlogits: 99 elements given"),
        "{err}"
    );
}

// Loop limit: checked before the slice lengths, so one-element buffers show the refusal.
#[test]
fn cross_entropy_refuses_rows_over_the_loop_limit() {
    let gpu = gpu();
    let Some(limit) = loop_limit_or_skip(&gpu, "cross_entropy_refuses_rows_over_the_loop_limit")
    else {
        return;
    };
    let largest = largest_within(limit, cross_entropy::loop_iterations);
    let t = gpu.alloc_elements(1, Category::Temporary, "tiny").unwrap();
    let t = t.whole();
    let over = largest + 1;
    let dims = CrossEntropyDims {
        rows: 1,
        cols: over,
        smoothing: 0.0,
    };
    assert_loop_limit(
        cross_entropy::forward(&gpu, &dims, t, t, t),
        "cols",
        largest,
    );
    let dims = CrossEntropyDims {
        rows: 2,
        cols: over,
        smoothing: 0.1,
    };
    let result = cross_entropy::backward(&gpu, &dims, t, t, t, t, 1.0);
    assert_loop_limit(result, "cols", largest);
}

#[test]
fn cross_entropy_at_the_loop_limit_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(53);
    let limit = gpu.loop_iteration_limit().unwrap_or(65_535);
    let cols = largest_within(limit, cross_entropy::loop_iterations) as usize;
    let case = Case {
        layout: RowLayout::InvocationPerRow,
        rows: 2,
        cols,
        smoothing: 0.1,
        dloss: LossGradient::PerRow,
    };
    check_case(&gpu, &mut rng, &case);
}
