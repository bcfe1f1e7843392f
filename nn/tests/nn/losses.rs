//! Losses against f64 CPU references (forward and gradient).

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::kernels::cross_entropy::reference as cross_entropy;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, gpu, to_f64};
use plimsoll_nn::{Error, loss};

use crate::common::input;

#[test]
fn mse_matches_reference() {
    let gpu = gpu();
    let pred = Rng::new(30).vec_f32(7, -2.0, 2.0);
    let target = Rng::new(31).vec_f32(7, -2.0, 2.0);
    let p = input(&gpu, &pred, &[7]);
    let t = Tensor::from_slice(&gpu, &target, &[7]).unwrap();
    let l = loss::mse(&p, &t).unwrap();
    // mean((p - t)^2); d/dp = 2 (p - t) / n.
    let n = 7.0;
    let want: f64 = pred
        .iter()
        .zip(&target)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum::<f64>()
        / n;
    assert_close("mse", &[l.item().unwrap()], &[want], 1e-6, 1e-5);
    l.backward().unwrap();
    let grad: Vec<f64> = pred
        .iter()
        .zip(&target)
        .map(|(a, b)| 2.0 * f64::from(a - b) / n)
        .collect();
    assert_close(
        "d mse / d pred",
        &p.grad().unwrap().to_vec().unwrap(),
        &grad,
        1e-6,
        1e-5,
    );
    let wrong = Tensor::from_slice(&gpu, &[0.0; 7], &[7, 1]).unwrap();
    // No silent broadcasting.
    let err = loss::mse(&p, &wrong).unwrap_err();
    assert!(
        matches!(&err, Error::InputShape { module: "mse", expected, found }
            if found == &[7] && expected.contains("[7, 1]")),
        "{err}"
    );
}

#[test]
fn cross_entropy_matches_reference() {
    let gpu = gpu();
    let (rows, classes) = (4, 5);
    let logits = Rng::new(32).vec_f32(rows * classes, -3.0, 3.0);
    let targets = [1u32, 4, 0, 4];
    for smoothing in [0.0f32, 0.1] {
        let x = input(&gpu, &logits, &[rows, classes]);
        let t = Tensor::from_indices(&gpu, &targets, &[rows]).unwrap();
        let l = loss::cross_entropy(&x, &t, smoothing).unwrap();
        // Per row: q = (1 - s) onehot(target) + s / C; loss = -sum_c q_c log softmax_c;
        // d loss / d logit_c = (softmax_c - q_c) / rows (the reference's mean-reduced backward).
        let s = f64::from(smoothing);
        let logits64 = to_f64(&logits);
        let losses = cross_entropy::forward_f64(&logits64, &targets, rows, classes, s);
        let total: f64 = losses.iter().sum();
        let scale = 1.0 / rows as f64;
        let grad =
            cross_entropy::backward_f64(&logits64, &targets, rows, classes, s, &[1.0], scale);
        assert_close(
            "cross_entropy",
            &[l.item().unwrap()],
            &[total / rows as f64],
            1e-5,
            1e-5,
        );
        l.backward().unwrap();
        assert_close(
            "d ce / d logits",
            &x.grad().unwrap().to_vec().unwrap(),
            &grad,
            1e-6,
            1e-4,
        );
    }
    let x = input(&gpu, &logits, &[rows, classes]);
    let t = Tensor::from_indices(&gpu, &targets, &[rows]).unwrap();
    let err = loss::cross_entropy(&x, &t, 1.5).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                what: "cross_entropy",
                ..
            }
        ) && err.to_string().contains("label_smoothing 1.5"),
        "{err}"
    );
    let f32_targets = Tensor::from_slice(&gpu, &[0.0; 4], &[4]).unwrap();
    let err = loss::cross_entropy(&x, &f32_targets, 0.0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InputShape {
                module: "cross_entropy",
                ..
            }
        ) && err.to_string().contains("u32 class targets"),
        "{err}"
    );
}

/// The chunked output head and loss against the unfused path (`x · weightᵀ`, then
/// cross-entropy): the same loss, `dx` and `dweight` within f32 rounding for every chunk size
/// (one row, a size that leaves a short last chunk, all rows, more than all, and the automatic
/// choice), with label smoothing and an upstream gradient other than 1; and over the forward and
/// backward the fused path's peak stays under the unfused one's by at least the whole logits.
#[test]
fn linear_cross_entropy_matches_the_unfused_head_and_never_holds_the_logits() {
    // 517: a vocabulary that is not a multiple of 4 goes through the transposed logits; 516
    // through the direct ones.
    for vocab in [517, 516] {
        head_against_unfused(vocab);
    }
}

