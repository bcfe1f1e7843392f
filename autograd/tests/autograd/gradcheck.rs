//! Gradient check for every op: the GPU backward against central finite differences of the f64
//! forwards in each family's CPU reference (`plimsoll_kernels_wgsl::kernels::<stem>::reference`;
//! `reference::<stem>` for a family not yet in the one-place layout), the oracle the kernel tests
//! use too, over random small shapes (proptest, 16 cases). The loss is `L = Σ op(inputs) ⊙ w`
//! with fixed random `w`, so every output element's gradient matters. The forward is checked against the
//! same reference on the way. Unary and binary ops are visited from `UnaryOp::ALL` and
//! `BinaryOp::ALL`, every op in every case, so a new op is checked without a new table row.

use plimsoll_autograd::{Derivative, Grads, Result, Tensor, no_grad};
use plimsoll_kernels_wgsl::kernels::binary::reference as binary;
use plimsoll_kernels_wgsl::kernels::binary::{BinaryOp, Broadcast, contiguous_strides};
use plimsoll_kernels_wgsl::kernels::copy::reference as copy;
use plimsoll_kernels_wgsl::kernels::cross_entropy::reference as cross_entropy;
use plimsoll_kernels_wgsl::kernels::dropout::reference as dropout;
use plimsoll_kernels_wgsl::kernels::layer_norm::reference as layer_norm;
use plimsoll_kernels_wgsl::kernels::matmul::MatmulDims;
use plimsoll_kernels_wgsl::kernels::matmul::reference as matmul;
use plimsoll_kernels_wgsl::kernels::reduce::AxisView;
use plimsoll_kernels_wgsl::kernels::reduce::reference as reduce;
use plimsoll_kernels_wgsl::kernels::softmax::reference as softmax;
use plimsoll_kernels_wgsl::kernels::unary::UnaryOp;
use plimsoll_kernels_wgsl::kernels::unary::reference as unary;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, gpu};
use proptest::prelude::*;

use crate::common::param;

/// Finite-difference step (f64 forwards: truncation ~h², rounding ~1e-16/h).
const STEP: f64 = 1e-4;

/// One input: values and shape.
type Input = (Vec<f32>, Vec<usize>);
/// A scalar form: name, GPU method, the binary op it computes, and whether the scalar is its
/// right operand (`x op s`) or its left one (`s op x`).
type ScalarCase = (
    &'static str,
    fn(&Tensor, f32) -> Result<Tensor>,
    BinaryOp,
    bool,
);

/// Checks `gpu_op` (forward and backward) against `cpu_op` (f64) at `inputs`.
fn check(
    name: &str,
    inputs: &[Input],
    gpu_op: impl Fn(&[Tensor]) -> Result<Tensor>,
    cpu_op: impl Fn(&[Vec<f64>]) -> Vec<f64>,
) {
    let gpu = gpu();
    let leaves: Vec<Tensor> = inputs.iter().map(|(d, s)| param(&gpu, d, s)).collect();
    let x64: Vec<Vec<f64>> = inputs
        .iter()
        .map(|(d, _)| d.iter().map(|&v| f64::from(v)).collect())
        .collect();
    let out = gpu_op(&leaves).unwrap();
    let want = cpu_op(&x64);
    assert_close(
        &format!("{name} forward"),
        &out.to_vec().unwrap(),
        &want,
        1e-4,
        1e-4,
    );
    let w = Rng::new(want.len() as u64 + 17).vec_f32(want.len(), -1.0, 1.0);
    let w_tensor = Tensor::from_slice(&gpu, &w, out.shape()).unwrap();
    out.mul(&w_tensor)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let loss = |x: &[Vec<f64>]| -> f64 {
        cpu_op(x)
            .iter()
            .zip(&w)
            .map(|(y, &w)| y * f64::from(w))
            .sum()
    };
    for (k, leaf) in leaves.iter().enumerate() {
        let mut x = x64.clone();
        let fd: Vec<f64> = (0..x[k].len())
            .map(|i| {
                let v = x[k][i];
                x[k][i] = v + STEP;
                let plus = loss(&x);
                x[k][i] = v - STEP;
                let minus = loss(&x);
                x[k][i] = v;
                (plus - minus) / (2.0 * STEP)
            })
            .collect();
        let got = leaf
            .grad()
            .map(|g| g.to_vec().unwrap())
            .unwrap_or_else(|| vec![0.0; fd.len()]);
        assert_close(
            &format!("{name} d/dinput{k} {:?}", inputs[k].1),
            &got,
            &fd,
            2e-3,
            2e-3,
        );
    }
}

