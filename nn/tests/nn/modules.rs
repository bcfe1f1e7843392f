//! Each module's forward and backward against an f64 CPU reference, parameter names, modes.

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::kernels::layer_norm::reference as layer_norm;
use plimsoll_kernels_wgsl::kernels::unary::UnaryOp;
use plimsoll_kernels_wgsl::kernels::unary::reference as unary;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, gpu, to_f64};
use plimsoll_nn::{
    Activation, CausalSelfAttention, Dropout, Embedding, Error, Init, LayerNorm, Linear, Module,
    ResidualMlpBlock, Sequential, TransformerBlock, mlp, zero_grad,
};

use crate::common::{Params, attention, check_module, input, linear};

fn names(m: &dyn Module) -> Vec<String> {
    m.parameters().into_iter().map(|(n, _)| n).collect()
}

#[test]
fn linear_matches_reference() {
    let gpu = gpu();
    let layer = Linear::new(&gpu, 5, 3, true, Init::KaimingUniform, 1).unwrap();
    assert_eq!(names(&layer), ["weight", "bias"]);
    assert_eq!(layer.weight().shape(), [3, 5]); // [out, in], as PyTorch
    let x = input(&gpu, &Rng::new(2).vec_f32(2 * 4 * 5, -1.0, 1.0), &[2, 4, 5]);
    check_module(&layer, &x, true, &|p: &Params, x: &[f64]| {
        linear(x, &p["weight"], &p["bias"], 5, 3)
    });
    let no_bias = Linear::new(&gpu, 4, 2, false, Init::XavierUniform, 3).unwrap();
    assert_eq!(names(&no_bias), ["weight"]);
    let x = input(&gpu, &Rng::new(4).vec_f32(3 * 4, -1.0, 1.0), &[3, 4]);
    check_module(&no_bias, &x, true, &|p: &Params, x: &[f64]| {
        linear(x, &p["weight"], &[], 4, 2)
    });
}

#[test]
fn linear_init_is_seeded_and_bounded() {
    let gpu = gpu();
    let a = Linear::new(&gpu, 6, 4, true, Init::KaimingUniform, 7).unwrap();
    let b = Linear::new(&gpu, 6, 4, true, Init::KaimingUniform, 7).unwrap();
    let c = Linear::new(&gpu, 6, 4, true, Init::KaimingUniform, 8).unwrap();
    let wa = a.weight().to_vec().unwrap();
    assert_eq!(wa, b.weight().to_vec().unwrap());
    assert_ne!(wa, c.weight().to_vec().unwrap());
    // Kaiming: sqrt(6 / 6) = 1; Xavier: sqrt(6 / (6 + 4)).
    assert!(wa.iter().all(|w| w.abs() <= 1.0));
    let x = Linear::new(&gpu, 6, 4, false, Init::XavierUniform, 7).unwrap();
    let bound = (6.0f32 / 10.0).sqrt();
    assert!(
        x.weight()
            .to_vec()
            .unwrap()
            .iter()
            .all(|w| w.abs() <= bound)
    );
    let err = Linear::new(&gpu, 0, 4, true, Init::XavierUniform, 7).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                what: "Linear::new",
                ..
            }
        ) && err.to_string().contains("in_features 0"),
        "{err}"
    );
    // A width-5 input to a 6-wide layer.
    let err = a
        .forward(&Tensor::from_slice(&gpu, &[0.0; 5], &[5]).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, Error::InputShape { module: "Linear", expected, found }
            if expected == "[.., 6]" && found == &[5]),
        "{err}"
    );
}

#[test]
fn layer_norm_matches_reference() {
    let gpu = gpu();
    let ln = LayerNorm::new(&gpu, 6, 1e-5).unwrap();
    // Non-trivial scale and shift, so their gradients are tested against something.
    ln.weight()
        .write_from_slice(&Rng::new(5).vec_f32(6, 0.5, 1.5))
        .unwrap();
    ln.bias()
        .write_from_slice(&Rng::new(6).vec_f32(6, -0.5, 0.5))
        .unwrap();
    let x = input(&gpu, &Rng::new(7).vec_f32(3 * 6, -2.0, 2.0), &[3, 6]);
    check_module(&ln, &x, true, &|p: &Params, x: &[f64]| {
        layer_norm::forward_f64(x, &p["weight"], &p["bias"], x.len() / 6, 6, 1e-5).y
    });
}

