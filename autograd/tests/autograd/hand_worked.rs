//! Hand-worked gradients, with the derivation in a comment.

use plimsoll_autograd::{Tensor, TensorOptions};
use plimsoll_kernels_wgsl::testing::{assert_close, gpu};

use crate::common::param;

fn grad(t: &Tensor) -> Vec<f32> {
    t.grad().unwrap().to_vec().unwrap()
}

#[test]
fn broadcast_mul_sums_over_the_broadcast_axis() {
    // y = a * b with a: [2, 3], b: [3] broadcast over rows; L = Σ y.
    // dL/da[i][j] = b[j]; dL/db[j] = Σ_i a[i][j].
    let gpu = gpu();
    let a = param(&gpu, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = param(&gpu, &[10.0, 20.0, 30.0], &[3]);
    a.mul(&b).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&a), vec![10.0, 20.0, 30.0, 10.0, 20.0, 30.0]);
    assert_eq!(grad(&b), vec![5.0, 7.0, 9.0]);
}

#[test]
fn matmul_two_by_two() {
    // C = A B with A = [[1, 2], [3, 4]], B = [[5, 6], [7, 8]]; L = Σ C.
    // dL/dA = 1 Bᵀ: row i is (Σ_j B[0][j], Σ_j B[1][j]) = (11, 15);
    // dL/dB = Aᵀ 1: row k is (Σ_i A[i][k]) repeated = (4, 4), (6, 6).
    let gpu = gpu();
    let a = param(&gpu, &[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = param(&gpu, &[5.0, 6.0, 7.0, 8.0], &[2, 2]);
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.to_vec().unwrap(), vec![19.0, 22.0, 43.0, 50.0]);
    c.sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&a), vec![11.0, 15.0, 11.0, 15.0]);
    assert_eq!(grad(&b), vec![4.0, 4.0, 6.0, 6.0]);
}

/// Matmul backward writes a leaf's gradient straight into its slot (a `Gradient` buffer, no
/// temporary) and accumulates into an existing one with the kernel's accumulate flag: a second
/// backward doubles it, and `A · A` (the same leaf twice) gets both terms.
#[test]
fn matmul_gradients_go_straight_into_leaf_slots_and_accumulate() {
    let gpu = gpu();
    let a = param(&gpu, &[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = param(&gpu, &[5.0, 6.0, 7.0, 8.0], &[2, 2]);
    for _ in 0..2 {
        a.matmul(&b).unwrap().sum_all().unwrap().backward().unwrap();
    }
    assert_eq!(grad(&a), vec![22.0, 30.0, 22.0, 30.0]);
    assert_eq!(grad(&b), vec![8.0, 8.0, 12.0, 12.0]);
    assert_eq!(
        a.grad().unwrap().category(),
        plimsoll_kernels_wgsl::Category::Gradient
    );
    // L = Σ (A·A): dL/dA[p][q] = rowsum(A)[q] + colsum(A)[p], rowsums (3, 7), colsums (4, 6).
    a.clear_grad();
    a.matmul(&a).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&a), vec![7.0, 11.0, 9.0, 13.0]);
}

#[test]
fn cross_entropy_of_uniform_logits() {
    // Logits all 0 over 4 classes: p = 1/4 each, loss = ln 4 per row, mean = ln 4.
    // dL/dx[r][j] = (p_j - onehot_j) / rows = (0.25 - [j = t]) / 2.
    let gpu = gpu();
    let x = param(&gpu, &[0.0; 8], &[2, 4]);
    let t = Tensor::from_indices(&gpu, &[1, 3], &[2]).unwrap();
    let loss = x.cross_entropy(&t, 0.0).unwrap();
    assert_close("loss", &[loss.item().unwrap()], &[4f64.ln()], 1e-6, 1e-6);
    loss.backward().unwrap();
    let want = [0.125, -0.375, 0.125, 0.125, 0.125, 0.125, 0.125, -0.375];
    assert_close("dx", &grad(&x), &want, 1e-6, 1e-6);
}