// ---- input domains and GPU methods (the math is in `reference`) ----

/// `[outer, axis, inner]` of `shape` at `axis`.
fn view(shape: &[usize], axis: usize) -> AxisView {
    AxisView::of_shape(shape, axis).unwrap()
}

/// `x` (row-major, `shape`) with its axes permuted: output axis `d` is input axis `perm[d]`.
fn permute64(x: &[f64], shape: &[usize], perm: &[usize]) -> Vec<f64> {
    let strides = contiguous_strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let src_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let mut out = vec![0.0; x.len()];
    copy::strided_copy(x, 0, &out_shape, &src_strides, &mut out, 0);
    out
}

/// The tensor method of each binary op. Exhaustive, so a new op does not compile until its
/// method is here; the check then covers it.
fn binary_method(op: BinaryOp) -> fn(&Tensor, &Tensor) -> Result<Tensor> {
    match op {
        BinaryOp::Add => Tensor::add,
        BinaryOp::Sub => Tensor::sub,
        BinaryOp::Mul => Tensor::mul,
        BinaryOp::Div => Tensor::div,
        BinaryOp::Max => Tensor::maximum,
        BinaryOp::Min => Tensor::minimum,
    }
}

/// Where the gradient check of `op` draws its inputs: `(low, high, both_signs)`, values in
/// `[low, high)`, each negated at random when `both_signs`. Every op not named gets the default.
fn unary_domain(op: UnaryOp) -> (f32, f32, bool) {
    match op {
        // ln, sqrt and x^2.5 are real (and smooth) only for x > 0.
        UnaryOp::Log | UnaryOp::Sqrt => (0.3, 3.0, false),
        UnaryOp::Pow => (0.3, 2.0, false),
        // A kink at 0: both signs, but never within a finite-difference step of it.
        UnaryOp::Relu | UnaryOp::Abs => (0.05, 2.0, true),
        // Wide enough to reach the tails.
        UnaryOp::Gelu | UnaryOp::Sigmoid => (-3.0, 3.0, false),
        _ => (-2.0, 2.0, false),
    }
}

/// `len` inputs for `op`, drawn from [`unary_domain`].
fn unary_input(op: UnaryOp, seed: u64, len: usize) -> Vec<f32> {
    let (low, high, both_signs) = unary_domain(op);
    let mut rng = Rng::new(seed);
    let mut x = rng.vec_f32(len, low, high);
    if both_signs {
        for v in &mut x {
            if rng.below(2) == 0 {
                *v = -*v;
            }
        }
    }
    x
}