#[test]
fn embedding_matches_reference() {
    let gpu = gpu();
    let emb = Embedding::new(&gpu, 7, 3, 11).unwrap();
    assert_eq!(names(&emb), ["weight"]);
    let ids = Tensor::from_indices(&gpu, &[3, 0, 6, 3, 1], &[5]).unwrap();
    check_module(&emb, &ids, false, &|p: &Params, ids: &[f64]| {
        ids.iter()
            .flat_map(|&i| p["weight"][i as usize * 3..i as usize * 3 + 3].to_vec())
            .collect()
    });
    let err = emb
        .forward(&Tensor::from_slice(&gpu, &[1.0], &[1]).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InputShape {
                module: "Embedding",
                ..
            }
        ) && err.to_string().contains("u32 token ids"),
        "{err}"
    );
}

/// A table kept in parts looks up and trains as the whole table: each id's row from its part
/// (one launch per part), each part's gradient its ids' rows, and its parameters named by part.
#[test]
fn an_embedding_in_parts_matches_the_whole_table() {
    let gpu = gpu();
    let data = Rng::new(12).vec_f32(9 * 3, -1.0, 1.0);
    let parts = vec![
        input(&gpu, &data[..2 * 3], &[2, 3]),
        input(&gpu, &data[2 * 3..7 * 3], &[5, 3]),
        input(&gpu, &data[7 * 3..], &[2, 3]),
    ];
    let emb = Embedding::in_parts(parts).unwrap();
    assert_eq!(
        names(&emb),
        ["weight.part0", "weight.part1", "weight.part2"]
    );
    assert_eq!(emb.rows(), 9);
    let ids = Tensor::from_indices(&gpu, &[3, 0, 8, 3, 1, 6, 2], &[7]).unwrap();
    check_module(&emb, &ids, false, &|p: &Params, ids: &[f64]| {
        let table: Vec<f64> = ["weight.part0", "weight.part1", "weight.part2"]
            .iter()
            .flat_map(|n| p[*n].clone())
            .collect();
        ids.iter()
            .flat_map(|&i| table[i as usize * 3..i as usize * 3 + 3].to_vec())
            .collect()
    });
    let err = Embedding::in_parts(Vec::new()).expect_err("no parts");
    assert!(
        matches!(err, Error::InvalidConfig { .. }) && err.to_string().contains("parts []"),
        "{err}"
    );
    let mismatched = vec![
        input(&gpu, &[0.5; 6], &[2, 3]),
        input(&gpu, &[0.5; 4], &[2, 2]),
    ];
    let err = Embedding::in_parts(mismatched).expect_err("widths 3 and 2");
    assert!(
        matches!(err, Error::InvalidConfig { .. }) && err.to_string().contains("[[2, 3], [2, 2]]"),
        "{err}"
    );
}

#[test]
fn activations_match_reference() {
    let gpu = gpu();
    let data = Rng::new(8).vec_f32(10, -3.0, 3.0);
    let cases: [(Box<dyn Module>, UnaryOp); 4] = [
        (Box::new(plimsoll_nn::Relu), UnaryOp::Relu),
        (Box::new(plimsoll_nn::Gelu), UnaryOp::Gelu),
        (Box::new(plimsoll_nn::Tanh), UnaryOp::Tanh),
        (Box::new(plimsoll_nn::Sigmoid), UnaryOp::Sigmoid),
    ];
    for (module, op) in cases {
        let x = input(&gpu, &data, &[2, 5]);
        assert!(module.parameters().is_empty());
        check_module(module.as_ref(), &x, true, &|_: &Params, x: &[f64]| {
            x.iter().map(|&v| unary::apply(op, v, 0.0)).collect()
        });
    }
}

