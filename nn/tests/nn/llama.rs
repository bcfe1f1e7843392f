//! The Llama blocks against f64 references with gradients by central differences (RMSNorm,
//! rotary embeddings, the SwiGLU MLP, grouped-query attention through the fused kernels), and a
//! small Llama whose every parameter receives a gradient, the same on the fused and the
//! reference attention paths.

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::kernels::attention::{AttentionDims, reference as attention_ref};
use plimsoll_kernels_wgsl::kernels::layer_norm::reference::rms_forward_f64;
use plimsoll_kernels_wgsl::kernels::rotary::{RotaryDims, reference::angle};
use plimsoll_kernels_wgsl::kernels::unary::reference::sigmoid;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, gpu, to_f64};
use plimsoll_nn::{
    CausalLm, Linear, Llama, LlamaConfig, Module, RmsNorm, SwiGlu, causal_attention,
    rotary_embedding,
};

use crate::common::{Params, check_module, input, linear, param};

#[test]
fn rms_norm_matches_reference_and_finite_differences() {
    let gpu = gpu();
    let (rows, cols) = (6, 10);
    let norm = RmsNorm::new(&gpu, cols, 1e-5).unwrap();
    // A scale that is not all ones, so its gradient is tested at a general point.
    let w = Rng::new(3).vec_f32(cols, 0.5, 1.5);
    norm.weight().write_from_slice(&w).unwrap();
    let x = input(
        &gpu,
        &Rng::new(4).vec_f32(rows * cols, -2.0, 2.0),
        &[2, 3, cols],
    );
    check_module(&norm, &x, true, &|p: &Params, x: &[f64]| {
        rms_forward_f64(x, &p["weight"], rows, cols, 1e-5).0
    });
}

/// A module of no parameters that applies [`rotary_embedding`], for `check_module`.
#[derive(Debug)]
struct Rope {
    base: f32,
    offset: usize,
}

impl Module for Rope {
    fn forward(&self, x: &Tensor) -> plimsoll_nn::Result<Tensor> {
        rotary_embedding(x, self.base, self.offset)
    }
    fn parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    fn set_training(&mut self, _: bool) {}
    fn is_training(&self) -> bool {
        true
    }
}

#[test]
fn rotary_embedding_matches_reference_and_finite_differences() {
    let gpu = gpu();
    for (shape, base, offset) in [
        ([2usize, 3, 5, 6], 10_000.0f32, 0usize),
        ([1, 2, 4, 8], 100.0, 7),
    ] {
        let [b, h, t, d] = shape;
        let x = input(&gpu, &Rng::new(5).vec_f32(b * h * t * d, -2.0, 2.0), &shape);
        let dims = RotaryDims {
            rows: (b * h * t) as u64,
            time: t as u64,
            head_dim: d as u64,
            base,
            offset: offset as u64,
        };
        check_module(
            &Rope { base, offset },
            &x,
            true,
            &|_: &Params, x: &[f64]| {
                let half = d / 2;
                let mut y = x.to_vec();
                for r in 0..b * h * t {
                    let pos = (r % t + offset) as u64;
                    for c in 0..half {
                        let (sin, cos) = angle(&dims, pos, c as u64).sin_cos();
                        let (a, z) = (x[r * d + c], x[r * d + c + half]);
                        y[r * d + c] = a * cos - z * sin;
                        y[r * d + c + half] = z * cos + a * sin;
                    }
                }
                y
            },
        );
    }
}

#[test]
fn swiglu_matches_reference_and_finite_differences() {
    let gpu = gpu();
    let (width, hidden, rows) = (6, 10, 4);
    let mut rng = Rng::new(8);
    let mut proj = |i: usize, o: usize| {
        let w = param(&gpu, &rng.vec_f32(i * o, -0.5, 0.5), &[o, i], "w");
        Linear::from_tensors(w, None).unwrap()
    };
    let mlp = SwiGlu::from_parts(
        proj(width, hidden),
        proj(width, hidden),
        proj(hidden, width),
    )
    .unwrap();
    let x = input(
        &gpu,
        &Rng::new(9).vec_f32(rows * width, -2.0, 2.0),
        &[rows, width],
    );
    check_module(&mlp, &x, true, &|p: &Params, x: &[f64]| {
        let gate = linear(x, &p["gate_proj.weight"], &[], width, hidden);
        let up = linear(x, &p["up_proj.weight"], &[], width, hidden);
        let h: Vec<f64> = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| g * sigmoid(*g) * u)
            .collect();
        linear(&h, &p["down_proj.weight"], &[], hidden, width)
    });
}