fn dims() -> impl Strategy<Value = (usize, usize, usize)> {
    (1usize..5, 1usize..5, 1usize..4)
}

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn gradcheck_binary_broadcast((r, c, _) in dims(), seed in any::<u64>(), row in any::<bool>()) {
        // b broadcasts along rows ([c]) or columns ([r, 1]); denominators kept away from 0.
        let (sa, sb) = (vec![r, c], if row { vec![c] } else { vec![r, 1] });
        let shape = Broadcast::new(&sa, &sb).unwrap();
        let b = Rng::new(seed ^ 1).vec_f32(sb.iter().product(), 0.5, 2.0);
        for op in BinaryOp::ALL {
            let mut a = Rng::new(seed).vec_f32(r * c, -2.0, 2.0);
            if matches!(op, BinaryOp::Max | BinaryOp::Min) {
                // max and min have a kink where a = b (and split ties): keep every pair 0.1 apart,
                // far beyond the finite-difference step.
                for i in 0..shape.len() {
                    let (ia, ib) = shape.operand_offsets(i);
                    if (a[ia] - b[ib]).abs() < 0.1 {
                        a[ia] = b[ib] + 0.2;
                    }
                }
            }
            let cpu = |x: &[Vec<f64>]| binary::broadcast_f64(op, &x[0], &x[1], &shape);
            let method = binary_method(op);
            let inputs = [(a, sa.clone()), (b.clone(), sb.clone())];
            check(&format!("{op:?}"), &inputs, |t| method(&t[0], &t[1]), cpu);
        }
    }

    #[test]
    fn gradcheck_scalar_forms((r, c, _) in dims(), seed in any::<u64>(), which in 0usize..6) {
        let x = (Rng::new(seed).vec_f32(r * c, 0.5, 2.0), vec![r, c]);
        let s = 1.75f32;
        let ops: [ScalarCase; 6] = [
            ("add_scalar", Tensor::add_scalar, BinaryOp::Add, true),
            ("sub_scalar", Tensor::sub_scalar, BinaryOp::Sub, true),
            ("mul_scalar", Tensor::mul_scalar, BinaryOp::Mul, true),
            ("div_scalar", Tensor::div_scalar, BinaryOp::Div, true),
            ("scalar_sub", Tensor::scalar_sub, BinaryOp::Sub, false),
            ("scalar_div", Tensor::scalar_div, BinaryOp::Div, false),
        ];
        let (name, g, op, scalar_rhs) = ops[which];
        let s64 = f64::from(s);
        let cpu = |x: &[Vec<f64>]| {
            x[0].iter()
                .map(|&v| if scalar_rhs { op.apply_f64(v, s64) } else { op.apply_f64(s64, v) })
                .collect()
        };
        check(name, &[x], |t| g(&t[0], s), cpu);
    }

    #[test]
    fn gradcheck_unary((r, c, d) in dims(), seed in any::<u64>()) {
        for op in UnaryOp::ALL {
            let x = (unary_input(op, seed, r * c * d), vec![r, c, d]);
            let exponent = if op == UnaryOp::Pow { 2.5 } else { 0.0 };
            let e64 = f64::from(exponent);
            let cpu = |x: &[Vec<f64>]| x[0].iter().map(|&v| unary::apply(op, v, e64)).collect();
            check(&format!("{op:?}"), &[x], |t| t[0].unary(op, exponent), cpu);
        }
    }

    #[test]
    fn gradcheck_matmul((b, m, k) in dims(), n in 1usize..6, seed in any::<u64>(), layout in 0usize..3) {
        // layout 0: both batched; 1: shared right matrix (a linear layer); 2: shared left matrix.
        let shared = (layout == 2, layout == 1);
        let sa = if shared.0 { vec![m, k] } else { vec![b, m, k] };
        let sb = if shared.1 { vec![k, n] } else { vec![b, k, n] };
        // A batch stride of 0 gives every batch the same matrix.
        let dims = MatmulDims {
            batch_stride_a: if shared.0 { 0 } else { m * k },
            batch_stride_b: if shared.1 { 0 } else { k * n },
            ..MatmulDims::dense(b, m, n, k)
        };
        let a = (Rng::new(seed).vec_f32(sa.iter().product(), -1.0, 1.0), sa);
        let bb = (Rng::new(seed ^ 3).vec_f32(sb.iter().product(), -1.0, 1.0), sb);
        check("matmul", &[a, bb], |t| t[0].matmul(&t[1]), |x| matmul::matmul_f64(&x[0], &x[1], &dims));
    }

    #[test]
    fn gradcheck_matmul_transposed((b, m, k) in dims(), n in 1usize..6, seed in any::<u64>(), rank in 1usize..4) {
        // x [.., k] of rank 1, 2 or 3 against W [n, k]: y = x · Wᵀ (PyTorch's linear layer).
        let sx: Vec<usize> = [b, m, k][3 - rank..].to_vec();
        let rows: usize = sx[..rank - 1].iter().product();
        let dims = MatmulDims { trans_b: true, ..MatmulDims::dense(1, rows, n, k) };
        let x = (Rng::new(seed).vec_f32(rows * k, -1.0, 1.0), sx);
        let w = (Rng::new(seed ^ 5).vec_f32(n * k, -1.0, 1.0), vec![n, k]);
        check("matmul_transposed", &[x, w], |t| t[0].matmul_transposed(&t[1]), |x| matmul::matmul_f64(&x[0], &x[1], &dims));
    }

    #[test]
    fn gradcheck_linear((b, m, k) in dims(), n in 1usize..6, seed in any::<u64>(), relu in any::<bool>()) {
        // x [b, m, k] · W [n, k]ᵀ + bias [n], then ReLU or not: one kernel (Tensor::linear).
        let rows = b * m;
        let dims = MatmulDims { trans_b: true, ..MatmulDims::dense(1, rows, n, k) };
        let x = (Rng::new(seed).vec_f32(rows * k, -1.0, 1.0), vec![b, m, k]);
        let w = (Rng::new(seed ^ 5).vec_f32(n * k, -1.0, 1.0), vec![n, k]);
        let bias = (Rng::new(seed ^ 9).vec_f32(n, -1.0, 1.0), vec![n]);
        let pre = |x: &[Vec<f64>]| matmul::matmul_f64(&x[0], &x[1], &dims).into_iter()
            .enumerate()
            .map(|(i, v)| v + x[2][i % n])
            .collect::<Vec<f64>>();
        // Not at ReLU's kink: there the f32 kernel and the f64 reference may take different
        // sides of it (or the differences straddle it), and the derivatives then differ.
        let inputs: Vec<Vec<f64>> = [&x, &w, &bias].iter().map(|(d, _)| d.iter().map(|&v| f64::from(v)).collect()).collect();
        prop_assume!(!relu || pre(&inputs).iter().all(|z| z.abs() > 1e-3));
        let cpu = |x: &[Vec<f64>]| pre(x).into_iter()
            .map(|v| if relu { v.max(0.0) } else { v })
            .collect();
        check("linear", &[x, w, bias], |t| t[0].linear(&t[1], &t[2], relu), cpu);
    }

    #[test]
    fn gradcheck_batched_matmul_transposed((b, m, k) in dims(), n in 1usize..6, h in 1usize..3, seed in any::<u64>()) {
        // q [b, h, m, k] against k [b, h, n, k]: attention's scores q · kᵀ, batched.
        let batch = b * h;
        let dims = MatmulDims {
            trans_b: true,
            batch_stride_a: m * k,
            batch_stride_b: n * k,
            ..MatmulDims::dense(batch, m, n, k)
        };
        let q = (Rng::new(seed).vec_f32(batch * m * k, -1.0, 1.0), vec![b, h, m, k]);
        let kk = (Rng::new(seed ^ 7).vec_f32(batch * n * k, -1.0, 1.0), vec![b, h, n, k]);
        check("matmul_transposed batched", &[q, kk], |t| t[0].matmul_transposed(&t[1]), |x| matmul::matmul_f64(&x[0], &x[1], &dims));
        // Scaled by the kernel, as attention's q · kᵀ / sqrt(d).
        let q = (Rng::new(seed ^ 1).vec_f32(batch * m * k, -1.0, 1.0), vec![b, h, m, k]);
        let kk = (Rng::new(seed ^ 2).vec_f32(batch * n * k, -1.0, 1.0), vec![b, h, n, k]);
        let cpu = |x: &[Vec<f64>]| matmul::matmul_f64(&x[0], &x[1], &dims).into_iter().map(|v| -0.37 * v).collect();
        check("matmul_transposed_scaled", &[q, kk], |t| t[0].matmul_transposed_scaled(&t[1], -0.37), cpu);
    }

    #[test]
    fn gradcheck_softmax_causal((b, t, _) in dims(), seed in any::<u64>()) {
        // [b, t, t] scores: row i of each block normalised over columns 0..=i, 0 after.
        let x = (Rng::new(seed).vec_f32(b * t * t, -2.0, 2.0), vec![b, t, t]);
        let cpu = |x: &[Vec<f64>]| {
            let mut out = vec![0.0; x[0].len()];
            for (r, row) in x[0].chunks(t).enumerate() {
                let seen = r % t + 1;
                let y = softmax::softmax_f64(&row[..seen], 1, seen);
                out[r * t..r * t + seen].copy_from_slice(&y);
            }
            out
        };
        check("softmax_causal", &[x], |t| t[0].softmax_causal(), cpu);
    }

    #[test]
    fn gradcheck_shape_ops((r, c, d) in dims(), seed in any::<u64>(), which in 0usize..4) {
        let shape = vec![r, c, d];
        let x = (Rng::new(seed).vec_f32(r * c * d, -2.0, 2.0), shape.clone());
        match which {
            0 => check("transpose", &[x], |t| t[0].transpose(0, 2), |x| permute64(&x[0], &shape, &[2, 1, 0])),
            1 => check("permute", &[x], |t| t[0].permute(&[1, 2, 0]), |x| permute64(&x[0], &shape, &[1, 2, 0])),
            2 => check("reshape", &[x], |t| t[0].reshape(&[r * c, d])?.mul_scalar(1.0), |x| x[0].clone()),
            _ => {
                // slice along axis 1 (a copy) and along axis 0 (a view)
                let (start, len) = (c / 2, c - c / 2);
                let cpu = |x: &[Vec<f64>]| {
                    let mut out = Vec::new();
                    for o in 0..r { for k in start..start + len { for i in 0..d { out.push(x[0][(o * c + k) * d + i]); } } }
                    out
                };
                check("slice axis 1", std::slice::from_ref(&x), |t| t[0].slice(1, start, len), cpu);
                let cpu0 = |x: &[Vec<f64>]| x[0][(r / 2) * c * d..].to_vec();
                check("slice axis 0", &[x], |t| t[0].slice(0, r / 2, r - r / 2), cpu0);
            }
        }
    }

    #[test]
    fn gradcheck_concat((r, c, d) in dims(), c2 in 1usize..4, seed in any::<u64>()) {
        let a = (Rng::new(seed).vec_f32(r * c * d, -2.0, 2.0), vec![r, c, d]);
        let b = (Rng::new(seed ^ 5).vec_f32(r * c2 * d, -2.0, 2.0), vec![r, c2, d]);
        let cpu = |x: &[Vec<f64>]| {
            let mut out = Vec::new();
            for o in 0..r {
                out.extend_from_slice(&x[0][o * c * d..(o + 1) * c * d]);
                out.extend_from_slice(&x[1][o * c2 * d..(o + 1) * c2 * d]);
            }
            out
        };
        check("concat", &[a, b], |t| Tensor::concat(&[&t[0], &t[1]], 1), cpu);
    }

    #[test]
    fn gradcheck_reductions((r, c, d) in dims(), seed in any::<u64>(), axis in 0usize..3, which in 0usize..4) {
        let shape = vec![r, c, d];
        let x = (Rng::new(seed).vec_f32(r * c * d, -2.0, 2.0), shape.clone());
        let along = view(&shape, axis);
        match which {
            0 => check("sum axis", &[x], |t| t[0].sum(&[axis], false), |x| reduce::sum_axis_f64(&x[0], along)),
            1 => check("mean axis", &[x], |t| t[0].mean(&[axis], true), |x| reduce::mean_axis_f64(&x[0], along)),
            2 => check("max axis", &[x], |t| t[0].max(axis, false), |x| reduce::max_axis_f64(&x[0], along).0),
            _ => {
                // two axes, then everything
                let two = |x: &[Vec<f64>]| {
                    let s = reduce::sum_axis_f64(&x[0], view(&shape, 2));
                    reduce::sum_axis_f64(&s, view(&[r, c], 0))
                };
                check("sum axes 0,2", std::slice::from_ref(&x), |t| t[0].sum(&[0, 2], false), two);
                let all = view(&[r * c * d], 0);
                check("mean all", &[x], |t| t[0].mean_all(), |x| reduce::mean_axis_f64(&x[0], all));
            }
        }
    }

    #[test]
    fn gradcheck_softmax((r, c, _) in dims(), seed in any::<u64>(), log in any::<bool>()) {
        let x = (Rng::new(seed).vec_f32(r * c, -2.0, 2.0), vec![r, c]);
        if log {
            check("log_softmax", &[x], |t| t[0].log_softmax(), |x| softmax::log_softmax_f64(&x[0], r, c));
        } else {
            check("softmax", &[x], |t| t[0].softmax(), |x| softmax::softmax_f64(&x[0], r, c));
        }
    }

    #[test]
    fn gradcheck_cross_entropy((r, c, _) in dims(), seed in any::<u64>(), smooth in any::<bool>()) {
        let x = (Rng::new(seed).vec_f32(r * c, -2.0, 2.0), vec![r, c]);
        let targets: Vec<u32> = (0..r).map(|i| ((seed >> (i % 32)) as usize % c) as u32).collect();
        let eps = if smooth { 0.1 } else { 0.0 };
        let t_gpu = Tensor::from_indices(&gpu(), &targets, &[r]).unwrap();
        // the mean over rows of the per-row losses
        let cpu = |x: &[Vec<f64>]| {
            let losses = cross_entropy::forward_f64(&x[0], &targets, r, c, eps);
            reduce::mean_axis_f64(&losses, view(&[r], 0))
        };
        check("cross_entropy", &[x], |t| t[0].cross_entropy(&t_gpu, eps as f32), cpu);
    }

    #[test]
    fn gradcheck_layer_norm((r, c, _) in dims(), extra in 1usize..4, seed in any::<u64>()) {
        let c = c + extra; // at least 2 columns: a row of 1 has zero variance
        let x = (Rng::new(seed).vec_f32(r * c, -2.0, 2.0), vec![r, c]);
        let gamma = (Rng::new(seed ^ 7).vec_f32(c, 0.5, 1.5), vec![c]);
        let beta = (Rng::new(seed ^ 9).vec_f32(c, -0.5, 0.5), vec![c]);
        let cpu = |x: &[Vec<f64>]| layer_norm::forward_f64(&x[0], &x[1], &x[2], r, c, 1e-5).y;
        check("layer_norm", &[x, gamma, beta], |t| t[0].layer_norm(&t[1], &t[2], 1e-5), cpu);
    }

    #[test]
    fn gradcheck_embedding((vocab, dim, tokens) in dims(), seed in any::<u64>()) {
        let table = (Rng::new(seed).vec_f32(vocab * dim, -1.0, 1.0), vec![vocab, dim]);
        let ids: Vec<u32> = (0..tokens + 2).map(|i| ((seed >> (3 * i)) as usize % vocab) as u32).collect();
        let ids_gpu = Tensor::from_indices(&gpu(), &ids, &[ids.len()]).unwrap();
        let cpu = |x: &[Vec<f64>]| ids.iter().flat_map(|&id| x[0][id as usize * dim..(id as usize + 1) * dim].to_vec()).collect();
        check("embedding", &[table], |t| t[0].embedding(&ids_gpu), cpu);
    }

    #[test]
    fn gradcheck_dropout((r, c, d) in dims(), seed in any::<u64>(), p in 0.0f32..0.8) {
        let x = (Rng::new(seed).vec_f32(r * c * d, -2.0, 2.0), vec![r, c, d]);
        let scale = f64::from(dropout::scale(p));
        let cpu = |x: &[Vec<f64>]| x[0].iter().enumerate()
            .map(|(i, &v)| if dropout::keep(seed, i as u32, p) { v * scale } else { 0.0 })
            .collect();
        check("dropout", &[x], |t| t[0].dropout_with_seed(p, seed), cpu);
    }

    #[test]
    fn gradcheck_checkpoint((r, c, _) in dims(), seed in any::<u64>()) {
        let x = (Rng::new(seed).vec_f32(r * c, -1.0, 1.0), vec![r, c]);
        let w = (Rng::new(seed ^ 11).vec_f32(c * c, -1.0, 1.0), vec![c, c]);
        let dims = MatmulDims::dense(1, r, c, c);
        let cpu = |x: &[Vec<f64>]| matmul::matmul_f64(&x[0], &x[1], &dims).into_iter()
            .map(|v| unary::apply(UnaryOp::Tanh, v, 0.0))
            .collect();
        let f = |t: &[Tensor]| plimsoll_autograd::checkpoint(&[&t[0], &t[1]], |xs: &[Tensor]| xs[0].matmul(&xs[1])?.tanh());
        check("checkpoint", &[x, w], f, cpu);
    }
}

