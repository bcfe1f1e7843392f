//! Shared helpers: the device, a seeded generator, tolerant comparison, and the module check
//! (GPU forward and backward against an f64 CPU reference).
#![allow(dead_code)]

use std::cell::OnceCell;
use std::collections::BTreeMap;

use plimsoll_autograd::{Gpu, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::GpuOptions;
use plimsoll_nn::{Module, zero_grad};

/// The device of this test thread (one per thread: concurrent read-backs from one `Gpu` can
/// report "map callback did not run", a known kernels-wgsl issue). Fails, never skips, without
/// an adapter.
pub fn gpu() -> Gpu {
    thread_local! {
        static GPU: OnceCell<&'static Gpu> = const { OnceCell::new() };
    }
    GPU.with(|g| {
        (*g.get_or_init(|| {
            let gpu = Gpu::with_options(GpuOptions::from_env()).unwrap_or_else(|e| {
                panic!(
                    "GPU tests need an adapter: {e}\n(on a machine without a GPU: \
                     apt-get install mesa-vulkan-drivers libvulkan1)"
                )
            });
            Box::leak(Box::new(gpu))
        }))
        .clone()
    })
}

/// SplitMix64, for seeded test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[low, high)`.
    pub fn f32(&mut self, low: f32, high: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        low + (high - low) * unit
    }

    pub fn vec(&mut self, len: usize, low: f32, high: f32) -> Vec<f32> {
        (0..len).map(|_| self.f32(low, high)).collect()
    }
}

/// Asserts `|got - want| <= atol + rtol * |want|` elementwise; prints the first mismatch.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = f64::from(g);
        assert!(
            (g - w).abs() <= atol + rtol * w.abs(),
            "{what}: first mismatch at {i}: got {g}, want {w} (atol {atol}, rtol {rtol})"
        );
    }
}

pub fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

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
    let r = rng.vec(y.numel(), -1.0, 1.0);
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

// ---- f64 CPU references (row-major) ----

/// `x · w + b`: `x` `[rows, k]`, `w` `[k, n]`, `b` `[n]` (or empty).
pub fn linear(x: &[f64], w: &[f64], b: &[f64], k: usize, n: usize) -> Vec<f64> {
    let rows = x.len() / k;
    let mut y = vec![0.0; rows * n];
    for r in 0..rows {
        for j in 0..n {
            let mut s = b.get(j).copied().unwrap_or(0.0);
            for i in 0..k {
                s += x[r * k + i] * w[i * n + j];
            }
            y[r * n + j] = s;
        }
    }
    y
}

/// Layer norm over rows of `dim` (biased variance).
pub fn layer_norm(x: &[f64], g: &[f64], b: &[f64], dim: usize, eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (row, out) in x.chunks(dim).zip(y.chunks_mut(dim)) {
        let mean = row.iter().sum::<f64>() / dim as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / dim as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for i in 0..dim {
            out[i] = (row[i] - mean) * rstd * g[i] + b[i];
        }
    }
    y
}

/// GELU, tanh approximation.
pub fn gelu(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh())
}

/// Causal multi-head attention over `[batch, time, dim]` with `p` holding `{prefix}qkv.*` and
/// `{prefix}proj.*`.
pub fn attention(
    p: &Params,
    prefix: &str,
    x: &[f64],
    time: usize,
    dim: usize,
    heads: usize,
) -> Vec<f64> {
    let get = |n: &str| &p[&format!("{prefix}{n}")];
    let qkv = linear(x, get("qkv.weight"), get("qkv.bias"), dim, 3 * dim);
    let batch = x.len() / (time * dim);
    let hd = dim / heads;
    let mut y = vec![0.0; x.len()];
    for b in 0..batch {
        for h in 0..heads {
            let at = |t: usize, which: usize, d: usize| {
                qkv[(b * time + t) * 3 * dim + which * dim + h * hd + d]
            };
            for t in 0..time {
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        (0..hd).map(|d| at(t, 0, d) * at(s, 1, d)).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    y[(b * time + t) * dim + h * hd + d] =
                        (0..=t).map(|s| e[s] / z * at(s, 2, d)).sum();
                }
            }
        }
    }
    linear(&y, get("proj.weight"), get("proj.bias"), dim, dim)
}
