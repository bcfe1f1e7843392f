//! Helpers of the nn tests beyond `plimsoll_kernels_wgsl::testing` (the shared device, the
//! comparison, the seeded RNG): the module check (GPU forward and backward against an f64 CPU
//! reference) and the f64 references of composite modules, built on
//! each family's `plimsoll_kernels_wgsl::kernels::<stem>::reference` (the one reference of each
//! op).
#![allow(dead_code)]

use std::collections::BTreeMap;

use plimsoll_autograd::{Gpu, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::kernels::matmul::MatmulDims;
use plimsoll_kernels_wgsl::kernels::matmul::reference as matmul;
use plimsoll_kernels_wgsl::kernels::softmax::reference as softmax;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, to_f64};
use plimsoll_nn::{Module, zero_grad};

/// Parameter values by name, in f64.
pub type Params = BTreeMap<String, Vec<f64>>;

/// Checks `module` on `x` against `reference(params, x)`: the GPU forward against the
/// reference, then, for `loss = sum(y * r)` with random `r`, every parameter gradient and the
/// input gradient (when `x_grad`) against central differences of the f64 reference.
pub fn check_module(
    module: &dyn Module,
    x: &Tensor,
    x_grad: bool,
    reference: &dyn Fn(&Params, &[f64]) -> Vec<f64>,
) {
    let params = module.parameters();
    let host: Params = params
        .iter()
        .map(|(n, t)| (n.clone(), to_f64(&t.to_vec().unwrap())))
        .collect();
    let x_host: Vec<f64> = if x.dtype() == plimsoll_autograd::DType::U32 {
        x.to_vec_u32()
            .unwrap()
            .iter()
            .map(|&i| f64::from(i))
            .collect()
    } else {
        to_f64(&x.to_vec().unwrap())
    };
    let y = module.forward(x).unwrap();
    let want = reference(&host, &x_host);
    assert_close("forward", &y.to_vec().unwrap(), &want, 1e-4, 1e-3);

    let mut rng = Rng::new(99);
    let r = rng.vec_f32(y.numel(), -1.0, 1.0);
    let r_t = Tensor::from_slice(x.gpu(), &r, y.shape()).unwrap();
    y.mul(&r_t).unwrap().sum_all().unwrap().backward().unwrap();
    let r64 = to_f64(&r);
    let loss = |p: &Params, x: &[f64]| -> f64 {
        reference(p, x).iter().zip(&r64).map(|(a, b)| a * b).sum()
    };
    let h = 1e-6;
    for (name, t) in &params {
        let got = t
            .grad()
            .unwrap_or_else(|| panic!("{name} has no gradient"))
            .to_vec()
            .unwrap();
        let mut p = host.clone();
        let want: Vec<f64> = (0..got.len())
            .map(|i| {
                let v = p[name][i];
                p.get_mut(name).unwrap()[i] = v + h;
                let plus = loss(&p, &x_host);
                p.get_mut(name).unwrap()[i] = v - h;
                let minus = loss(&p, &x_host);
                p.get_mut(name).unwrap()[i] = v;
                (plus - minus) / (2.0 * h)
            })
            .collect();
        assert_close(&format!("d loss / d {name}"), &got, &want, 2e-4, 2e-3);
    }
    if x_grad {
        let got = x.grad().expect("input has no gradient").to_vec().unwrap();
        let mut xs = x_host.clone();
        let want: Vec<f64> = (0..got.len())
            .map(|i| {
                let v = xs[i];
                xs[i] = v + h;
                let plus = loss(&host, &xs);
                xs[i] = v - h;
                let minus = loss(&host, &xs);
                xs[i] = v;
                (plus - minus) / (2.0 * h)
            })
            .collect();
        assert_close("d loss / d x", &got, &want, 2e-4, 2e-3);
        x.clear_grad();
    }
    zero_grad(&params);
}

/// An input leaf that requires grad.
pub fn input(gpu: &Gpu, data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice_with(
        gpu,
        data,
        shape,
        TensorOptions::default().requires_grad(true),
    )
    .unwrap()
}

/// A parameter leaf.
pub fn param(gpu: &Gpu, data: &[f32], shape: &[usize], label: &str) -> Tensor {
    Tensor::from_slice_with(gpu, data, shape, TensorOptions::parameter(label)).unwrap()
}

// ---- f64 CPU references of composite modules (row-major) ----

/// `x · wᵀ + b`: `x` `[rows, k]`, `w` `[n, k]` (PyTorch's layout), `b` `[n]` (or empty).
pub fn linear(x: &[f64], w: &[f64], b: &[f64], k: usize, n: usize) -> Vec<f64> {
    // y = x · Wᵀ with W stored [n, k] (PyTorch's nn.Linear layout).
    let dims = MatmulDims {
        trans_b: true,
        ..MatmulDims::dense(1, x.len() / k, n, k)
    };
    let mut y = matmul::matmul_f64(x, w, &dims);
    if !b.is_empty() {
        for row in y.chunks_mut(n) {
            row.iter_mut().zip(b).for_each(|(v, bias)| *v += bias);
        }
    }
    y
}

/// Causal multi-head attention over `[batch, time, dim]` with `p` holding `{prefix}c_attn.*` and
/// `{prefix}c_proj.*`.
pub fn attention(
    p: &Params,
    prefix: &str,
    x: &[f64],
    time: usize,
    dim: usize,
    heads: usize,
) -> Vec<f64> {
    let get = |n: &str| &p[&format!("{prefix}{n}")];
    let qkv = linear(x, get("c_attn.weight"), get("c_attn.bias"), dim, 3 * dim);
    let batch = x.len() / (time * dim);
    let hd = dim / heads;
    let mut y = vec![0.0; x.len()];
    for b in 0..batch {
        for h in 0..heads {
            let at = |t: usize, which: usize, d: usize| {
                qkv[(b * time + t) * 3 * dim + which * dim + h * hd + d]
            };
            for t in 0..time {
                // query t attends to keys 0..=t
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        (0..hd).map(|d| at(t, 0, d) * at(s, 1, d)).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let weights = softmax::softmax_f64(&scores, 1, t + 1);
                for d in 0..hd {
                    y[(b * time + t) * dim + h * hd + d] =
                        (0..=t).map(|s| weights[s] * at(s, 2, d)).sum();
                }
            }
        }
    }
    linear(&y, get("c_proj.weight"), get("c_proj.bias"), dim, dim)
}

/// How many allocations of at least `bytes` labelled "add" (an addition's output) the backward of
/// `loss` allocates: the additions of gradients that reached a tensor two ways.
pub fn additions_in_backward(gpu: &Gpu, loss: &Tensor, bytes: u64) -> usize {
    use plimsoll_allocator::TraceEventKind;
    let ((), trace) =
        plimsoll_kernels_wgsl::testing::allocator_trace_of(gpu, || loss.backward().unwrap());
    trace
        .events
        .iter()
        .filter(|e| e.kind == TraceEventKind::Allocate && e.size_bytes >= bytes)
        .filter(|e| e.label.as_deref() == Some("add"))
        .count()
}

/// Sets `p.grad = g` (backward of `sum(p * g)`), after clearing it.
pub fn set_grad(gpu: &Gpu, p: &Tensor, g: &[f32]) {
    p.clear_grad();
    let c = Tensor::from_slice(gpu, g, p.shape()).unwrap();
    p.mul(&c).unwrap().sum_all().unwrap().backward().unwrap();
}