/// An op defined outside the crate: `x ⊙ y` computed by the crate's ops without recording,
/// made a node by [`Tensor::from_op`] with its own [`Derivative`].
#[derive(Debug, Clone)]
struct Product {
    x: Tensor,
    y: Tensor,
}

impl Derivative for Product {
    /// d(x ⊙ y) = (g ⊙ y, g ⊙ x).
    fn backward(&self, g: &Tensor, needs: &[bool]) -> Result<Grads> {
        let wants = |i: usize| needs.get(i).copied().unwrap_or(true);
        let dx = if wants(0) {
            Some(g.mul(&self.y)?)
        } else {
            None
        };
        let dy = if wants(1) {
            Some(g.mul(&self.x)?)
        } else {
            None
        };
        Ok(Grads::from_iter([dx, dy]))
    }

    fn saved_activations(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.x, &mut self.y]
    }
}

fn product(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let out = {
        let _no_grad = no_grad();
        x.mul(y)?
    };
    Tensor::from_op(out, &[x, y], || Product {
        x: x.detach(),
        y: y.detach(),
    })
}

/// The custom op's gradients against finite differences, as every built-in op's: a fused op
/// written in its own module (here, another crate) needs no arm in `Op` or `backward_op`.
#[test]
fn a_custom_op_from_outside_the_crate_matches_finite_differences() {
    let mut rng = Rng::new(3);
    let shape = vec![3, 5];
    let inputs = [
        (rng.vec_f32(15, -2.0, 2.0), shape.clone()),
        (rng.vec_f32(15, -2.0, 2.0), shape),
    ];
    check(
        "custom product",
        &inputs,
        |t| product(&t[0], &t[1]),
        |x| x[0].iter().zip(&x[1]).map(|(a, b)| a * b).collect(),
    );
}