fn head_against_unfused(vocab: usize) {
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let (rows, width, smoothing) = (96, 24, 0.1);
    let xs = Rng::new(40).vec_f32(rows * width, -1.0, 1.0);
    let ws = Rng::new(41).vec_f32(vocab * width, -0.5, 0.5);
    let mut rng = Rng::new(42);
    let ts: Vec<u32> = (0..rows).map(|_| rng.below(vocab as u64) as u32).collect();
    let run = |chunk: Option<usize>| {
        let x = input(&gpu, &xs, &[2, rows / 2, width]);
        let w = input(&gpu, &ws, &[vocab, width]);
        let t = Tensor::from_indices(&gpu, &ts, &[2, rows / 2]).unwrap();
        gpu.with_allocator(|a| a.reset_peaks());
        let loss = match chunk {
            Some(c) => loss::linear_cross_entropy(&x, &w, &t, smoothing, c).unwrap(),
            None => {
                let logits = x.matmul_transposed(&w).unwrap();
                let logits = logits.reshape(&[rows, vocab]).unwrap();
                let flat = t.reshape(&[rows]).unwrap();
                loss::cross_entropy(&logits, &flat, smoothing).unwrap()
            }
        };
        loss.mul_scalar(3.0).unwrap().backward().unwrap();
        let peak = gpu.with_allocator(|a| a.stats().peak_allocated_bytes);
        let values = vec![
            vec![loss.item().unwrap()],
            x.grad().unwrap().to_vec().unwrap(),
            w.grad().unwrap().to_vec().unwrap(),
        ];
        (peak, values)
    };
    let (unfused_peak, want) = run(None);
    let logits_bytes = (rows * vocab * 4) as u64;
    for chunk in [1, 7, rows, rows + 5, 0] {
        let (peak, got) = run(Some(chunk));
        for (name, (g, w)) in ["loss", "dx", "dweight"].iter().zip(got.iter().zip(&want)) {
            let what = format!("{name}, vocab {vocab}, chunk {chunk}");
            assert_close(&what, g, &to_f64(w), 1e-5, 1e-4);
        }
        if chunk != 0 && chunk < rows / 2 {
            assert!(
                peak + logits_bytes <= unfused_peak,
                "chunk {chunk}: peak {peak} B, unfused {unfused_peak} B, logits {logits_bytes} B"
            );
        }
    }
}

/// The automatic chunk follows the Liger rule (a chunk's logits about the size of the input),
/// stays within the rows, and keeps a chunk's logits inside one binding.
#[test]
fn the_automatic_loss_chunk_keeps_a_chunk_near_the_input_size_and_inside_one_binding() {
    // GPT-2 small at micro-batch 12: 12,288 rows of 768 against 50,257 tokens.
    let chunk = loss::loss_chunk_rows(12 * 1024, 768, 50_257, 128 << 20);
    assert_eq!(chunk, 256, "ceil(12288 / 66) = 187, to a power of two");
    // A character vocabulary: one chunk of every row.
    assert_eq!(
        loss::loss_chunk_rows(64 * 256, 384, 65, 128 << 20),
        64 * 256
    );
    // A small binding caps the chunk: 50,257 x 4 B = 201,028 B a row.
    assert_eq!(loss::loss_chunk_rows(12 * 1024, 768, 50_257, 1 << 20), 5);
    // A narrow model still gets 8 MiB of logits a chunk: ceil(2^21 / 50,257) = 42, to 64
    // (Liger's rule alone would give one row).
    assert_eq!(loss::loss_chunk_rows(256, 128, 50_257, 128 << 20), 64);
    assert_eq!(loss::loss_chunk_rows(0, 768, 50_257, 0), 1);
}

/// Bad input to the chunked loss is a typed error, not a panic.
#[test]
fn linear_cross_entropy_refuses_shapes_that_do_not_fit() {
    let gpu = gpu();
    let x = input(&gpu, &[0.5; 12], &[3, 4]);
    let w = input(&gpu, &[0.5; 20], &[5, 4]);
    let t = Tensor::from_indices(&gpu, &[0, 1], &[2]).unwrap();
    let err = loss::linear_cross_entropy(&x, &w, &t, 0.0, 0).expect_err("2 targets for 3 rows");
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    let t = Tensor::from_indices(&gpu, &[0, 1, 2], &[3]).unwrap();
    let w5 = input(&gpu, &[0.5; 25], &[5, 5]);
    let err = loss::linear_cross_entropy(&x, &w5, &t, 0.0, 0).expect_err("width 5 against 4");
    assert!(
        matches!(err, Error::InvalidConfig { .. }) && err.to_string().contains("weight [[5, 5]]"),
        "{err}"
    );
    let err = loss::linear_cross_entropy(&x, &w, &t, 1.5, 0).expect_err("smoothing 1.5");
    assert!(
        matches!(err, Error::InvalidConfig { .. })
            && err
                .to_string()
                .contains("label_smoothing 1.5 must be in [0, 1]"),
        "{err}"
    );
}