#[test]
fn max_sends_the_gradient_to_the_arg_max() {
    // y = max over axis 1 of [[1, 5, 2], [7, 0, 7]]: (5, 7); the first of equal values wins.
    // L = 2 y[0] + 3 y[1]: dL/dx = [[0, 2, 0], [3, 0, 0]].
    let gpu = gpu();
    let x = param(&gpu, &[1.0, 5.0, 2.0, 7.0, 0.0, 7.0], &[2, 3]);
    let y = x.max(1, false).unwrap();
    assert_eq!(y.to_vec().unwrap(), vec![5.0, 7.0]);
    let w = Tensor::from_slice(&gpu, &[2.0, 3.0], &[2]).unwrap();
    y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(grad(&x), vec![0.0, 2.0, 0.0, 3.0, 0.0, 0.0]);
}

#[test]
fn fan_out_accumulates() {
    // y = x * x + x uses x three times: dy/dx = 2x + 1 = 7 at x = 3 (micrograd's += rule).
    let gpu = gpu();
    let x = param(&gpu, &[3.0], &[1]);
    x.mul(&x)
        .unwrap()
        .add(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grad(&x), vec![7.0]);
}

#[test]
fn dropout_backward_uses_the_forward_mask() {
    // y = dropout(x): y_i = x_i m_i / (1 - p), so dL/dx_i = m_i / (1 - p) for L = Σ y, and
    // the kept positions of y and of the gradient coincide.
    let gpu = gpu();
    let x = Tensor::ones(&gpu, &[1000], TensorOptions::parameter("x")).unwrap();
    let y = x.dropout_with_seed(0.25, 99).unwrap();
    let yv = y.to_vec().unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let g = grad(&x);
    assert_eq!(yv, g);
    let want = plimsoll_kernels_wgsl::kernels::dropout::reference::dropout(&[1.0; 1000], 0.25, 99);
    assert_eq!(g, want);
}

/// `linear(x, W, b, relu)` is `x·Wᵀ`, `+ b` and `relu` in one kernel: the output and all three
/// gradients equal the unfused ops' bit for bit (the same additions in the same order), on a
/// product large enough for the vec4 entry point and on a small one; shapes that do not fit are
/// refused.
#[test]
fn linear_equals_matmul_add_relu() {
    use plimsoll_autograd::Error;
    use plimsoll_kernels_wgsl::testing::Rng;
    let gpu = gpu();
    for (rows, n, k) in [(6usize, 5usize, 3usize), (128, 256, 128)] {
        for relu in [false, true] {
            let mut rng = Rng::new((rows * 31 + n) as u64);
            let xs = rng.vec_f32(rows * k, -1.0, 1.0);
            let ws = rng.vec_f32(n * k, -1.0, 1.0);
            let bs = rng.vec_f32(n, -1.0, 1.0);
            let gs = rng.vec_f32(rows * n, -1.0, 1.0);
            let run = |fused: bool| {
                let x = crate::common::param(&gpu, &xs, &[rows, k]);
                let w = crate::common::param(&gpu, &ws, &[n, k]);
                let b = crate::common::param(&gpu, &bs, &[n]);
                let y = if fused {
                    x.linear(&w, &b, relu).unwrap()
                } else {
                    let z = x.matmul_transposed(&w).unwrap().add(&b).unwrap();
                    if relu { z.relu().unwrap() } else { z }
                };
                let g = Tensor::from_slice(&gpu, &gs, &[rows, n]).unwrap();
                let out = y.to_vec().unwrap();
                y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                [out, grad(&x), grad(&w), grad(&b)].map(bits)
            };
            let (fused, unfused) = (run(true), run(false));
            for (i, what) in ["output", "dx", "dW", "db"].iter().enumerate() {
                assert!(
                    fused[i] == unfused[i],
                    "{what} differs: rows {rows} n {n} k {k} relu {relu}"
                );
            }
        }
    }
    let x = param(&gpu, &[1.0; 6], &[2, 3]);
    let w = param(&gpu, &[1.0; 6], &[2, 3]);
    let bad_w = param(&gpu, &[1.0; 6], &[3, 2]);
    let b = param(&gpu, &[1.0; 2], &[2]);
    let bad_b = param(&gpu, &[1.0; 3], &[3]);
    for (w, b) in [(&bad_w, &b), (&w, &bad_b)] {
        assert!(matches!(
            x.linear(w, b, true),
            Err(Error::ShapeMismatch { op: "linear", .. })
        ));
    }
}

