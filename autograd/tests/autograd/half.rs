//! f16 storage: `to_f16`/`to_f32`, and activations saved for backward in f16
//! (`f16_activations`), on both conversion paths: the gradients against a CPU oracle that rounds
//! the saved activation to f16, against the f32 run, and the activation peak.

use plimsoll_autograd::{Category, DType, Error, Gpu, Tensor, f16_activations};
use plimsoll_kernels_wgsl::kernels::convert::F16Path;
use plimsoll_kernels_wgsl::reference::convert::round_to_f16;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, fresh_gpu};

use crate::common::{allocated, param, peak, reset_peaks};

/// A fresh device on each conversion path the adapter has (lavapipe: both).
fn devices() -> Vec<(F16Path, Gpu)> {
    let mut out = Vec::new();
    for path in [F16Path::Packed, F16Path::Native] {
        let gpu = fresh_gpu();
        if gpu.set_f16_path(path).is_ok() {
            out.push((path, gpu));
        }
    }
    out
}

#[test]
fn casts_round_trip_and_f16_tensors_are_refused_by_f32_ops() {
    for (path, gpu) in devices() {
        let x: Vec<f32> = vec![0.1, -2.5, 70000.0, 1.0 / 3.0, 6.0e-5];
        let t = Tensor::from_slice(&gpu, &x, &[5]).unwrap();
        let h = t.to_f16().unwrap();
        assert_eq!(h.dtype(), DType::F16);
        let want = round_to_f16(&x);
        assert_eq!(h.to_vec().unwrap(), want, "{path:?}: f16 read back");
        assert_eq!(h.to_f32().unwrap().to_vec().unwrap(), want, "{path:?}");
        // A view at an odd element offset reads and converts its own halves.
        let tail = h.reshape(&[5]).unwrap().slice(0, 1, 3).unwrap();
        assert_eq!(tail.to_f32().unwrap().to_vec().unwrap(), want[1..4]);
        // Ops take f16 operands and compute in f32.
        let sum = h.add(&t).unwrap();
        assert_eq!(sum.dtype(), DType::F32);
        let want_sum: Vec<f32> = want.iter().zip(&x).map(|(a, b)| a + b).collect();
        assert_eq!(sum.to_vec().unwrap(), want_sum, "{path:?}: f16 + f32");
        let err = h.elements().unwrap_err();
        assert!(matches!(err, Error::DTypeMismatch { .. }), "{err}");
        let err = h.to_f16().unwrap_err();
        assert!(err.to_string().contains("to_f16"), "{err}");
        let err = t.to_f32().unwrap_err();
        assert!(err.to_string().contains("to_f32"), "{err}");
    }
}

/// `a = x * 1` (an activation) sliced to rows 1..4 (element offset 3: the middle of a word of
/// halves), times a weight: dW = aᵀ · 1 must use `a` as f16 rounded it under
/// `f16_activations`, and `a` itself without.
#[test]
fn a_saved_activation_at_an_odd_offset_comes_back_rounded_to_f16() {
    let (rows, cols, out) = (5, 3, 2);
    let x: Vec<f32> = Rng::new(3).vec_f32(rows * cols, -3.0, 3.0);
    for (path, gpu) in devices() {
        let grad_w = |half: bool| {
            let xt = param(&gpu, &x, &[rows, cols]);
            let w = param(&gpu, &vec![0.5; cols * out], &[cols, out]);
            let loss = {
                let _guard = half.then(f16_activations);
                let a = xt.mul_scalar(1.0).unwrap().slice(0, 1, 3).unwrap();
                a.matmul(&w).unwrap().sum_all().unwrap()
            };
            loss.backward().unwrap();
            w.grad().unwrap().to_vec().unwrap()
        };
        let oracle = |a: &[f32]| -> Vec<f64> {
            let mut g = vec![0.0; cols * out];
            for r in 1..4 {
                for c in 0..cols {
                    for o in 0..out {
                        g[c * out + o] += f64::from(a[r * cols + c]);
                    }
                }
            }
            g
        };
        let rounded = round_to_f16(&x);
        let name = format!("{path:?} dW with f16 activations");
        assert_close(&name, &grad_w(true), &oracle(&rounded), 1e-6, 1e-6);
        assert_close("dW in f32", &grad_w(false), &oracle(&x), 1e-6, 1e-6);
        assert!(
            oracle(&rounded) != oracle(&x),
            "the data must show f16's rounding"
        );
    }
}

const LAYERS: usize = 6;
const WIDTH: usize = 64;
const BATCH: usize = 128;

