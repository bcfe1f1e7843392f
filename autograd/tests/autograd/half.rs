//! f16 storage: `to_f16`/`to_f32`, and activations saved for backward in f16
//! (`f16_activations`), on both conversion paths: the gradients against a CPU oracle that rounds
//! the saved activation to f16, against the f32 run, and the activation peak.

use plimsoll_autograd::{Category, DType, Error, Gpu, Tensor, TensorOptions, f16_activations};
use plimsoll_kernels_wgsl::kernels::convert::reference::round_to_f16;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, f16_devices, fresh_gpu};

use crate::common::{allocated, param, peak, reset_peaks};

#[test]
fn casts_round_trip_and_f16_tensors_are_refused_by_f32_ops() {
    for (path, gpu) in f16_devices() {
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
    for (path, gpu) in f16_devices() {
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
    for (path, gpu) in f16_devices() {
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

/// An input leaf that requires grad (not a parameter: no f16 copy is made of it).
fn input(gpu: &Gpu, data: &[f32], shape: &[usize]) -> Tensor {
    let options = TensorOptions::default().requires_grad(true);
    Tensor::from_slice_with(gpu, data, shape, options).unwrap()
}

/// Bytes held now by live allocations labelled `label`.
fn held(gpu: &Gpu, label: &str) -> u64 {
    gpu.flush("stats").unwrap();
    gpu.with_allocator(|a| a.summary().top_labels)
        .iter()
        .find(|l| l.label == label)
        .map_or(0, |l| l.allocated_bytes)
}

/// Under `f16_activations` a linear layer reads an f16 input and an f32 weight as they are
/// (no f32 copy of the input: no temporary memory at all) and writes its output in f16; the
/// weight's gradient reads the saved f16 input. Against a CPU reference on the f16-rounded
/// input, on both paths.
#[test]
fn f16_matmuls_read_their_operands_without_f32_copies() {
    let (rows, k, n) = (33, 48, 40);
    let mut rng = Rng::new(21);
    let x = rng.vec_f32(rows * k, -1.0, 1.0);
    let w = rng.vec_f32(n * k, -0.5, 0.5);
    let b = rng.vec_f32(n, -0.5, 0.5);
    let x16 = round_to_f16(&x);
    // y = x16 · wᵀ + b, in f64
    let y_want: Vec<f64> = (0..rows * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            let dot: f64 = (0..k)
                .map(|l| f64::from(x16[r * k + l]) * f64::from(w[c * k + l]))
                .sum();
            dot + f64::from(b[c])
        })
        .collect();
    // dW[c][l] = Σ_r x16[r][l] (the seed is all ones)
    let dw_want: Vec<f64> = (0..n * k)
        .map(|i| (0..rows).map(|r| f64::from(x16[r * k + i % k])).sum())
        .collect();
    for (path, gpu) in f16_devices() {
        let xh = Tensor::from_slice(&gpu, &x, &[rows, k])
            .unwrap()
            .to_f16()
            .unwrap();
        let (wt, bt) = (param(&gpu, &w, &[n, k]), param(&gpu, &b, &[n]));
        reset_peaks(&gpu);
        let before = allocated(&gpu, Category::Temporary); // xh itself
        let guard = f16_activations();
        let y = xh.linear(&wt, &bt, false).unwrap();
        drop(guard);
        assert_eq!(y.dtype(), DType::F16, "{path:?}");
        let temporary = peak(&gpu, Category::Temporary) - before;
        assert_eq!(temporary, 0, "{path:?}: no widened copy");
        // One rounding of the f32 result to f16 (2^-11 relative), f32 sums of 48 products.
        assert_close(
            &format!("{path:?} y"),
            &y.to_vec().unwrap(),
            &y_want,
            1e-4,
            1.0 / 2048.0,
        );
        y.sum_all().unwrap().backward().unwrap();
        let dw = wt.grad().unwrap().to_vec().unwrap();
        assert_close(&format!("{path:?} dW"), &dw, &dw_want, 1e-4, 1e-6);
    }
}

/// Under `f16_weight_copies` a weight is converted to f16 once for every forward and backward
/// the guard spans (two micro-batches here: one copy held while both graphs are alive), the
/// matmuls read the copy (the input's gradient is the rounded weight's), the gradients reach
/// the f32 weight, and `forget_weight_copies` (the optimizers call it) frees the copy.
#[test]
fn weights_are_copied_to_f16_once_per_update() {
    let (rows, k, n) = (8, 48, 64);
    let mut rng = Rng::new(22);
    let w = rng.vec_f32(n * k, -1.0, 1.0);
    let w16 = round_to_f16(&w);
    // dX[r][l] = Σ_c w[c][l] with the seed all ones: the column sums of the weight read.
    let column_sums = |w: &[f32]| -> Vec<f64> {
        (0..rows * k)
            .map(|i| (0..n).map(|c| f64::from(w[c * k + i % k])).sum())
            .collect()
    };
    let copy_bytes = (n * k * 2) as u64;
    for (path, gpu) in f16_devices() {
        let wt = param(&gpu, &w, &[n, k]);
        let inputs: Vec<Tensor> = (0..2)
            .map(|_| input(&gpu, &rng.vec_f32(rows * k, -1.0, 1.0), &[rows, k]))
            .collect();
        let weights = plimsoll_autograd::f16_weight_copies();
        let outputs: Vec<Tensor> = inputs
            .iter()
            .map(|x| {
                let _half = f16_activations();
                x.matmul_transposed(&wt).unwrap()
            })
            .collect();
        assert_eq!(
            held(&gpu, "f16 w"),
            copy_bytes,
            "{path:?}: one copy for both passes"
        );
        for y in outputs {
            y.sum_all().unwrap().backward().unwrap();
        }
        for x in &inputs {
            let dx = x.grad().unwrap().to_vec().unwrap();
            assert_close(&format!("{path:?} dX"), &dx, &column_sums(&w16), 1e-5, 1e-6);
        }
        // dW = Σ over both passes of Σ_r x[r] (the inputs are f32 leaves, read as they are):
        // into the f32 weight's gradient.
        let xs: Vec<Vec<f32>> = inputs.iter().map(|x| x.to_vec().unwrap()).collect();
        let dw_want: Vec<f64> = (0..n * k)
            .map(|i| {
                let l = i % k;
                xs.iter()
                    .map(|x| (0..rows).map(|r| f64::from(x[r * k + l])).sum::<f64>())
                    .sum()
            })
            .collect();
        assert_eq!(wt.grad().unwrap().dtype(), DType::F32);
        assert_close(
            &format!("{path:?} dW"),
            &wt.grad().unwrap().to_vec().unwrap(),
            &dw_want,
            1e-4,
            1e-6,
        );
        assert_eq!(
            held(&gpu, "f16 w"),
            copy_bytes,
            "{path:?}: kept for the next pass"
        );
        plimsoll_autograd::forget_weight_copies();
        assert_eq!(held(&gpu, "f16 w"), 0, "{path:?}: forgotten");
        drop(weights);
        // Without the guard the matmul reads the f32 weight: no copy, the exact column sums.
        let x = input(&gpu, &xs[0], &[rows, k]);
        let y = {
            let _half = f16_activations();
            x.matmul_transposed(&wt).unwrap()
        };
        assert_eq!(
            held(&gpu, "f16 w"),
            0,
            "{path:?}: no copy without the guard"
        );
        y.sum_all().unwrap().backward().unwrap();
        let dx = x.grad().unwrap().to_vec().unwrap();
        assert_close(
            &format!("{path:?} dX (f32 w)"),
            &dx,
            &column_sums(&w),
            1e-5,
            1e-6,
        );
    }
}

/// Under `f16_activations` an add of two f16 activations, scalar multiplies and a GELU run on
/// the 16-bit kernels (f16 in and out, no temporary memory), with values as the CPU rounds them
/// and the gradient of the rounded chain (halving and doubling a half is exact).
#[test]
fn f16_elementwise_ops_run_in_16_bits() {
    let x: Vec<f32> = Rng::new(23).vec_f32(35, -3.0, 3.0);
    let gelu = |v: f64| plimsoll_kernels_wgsl::kernels::unary::reference::gelu(v);
    let gelu_d = |v: f64| plimsoll_kernels_wgsl::kernels::unary::reference::gelu_derivative(v);
    let h = round_to_f16(&x);
    let s: Vec<f32> = round_to_f16(&h.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
    let want: Vec<f32> = round_to_f16(
        &s.iter()
            .map(|&v| gelu(f64::from(v)) as f32)
            .collect::<Vec<_>>(),
    );
    let dx_want: Vec<f64> = s.iter().map(|&v| 2.0 * gelu_d(f64::from(v))).collect();
    for (path, gpu) in f16_devices() {
        let xt = param(&gpu, &x, &[5, 7]);
        let guard = f16_activations();
        let h = xt.mul_scalar(1.0).unwrap();
        reset_peaks(&gpu);
        let before = allocated(&gpu, Category::Temporary);
        let s = h
            .add(&h)
            .unwrap()
            .mul_scalar(0.5)
            .unwrap()
            .mul_scalar(2.0)
            .unwrap();
        let g = s.gelu().unwrap();
        let temporary = peak(&gpu, Category::Temporary) - before;
        drop(guard);
        assert_eq!(
            (h.dtype(), s.dtype(), g.dtype()),
            (DType::F16, DType::F16, DType::F16)
        );
        assert_eq!(temporary, 0, "{path:?}: no f32 copies");
        // GELU in f32 then one rounding: one f16 ULP at most.
        assert_close(
            &format!("{path:?} gelu"),
            &g.to_vec().unwrap(),
            &want,
            1e-6,
            1.0 / 1024.0,
        );
        g.sum_all().unwrap().backward().unwrap();
        let dx = xt.grad().unwrap().to_vec().unwrap();
        assert_close(&format!("{path:?} dx"), &dx, &dx_want, 1e-5, 1e-5);
    }
}

/// An f16 permute and a slice that copies move the halves as they are (f16 out, no f32 copy),
/// and the gradient flows back through both.
#[test]
fn f16_permutes_and_copied_slices_stay_16_bit() {
    let x: Vec<f32> = Rng::new(24).vec_f32(30, -3.0, 3.0);
    let h = round_to_f16(&x);
    // p[i][j][k] = h[j][k][i] over h of shape (2, 3, 5): p has shape (5, 2, 3).
    let p_want: Vec<f32> = (0..30)
        .map(|n| {
            let (i, j, k) = (n / 6, (n / 3) % 2, n % 3);
            h[j * 15 + k * 5 + i]
        })
        .collect();
    // s = h[:, 1:3, :]: shape (2, 2, 5), a copy (axis 0 has extent 2).
    let s_want: Vec<f32> = (0..20)
        .map(|n| {
            let (j, k, l) = (n / 10, (n / 5) % 2, n % 5);
            h[j * 15 + (k + 1) * 5 + l]
        })
        .collect();
    for (path, gpu) in f16_devices() {
        let xt = param(&gpu, &x, &[2, 3, 5]);
        let guard = f16_activations();
        let ht = xt.mul_scalar(1.0).unwrap();
        reset_peaks(&gpu);
        let before = allocated(&gpu, Category::Temporary);
        let p = ht.permute(&[2, 0, 1]).unwrap();
        let s = ht.slice(1, 1, 2).unwrap();
        let temporary = peak(&gpu, Category::Temporary) - before;
        drop(guard);
        assert_eq!((p.dtype(), s.dtype()), (DType::F16, DType::F16), "{path:?}");
        assert_eq!(temporary, 0, "{path:?}: no f32 copies");
        assert_eq!(p.to_vec().unwrap(), p_want, "{path:?} permute");
        assert_eq!(s.to_vec().unwrap(), s_want, "{path:?} slice");
        let loss = p.sum_all().unwrap().add(&s.sum_all().unwrap()).unwrap();
        loss.backward().unwrap();
        // d/dx: 1 from the permute, and 1 more where the slice read.
        let dx_want: Vec<f32> = (0..30)
            .map(|n| if (n / 5) % 3 >= 1 { 2.0 } else { 1.0 })
            .collect();
        assert_eq!(xt.grad().unwrap().to_vec().unwrap(), dx_want, "{path:?} dx");
    }
}
