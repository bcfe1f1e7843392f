//! Sanity checks of the CPU references against independent oracles, so that a wrong reference
//! never becomes a wrong oracle for the GPU kernels: central finite differences (in `f64`) of
//! each forward reference for every backward, hand-worked small cases (derivations in the
//! comments), and identities.
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plimsoll_kernels_wgsl::reference::{
    binary, convert, cross_entropy, embedding, layer_norm, nonfinite, optimizer, reduce, softmax,
    unary,
};

/// Seeded xorshift: values in [lo, hi).
struct Rng(u64);

impl Rng {
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + (hi - lo) * ((self.0 >> 40) as f32 / (1u64 << 24) as f32)
    }
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Asserts `|got - want| <= atol + rtol |want|` elementwise, naming the first mismatch.
fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= atol + rtol * w.abs();
        assert!(ok, "{what}: first mismatch at {i}: got {g}, want {w}");
    }
}

/// Central-difference gradient of the scalar `loss(x)` with respect to every element of `x`.
/// The step is taken in `f32` and the actual `(x+h) - (x-h)` is the denominator.
fn numeric_gradient(x: &[f32], h: f32, loss: impl Fn(&[f32]) -> f64) -> Vec<f32> {
    let mut xs = x.to_vec();
    (0..x.len())
        .map(|i| {
            let (plus, minus) = (x[i] + h, x[i] - h);
            xs[i] = plus;
            let lp = loss(&xs);
            xs[i] = minus;
            let lm = loss(&xs);
            xs[i] = x[i];
            ((lp - lm) / (f64::from(plus) - f64::from(minus))) as f32
        })
        .collect()
}