/// Grouped-query attention through the fused kernels against the f64 reference: the output and
/// the gradients of queries, keys and values (keys and values of 2 heads serving 6 query heads:
/// each key/value gradient sums its 3 query heads).
#[test]
fn grouped_query_attention_matches_reference_and_reaches_keys_and_values() {
    let gpu = gpu();
    let (batch, heads, kv_heads, time, d) = (2usize, 6usize, 2usize, 19usize, 8usize);
    let mut rng = Rng::new(10);
    let q_data = rng.vec_f32(batch * heads * time * d, -1.5, 1.5);
    let k_data = rng.vec_f32(batch * kv_heads * time * d, -1.5, 1.5);
    let v_data = rng.vec_f32(batch * kv_heads * time * d, -1.5, 1.5);
    let r = rng.vec_f32(batch * heads * time * d, -1.0, 1.0);
    let q = input(&gpu, &q_data, &[batch, heads, time, d]);
    let k = input(&gpu, &k_data, &[batch, kv_heads, time, d]);
    let v = input(&gpu, &v_data, &[batch, kv_heads, time, d]);
    let scale = 1.0 / (d as f32).sqrt();
    let y = causal_attention(&q, &k, &v, scale).unwrap();
    let r_t = Tensor::from_slice(&gpu, &r, y.shape()).unwrap();
    y.mul(&r_t).unwrap().sum_all().unwrap().backward().unwrap();
    let dims = AttentionDims {
        heads_batch: (batch * heads) as u64,
        group: (heads / kv_heads) as u64,
        time: time as u64,
        head_dim: d as u64,
        scale,
        dropout: 0.0,
        seed: 0,
    };
    let (want_o, _) = attention_ref::forward(&dims, &q_data, &k_data, &v_data);
    let (dq, dk, dv) = attention_ref::backward(&dims, &q_data, &k_data, &v_data, &r);
    assert_close("o", &y.to_vec().unwrap(), &to_f64(&want_o), 1e-5, 1e-4);
    for (name, t, want) in [("dq", &q, dq), ("dk", &k, dk), ("dv", &v, dv)] {
        let got = t.grad().unwrap().to_vec().unwrap();
        assert_close(name, &got, &to_f64(&want), 1e-5, 1e-4);
        assert!(got.iter().any(|g| g.abs() > 1e-3), "{name} is all zero");
    }
    // Keys that do not divide the heads are refused with the shapes.
    let k3 = input(&gpu, &vec![0.0; batch * 4 * time * d], &[batch, 4, time, d]);
    let err = causal_attention(&q, &k3, &k3, scale).expect_err("4 does not divide 6");
    assert!(err.to_string().contains("grouped-query"), "{err}");
}

/// Token ids and next-token targets `[batch, time]` over `tiny_config`'s 13 tokens.
fn tokens(gpu: &plimsoll_autograd::Gpu, batch: usize, time: usize) -> (Tensor, Tensor) {
    let ids: Vec<u32> = (0..batch * time).map(|i| (i * 7 % 13) as u32).collect();
    let targets: Vec<u32> = (0..batch * time).map(|i| (i * 5 % 13) as u32).collect();
    (
        Tensor::from_indices(gpu, &ids, &[batch, time]).unwrap(),
        Tensor::from_indices(gpu, &targets, &[batch, time]).unwrap(),
    )
}

fn tiny_config(tie: bool) -> LlamaConfig {
    LlamaConfig {
        vocab_size: 13,
        max_position_embeddings: 16,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        hidden_size: 32,
        intermediate_size: 48,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-5,
        tie_word_embeddings: tie,
    }
}