#[test]
fn dropout_is_active_only_in_training() {
    let gpu = gpu();
    let mut d = Dropout::new(0.5);
    let x = Tensor::ones(&gpu, &[64], Default::default()).unwrap();
    let y = d.forward(&x).unwrap().to_vec().unwrap();
    assert!(
        y.iter().all(|&v| v == 0.0 || v == 2.0),
        "inverted dropout: 0 or 1/(1-p)"
    );
    assert!(y.contains(&0.0) && y.contains(&2.0));
    d.set_training(false);
    assert!(!d.is_training());
    assert_eq!(d.forward(&x).unwrap().to_vec().unwrap(), vec![1.0; 64]);
}

#[test]
fn attention_matches_reference() {
    let gpu = gpu();
    let (batch, time, dim, heads) = (2, 3, 8, 2);
    let attn = CausalSelfAttention::new(&gpu, dim, heads, 12).unwrap();
    assert_eq!(
        names(&attn),
        [
            "c_attn.weight",
            "c_attn.bias",
            "c_proj.weight",
            "c_proj.bias"
        ]
    );
    let x = input(
        &gpu,
        &Rng::new(13).vec_f32(batch * time * dim, -1.0, 1.0),
        &[batch, time, dim],
    );
    check_module(&attn, &x, true, &|p: &Params, x: &[f64]| {
        attention(p, "", x, time, dim, heads)
    });
    // Both paths, over more positions than one 16-key tile of the fused kernel.
    for efficient in [true, false] {
        let time = 20;
        let mut attn = CausalSelfAttention::new(&gpu, dim, heads, 12).unwrap();
        attn.set_memory_efficient(efficient);
        assert_eq!(attn.is_memory_efficient(), efficient);
        let x = input(
            &gpu,
            &Rng::new(14).vec_f32(batch * time * dim, -1.0, 1.0),
            &[batch, time, dim],
        );
        check_module(&attn, &x, true, &|p: &Params, x: &[f64]| {
            attention(p, "", x, time, dim, heads)
        });
    }
    // 3 heads do not divide 8.
    let err = CausalSelfAttention::new(&gpu, 8, 3, 0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                what: "CausalSelfAttention::new",
                ..
            }
        ) && err
            .to_string()
            .contains("dim 8 must be a positive multiple of heads 3"),
        "{err}"
    );
    let err = attn
        .forward(&Tensor::zeros(&gpu, &[3, 8], Default::default()).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, Error::InputShape { module: "CausalSelfAttention", found, .. }
            if found == &[3, 8]),
        "{err}"
    );
}

#[test]
fn residual_mlp_block_matches_reference() {
    let gpu = gpu();
    let (dim, hidden) = (4, 6);
    let block = ResidualMlpBlock::new(&gpu, dim, hidden, Activation::Tanh, 14).unwrap();
    assert_eq!(
        names(&block),
        [
            "ln.weight",
            "ln.bias",
            "fc1.weight",
            "fc1.bias",
            "fc2.weight",
            "fc2.bias"
        ]
    );
    let x = input(&gpu, &Rng::new(15).vec_f32(3 * dim, -1.0, 1.0), &[3, dim]);
    check_module(&block, &x, true, &|p: &Params, x: &[f64]| {
        let rows = x.len() / dim;
        let h = layer_norm::forward_f64(x, &p["ln.weight"], &p["ln.bias"], rows, dim, 1e-5).y;
        let h: Vec<f64> = linear(&h, &p["fc1.weight"], &p["fc1.bias"], dim, hidden)
            .iter()
            .map(|v| v.tanh())
            .collect();
        let h = linear(&h, &p["fc2.weight"], &p["fc2.bias"], hidden, dim);
        x.iter().zip(h).map(|(a, b)| a + b).collect()
    });
}

