//! Gradient check for every op: the GPU backward against central finite differences in f64 of
//! CPU reference forwards, over random small shapes (proptest, 16 cases per op). The loss is
//! `L = Σ op(inputs) ⊙ w` with fixed random `w`, so every output element's gradient matters.
//! The forward is checked against the same reference on the way.

use plimsoll_autograd::{Result, Tensor};
use plimsoll_kernels_wgsl::kernels::binary::Broadcast;
use plimsoll_kernels_wgsl::kernels::unary::UnaryOp;
use plimsoll_kernels_wgsl::reference;
use proptest::prelude::*;

use crate::common::{assert_close, gpu, param, values};

/// Finite-difference step (f64 forwards: truncation ~h², rounding ~1e-16/h).
const STEP: f64 = 1e-4;

/// One input: values and shape.
type Input = (Vec<f32>, Vec<usize>);
/// A binary op: name, GPU method, f64 scalar function.
type BinaryCase = (
    &'static str,
    fn(&Tensor, &Tensor) -> Result<Tensor>,
    fn(f64, f64) -> f64,
);
/// A scalar form: name, GPU method, f64 function of (x, s).
type ScalarCase = (
    &'static str,
    fn(&Tensor, f32) -> Result<Tensor>,
    fn(f64, f64) -> f64,
);
/// A unary op: reference op, GPU method, input range.
type UnaryCase = (UnaryOp, fn(&Tensor) -> Result<Tensor>, f32, f32);

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
    let w = values(want.len() as u64 + 17, want.len(), -1.0, 1.0);
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

// ---- f64 CPU forwards ----

fn broadcast64(
    a: &[f64],
    sa: &[usize],
    b: &[f64],
    sb: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let shape = Broadcast::new(sa, sb).unwrap();
    (0..shape.len())
        .map(|i| {
            let (ia, ib) = shape.operand_offsets(i);
            f(a[ia], b[ib])
        })
        .collect()
}

fn strides(shape: &[usize]) -> Vec<usize> {
    plimsoll_kernels_wgsl::kernels::binary::contiguous_strides(shape)
}

fn permute64(x: &[f64], shape: &[usize], perm: &[usize]) -> Vec<f64> {
    let st = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let n: usize = out_shape.iter().product();
    (0..n)
        .map(|mut i| {
            let mut src = 0;
            for d in (0..out_shape.len()).rev() {
                src += (i % out_shape[d]) * st[perm[d]];
                i /= out_shape[d];
            }
            x[src]
        })
        .collect()
}

/// `[outer, axis, inner]` of `shape` at `axis`.
fn split_at(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

fn reduce64(x: &[f64], shape: &[usize], axis: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let (outer, n, inner) = split_at(shape, axis);
    let mut out = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let column: Vec<f64> = (0..n).map(|k| x[(o * n + k) * inner + i]).collect();
            out.push(f(&column));
        }
    }
    out
}

fn rows64(x: &[f64], cols: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    x.chunks(cols).flat_map(f).collect()
}

fn log_softmax_row(r: &[f64]) -> Vec<f64> {
    let m = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + r.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    r.iter().map(|v| v - lse).collect()
}