/// Every parameter of a small Llama (grouped-query heads, untied head) gets a gradient, not all
/// zero, and the fused and reference attention paths give the same loss and gradients, with and
/// without checkpointing; the names are Hugging Face's and the count is the config's.
#[test]
fn llama_gradients_reach_every_parameter_on_both_attention_paths() {
    let gpu = gpu();
    let config = tiny_config(false);
    let (batch, time) = (3, 11);
    let (ids, targets) = tokens(&gpu, batch, time);
    let mut runs = Vec::new();
    for (efficient, segment) in [(true, 0), (false, 0), (true, 1)] {
        let mut model = Llama::new(&gpu, config, 21).unwrap();
        model.set_memory_efficient_attention(efficient);
        let loss = model
            .loss_checkpointed(&ids, &targets, segment, 0.0, 0)
            .unwrap();
        loss.backward().unwrap();
        let mut values = vec![vec![loss.item().unwrap()]];
        for (name, p) in model.parameters() {
            let g = p
                .grad()
                .unwrap_or_else(|| panic!("{name} has no gradient"))
                .to_vec()
                .unwrap();
            assert!(
                g.iter().any(|v| v.abs() > 0.0),
                "{name}'s gradient is all zero"
            );
            values.push(g);
        }
        runs.push((model, values));
    }
    for run in &runs[1..] {
        for (i, (a, b)) in runs[0].1.iter().zip(&run.1).enumerate() {
            assert_close(&format!("tensor {i}"), a, &to_f64(b), 1e-5, 1e-4);
        }
    }
    let model = &runs[0].0;
    let names: Vec<String> = model.parameters().into_iter().map(|(n, _)| n).collect();
    for want in [
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight",
        "lm_head.weight",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    let count: usize = model.parameters().iter().map(|(_, p)| p.numel()).sum();
    assert_eq!(count, config.parameter_count());
    // Tied: no lm_head, one table fewer.
    let tied = Llama::new(&gpu, tiny_config(true), 21).unwrap();
    let tied_count: usize = tied.parameters().iter().map(|(_, p)| p.numel()).sum();
    assert_eq!(tied_count, count - 13 * 32);
    assert_eq!(tied_count, tiny_config(true).parameter_count());
}

/// A Llama whose layers' parameters are in host memory ([`plimsoll_nn::evict_blocks_as_built`])
/// gives the loss and gradients of the same Llama on the device, bit for bit, every layer a
/// segment; the layers' parameters and gradients end in host memory.
#[test]
fn a_llama_whose_layers_are_in_host_memory_gives_the_same_loss_and_gradients() {
    let gpu = gpu();
    let config = tiny_config(true);
    let (batch, time) = (2, 9);
    let (ids, targets) = tokens(&gpu, batch, time);
    let run = |streamed: bool| {
        let model = {
            let _evict = streamed.then(plimsoll_nn::evict_blocks_as_built);
            Llama::new(&gpu, config, 21).unwrap()
        };
        let loss = model.loss_checkpointed(&ids, &targets, 1, 0.0, 0).unwrap();
        loss.backward().unwrap();
        for (name, p) in model.block_parameters() {
            let on_host = !p.is_resident() && !p.grad().unwrap().is_resident();
            assert_eq!(on_host, streamed, "{name}");
        }
        let mut values = vec![vec![loss.item().unwrap()]];
        values.extend(
            model
                .parameters()
                .into_iter()
                .map(|(_, p)| p.grad().unwrap().to_vec().unwrap()),
        );
        values
    };
    assert_eq!(run(true), run(false));
}

/// Shapes the model cannot take are refused with the figures.
#[test]
fn llama_config_refuses_shapes_it_cannot_run() {
    let gpu = gpu();
    let bad = [
        (
            LlamaConfig {
                num_key_value_heads: 3,
                ..tiny_config(false)
            },
            "divide",
        ),
        (
            LlamaConfig {
                hidden_size: 36,
                num_attention_heads: 12,
                num_key_value_heads: 4,
                ..tiny_config(false)
            },
            "odd",
        ),
        (
            LlamaConfig {
                intermediate_size: 0,
                ..tiny_config(false)
            },
            "intermediate_size",
        ),
    ];
    for (config, needle) in bad {
        let err = Llama::new(&gpu, config, 1).expect_err("must be refused");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
}

/// Under f16 activations the fused attention takes f16 q, k, v and saves them and its output in
/// f16, and both its forward and its backward read those halves with the f16 kernels (no f32
/// copies): with inputs that f16 holds exactly, the gradients are the f32 path's to the f16
/// rounding of the saved output (which `delta = rowsum(dO * O)` reads).
#[test]
fn f16_saved_attention_matches_the_f32_path_on_rounded_values() {
    use plimsoll_autograd::half::f16_activations;
    use plimsoll_kernels_wgsl::kernels::convert::reference::round_to_f16;
    let gpu = gpu();
    let (batch, heads, kv_heads, time, d) = (2usize, 4usize, 2usize, 21usize, 8usize);
    let mut rng = Rng::new(12);
    let q_data = round_to_f16(&rng.vec_f32(batch * heads * time * d, -1.5, 1.5));
    let k_data = round_to_f16(&rng.vec_f32(batch * kv_heads * time * d, -1.5, 1.5));
    let v_data = round_to_f16(&rng.vec_f32(batch * kv_heads * time * d, -1.5, 1.5));
    let r = rng.vec_f32(batch * heads * time * d, -1.0, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    let run = |half: bool| {
        let q = input(&gpu, &q_data, &[batch, heads, time, d]);
        let k = input(&gpu, &k_data, &[batch, kv_heads, time, d]);
        let v = input(&gpu, &v_data, &[batch, kv_heads, time, d]);
        // Activations (outputs of an op), which f16 activations keep in f16: the attention
        // then takes f16 inputs and saves them as they are.
        let guard = half.then(f16_activations);
        let [qa, ka, va] = [&q, &k, &v].map(|t| t.mul_scalar(1.0).unwrap());
        if half {
            assert_eq!(qa.dtype(), plimsoll_autograd::DType::F16);
        }
        let y = causal_attention(&qa, &ka, &va, scale).unwrap();
        drop(guard);
        let r_t = Tensor::from_slice(&gpu, &r, y.shape()).unwrap();
        y.mul(&r_t).unwrap().sum_all().unwrap().backward().unwrap();
        let grads: Vec<Vec<f32>> = [&q, &k, &v]
            .iter()
            .map(|t| t.grad().unwrap().to_vec().unwrap())
            .collect();
        (y.to_vec().unwrap(), grads)
    };
    let (y16, g16) = run(true);
    let (y32, g32) = run(false);
    // The output itself is kept in f16 under f16 activations.
    assert_close("o", &y16, &to_f64(&y32), 1e-3, 1e-3);
    for (name, (a, b)) in ["dq", "dk", "dv"].iter().zip(g16.iter().zip(&g32)) {
        assert_close(name, a, &to_f64(b), 2e-3, 2e-3);
    }
}

/// q, k and v sliced from one tensor (as a GPT's projection gives them) get their gradients in
/// one allocation that is that tensor's gradient as it is: the same values as three separate
/// leaves get, and no "slice grad" is assembled (no copy into place).
#[test]
fn attention_gradients_of_one_tensors_slices_need_no_copy() {
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    gpu.with_allocator(|a| a.set_trace_capacity(1 << 16));
    let (batch, heads, time, d) = (2usize, 3usize, 11usize, 8usize);
    let n = batch * heads * time * d;
    let mut rng = Rng::new(12);
    let data = rng.vec_f32(3 * n, -1.5, 1.5);
    let r = rng.vec_f32(n, -1.0, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    let shape = [batch, heads, time, d];
    let loss = |q: &Tensor, k: &Tensor, v: &Tensor| {
        let y = causal_attention(q, k, v, scale).unwrap();
        let r_t = Tensor::from_slice(&gpu, &r, y.shape()).unwrap();
        y.mul(&r_t).unwrap().sum_all().unwrap().backward().unwrap();
    };
    // A node (as a GPT's permuted projection is), not a leaf: its gradient is assembled from
    // the slices' pieces.
    let leaf = input(&gpu, &data, &[3, batch, heads, time, d]);
    let qkv = leaf.mul_scalar(1.0).unwrap();
    let part = |i: usize| qkv.slice(0, i, 1).unwrap().reshape(&shape).unwrap();
    loss(&part(0), &part(1), &part(2));
    let got = leaf.grad().unwrap().to_vec().unwrap();
    let assembled = gpu.with_allocator(|a| {
        a.trace()
            .events
            .iter()
            .filter(|e| e.label.as_deref() == Some("slice grad"))
            .count()
    });
    assert_eq!(assembled, 0, "the slices' gradients were copied into place");
    let leaves: Vec<Tensor> = (0..3)
        .map(|i| input(&gpu, &data[i * n..(i + 1) * n], &shape))
        .collect();
    loss(&leaves[0], &leaves[1], &leaves[2]);
    let want: Vec<f32> = leaves
        .iter()
        .flat_map(|t| t.grad().unwrap().to_vec().unwrap())
        .collect();
    assert_eq!(got, want);
}

/// As for the GPT: RMSNorm's backward adds into the residual stream's gradient in its kernel,
/// so a Llama's backward allocates no addition of the stream's size.
#[test]
fn a_llamas_backward_adds_no_residual_gradients_apart() {
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let config = tiny_config(false);
    let (batch, time) = (3, 11);
    let (ids, targets) = tokens(&gpu, batch, time);
    let model = Llama::new(&gpu, config, 21).unwrap();
    let loss = model.loss_checkpointed(&ids, &targets, 0, 0.0, 0).unwrap();
    let stream = (batch * time * config.hidden_size * 4) as u64;
    let additions = crate::common::additions_in_backward(&gpu, &loss, stream);
    assert_eq!(additions, 0, "additions of the stream's size in backward");
}