/// The f64 reference of a pre-norm transformer block.
pub fn transformer_reference(
    p: &Params,
    x: &[f64],
    time: usize,
    dim: usize,
    heads: usize,
    hidden: usize,
) -> Vec<f64> {
    let rows = x.len() / dim;
    let h = layer_norm::forward_f64(x, &p["ln_1.weight"], &p["ln_1.bias"], rows, dim, 1e-5).y;
    let a = attention(p, "attn.", &h, time, dim, heads);
    let x: Vec<f64> = x.iter().zip(a).map(|(a, b)| a + b).collect();
    let h = layer_norm::forward_f64(&x, &p["ln_2.weight"], &p["ln_2.bias"], rows, dim, 1e-5).y;
    let h: Vec<f64> = linear(&h, &p["mlp.c_fc.weight"], &p["mlp.c_fc.bias"], dim, hidden)
        .into_iter()
        .map(unary::gelu)
        .collect();
    let h = linear(
        &h,
        &p["mlp.c_proj.weight"],
        &p["mlp.c_proj.bias"],
        hidden,
        dim,
    );
    x.iter().zip(h).map(|(a, b)| a + b).collect()
}

#[test]
fn transformer_block_matches_reference() {
    let gpu = gpu();
    let (batch, time, dim, heads, hidden) = (1, 4, 8, 2, 16);
    let block = TransformerBlock::new(&gpu, dim, heads, hidden, 16).unwrap();
    assert_eq!(
        names(&block),
        [
            "ln_1.weight",
            "ln_1.bias",
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "attn.c_proj.bias",
            "ln_2.weight",
            "ln_2.bias",
            "mlp.c_fc.weight",
            "mlp.c_fc.bias",
            "mlp.c_proj.weight",
            "mlp.c_proj.bias"
        ]
    );
    let x = input(
        &gpu,
        &Rng::new(17).vec_f32(batch * time * dim, -1.0, 1.0),
        &[batch, time, dim],
    );
    check_module(&block, &x, true, &|p: &Params, x: &[f64]| {
        transformer_reference(p, x, time, dim, heads, hidden)
    });
}

#[test]
fn mlp_matches_reference_and_names_children() {
    let gpu = gpu();
    let net = mlp(&gpu, &[3, 5, 2], Activation::Relu, 18).unwrap();
    assert_eq!(net.len(), 3);
    assert_eq!(names(&net), ["0.weight", "0.bias", "2.weight", "2.bias"]);
    let x = input(&gpu, &Rng::new(19).vec_f32(4 * 3, -1.0, 1.0), &[4, 3]);
    check_module(&net, &x, true, &|p: &Params, x: &[f64]| {
        let h: Vec<f64> = linear(x, &p["0.weight"], &p["0.bias"], 3, 5)
            .into_iter()
            .map(|v| v.max(0.0))
            .collect();
        linear(&h, &p["2.weight"], &p["2.bias"], 5, 2)
    });
    let err = mlp(&gpu, &[3], Activation::Relu, 0).unwrap_err();
    assert!(
        matches!(err, Error::InvalidConfig { what: "mlp", .. })
            && err.to_string().contains("widths [3]"),
        "{err}"
    );
}

/// In a `Sequential`, a `Linear` followed by a `Relu` runs as one `Tensor::linear` (the ReLU in
/// the matmul's epilogue): the output and the gradients equal those of the two run apart (a
/// checkpoint segment of one child splits them) bit for bit, and only the ReLU's output stays
/// saved for backward, not the pre-activation as well.
#[test]
fn sequential_fuses_linear_and_relu() {
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let net = mlp(&gpu, &[6, 16, 16, 3], Activation::Relu, 31).unwrap();
    let params = net.parameters();
    let x = input(&gpu, &Rng::new(32).vec_f32(8 * 6, -1.0, 1.0), &[8, 6]);
    let activation_bytes = || {
        gpu.flush("stats").unwrap();
        let stats = gpu.with_allocator(|a| a.stats().clone());
        stats
            .category(plimsoll_kernels_wgsl::Category::Activation)
            .allocated_bytes
    };
    let before = activation_bytes();
    let run = |segment_len: usize| {
        let y = net.forward_checkpointed(&x, segment_len).unwrap();
        let held = activation_bytes() - before;
        let out = y.to_vec().unwrap();
        y.sum_all().unwrap().backward().unwrap();
        let grads: Vec<Vec<u32>> = params
            .iter()
            .map(|(_, p)| p.grad().unwrap().to_vec().unwrap())
            .map(|g| g.into_iter().map(f32::to_bits).collect())
            .collect();
        zero_grad(&params);
        (out, grads, held)
    };
    let (fused_y, fused_g, fused_held) = run(0);
    let (split_y, split_g, _) = run(1);
    assert_eq!(fused_y, split_y, "forward differs");
    assert_eq!(fused_g, split_g, "gradients differ");
    // Fused: the two hidden ReLU outputs (8 x 16 each) and the output (8 x 3), in 256-byte
    // blocks at least; unfused, each hidden layer's pre-activation would be held too.
    let hidden = 8 * 16 * 4;
    assert!(
        fused_held < 4 * hidden,
        "{fused_held} activation bytes held after the fused forward"
    );
}

