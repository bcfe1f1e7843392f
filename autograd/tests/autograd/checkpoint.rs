//! The checkpoint mechanism: a 16-layer MLP, every layer checkpointed, against the same MLP
//! without: identical gradients (same dropout masks) and a lower activation peak.

use plimsoll_autograd::{Category, Gpu, Result, Tensor, checkpoint, manual_seed};
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, fresh_gpu};

use crate::common::{param, peak, reset_peaks};

const LAYERS: usize = 16;
const WIDTH: usize = 24;
const BATCH: usize = 9;

fn layer(h: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    h.matmul(w)?.add(b)?.gelu()?.dropout(0.2)
}

/// Runs forward and backward; returns every parameter gradient and the activation peak.
fn run(gpu: &Gpu, checkpointed: bool) -> (Vec<Vec<f32>>, u64) {
    run_with(gpu, checkpointed, false).0
}

/// [`run`], with the segments' inputs in host memory when `offloaded`; also the activation
/// memory held once forward is done (before the loss), and the offloaded host bytes' peak.
fn run_with(gpu: &Gpu, checkpointed: bool, offloaded: bool) -> ((Vec<Vec<f32>>, u64), u64, u64) {
    let params: Vec<(Tensor, Tensor)> = (0..LAYERS as u64)
        .map(|i| {
            let w = param(
                gpu,
                &Rng::new(i).vec_f32(WIDTH * WIDTH, -0.4, 0.4),
                &[WIDTH, WIDTH],
            );
            let b = param(gpu, &Rng::new(100 + i).vec_f32(WIDTH, -0.1, 0.1), &[WIDTH]);
            (w, b)
        })
        .collect();
    let x = Tensor::from_slice(
        gpu,
        &Rng::new(7).vec_f32(BATCH * WIDTH, -1.0, 1.0),
        &[BATCH, WIDTH],
    )
    .unwrap();
    let targets: Vec<u32> = (0..BATCH as u32).map(|i| (i * 7) % WIDTH as u32).collect();
    let targets = Tensor::from_indices(gpu, &targets, &[BATCH]).unwrap();
    manual_seed(1234);
    reset_peaks(gpu);
    plimsoll_autograd::reset_offloaded_peak();
    let offload = offloaded.then(plimsoll_autograd::offload_inputs);
    let mut h = x;
    for (w, b) in &params {
        h = if checkpointed {
            let (w, b) = (w.clone(), b.clone());
            checkpoint(&[&h], move |xs: &[Tensor]| layer(&xs[0], &w, &b)).unwrap()
        } else {
            layer(&h, w, b).unwrap()
        };
    }
    drop(offload);
    let held = gpu.with_allocator(|a| a.stats().category(Category::Activation).allocated_bytes);
    let loss = h.cross_entropy(&targets, 0.0).unwrap();
    drop(h);
    loss.backward().unwrap();
    drop(loss);
    let activation_peak = peak(gpu, Category::Activation);
    let host_peak = plimsoll_autograd::offloaded_host_bytes().1;
    let grads = params
        .iter()
        .flat_map(|(w, b)| {
            [
                w.grad().unwrap().to_vec().unwrap(),
                b.grad().unwrap().to_vec().unwrap(),
            ]
        })
        .collect();
    ((grads, activation_peak), held, host_peak)
}

#[test]
fn checkpointed_mlp_has_identical_gradients_and_a_lower_activation_peak() {
    let gpu = fresh_gpu();
    let (plain, plain_peak) = run(&gpu, false);
    let (checkpointed, checkpointed_peak) = run(&gpu, true);
    for (i, (p, c)) in plain.iter().zip(&checkpointed).enumerate() {
        for (j, (a, b)) in p.iter().zip(c).enumerate() {
            let tolerance = 1e-6 * a.abs().max(b.abs()).max(1e-30);
            assert!((a - b).abs() <= tolerance, "grad {i}[{j}]: {a} vs {b}");
        }
        assert!(p.iter().any(|&v| v != 0.0), "grad {i} is all zero");
    }
    assert!(
        checkpointed_peak < plain_peak,
        "activation peak with checkpoints {checkpointed_peak} >= without {plain_peak}"
    );
    eprintln!("activation peak: plain {plain_peak} B, checkpointed {checkpointed_peak} B");
}