/// A transformer-like stack (layer norm, a fused linear + ReLU, causal attention over the
/// rows, GELU) and a cross-entropy; returns each parameter's gradient and the activation peak.
fn stack(gpu: &Gpu, half: bool) -> (Vec<Vec<f32>>, u64) {
    let mut rng = Rng::new(11);
    let params: Vec<[Tensor; 4]> = (0..LAYERS)
        .map(|_| {
            let w = param(gpu, &rng.vec_f32(WIDTH * WIDTH, -0.2, 0.2), &[WIDTH, WIDTH]);
            let b = param(gpu, &rng.vec_f32(WIDTH, -0.1, 0.1), &[WIDTH]);
            let gamma = param(gpu, &rng.vec_f32(WIDTH, 0.8, 1.2), &[WIDTH]);
            let beta = param(gpu, &rng.vec_f32(WIDTH, -0.1, 0.1), &[WIDTH]);
            [w, b, gamma, beta]
        })
        .collect();
    let x =
        Tensor::from_slice(gpu, &rng.vec_f32(BATCH * WIDTH, -1.0, 1.0), &[BATCH, WIDTH]).unwrap();
    let targets: Vec<u32> = (0..BATCH as u32).map(|i| (i * 5) % WIDTH as u32).collect();
    let targets = Tensor::from_indices(gpu, &targets, &[BATCH]).unwrap();
    reset_peaks(gpu);
    let loss = {
        let _guard = half.then(f16_activations);
        let mut h = x;
        for [w, b, gamma, beta] in &params {
            let n = h.layer_norm(gamma, beta, 1e-5).unwrap();
            let y = n.linear(w, b, true).unwrap();
            let att = y
                .matmul_transposed_scaled(&y, 0.125)
                .unwrap()
                .softmax_causal()
                .unwrap();
            h = att.matmul(&y).unwrap().gelu().unwrap().add(&h).unwrap();
        }
        h.cross_entropy(&targets, 0.0).unwrap()
    };
    loss.backward().unwrap();
    drop(loss);
    let activation_peak = peak(gpu, Category::Activation);
    let grads = params
        .iter()
        .flat_map(|p| p.iter().map(|t| t.grad().unwrap().to_vec().unwrap()))
        .collect();
    (grads, activation_peak)
}

#[test]
fn f16_activations_halve_the_activation_peak_and_keep_the_gradients() {
    for (path, gpu) in devices() {
        let (full, full_peak) = stack(&gpu, false);
        let (half, half_peak) = stack(&gpu, true);
        // Every activation rounded to f16 (the residual stream too) moves each gradient by
        // about f16's relative precision (2^-11) per layer: compared as vectors.
        for (i, (h, f)) in half.iter().zip(&full).enumerate() {
            let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
            let diff: Vec<f32> = h.iter().zip(f).map(|(a, b)| a - b).collect();
            let relative = norm(&diff) / norm(f);
            assert!(
                relative < 1e-2,
                "{path:?} parameter {i}: gradient moved by {relative:.2e} of its norm"
            );
        }
        let ratio = half_peak as f64 / full_peak as f64;
        assert!(
            ratio <= 0.55,
            "{path:?}: activation peak {half_peak} B with f16, {full_peak} B in f32 ({ratio:.3})"
        );
    }
}

/// Attention's probabilities are saved by the softmax and by the product with `v`: one f16
/// copy serves both, and the f32 output is freed as soon as the op has run.
#[test]
fn an_activation_saved_by_two_ops_is_converted_once() {
    let gpu = fresh_gpu();
    let (rows, cols) = (64, 64);
    let x = param(
        &gpu,
        &Rng::new(5).vec_f32(rows * cols, -1.0, 1.0),
        &[rows, cols],
    );
    let v = param(
        &gpu,
        &Rng::new(6).vec_f32(cols * cols, -1.0, 1.0),
        &[cols, cols],
    );
    let before = allocated(&gpu, Category::Activation);
    let guard = f16_activations();
    let y = x.softmax().unwrap();
    let z = y.matmul(&v).unwrap();
    drop(guard);
    assert_eq!((y.dtype(), z.dtype()), (DType::F16, DType::F16));
    let held = |label: &str| {
        gpu.with_allocator(|a| a.summary().top_labels)
            .iter()
            .find(|l| l.label == label)
            .map_or(0, |l| l.allocated_bytes)
    };
    let half = (rows * cols * 2) as u64; // a multiple of the 256-byte granule
    assert_eq!(
        held("f16 softmax"),
        half,
        "one f16 copy of the probabilities"
    );
    assert_eq!(held("softmax"), 0, "the f32 probabilities are freed");
    assert_eq!(
        allocated(&gpu, Category::Activation) - before,
        2 * half,
        "y and z in f16"
    );
    // Backward runs through both ops' saved copy.
    z.sum_all().unwrap().backward().unwrap();
    assert!(x.grad().is_some() && v.grad().is_some());
}