/// `sum_i w_i v_i` in f64: a random linear functional, whose gradient is the backward with dy = w.
fn dot(w: &[f32], v: &[f32]) -> f64 {
    w.iter()
        .zip(v)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

// ---------------------------------------------------------------------------------- unary

#[test]
fn unary_backward_matches_finite_differences() {
    use unary::UnaryOp;
    for op in UnaryOp::ALL {
        for exponent in [3.0f64, 2.5, -1.5, 0.0] {
            if op != UnaryOp::Pow && exponent != 3.0 {
                continue;
            }
            let positive_only = matches!(op, UnaryOp::Log | UnaryOp::Sqrt)
                || (op == UnaryOp::Pow && exponent.fract() != 0.0);
            let points: &[f64] = if positive_only {
                &[0.3, 0.9, 1.7, 4.2]
            } else {
                &[-2.3, -0.7, -0.1, 0.2, 0.8, 1.9, 3.1]
            };
            for &x in points {
                let h = 1e-6;
                let numeric = (unary::apply(op, x + h, exponent)
                    - unary::apply(op, x - h, exponent))
                    / (2.0 * h);
                let saved = if op.backward_uses_output() {
                    unary::apply(op, x, exponent)
                } else {
                    x
                };
                let analytic = unary::apply_backward(op, saved, 1.0, exponent);
                assert!(
                    (numeric - analytic).abs() <= 1e-6 + 1e-6 * analytic.abs(),
                    "{op:?} p={exponent} at x={x}: analytic {analytic}, numeric {numeric}"
                );
            }
        }
    }
}

#[test]
fn unary_hand_worked_values() {
    // gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.5 (1 + tanh(0.8335565)) = 0.8411920
    // (PyTorch: F.gelu(torch.tensor(1.), approximate="tanh") = 0.8412).
    assert!((unary::gelu(1.0) - 0.841_191_990_6).abs() < 1e-9);
    assert_eq!(unary::gelu(0.0), 0.0);
    assert_eq!(unary::sigmoid(0.0), 0.5);
    // (-2)^3 = -8, (-2)^2 = 4, 4^0.5 = 2, 0^0 = 1, (-2)^0.5 = NaN
    let y = unary::forward(unary::UnaryOp::Pow, &[-2.0], 3.0);
    assert_eq!(y, [-8.0]);
    assert_eq!(unary::forward(unary::UnaryOp::Pow, &[-2.0], 2.0), [4.0]);
    assert_eq!(
        unary::forward(unary::UnaryOp::Pow, &[4.0, 0.0], 0.5)[0],
        2.0
    );
    assert_eq!(unary::forward(unary::UnaryOp::Pow, &[0.0], 0.0), [1.0]);
    assert!(unary::forward(unary::UnaryOp::Pow, &[-2.0], 0.5)[0].is_nan());
    // relu'(0) = 0 and |x|'(0) = 0, as PyTorch
    assert_eq!(
        unary::relu_backward(&[0.0, 2.0, -1.0], &[5.0, 5.0, 5.0]),
        [0.0, 5.0, 0.0]
    );
    assert_eq!(
        unary::backward(unary::UnaryOp::Abs, &[0.0, -3.0], &[5.0, 5.0], 0.0),
        [0.0, -5.0]
    );
    // tanh' from y = 0.5: 1 - 0.25 = 0.75; sigmoid' from y = 0.5: 0.25
    assert_eq!(unary::tanh_backward(&[0.5], &[2.0]), [1.5]);
    assert_eq!(unary::sigmoid_backward(&[0.5], &[2.0]), [0.5]);
    // extreme inputs stay finite where the function is
    let big = unary::forward(unary::UnaryOp::Sigmoid, &[-100.0, 100.0], 0.0);
    assert!(big[0] >= 0.0 && big[0] < 1e-40 && big[1] == 1.0, "{big:?}");
    assert_eq!(
        unary::gelu_backward(&[-30.0, 30.0], &[1.0, 1.0]),
        [0.0, 1.0]
    );
}

#[test]
fn unary_shader_codes_are_the_documented_order() {
    let codes: Vec<u32> = unary::UnaryOp::ALL
        .iter()
        .map(|op| op.shader_code())
        .collect();
    assert_eq!(codes, (0..10).collect::<Vec<_>>());
    let codes: Vec<u32> = binary::BinaryOp::ALL
        .iter()
        .map(|op| op.shader_code())
        .collect();
    assert_eq!(codes, (0..6).collect::<Vec<_>>());
}

// --------------------------------------------------------------------------------- binary

#[test]
fn binary_broadcast_hand_worked() {
    // [2,3] + [3]: b is repeated over rows; strides b = [0, 1]
    let shape = binary::Broadcast::new(&[2, 3], &[3]).expect("compatible");
    assert_eq!(shape.out_shape, [2, 3]);
    assert_eq!(shape.a_strides, [3, 1]);
    assert_eq!(shape.b_strides, [0, 1]);
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let out = binary::broadcast(binary::BinaryOp::Add, &a, &[10.0, 20.0, 30.0], &shape);
    assert_eq!(out, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    // [2,1] * [1,3] -> [2,3] outer product
    let shape = binary::Broadcast::new(&[2, 1], &[1, 3]).expect("compatible");
    assert_eq!(shape.out_shape, [2, 3]);
    let out = binary::broadcast(
        binary::BinaryOp::Mul,
        &[2.0, 3.0],
        &[1.0, 10.0, 100.0],
        &shape,
    );
    assert_eq!(out, [2.0, 20.0, 200.0, 3.0, 30.0, 300.0]);
    assert!(binary::Broadcast::new(&[2, 3], &[2]).is_none());
    // scalar forms: 1 - 5 = -4 and 5 - 1 = 4; max/min propagate NaN
    assert_eq!(
        binary::scalar_rhs(binary::BinaryOp::Sub, &[1.0], 5.0),
        [-4.0]
    );
    assert_eq!(
        binary::scalar_lhs(binary::BinaryOp::Sub, 5.0, &[1.0]),
        [4.0]
    );
    assert!(binary::BinaryOp::Max.apply(f32::NAN, 1.0).is_nan());
    assert!(binary::BinaryOp::Min.apply(1.0, f32::NAN).is_nan());
    // max tie: half of dy to each side (PyTorch maximum)
    assert_eq!(
        binary::BinaryOp::Max.apply_backward(2.0, 2.0, 1.0),
        (0.5, 0.5)
    );
}

#[test]
fn binary_backward_with_sum_to_shape_matches_finite_differences() {
    let mut rng = Rng(0x5eed_0001);
    let (a_shape, b_shape) = ([2usize, 1, 3], [4usize, 1]);
    let shape = binary::Broadcast::new(&a_shape, &b_shape).expect("compatible");
    let a = rng.vec(6, 0.5, 2.0);
    let b = rng.vec(4, 0.5, 2.0);
    let w = rng.vec(shape.len(), -1.0, 1.0);
    for op in binary::BinaryOp::ALL {
        let (da_full, db_full) = binary::backward(op, &a, &b, &w, &shape);
        let da = reduce::sum_to_shape(&da_full, &shape.out_shape, &a_shape).expect("reducible");
        let db = reduce::sum_to_shape(&db_full, &shape.out_shape, &b_shape).expect("reducible");
        let num_a = numeric_gradient(&a, 1e-3, |a| dot(&w, &binary::broadcast(op, a, &b, &shape)));
        let num_b = numeric_gradient(&b, 1e-3, |b| dot(&w, &binary::broadcast(op, &a, b, &shape)));
        assert_close(&format!("{op:?} da"), &da, &num_a, 2e-3, 2e-3);
        assert_close(&format!("{op:?} db"), &db, &num_b, 2e-3, 2e-3);
    }
}

// --------------------------------------------------------------------------------- reduce

#[test]
fn reduce_hand_worked() {
    // x of shape [2, 3, 2] = 0..12; axis 1: view [outer 2, axis 3, inner 2]
    let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let view = reduce::AxisView::of_shape(&[2, 3, 2], 1).expect("axis in range");
    assert_eq!(
        view,
        reduce::AxisView {
            outer: 2,
            axis_len: 3,
            inner: 2
        }
    );
    // out[0,0] = 0 + 2 + 4 = 6, out[0,1] = 1 + 3 + 5 = 9, out[1,0] = 6 + 8 + 10, out[1,1] = 27
    assert_eq!(reduce::sum_axis(&x, view), [6.0, 9.0, 24.0, 27.0]);
    assert_eq!(reduce::mean_axis(&x, view), [2.0, 3.0, 8.0, 9.0]);
    let (values, indices) = reduce::max_axis(&x, view);
    assert_eq!(values, [4.0, 5.0, 10.0, 11.0]);
    assert_eq!(indices, [2, 2, 2, 2]);
    let dx = reduce::max_backward(&[1.0, 2.0, 3.0, 4.0], &indices, view);
    assert_eq!(
        dx,
        [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0]
    );
    assert_eq!(reduce::sum_all(&x), 66.0);
    assert_eq!(reduce::mean_all(&x), 5.5);
    // ties: first index; NaN wins
    assert_eq!(reduce::max_all(&[1.0, 3.0, 3.0]), (3.0, 1));
    let (v, i) = reduce::max_all(&[1.0, f32::NAN, 5.0, f32::NAN]);
    assert!(v.is_nan());
    assert_eq!(i, 1);
    // sum_to_shape: [2,3] -> [3] sums rows, -> [2,1] sums columns, -> [] sums all
    let m = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    assert_eq!(
        reduce::sum_to_shape(&m, &[2, 3], &[3]),
        Some(vec![5.0, 7.0, 9.0])
    );
    assert_eq!(
        reduce::sum_to_shape(&m, &[2, 3], &[2, 1]),
        Some(vec![6.0, 15.0])
    );
    assert_eq!(reduce::sum_to_shape(&m, &[2, 3], &[]), Some(vec![21.0]));
    assert_eq!(reduce::sum_to_shape(&m, &[2, 3], &[2]), None);
}

// -------------------------------------------------------------------------------- softmax

#[test]
fn softmax_hand_worked_and_identities() {
    // softmax([1,2,3]) = e^(j-3) / (e^-2 + e^-1 + 1) = [0.09003057, 0.24472847, 0.66524096]
    let y = softmax::softmax(&[1.0, 2.0, 3.0], 1, 3);
    assert_close(
        "softmax [1,2,3]",
        &y,
        &[0.090_030_57, 0.244_728_47, 0.665_240_96],
        1e-7,
        1e-6,
    );
    // shift invariance, and no overflow at 1000
    let y_big = softmax::softmax(&[1001.0, 1002.0, 1003.0], 1, 3);
    assert_close("softmax shifted", &y_big, &y, 1e-7, 1e-6);
    // log_softmax = log(softmax), rows sum to 1
    let mut rng = Rng(0x5eed_0002);
    let (rows, cols) = (3, 7);
    let x = rng.vec(rows * cols, -4.0, 4.0);
    let s = softmax::softmax(&x, rows, cols);
    let ls = softmax::log_softmax(&x, rows, cols);
    let log_s: Vec<f32> = s.iter().map(|v| v.ln()).collect();
    assert_close("log_softmax = ln softmax", &ls, &log_s, 1e-6, 1e-5);
    for row in s.chunks(cols) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}

#[test]
fn softmax_backwards_match_finite_differences() {
    let mut rng = Rng(0x5eed_0003);
    let (rows, cols) = (3, 5);
    let x = rng.vec(rows * cols, -2.0, 2.0);
    let w = rng.vec(rows * cols, -1.0, 1.0);
    let y = softmax::softmax(&x, rows, cols);
    let analytic = softmax::softmax_backward(&y, &w, rows, cols);
    let numeric = numeric_gradient(&x, 1e-3, |x| dot(&w, &softmax::softmax(x, rows, cols)));
    assert_close("softmax backward", &analytic, &numeric, 1e-3, 1e-3);
    let ly = softmax::log_softmax(&x, rows, cols);
    let analytic = softmax::log_softmax_backward(&ly, &w, rows, cols);
    let numeric = numeric_gradient(&x, 1e-3, |x| dot(&w, &softmax::log_softmax(x, rows, cols)));
    assert_close("log_softmax backward", &analytic, &numeric, 1e-3, 1e-3);
}

// -------------------------------------------------------------------------- cross_entropy

#[test]
fn cross_entropy_hand_worked() {
    // uniform logits over 3 classes: loss = log 3 = 1.0986123 for any target and any smoothing
    let loss = cross_entropy::forward(&[0.0, 0.0, 0.0, 5.0, 5.0, 5.0], &[0, 2], 2, 3, 0.0);
    assert_close("ce uniform", &loss, &[1.098_612_3, 1.098_612_3], 1e-7, 1e-6);
    // logits [1,2,3], target 2: loss = -log softmax_2 = -ln 0.66524096 = 0.40760596;
    // with eps = 0.1: 0.9 * 0.40760596 + 0.1 * (lse - mean x), lse = 3.40760596, mean x = 2
    //   = 0.36684536 + 0.14076060 = 0.50760596
    let loss = cross_entropy::forward(&[1.0, 2.0, 3.0], &[2], 1, 3, 0.0);
    assert_close("ce [1,2,3]", &loss, &[0.407_605_96], 1e-7, 1e-6);
    let loss = cross_entropy::forward(&[1.0, 2.0, 3.0], &[2], 1, 3, 0.1);
    assert_close("ce [1,2,3] eps", &loss, &[0.507_605_96], 1e-7, 1e-6);
    // backward, mean over 1 row, eps 0: softmax - onehot = [0.0900306, 0.2447285, -0.3347590]
    let d = cross_entropy::backward(&[1.0, 2.0, 3.0], &[2], 1, 3, 0.0, &[1.0], 1.0);
    assert_close(
        "ce grad",
        &d,
        &[0.090_030_57, 0.244_728_47, -0.334_759_04],
        1e-7,
        1e-6,
    );
    // an invalid target gives NaN loss and NaN gradient for that row only
    let loss = cross_entropy::forward(&[0.0, 0.0, 1.0, 2.0], &[2, 1], 2, 2, 0.0);
    assert!(loss[0].is_nan() && loss[1].is_finite());
    let d = cross_entropy::backward(&[0.0, 0.0, 1.0, 2.0], &[2, 1], 2, 2, 0.0, &[1.0], 0.5);
    assert!(d[0].is_nan() && d[1].is_nan() && d[2].is_finite() && d[3].is_finite());
}

#[test]
fn cross_entropy_backward_matches_finite_differences() {
    let mut rng = Rng(0x5eed_0004);
    let (rows, cols) = (4, 6);
    let x = rng.vec(rows * cols, -3.0, 3.0);
    let targets = [0u32, 5, 2, 2];
    for smoothing in [0.0f32, 0.1] {
        // mean reduction: L = (1/rows) sum_r l_r, dloss = 0.7 (a device scalar), scale = 1/rows
        let analytic = cross_entropy::backward(&x, &targets, rows, cols, smoothing, &[0.7], 0.25);
        let numeric = numeric_gradient(&x, 1e-3, |x| {
            let l = cross_entropy::forward(x, &targets, rows, cols, smoothing);
            0.7 * l.iter().map(|&v| f64::from(v)).sum::<f64>() / rows as f64
        });
        assert_close("ce backward mean", &analytic, &numeric, 1e-3, 1e-3);
        // per-row dloss (reduction none)
        let w = rng.vec(rows, -1.0, 1.0);
        let analytic = cross_entropy::backward(&x, &targets, rows, cols, smoothing, &w, 1.0);
        let numeric = numeric_gradient(&x, 1e-3, |x| {
            dot(
                &w,
                &cross_entropy::forward(x, &targets, rows, cols, smoothing),
            )
        });
        assert_close("ce backward per-row", &analytic, &numeric, 1e-3, 1e-3);
    }
}

// ----------------------------------------------------------------------------- layer_norm

#[test]
fn layer_norm_hand_worked() {
    // x = [1, 2, 3, 4]: mean 2.5, var = (2.25 + 0.25 + 0.25 + 2.25)/4 = 1.25, eps 0:
    // rstd = 1/sqrt(1.25) = 0.8944272, y = [-1.3416408, -0.4472136, 0.4472136, 1.3416408]
    let f = layer_norm::forward(&[1.0, 2.0, 3.0, 4.0], &[1.0; 4], &[0.0; 4], 1, 4, 0.0);
    assert_close("ln mean", &f.mean, &[2.5], 0.0, 1e-7);
    assert_close("ln rstd", &f.rstd, &[0.894_427_2], 0.0, 1e-6);
    let want = [-1.341_640_8, -0.447_213_6, 0.447_213_6, 1.341_640_8];
    assert_close("ln y", &f.y, &want, 1e-7, 1e-6);
    // gamma 2, beta 1: y' = 2y + 1
    let f2 = layer_norm::forward(&[1.0, 2.0, 3.0, 4.0], &[2.0; 4], &[1.0; 4], 1, 4, 0.0);
    let want2: Vec<f32> = want.iter().map(|v| 2.0 * v + 1.0).collect();
    assert_close("ln affine", &f2.y, &want2, 1e-6, 1e-6);
}

#[test]
fn layer_norm_backward_matches_finite_differences() {
    let mut rng = Rng(0x5eed_0005);
    let (rows, cols, eps) = (3, 5, 1e-5);
    let x = rng.vec(rows * cols, -2.0, 2.0);
    let gamma = rng.vec(cols, 0.5, 1.5);
    let beta = rng.vec(cols, -0.5, 0.5);
    let w = rng.vec(rows * cols, -1.0, 1.0);
    let f = layer_norm::forward(&x, &gamma, &beta, rows, cols, eps);
    let b = layer_norm::backward(&x, &gamma, &f.mean, &f.rstd, &w, rows, cols);
    let loss = |x: &[f32], g: &[f32], bt: &[f32]| {
        dot(&w, &layer_norm::forward(x, g, bt, rows, cols, eps).y)
    };
    let num_x = numeric_gradient(&x, 1e-3, |x| loss(x, &gamma, &beta));
    let num_g = numeric_gradient(&gamma, 1e-3, |g| loss(&x, g, &beta));
    let num_b = numeric_gradient(&beta, 1e-3, |bt| loss(&x, &gamma, bt));
    assert_close("ln dx", &b.dx, &num_x, 2e-3, 2e-3);
    assert_close("ln dgamma", &b.dgamma, &num_g, 2e-3, 2e-3);
    assert_close("ln dbeta", &b.dbeta, &num_b, 2e-3, 2e-3);
}

// ------------------------------------------------------------------------------ embedding

#[test]
fn embedding_gather_and_scatter_are_adjoint() {
    // table [3, 2]; ids [2, 0, 2]
    let table = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let ids = [2u32, 0, 2];
    assert_eq!(
        embedding::gather(&table, &ids, 3, 2),
        [5.0, 6.0, 1.0, 2.0, 5.0, 6.0]
    );
    // row 2 gets dy rows 0 and 2, row 0 gets dy row 1, row 1 nothing
    let dy = [1.0, 10.0, 100.0, 1000.0, 2.0, 20.0];
    assert_eq!(
        embedding::scatter_add(&ids, &dy, 3, 2),
        [100.0, 1000.0, 0.0, 0.0, 3.0, 30.0]
    );
    // <gather(T), dy> = <T, scatter_add(dy)>: scatter_add is the transpose of gather
    let mut rng = Rng(0x5eed_0006);
    let (vocab, dim) = (7, 3);
    let ids = [6u32, 1, 1, 0, 3, 6, 6];
    let t = rng.vec(vocab * dim, -1.0, 1.0);
    let dy = rng.vec(ids.len() * dim, -1.0, 1.0);
    let lhs = dot(&embedding::gather(&t, &ids, vocab, dim), &dy);
    let rhs = dot(&t, &embedding::scatter_add(&ids, &dy, vocab, dim));
    assert!((lhs - rhs).abs() < 1e-5, "{lhs} vs {rhs}");
    // an out-of-range id gathers NaN and scatters nothing
    assert!(
        embedding::gather(&table, &[3], 3, 2)
            .iter()
            .all(|v| v.is_nan())
    );
    assert_eq!(embedding::scatter_add(&[3], &[1.0, 1.0], 3, 2), [0.0; 6]);
}

// ------------------------------------------------------------------------------ optimizer

#[test]
fn adamw_one_step_by_hand() {
    // p = 1, g = 0.5, lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, t = 1:
    // p <- 1 * (1 - 0.1*0.01) = 0.999; m = 0.1 * 0.5 = 0.05; v = 0.001 * 0.25 = 0.00025;
    // bc1 = 0.1, bc2 = 0.001: m_hat = 0.5, sqrt(v_hat) = 0.5;
    // p <- 0.999 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.999 - 0.09999999800 = 0.8990000020
    let config = optimizer::AdamWConfig {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let (mut p, mut m, mut v) = (vec![1.0f32], vec![0.0f32], vec![0.0f32]);
    optimizer::adamw_step(&mut p, &[0.5], &mut m, &mut v, &config, 1, 1.0);
    assert!((p[0] - 0.899).abs() < 1e-6, "p = {}", p[0]);
    assert!((m[0] - 0.05).abs() < 1e-8 && (v[0] - 0.000_25).abs() < 1e-10);
    // the first AdamW step moves every coordinate by about lr (sign of g), whatever |g|
    let (mut p, mut m, mut v) = (vec![0.0f32; 3], vec![0.0f32; 3], vec![0.0f32; 3]);
    let config = optimizer::AdamWConfig {
        weight_decay: 0.0,
        ..config
    };
    optimizer::adamw_step(
        &mut p,
        &[1e-3, -7.0, 300.0],
        &mut m,
        &mut v,
        &config,
        1,
        1.0,
    );
    assert_close("adamw first step", &p, &[-0.1, 0.1, -0.1], 1e-5, 1e-5);
    // the scalars are the f64 formulas rounded once
    let s = config.scalars(3);
    assert_eq!(s.step_size, (0.1 / (1.0 - 0.9f64.powi(3))) as f32);
    assert_eq!(
        s.bias_correction2_sqrt,
        (1.0 - 0.999f64.powi(3)).sqrt() as f32
    );
}

#[test]
fn sgd_steps_by_hand() {
    // momentum 0.9, lr 0.1, g = 1 on both steps, p0 = 1:
    // plain:    step 1: buf = g = 1, p = 1 - 0.1 = 0.9; step 2: buf = 0.9 + 1 = 1.9, p = 0.71
    // nesterov: step 1: update = 1 + 0.9*1 = 1.9, p = 0.81; step 2: buf = 1.9,
    //           update = 1 + 0.9*1.9 = 2.71, p = 0.81 - 0.271 = 0.539
    for (nesterov, want) in [(false, [0.9f32, 0.71]), (true, [0.81, 0.539])] {
        let config = optimizer::SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov,
        };
        let (mut p, mut buf) = (vec![1.0f32], vec![0.0f32]);
        optimizer::sgd_step(&mut p, &[1.0], &mut buf, &config, true, 1.0);
        assert!(
            (p[0] - want[0]).abs() < 1e-6,
            "nesterov={nesterov} step 1: {}",
            p[0]
        );
        optimizer::sgd_step(&mut p, &[1.0], &mut buf, &config, false, 1.0);
        assert!(
            (p[0] - want[1]).abs() < 1e-6,
            "nesterov={nesterov} step 2: {}",
            p[0]
        );
    }
    // weight decay 0.5, dampening 0.5, no momentum buffer on step 1 dampening:
    // step 1: g = 1 + 0.5*1 = 1.5, buf = 1.5, p = 1 - 0.15 = 0.85
    // step 2: g = 1 + 0.5*0.85 = 1.425, buf = 0.9*1.5 + 0.5*1.425 = 2.0625, p = 0.85 - 0.20625
    let config = optimizer::SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.5,
        weight_decay: 0.5,
        nesterov: false,
    };
    let (mut p, mut buf) = (vec![1.0f32], vec![0.0f32]);
    optimizer::sgd_step(&mut p, &[1.0], &mut buf, &config, true, 1.0);
    optimizer::sgd_step(&mut p, &[1.0], &mut buf, &config, false, 1.0);
    assert!(
        (p[0] - 0.643_75).abs() < 1e-6 && (buf[0] - 2.0625).abs() < 1e-6,
        "{p:?} {buf:?}"
    );
    // no momentum: plain p -= lr * g * grad_scale (grad_scale 0.5 unscales)
    let config = optimizer::SgdConfig {
        momentum: 0.0,
        weight_decay: 0.0,
        ..config
    };
    let (mut p, mut buf) = (vec![1.0f32], vec![42.0f32]);
    optimizer::sgd_step(&mut p, &[2.0], &mut buf, &config, true, 0.5);
    assert_eq!((p[0], buf[0]), (0.9, 42.0));
}

// ------------------------------------------------------------------------------ nonfinite

#[test]
fn nonfinite_flags() {
    assert_eq!(
        nonfinite::flags(&[1.0, 2.0, f32::MAX]),
        [0, nonfinite::NO_INDEX]
    );
    assert_eq!(nonfinite::flags(&[1.0, f32::INFINITY, f32::NAN]), [1, 1]);
    assert_eq!(nonfinite::flags(&[f32::NAN]), [1, 0]);
    assert_eq!(
        nonfinite::first_nonfinite(&[0.0, -0.0, f32::NEG_INFINITY]),
        Some(2)
    );
}

// -------------------------------------------------------------------------------- convert

#[test]
fn f16_round_trips_and_hand_worked_bits() {
    // exactly representable values survive: 1, -2.5, 65504 (max half), 0.5, -0, 2^-14 (min
    // normal), 2^-24 (min subnormal), 3.140625
    let exact = [
        1.0,
        -2.5,
        65504.0,
        0.5,
        -0.0,
        2f32.powi(-14),
        2f32.powi(-24),
        3.140_625,
    ];
    let back = convert::round_to_f16(&exact);
    for (a, b) in exact.iter().zip(&back) {
        assert_eq!(a.to_bits(), b.to_bits(), "{a} round-tripped to {b}");
    }
    // 0.1 = 0x2E66.66.. in half units -> 0x2e66 = 0.099975586 (WGPU30.md §6)
    assert_eq!(convert::f32_to_f16_bits(0.1), 0x2e66);
    assert_eq!(convert::round_to_f16(&[0.1]), [0.099_975_586]);
    // layout: [1.0, -2.5] -> 0xc1003c00 (element 0 in the low half); odd length: high half 0
    assert_eq!(
        convert::pack_f16(&[1.0, -2.5, 1.0]),
        [0xc100_3c00, 0x0000_3c00]
    );
    // ties to even: 1 + 2^-11 is halfway between 0x3c00 and 0x3c01 -> 0x3c00 (even);
    // 1 + 3*2^-11 is halfway between 0x3c01 and 0x3c02 -> 0x3c02 (even)
    assert_eq!(convert::f32_to_f16_bits(1.0 + 2f32.powi(-11)), 0x3c00);
    assert_eq!(convert::f32_to_f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
    // overflow: 65519 -> 65504, 65520 -> inf, 70000 -> inf; NaN stays NaN; 1e-8 -> 0
    assert_eq!(convert::f32_to_f16_bits(65519.0), 0x7bff);
    assert_eq!(convert::f32_to_f16_bits(65520.0), 0x7c00);
    assert_eq!(convert::f32_to_f16_bits(-70000.0), 0xfc00);
    assert!(convert::f16_bits_to_f32(convert::f32_to_f16_bits(f32::NAN)).is_nan());
    assert_eq!(convert::f32_to_f16_bits(1e-8), 0x0000);
}

#[test]
fn every_half_round_trips_through_f32() {
    for h in 0..=u16::MAX {
        let v = convert::f16_bits_to_f32(h);
        if v.is_nan() {
            assert!(
                h & 0x7c00 == 0x7c00 && h & 0x3ff != 0,
                "{h:#06x} decoded to NaN"
            );
            continue;
        }
        assert_eq!(
            convert::f32_to_f16_bits(v),
            h,
            "{h:#06x} -> {v} did not round-trip"
        );
    }
}