#[test]
fn checkpointed_sequential_equals_plain() {
    let gpu = gpu();
    let (time, dim) = (3, 8);
    let net = Sequential::new()
        .push(TransformerBlock::new(&gpu, dim, 2, 16, 20).unwrap())
        .push(Dropout::new(0.25))
        .push(TransformerBlock::new(&gpu, dim, 2, 16, 21).unwrap())
        .push(Linear::new(&gpu, dim, 5, true, Init::XavierUniform, 22).unwrap());
    assert_eq!(names(&net)[0], "0.ln_1.weight");
    assert_eq!(names(&net).last().unwrap(), "3.bias");
    let params = net.parameters();
    let x = Tensor::from_slice(
        &gpu,
        &Rng::new(23).vec_f32(time * dim, -1.0, 1.0),
        &[1, time, dim],
    )
    .unwrap();
    let run = |segment_len: usize| {
        plimsoll_autograd::manual_seed(5);
        let y = net.forward_checkpointed(&x, segment_len).unwrap();
        let out = y.to_vec().unwrap();
        y.sum_all().unwrap().backward().unwrap();
        let grads: Vec<Vec<f32>> = params
            .iter()
            .map(|(_, p)| p.grad().unwrap().to_vec().unwrap())
            .collect();
        zero_grad(&params);
        (out, grads)
    };
    let (plain_y, plain_g) = run(0);
    for segment_len in [1, 3] {
        let (y, g) = run(segment_len);
        assert_eq!(y, plain_y, "segment_len {segment_len}: forward differs");
        for ((name, _), (a, b)) in params.iter().zip(g.iter().zip(&plain_g)) {
            assert_close(
                &format!("{name} (segment_len {segment_len})"),
                a,
                &to_f64(b),
                1e-5,
                1e-4,
            );
        }
    }
}

#[test]
fn set_training_reaches_every_child() {
    let gpu = gpu();
    let mut net = Sequential::new()
        .push(Linear::new(&gpu, 2, 2, true, Init::XavierUniform, 0).unwrap())
        .push(Dropout::new(0.9));
    assert!(net.is_training());
    net.set_training(false);
    assert!(!net.is_training());
    // Dropout 0.9 in eval mode is the identity: the output is exactly the linear layer's.
    let x = Tensor::ones(&gpu, &[1, 2], Default::default()).unwrap();
    let y = net.forward(&x).unwrap().to_vec().unwrap();
    let p = net.parameters();
    let (w, b) = (p[0].1.to_vec().unwrap(), p[1].1.to_vec().unwrap());
    // W is [out, in]: row o holds output o's weights.
    assert_eq!(y, vec![w[0] + w[1] + b[0], w[2] + w[3] + b[1]]);
}