fn matmul64(
    a: &[f64],
    b: &[f64],
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    shared: (bool, bool),
) -> Vec<f64> {
    let mut c = vec![0.0; batch * m * n];
    for bi in 0..batch {
        let (oa, ob) = (
            if shared.0 { 0 } else { bi * m * k },
            if shared.1 { 0 } else { bi * k * n },
        );
        for i in 0..m {
            for j in 0..n {
                c[(bi * m + i) * n + j] =
                    (0..k).map(|l| a[oa + i * k + l] * b[ob + l * n + j]).sum();
            }
        }
    }
    c
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
    fn gradcheck_binary_broadcast((r, c, _) in dims(), seed in any::<u64>(), which in 0usize..4, row in any::<bool>()) {
        let a = (values(seed, r * c, -2.0, 2.0), vec![r, c]);
        // b broadcasts along rows ([c]) or columns ([r, 1]); denominators kept away from 0.
        let sb = if row { vec![c] } else { vec![r, 1] };
        let b = (values(seed ^ 1, sb.iter().product(), 0.5, 2.0), sb);
        let (sa, sbb) = (a.1.clone(), b.1.clone());
        let ops: [BinaryCase; 4] = [
            ("add", Tensor::add, |x, y| x + y),
            ("sub", Tensor::sub, |x, y| x - y),
            ("mul", Tensor::mul, |x, y| x * y),
            ("div", Tensor::div, |x, y| x / y),
        ];
        let (name, g, f) = ops[which];
        check(name, &[a, b], |t| g(&t[0], &t[1]), |x| broadcast64(&x[0], &sa, &x[1], &sbb, f));
    }

    #[test]
    fn gradcheck_scalar_forms((r, c, _) in dims(), seed in any::<u64>(), which in 0usize..6) {
        let x = (values(seed, r * c, 0.5, 2.0), vec![r, c]);
        let s = 1.75f32;
        let ops: [ScalarCase; 6] = [
            ("add_scalar", Tensor::add_scalar, |x, s| x + s),
            ("sub_scalar", Tensor::sub_scalar, |x, s| x - s),
            ("mul_scalar", Tensor::mul_scalar, |x, s| x * s),
            ("div_scalar", Tensor::div_scalar, |x, s| x / s),
            ("scalar_sub", Tensor::scalar_sub, |x, s| s - x),
            ("scalar_div", Tensor::scalar_div, |x, s| s / x),
        ];
        let (name, g, f) = ops[which];
        check(name, &[x], |t| g(&t[0], s), |x| x[0].iter().map(|&v| f(v, f64::from(s))).collect());
    }

    #[test]
    fn gradcheck_unary((r, c, d) in dims(), seed in any::<u64>(), which in 0usize..9) {
        let table: [UnaryCase; 9] = [
            (UnaryOp::Neg, Tensor::neg, -2.0, 2.0),
            (UnaryOp::Exp, Tensor::exp, -2.0, 2.0),
            (UnaryOp::Log, Tensor::log, 0.3, 3.0),
            (UnaryOp::Sqrt, Tensor::sqrt, 0.3, 3.0),
            (UnaryOp::Pow, |t| t.powf(2.5), 0.3, 2.0),
            (UnaryOp::Relu, Tensor::relu, -2.0, 2.0),
            (UnaryOp::Gelu, Tensor::gelu, -3.0, 3.0),
            (UnaryOp::Tanh, Tensor::tanh, -2.0, 2.0),
            (UnaryOp::Sigmoid, Tensor::sigmoid, -3.0, 3.0),
        ];
        let (op, g, lo, hi) = table[which];
        let x = (values(seed, r * c * d, lo, hi), vec![r, c, d]);
        let exponent = if op == UnaryOp::Pow { 2.5 } else { 0.0 };
        let cpu = move |x: &[Vec<f64>]| x[0].iter().map(|&v| reference::unary::apply(op, v, exponent)).collect();
        check(&format!("{op:?}"), &[x], |t| g(&t[0]), cpu);
    }

    #[test]
    fn gradcheck_matmul((b, m, k) in dims(), n in 1usize..6, seed in any::<u64>(), layout in 0usize..3) {
        // layout 0: both batched; 1: shared right matrix (a linear layer); 2: shared left matrix.
        let shared = (layout == 2, layout == 1);
        let sa = if shared.0 { vec![m, k] } else { vec![b, m, k] };
        let sb = if shared.1 { vec![k, n] } else { vec![b, k, n] };
        let a = (values(seed, sa.iter().product(), -1.0, 1.0), sa);
        let bb = (values(seed ^ 3, sb.iter().product(), -1.0, 1.0), sb);
        check("matmul", &[a, bb], |t| t[0].matmul(&t[1]), |x| matmul64(&x[0], &x[1], b, m, k, n, shared));
    }

    #[test]
    fn gradcheck_shape_ops((r, c, d) in dims(), seed in any::<u64>(), which in 0usize..4) {
        let shape = vec![r, c, d];
        let x = (values(seed, r * c * d, -2.0, 2.0), shape.clone());
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
        let a = (values(seed, r * c * d, -2.0, 2.0), vec![r, c, d]);
        let b = (values(seed ^ 5, r * c2 * d, -2.0, 2.0), vec![r, c2, d]);
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
        let x = (values(seed, r * c * d, -2.0, 2.0), shape.clone());
        let sum = |v: &[f64]| v.iter().sum::<f64>();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        match which {
            0 => check("sum axis", &[x], |t| t[0].sum(&[axis], false), |x| reduce64(&x[0], &shape, axis, sum)),
            1 => check("mean axis", &[x], |t| t[0].mean(&[axis], true), |x| reduce64(&x[0], &shape, axis, mean)),
            2 => check("max axis", &[x], |t| t[0].max(axis, false), |x| reduce64(&x[0], &shape, axis, max)),
            _ => {
                // two axes, then everything
                let two = |x: &[Vec<f64>]| { let s = reduce64(&x[0], &shape, 2, sum); reduce64(&s, &[r, c], 0, sum) };
                check("sum axes 0,2", std::slice::from_ref(&x), |t| t[0].sum(&[0, 2], false), two);
                check("mean all", &[x], |t| t[0].mean_all(), |x| vec![mean(&x[0])]);
            }
        }
    }

    #[test]
    fn gradcheck_softmax((r, c, _) in dims(), seed in any::<u64>(), log in any::<bool>()) {
        let x = (values(seed, r * c, -2.0, 2.0), vec![r, c]);
        if log {
            check("log_softmax", &[x], |t| t[0].log_softmax(), |x| rows64(&x[0], c, log_softmax_row));
        } else {
            let softmax = |row: &[f64]| log_softmax_row(row).into_iter().map(f64::exp).collect();
            check("softmax", &[x], |t| t[0].softmax(), |x| rows64(&x[0], c, softmax));
        }
    }

    #[test]
    fn gradcheck_cross_entropy((r, c, _) in dims(), seed in any::<u64>(), smooth in any::<bool>()) {
        let x = (values(seed, r * c, -2.0, 2.0), vec![r, c]);
        let targets: Vec<u32> = (0..r).map(|i| ((seed >> (i % 32)) as usize % c) as u32).collect();
        let eps = if smooth { 0.1 } else { 0.0 };
        let t_gpu = Tensor::from_indices(&gpu(), &targets, &[r]).unwrap();
        let cpu = |x: &[Vec<f64>]| {
            let total: f64 = x[0].chunks(c).zip(&targets).map(|(row, &t)| {
                let lp = log_softmax_row(row);
                let mean_lp = lp.iter().sum::<f64>() / c as f64;
                -(1.0 - eps) * lp[t as usize] - eps * mean_lp
            }).sum();
            vec![total / r as f64]
        };
        check("cross_entropy", &[x], |t| t[0].cross_entropy(&t_gpu, eps as f32), cpu);
    }

    #[test]
    fn gradcheck_layer_norm((r, c, _) in dims(), extra in 1usize..4, seed in any::<u64>()) {
        let c = c + extra; // at least 2 columns: a row of 1 has zero variance
        let x = (values(seed, r * c, -2.0, 2.0), vec![r, c]);
        let gamma = (values(seed ^ 7, c, 0.5, 1.5), vec![c]);
        let beta = (values(seed ^ 9, c, -0.5, 0.5), vec![c]);
        let cpu = |x: &[Vec<f64>]| rows64(&x[0], c, |row| {
            let m = row.iter().sum::<f64>() / c as f64;
            let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / c as f64;
            let rstd = 1.0 / (var + 1e-5).sqrt();
            row.iter().enumerate().map(|(j, v)| (v - m) * rstd * x[1][j] + x[2][j]).collect()
        });
        check("layer_norm", &[x, gamma, beta], |t| t[0].layer_norm(&t[1], &t[2], 1e-5), cpu);
    }

    #[test]
    fn gradcheck_embedding((vocab, dim, tokens) in dims(), seed in any::<u64>()) {
        let table = (values(seed, vocab * dim, -1.0, 1.0), vec![vocab, dim]);
        let ids: Vec<u32> = (0..tokens + 2).map(|i| ((seed >> (3 * i)) as usize % vocab) as u32).collect();
        let ids_gpu = Tensor::from_indices(&gpu(), &ids, &[ids.len()]).unwrap();
        let cpu = |x: &[Vec<f64>]| ids.iter().flat_map(|&id| x[0][id as usize * dim..(id as usize + 1) * dim].to_vec()).collect();
        check("embedding", &[table], |t| t[0].embedding(&ids_gpu), cpu);
    }

    #[test]
    fn gradcheck_dropout((r, c, d) in dims(), seed in any::<u64>(), p in 0.0f32..0.8) {
        let x = (values(seed, r * c * d, -2.0, 2.0), vec![r, c, d]);
        let scale = f64::from(reference::dropout::scale(p));
        let cpu = |x: &[Vec<f64>]| x[0].iter().enumerate()
            .map(|(i, &v)| if reference::dropout::keep(seed, i as u32, p) { v * scale } else { 0.0 })
            .collect();
        check("dropout", &[x], |t| t[0].dropout_with_seed(p, seed), cpu);
    }

    #[test]
    fn gradcheck_checkpoint((r, c, _) in dims(), seed in any::<u64>()) {
        let x = (values(seed, r * c, -1.0, 1.0), vec![r, c]);
        let w = (values(seed ^ 11, c * c, -1.0, 1.0), vec![c, c]);
        let cpu = |x: &[Vec<f64>]| matmul64(&x[0], &x[1], 1, r, c, c, (false, false)).into_iter().map(f64::tanh).collect();
        let f = |t: &[Tensor]| plimsoll_autograd::checkpoint(&[&t[0], &t[1]], |xs: &[Tensor]| xs[0].matmul(&xs[1])?.tanh());
        check("checkpoint", &[x, w], f, cpu);
    }
}