/// `want_grad_squares`: the weight-gradient matmul of the next backward leaves partial sums
/// whose sum is the gradient's squared norm (the oracle: the gradient read back, squared and
/// summed in f64), also when it accumulates onto a gradient already there (the squares of the
/// sum); anything else that then changes the gradient (here an embedding lookup of the same
/// table) makes them stale (`None`); a bias (not written by a matmul) gets none; `take` ends the
/// request, and `clear_grad` drops it.
#[test]
fn grad_squares_come_from_the_weight_gradient_matmul() {
    use plimsoll_kernels_wgsl::testing::Rng;
    let gpu = gpu();
    let mut rng = Rng::new(77);
    let (rows, n, k) = (130, 260, 124); // large enough for the vec4 entry point
    let x = Tensor::from_slice(&gpu, &rng.vec_f32(rows * k, -1.0, 1.0), &[rows, k]).unwrap();
    let w = param(&gpu, &rng.vec_f32(n * k, -1.0, 1.0), &[n, k]);
    let b = param(&gpu, &rng.vec_f32(n, -1.0, 1.0), &[n]);
    let squared = |t: &Tensor| -> f64 {
        t.grad()
            .unwrap()
            .to_vec()
            .unwrap()
            .iter()
            .map(|&v| f64::from(v).powi(2))
            .sum()
    };
    let summed = |p: Tensor| -> f64 { p.to_vec().unwrap().iter().map(|&v| f64::from(v)).sum() };
    let loss = |relu: bool| x.linear(&w, &b, relu).unwrap().sum_all().unwrap();
    // Fresh, then accumulated onto (the second backward's squares are of the sum).
    for round in 0..2 {
        w.want_grad_squares();
        b.want_grad_squares();
        loss(round == 1).backward().unwrap();
        let got = summed(w.take_grad_squares().unwrap());
        let want = squared(&w);
        assert!(
            (got - want).abs() <= 1e-5 * want,
            "round {round}: {got} against {want}"
        );
        assert!(
            b.take_grad_squares().is_none(),
            "the bias's gradient is no matmul's"
        );
        assert!(w.take_grad_squares().is_none(), "take ends the request");
    }
    // Not asked: none.
    loss(false).backward().unwrap();
    assert!(w.take_grad_squares().is_none());
    // The same table also looked up: backward runs the ops in reverse. Looked up after the
    // product, its gradient lands first and the matmul accumulates last: the squares are of
    // the whole gradient. Looked up before, its gradient lands after the matmul's: stale.
    let ids = Tensor::from_indices(&gpu, &[1, 2], &[2]).unwrap();
    let looked_up = || w.embedding(&ids).unwrap().sum_all().unwrap();
    w.clear_grad();
    w.want_grad_squares();
    loss(false).add(&looked_up()).unwrap().backward().unwrap();
    let (got, want) = (summed(w.take_grad_squares().unwrap()), squared(&w));
    assert!(
        (got - want).abs() <= 1e-5 * want,
        "matmul last: {got} against {want}"
    );
    w.clear_grad();
    w.want_grad_squares();
    let first = looked_up();
    first.add(&loss(false)).unwrap().backward().unwrap();
    assert!(
        w.take_grad_squares().is_none(),
        "stale after the embedding's gradient"
    );
    // clear_grad drops a request.
    w.want_grad_squares();
    w.clear_grad();
    loss(false).backward().unwrap();
    assert!(w.take_grad_squares().is_none());
}