/// The fused attention keeps no `T x T` tensor: over a forward of batch 2, 4 heads of 8
/// features and 128 positions, the reference path's activation peak exceeds the fused one's by
/// at least its probabilities (2 x 4 x 128 x 128 floats, 512 KiB), while both give the same
/// output, input gradient and parameter gradients within f32 rounding.
#[test]
fn fused_attention_keeps_no_probabilities_and_matches_the_reference_path() {
    use plimsoll_kernels_wgsl::Category;
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let (batch, time, dim, heads) = (2, 128, 32, 4);
    let data = Rng::new(15).vec_f32(batch * time * dim, -1.0, 1.0);
    let r = Rng::new(16).vec_f32(batch * time * dim, -1.0, 1.0);
    let mut runs = Vec::new();
    for efficient in [true, false] {
        let mut attn = CausalSelfAttention::new(&gpu, dim, heads, 12).unwrap();
        attn.set_memory_efficient(efficient);
        let x = input(&gpu, &data, &[batch, time, dim]);
        gpu.with_allocator(|a| a.reset_peaks());
        let y = attn.forward(&x).unwrap();
        let peak = gpu.with_allocator(|a| {
            a.stats()
                .category(Category::Activation)
                .peak_allocated_bytes
        });
        let r_t = Tensor::from_slice(&gpu, &r, y.shape()).unwrap();
        y.mul(&r_t).unwrap().sum_all().unwrap().backward().unwrap();
        let mut grads = vec![y.to_vec().unwrap(), x.grad().unwrap().to_vec().unwrap()];
        for (_, p) in attn.parameters() {
            grads.push(p.grad().unwrap().to_vec().unwrap());
        }
        runs.push((peak, grads));
    }
    let probabilities = (batch * heads * time * time * 4) as u64;
    assert!(
        runs[1].0 >= runs[0].0 + probabilities,
        "activation peaks: fused {} B, reference {} B",
        runs[0].0,
        runs[1].0
    );
    for (i, (fused, reference)) in runs[0].1.iter().zip(&runs[1].1).enumerate() {
        assert_close(
            &format!("tensor {i}"),
            fused,
            &to_f64(reference),
            1e-5,
            1e-4,
        );
    }
}

/// Attention dropout: with the thread's random state set alike, the fused kernels and the
/// reference path (probabilities, then the `dropout` kernel) drop the same probabilities:
/// the same output, input gradient and parameter gradients within f32 rounding; the output
/// differs from no dropout and from another seed; evaluation mode drops nothing.
#[test]
fn attention_dropout_drops_the_same_probabilities_on_both_paths() {
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let (batch, time, dim, heads) = (2, 40, 16, 2);
    let data = Rng::new(25).vec_f32(batch * time * dim, -1.0, 1.0);
    let r = Rng::new(26).vec_f32(batch * time * dim, -1.0, 1.0);
    let run = |efficient: bool, p: f32, seed: u64, training: bool| {
        let mut attn = CausalSelfAttention::new(&gpu, dim, heads, 12).unwrap();
        attn.set_memory_efficient(efficient);
        attn.set_dropout(p).unwrap();
        attn.set_training(training);
        let x = input(&gpu, &data, &[batch, time, dim]);
        plimsoll_autograd::manual_seed(seed);
        let y = attn.forward(&x).unwrap();
        let r_t = Tensor::from_slice(&gpu, &r, y.shape()).unwrap();
        y.mul(&r_t).unwrap().sum_all().unwrap().backward().unwrap();
        let mut values = vec![y.to_vec().unwrap(), x.grad().unwrap().to_vec().unwrap()];
        for (_, p) in attn.parameters() {
            values.push(p.grad().unwrap().to_vec().unwrap());
        }
        values
    };
    let fused = run(true, 0.25, 7, true);
    let reference = run(false, 0.25, 7, true);
    for (i, (f, r)) in fused.iter().zip(&reference).enumerate() {
        assert_close(&format!("tensor {i}"), f, &to_f64(r), 1e-5, 1e-4);
    }
    let differs = |a: &[f32], b: &[f32]| a.iter().zip(b).any(|(x, y)| (x - y).abs() > 1e-3);
    assert!(
        differs(&fused[0], &run(true, 0.0, 7, true)[0]),
        "dropout changed nothing"
    );
    assert!(
        differs(&fused[0], &run(true, 0.25, 8, true)[0]),
        "the seed changed nothing"
    );
    let eval = run(true, 0.25, 7, false);
    let none = run(true, 0.0, 7, true);
    assert_close("evaluation", &eval[0], &to_f64(&none[0]), 1e-6, 1e-6);
    assert!(
        CausalSelfAttention::new(&gpu, dim, heads, 1)
            .unwrap()
            .set_dropout(1.0)
            .is_err()
    );
}
