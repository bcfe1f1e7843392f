use plimsoll_kernels_wgsl::kernels::cross_entropy::{
    self, CrossEntropyBackwardBuffers, CrossEntropyForwardBuffers, LossGradient,
};
use plimsoll_kernels_wgsl::kernels::largest_within;
use plimsoll_kernels_wgsl::{Category, Gpu, reference};

use crate::common::{Guarded, Rng, assert_loop_limit, gpu, loop_limit_or_note, upload_u32_at};

// Tolerances. Loss: lse and the row mean are f32 sums of <= 1000 terms on the GPU (f64 in the
// reference) of magnitude <= ~8, so the absolute error of a loss of size ~log(cols) + 8 stays
// near 1e-6 (atol 1e-5, rtol 1e-5). Gradient: softmax_j - q_j with exp(x - lse) accurate to a
// few ulp once lse is (abs error ~1e-6), i.e. relative ~2e-6 of p_j <= 1, times g*scale <= 2:
// atol 4e-6, rtol 1e-4.
const LOSS_TOL: (f32, f32) = (1e-5, 1e-5);
const GRAD_TOL: (f32, f32) = (4e-6, 1e-4);

struct Case {
    rows: usize,
    cols: usize,
    smoothing: f32,
    dloss: LossGradient,
}

fn check_case(gpu: &Gpu, rng: &mut Rng, case: &Case) {
    let Case {
        rows,
        cols,
        smoothing,
        dloss,
    } = *case;
    let name = |what: &str| format!("{what} [{rows}, {cols}] eps {smoothing} {dloss:?}");
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

    let logits_gpu = Guarded::upload(gpu, rng, &logits, 3, "logits");
    let targets_gpu = upload_u32_at(gpu, &targets, 5, "targets");
    let losses_gpu = Guarded::random(gpu, rng, rows, 2, "losses");
    let dloss_gpu = Guarded::upload(gpu, rng, &dloss_values, 1, "dloss");
    let dlogits_gpu = Guarded::random(gpu, rng, rows * cols, 6, "dlogits");
    let forward = CrossEntropyForwardBuffers {
        logits: &logits_gpu.buffer,
        logits_offset: logits_gpu.at(),
        targets: &targets_gpu,
        targets_offset: 5,
        losses: &losses_gpu.buffer,
        losses_offset: losses_gpu.at(),
    };
    cross_entropy::forward(gpu, &forward, rows as u64, cols as u64, smoothing).unwrap();
    let backward = CrossEntropyBackwardBuffers {
        logits: &logits_gpu.buffer,
        logits_offset: logits_gpu.at(),
        targets: &targets_gpu,
        targets_offset: 5,
        dloss: &dloss_gpu.buffer,
        dloss_offset: dloss_gpu.at(),
        dlogits: &dlogits_gpu.buffer,
        dlogits_offset: dlogits_gpu.at(),
    };
    let (r, c) = (rows as u64, cols as u64);
    cross_entropy::backward(gpu, &backward, r, c, smoothing, dloss, scale).unwrap();

    let want = reference::cross_entropy::forward(&logits, &targets, rows, cols, smoothing);
    let (atol, rtol) = LOSS_TOL;
    losses_gpu.check(gpu, &name("cross_entropy forward"), &want, atol, rtol);
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
    dlogits_gpu.check(gpu, &name("cross_entropy backward"), &want, atol, rtol);
}

#[test]
fn cross_entropy_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(51);
    for rows in [1usize, 3, 37, 129] {
        for cols in [1usize, 10, 33, 257, 1000] {
            for (smoothing, dloss) in [(0.0, LossGradient::Broadcast), (0.1, LossGradient::PerRow)]
            {
                let case = Case {
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

#[test]
fn cross_entropy_rejects_bad_arguments() {
    let gpu = gpu();
    let logits = gpu
        .alloc_elements(100, Category::Temporary, "logits")
        .unwrap();
    let targets = upload_u32_at(&gpu, &[0; 10], 0, "targets");
    let losses = gpu
        .alloc_elements(10, Category::Temporary, "losses")
        .unwrap();
    let mut b = CrossEntropyForwardBuffers {
        logits: &logits,
        logits_offset: 0,
        targets: &targets,
        targets_offset: 0,
        losses: &losses,
        losses_offset: 0,
    };
    cross_entropy::forward(&gpu, &b, 10, 10, 0.0).unwrap();
    // Zero classes, smoothing outside [0, 1], and each range one element too far.
    let err = cross_entropy::forward(&gpu, &b, 10, 0, 0.0).unwrap_err();
    assert!(err.to_string().contains("0 classes"), "{err}");
    assert!(cross_entropy::forward(&gpu, &b, 10, 10, 1.5).is_err());
    assert!(cross_entropy::forward(&gpu, &b, 10, 10, f32::NAN).is_err());
    b.targets_offset = 1;
    let err = cross_entropy::forward(&gpu, &b, 10, 10, 0.0).unwrap_err();
    assert!(err.to_string().contains("targets: elements 1..11"), "{err}");
    b.targets_offset = 0;
    b.losses_offset = 1;
    assert!(cross_entropy::forward(&gpu, &b, 10, 10, 0.0).is_err());
    let backward = CrossEntropyBackwardBuffers {
        logits: &logits,
        logits_offset: 0,
        targets: &targets,
        targets_offset: 0,
        dloss: &losses,
        dloss_offset: 1,
        dlogits: &logits,
        dlogits_offset: 0,
    };
    // A per-row dloss needs 10 elements from offset 1 of a 10-element buffer; a broadcast one 1.
    let err = cross_entropy::backward(&gpu, &backward, 10, 10, 0.0, LossGradient::PerRow, 1.0)
        .unwrap_err();
    assert!(err.to_string().contains("dloss"), "{err}");
    cross_entropy::backward(&gpu, &backward, 10, 10, 0.0, LossGradient::Broadcast, 0.1).unwrap();
}

// Loop limit: checked before the ranges, so one-element buffers show the refusal.
#[test]
fn cross_entropy_refuses_rows_over_the_loop_limit() {
    let gpu = gpu();
    let Some(limit) = loop_limit_or_note(&gpu, "cross_entropy") else {
        return;
    };
    let largest = largest_within(limit, cross_entropy::loop_iterations);
    let t = gpu.alloc_elements(1, Category::Temporary, "tiny").unwrap();
    let forward = CrossEntropyForwardBuffers {
        logits: &t,
        logits_offset: 0,
        targets: &t,
        targets_offset: 0,
        losses: &t,
        losses_offset: 0,
    };
    let over = largest + 1;
    assert_loop_limit(
        cross_entropy::forward(&gpu, &forward, 1, over, 0.0),
        "cols",
        largest,
    );
    let backward = CrossEntropyBackwardBuffers {
        logits: &t,
        logits_offset: 0,
        targets: &t,
        targets_offset: 0,
        dloss: &t,
        dloss_offset: 0,
        dlogits: &t,
        dlogits_offset: 0,
    };
    let result =
        cross_entropy::backward(&gpu, &backward, 2, over, 0.1, LossGradient::Broadcast, 1.0);
    assert_loop_limit(result, "cols", largest);
}

#[test]
fn cross_entropy_at_the_loop_limit_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(53);
    let limit = gpu.loop_iteration_limit().unwrap_or(65_535);
    let cols = largest_within(limit, cross_entropy::loop_iterations) as usize;
    let case = Case {
        rows: 2,
        cols,
        smoothing: 0.1,
        dloss: LossGradient::PerRow,
    };
    check_case(&gpu, &mut rng, &case);
}