/// Under `f16_activations` (the saved input stored in f16) the chunked loss trains as in f32:
/// its loss and gradients within f16 rounding of the f32 ones.
#[test]
fn linear_cross_entropy_under_f16_activations_matches_f32_within_f16_rounding() {
    let gpu = gpu();
    let (rows, width, vocab) = (40, 16, 70);
    let xs = Rng::new(50).vec_f32(rows * width, -1.0, 1.0);
    let ws = Rng::new(51).vec_f32(vocab * width, -0.5, 0.5);
    let mut rng = Rng::new(52);
    let ts: Vec<u32> = (0..rows).map(|_| rng.below(vocab as u64) as u32).collect();
    let run = |half: bool| {
        let _guard = half.then(plimsoll_autograd::f16_activations);
        let x = input(&gpu, &xs, &[rows, width]);
        let w = input(&gpu, &ws, &[vocab, width]);
        let t = Tensor::from_indices(&gpu, &ts, &[rows]).unwrap();
        // A recorded op before the loss, so its input is an activation the tape may keep in f16.
        let h = x.mul_scalar(1.0).unwrap();
        let loss = loss::linear_cross_entropy(&h, &w, &t, 0.0, 9).unwrap();
        loss.backward().unwrap();
        vec![
            vec![loss.item().unwrap()],
            x.grad().unwrap().to_vec().unwrap(),
            w.grad().unwrap().to_vec().unwrap(),
        ]
    };
    let (f32_run, f16_run) = (run(false), run(true));
    for (name, (h, f)) in ["loss", "dx", "dweight"]
        .iter()
        .zip(f16_run.iter().zip(&f32_run))
    {
        assert_close(&format!("{name} in f16"), h, &to_f64(f), 2e-3, 2e-2);
    }
}

/// A weight kept in parts of whole rows gives the same loss and gradients as the one tensor:
/// `dx`, and each part's gradient the matching rows of the whole one's, for several chunks.
#[test]
fn linear_cross_entropy_over_a_weight_in_parts_matches_the_whole_weight() {
    let gpu = gpu();
    let (rows, width, smoothing) = (30, 12, 0.05);
    let split = [5usize, 17, 31];
    let vocab: usize = split.iter().sum();
    let xs = Rng::new(60).vec_f32(rows * width, -1.0, 1.0);
    let ws = Rng::new(61).vec_f32(vocab * width, -0.5, 0.5);
    let mut rng = Rng::new(62);
    let ts: Vec<u32> = (0..rows).map(|_| rng.below(vocab as u64) as u32).collect();
    let t = Tensor::from_indices(&gpu, &ts, &[rows]).unwrap();
    // The whole weight.
    let x = input(&gpu, &xs, &[rows, width]);
    let w = input(&gpu, &ws, &[vocab, width]);
    let whole = loss::linear_cross_entropy(&x, &w, &t, smoothing, 7).unwrap();
    whole.mul_scalar(2.0).unwrap().backward().unwrap();
    let (want_dx, want_dw) = (
        x.grad().unwrap().to_vec().unwrap(),
        w.grad().unwrap().to_vec().unwrap(),
    );
    // The same weight in three parts.
    let x = input(&gpu, &xs, &[rows, width]);
    let mut first = 0;
    let parts: Vec<Tensor> = split
        .iter()
        .map(|&r| {
            let p = input(&gpu, &ws[first * width..(first + r) * width], &[r, width]);
            first += r;
            p
        })
        .collect();
    let refs: Vec<&Tensor> = parts.iter().collect();
    let in_parts = loss::linear_cross_entropy_parts(&x, &refs, &t, smoothing, 7).unwrap();
    in_parts.mul_scalar(2.0).unwrap().backward().unwrap();
    let got = in_parts.item().unwrap();
    assert_close(
        "loss in parts",
        &[got],
        &[f64::from(whole.item().unwrap())],
        1e-6,
        1e-5,
    );
    let dx = x.grad().unwrap().to_vec().unwrap();
    assert_close("dx in parts", &dx, &to_f64(&want_dx), 1e-6, 1e-4);
    let mut first = 0;
    for (p, &r) in parts.iter().zip(&split) {
        let dp = p.grad().unwrap().to_vec().unwrap();
        let want = &want_dw[first * width..(first + r) * width];
        assert_close(
            &format!("dweight rows {first}.."),
            &dp,
            &to_f64(want),
            1e-6,
            1e-4,
        );
        first += r;
    }
}