#[test]
fn checkpoint_under_no_grad_is_a_plain_call() {
    let gpu = fresh_gpu();
    let x = param(&gpu, &[1.0, 2.0], &[2]);
    let _g = plimsoll_autograd::no_grad();
    let y = checkpoint(&[&x], |xs: &[Tensor]| xs[0].mul_scalar(2.0)).unwrap();
    assert!(!y.requires_grad());
    assert_eq!(y.to_vec().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn checkpoint_gradients_flow_to_inputs_and_captured_parameters() {
    // y = checkpoint(x -> (x * w).tanh()) ; L = Σ y. dL/dx = (1 - y²) w, dL/dw = (1 - y²) x.
    let gpu = fresh_gpu();
    let x = param(&gpu, &[0.5, -1.0, 2.0], &[3]);
    let w = param(&gpu, &[1.5, 0.25, -0.5], &[3]);
    let wc = w.clone();
    let y = checkpoint(&[&x], move |xs: &[Tensor]| xs[0].mul(&wc)?.tanh()).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let (xv, wv) = ([0.5f64, -1.0, 2.0], [1.5f64, 0.25, -0.5]);
    let dy: Vec<f64> = (0..3)
        .map(|i| 1.0 - (xv[i] * wv[i]).tanh().powi(2))
        .collect();
    let want_x: Vec<f64> = (0..3).map(|i| dy[i] * wv[i]).collect();
    let want_w: Vec<f64> = (0..3).map(|i| dy[i] * xv[i]).collect();
    assert_close(
        "dx",
        &x.grad().unwrap().to_vec().unwrap(),
        &want_x,
        1e-6,
        1e-5,
    );
    assert_close(
        "dw",
        &w.grad().unwrap().to_vec().unwrap(),
        &want_w,
        1e-6,
        1e-5,
    );
}

#[test]
fn a_segment_knows_when_backward_runs_it_again() {
    // The forward runs the segment once (not recomputing), backward once more (recomputing),
    // and the flag is off again afterwards.
    let gpu = fresh_gpu();
    let x = param(&gpu, &[1.0, 2.0], &[2]);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let y = checkpoint(&[&x], move |xs: &[Tensor]| {
        log.lock()
            .unwrap()
            .push(plimsoll_autograd::is_recomputing());
        xs[0].mul_scalar(3.0)
    })
    .unwrap();
    assert_eq!(*seen.lock().unwrap(), [false]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(*seen.lock().unwrap(), [false, true]);
    assert!(!plimsoll_autograd::is_recomputing());
    assert_eq!(x.grad().unwrap().to_vec().unwrap(), [3.0, 3.0]);
}

/// The segments' inputs in host memory (`offload_inputs`): the same gradients bit for bit,
/// and after forward the device holds only the last segment's output, where it held every
/// segment's input: the host holds those (the input and the 15 hidden states, 16 of
/// [9, 24] f32).
#[test]
fn offloaded_segment_inputs_keep_the_gradients_and_leave_the_device() {
    let gpu = fresh_gpu();
    let ((kept, _), held_on_device, none_on_host) = run_with(&gpu, true, false);
    let ((offloaded, _), held_offloaded, host_peak) = run_with(&gpu, true, true);
    assert_eq!(kept, offloaded, "the same gradients");
    assert_eq!(none_on_host, 0);
    let hidden = (4 * BATCH * WIDTH) as u64;
    assert_eq!(
        host_peak,
        LAYERS as u64 * hidden,
        "every segment's input on the host"
    );
    assert!(
        held_on_device >= held_offloaded + (LAYERS as u64 - 1) * hidden,
        "after forward: {held_on_device} bytes of activations kept, {held_offloaded} offloaded"
    );
    assert_eq!(
        plimsoll_autograd::offloaded_host_bytes().0,
        0,
        "freed after backward"
    );
}
