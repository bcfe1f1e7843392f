//! The GPT against an f64 reference built from the reference's layer norm, the block reference
//! and the tied head; its names, state dict and checkpointed backward.

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::kernels::layer_norm::reference as layer_norm;
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, gpu};
use plimsoll_nn::{CausalLm, Gpt, GptConfig, Module, parameter_count};

use crate::common::{Params, check_module, linear};
use crate::modules::transformer_reference;

const TINY: GptConfig = GptConfig {
    vocab_size: 11,
    block_size: 6,
    n_layer: 2,
    n_head: 2,
    n_embd: 8,
};

/// nanoGPT's forward in f64: embeddings, blocks, final norm, logits `h · wteᵀ`.
fn gpt_reference(p: &Params, ids: &[f64], cfg: GptConfig, time: usize) -> Vec<f64> {
    let c = cfg.n_embd;
    let (wte, wpe) = (&p["transformer.wte.weight"], &p["transformer.wpe.weight"]);
    let mut x = Vec::with_capacity(ids.len() * c);
    for (i, &id) in ids.iter().enumerate() {
        let (id, t) = (id as usize, i % time);
        x.extend((0..c).map(|j| wte[id * c + j] + wpe[t * c + j]));
    }
    for layer in 0..cfg.n_layer {
        let prefix = format!("transformer.h.{layer}.");
        let block: Params = p
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(&prefix).map(|r| (r.to_string(), v.clone())))
            .collect();
        x = transformer_reference(&block, &x, time, c, cfg.n_head, 4 * c);
    }
    let (g, b) = (&p["transformer.ln_f.weight"], &p["transformer.ln_f.bias"]);
    let h = layer_norm::forward_f64(&x, g, b, ids.len(), c, 1e-5).y;
    linear(&h, wte, &[], c, cfg.vocab_size)
}

fn ids(batch: usize, time: usize, seed: u64) -> (Vec<u32>, Tensor) {
    let mut rng = Rng::new(seed);
    let ids: Vec<u32> = (0..batch * time)
        .map(|_| rng.below(TINY.vocab_size as u64) as u32)
        .collect();
    let tensor = Tensor::from_indices(&gpu(), &ids, &[batch, time]).unwrap();
    (ids, tensor)
}

#[test]
fn gpt_matches_reference_with_a_tied_head() {
    let gpu = gpu();
    let model = Gpt::new(&gpu, TINY, 3).unwrap();
    assert_eq!(parameter_count(&model), TINY.parameter_count());
    let time = 5;
    let (_, x) = ids(2, time, 4);
    check_module(&model, &x, false, &|p: &Params, ids: &[f64]| {
        gpt_reference(p, ids, TINY, time)
    });
}

#[test]
fn gpt_names_are_nanogpts_and_the_state_dict_ties_the_head() {
    let model = Gpt::new(&gpu(), TINY, 5).unwrap();
    let names: Vec<String> = model.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names[..3],
        [
            "transformer.wte.weight",
            "transformer.wpe.weight",
            "transformer.h.0.ln_1.weight"
        ]
    );
    assert!(names.contains(&"transformer.h.1.attn.c_attn.weight".to_string()));
    assert!(names.contains(&"transformer.h.1.mlp.c_proj.bias".to_string()));
    assert_eq!(names.last().unwrap(), "transformer.ln_f.bias");
    let state = model.state_dict();
    let (_, head) = state.iter().find(|(n, _)| n == "lm_head.weight").unwrap();
    let (_, wte) = state
        .iter()
        .find(|(n, _)| n == "transformer.wte.weight")
        .unwrap();
    assert_eq!(head.to_vec().unwrap(), wte.to_vec().unwrap());
    assert_eq!(head.shape(), [11, 8]);
    let c_attn = &model.parameters()[4].1;
    assert_eq!(c_attn.shape(), [24, 8], "PyTorch's [out, in]");
}

#[test]
fn gpt_refuses_bad_configs_and_inputs() {
    let bad = GptConfig { n_head: 3, ..TINY };
    assert!(
        Gpt::new(&gpu(), bad, 0)
            .unwrap_err()
            .to_string()
            .contains("n_head")
    );
    let model = Gpt::new(&gpu(), TINY, 0).unwrap();
    let (_, too_long) = ids(1, 6, 1);
    assert!(model.forward(&too_long).is_ok());
    let long = Tensor::from_indices(&gpu(), &[0; 7], &[1, 7]).unwrap();
    assert!(
        model
            .forward(&long)
            .unwrap_err()
            .to_string()
            .contains("time <= 6")
    );
}

/// Checkpointing every block gives the same gradients as keeping every activation.
#[test]
fn checkpointed_blocks_give_the_same_gradients() {
    let gpu = gpu();
    let (_, x) = ids(2, 6, 9);
    let grads = |segment: usize| {
        let model = Gpt::new(&gpu, TINY, 7).unwrap();
        let logits = model.forward_checkpointed(&x, segment).unwrap();
        logits
            .mul(&logits)
            .unwrap()
            .mean_all()
            .unwrap()
            .backward()
            .unwrap();
        model
            .parameters()
            .into_iter()
            .map(|(n, t)| (n, t.grad().unwrap().to_vec().unwrap()))
            .collect::<Vec<_>>()
    };
    let (plain, checkpointed) = (grads(0), grads(1));
    for ((name, a), (_, b)) in plain.iter().zip(&checkpointed) {
        assert_close(name, b, a, 1e-6, 1e-5);
    }
}

/// The GPT of `cfg` (seed 7) on `gpu`, its blocks built into host memory when `streamed`
/// ([`plimsoll_nn::evict_blocks_as_built`]).
fn streamed_or_not(gpu: &plimsoll_kernels_wgsl::Gpu, cfg: GptConfig, streamed: bool) -> Gpt {
    let _evict = streamed.then(plimsoll_nn::evict_blocks_as_built);
    Gpt::new(gpu, cfg, 7).unwrap()
}

/// Back-propagates the mean of `out`'s squares.
fn mean_square_backward(out: &Tensor) {
    out.mul(out)
        .unwrap()
        .mean_all()
        .unwrap()
        .backward()
        .unwrap();
}

/// A GPT built with its blocks' parameters in host memory ([`evict_blocks_as_built`]) gives
/// the logits and gradients of the same GPT on the device, bit for bit: without checkpointing
/// (each block then a segment of its own), block by block and two blocks a segment, over two
/// backwards that add up; without grad too. The blocks' parameters and gradients end in host
/// memory, and the device held one segment's parameters at a time.
#[test]
fn a_gpt_whose_blocks_are_in_host_memory_gives_the_same_logits_and_gradients() {
    // A device of its own: its allocator counts this test's parameters alone.
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let x = Tensor::from_indices(&gpu, &ids(2, 6, 9).0, &[2, 6]).unwrap();
    let cfg = GptConfig { n_layer: 3, ..TINY };
    let run = |segment: usize, streamed: bool| {
        let model = streamed_or_not(&gpu, cfg, streamed);
        let blocks = model.block_parameters();
        assert_eq!(blocks.iter().all(|(_, p)| !p.is_resident()), streamed);
        let parameter_bytes = || {
            gpu.with_allocator(|a| {
                let s = a.stats();
                let p = s.category(plimsoll_kernels_wgsl::Category::Parameter);
                (p.allocated_bytes, p.peak_allocated_bytes)
            })
        };
        gpu.with_allocator(|a| a.reset_peaks());
        let built = parameter_bytes().0;
        let mut logits = Vec::new();
        for _ in 0..2 {
            let out = model.forward_checkpointed(&x, segment).unwrap();
            logits.push(out.to_vec().unwrap());
            mean_square_backward(&out);
        }
        let peak = (built, parameter_bytes().1);
        let no_grad = {
            let _no_grad = plimsoll_autograd::no_grad();
            model.forward_checkpointed(&x, 0).unwrap().to_vec().unwrap()
        };
        assert_eq!(&no_grad, &logits[0]);
        if streamed {
            for (name, p) in &blocks {
                let g = p.grad().unwrap();
                assert!(
                    !p.is_resident() && !g.is_resident(),
                    "{name} left in host memory"
                );
            }
        }
        let grads: Vec<_> = model
            .parameters()
            .into_iter()
            .map(|(n, t)| (n, t.grad().unwrap().to_vec().unwrap()))
            .collect();
        (logits, grads, peak)
    };
    for segment in [0, 1, 2] {
        let (logits, grads, (all, all_peak)) = run(segment, false);
        let (streamed_logits, streamed_grads, (rest, peak)) = run(segment, true);
        assert_eq!(streamed_logits, logits, "segments of {segment}");
        assert_eq!(streamed_grads, grads, "segments of {segment}");
        // The device's parameter bytes: all of them, or the embeddings, the last norm and
        // the blocks of one segment (less than one block more: a restored tensor may take a
        // free block a little larger than itself).
        let block = (all - rest) / 3;
        let len = segment.max(1) as u64;
        assert_eq!(all_peak, all);
        let most = rest + len * block;
        assert!(
            (most..most + block).contains(&peak),
            "segments of {segment}: peak {peak}, {rest} besides blocks of {block}"
        );
    }
}

/// In f16, with the weights read through f16 copies made once per update, a GPT whose blocks
/// are in host memory gives the same logits and gradients, and keeps no copy of a streamed
/// block's weights after its segment: with the copies' guard still alive after backward, the
/// device holds fewer temporary bytes than the same GPT on the device does.
#[test]
fn streamed_blocks_keep_no_f16_weight_copies() {
    use plimsoll_autograd::{f16_activations, f16_weight_copies};
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let x = Tensor::from_indices(&gpu, &ids(2, 6, 9).0, &[2, 6]).unwrap();
    let cfg = GptConfig { n_layer: 3, ..TINY };
    let run = |streamed: bool| {
        let model = streamed_or_not(&gpu, cfg, streamed);
        let _copies = f16_weight_copies();
        let logits = {
            let _half = f16_activations();
            let out = model.forward_checkpointed(&x, 1).unwrap();
            let logits = out.to_vec().unwrap();
            mean_square_backward(&out);
            logits
        };
        let temporary = gpu.with_allocator(|a| {
            a.stats()
                .category(plimsoll_kernels_wgsl::Category::Temporary)
                .allocated_bytes
        });
        let grads: Vec<_> = model
            .parameters()
            .into_iter()
            .map(|(_, t)| t.grad().unwrap().to_vec().unwrap())
            .collect();
        (logits, grads, temporary)
    };
    let (logits, grads, all_copies) = run(false);
    let (streamed_logits, streamed_grads, some_copies) = run(true);
    assert_eq!((streamed_logits, streamed_grads), (logits, grads));
    assert!(
        some_copies < all_copies,
        "{some_copies} temporary bytes streamed, {all_copies} on the device"
    );
}

/// A GPT whose token table is past one binding (a device that binds 4 KiB: the 300 x 8 table
/// takes 9,600 B) keeps it in three parts, and trains as the same GPT with the table whole:
/// three AdamW steps through the chunked loss give the same losses and parameters (the parts
/// given the whole table's values).
#[test]
fn a_gpt_whose_token_table_passes_one_binding_trains_as_with_the_table_whole() {
    use plimsoll_kernels_wgsl::GpuOptions;
    use plimsoll_kernels_wgsl::testing::gpu_with;
    use plimsoll_nn::{AdamW, AdamWConfig, Optimizer, zero_grad};
    let cfg = GptConfig {
        vocab_size: 300,
        ..TINY
    };
    let whole_gpu = gpu();
    let small_gpu = gpu_with(GpuOptions {
        max_binding_bytes: Some(4096),
        ..GpuOptions::from_env()
    });
    let whole = Gpt::new(&whole_gpu, cfg, 5).unwrap();
    let parted = Gpt::new(&small_gpu, cfg, 5).unwrap();
    let names: Vec<String> = parted.parameters().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.contains(&"transformer.wte.weight.part2".to_string()),
        "{names:?}"
    );
    // The parts take the whole table's values; every other parameter its namesake's.
    let values: std::collections::HashMap<String, Vec<f32>> = whole
        .parameters()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec().unwrap()))
        .collect();
    let table = &values["transformer.wte.weight"];
    let mut first = 0;
    for (name, t) in parted.parameters() {
        let v = match name.strip_prefix("transformer.wte.weight.part") {
            Some(_) => {
                let part = table[first..first + t.numel()].to_vec();
                first += t.numel();
                part
            }
            None => values[&name].clone(),
        };
        t.write_from_slice(&v).unwrap();
    }
    assert_eq!(first, table.len());
    let run = |gpt: &Gpt, gpu: &plimsoll_autograd::Gpu| {
        let params = gpt.parameters();
        let mut opt = AdamW::new(AdamWConfig::default());
        let mut losses = Vec::new();
        for step in 0..3u32 {
            let ids: Vec<u32> = (0..12u32).map(|i| (i * 37 + step * 101) % 300).collect();
            let targets: Vec<u32> = (0..12u32).map(|i| (i * 53 + step * 7 + 1) % 300).collect();
            let ids = Tensor::from_indices(gpu, &ids, &[2, 6]).unwrap();
            let targets = Tensor::from_indices(gpu, &targets, &[2, 6]).unwrap();
            let loss = gpt.loss_checkpointed(&ids, &targets, 0, 0.0, 0).unwrap();
            loss.backward().unwrap();
            opt.step(&params).unwrap();
            zero_grad(&params);
            losses.push(f64::from(loss.item().unwrap()));
        }
        let mut flat: Vec<f32> = Vec::new();
        for (_, t) in params {
            flat.extend(t.to_vec().unwrap());
        }
        (losses, flat)
    };
    let (want_losses, want) = run(&whole, &whole_gpu);
    let (losses, got) = run(&parted, &small_gpu);
    assert_close(
        "losses",
        &losses.iter().map(|&l| l as f32).collect::<Vec<_>>(),
        &want_losses,
        1e-6,
        1e-5,
    );
    // Both list the table first (whole, or its parts in order), then the same parameters.
    assert_close(
        "parameters after 3 steps",
        &got,
        &want.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        1e-6,
        1e-4,
    );
}

/// The residual stream's gradient reaches each block's input two ways (around the block, and
/// through its layer norm); layer norm's backward adds into it in its kernel, so backward
/// allocates no addition of the stream's size.
#[test]
fn a_gpts_backward_adds_no_residual_gradients_apart() {
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let cfg = GptConfig {
        n_layer: 3,
        n_embd: 32,
        block_size: 16,
        ..TINY
    };
    let (batch, time) = (2, 16);
    let x = Tensor::from_indices(&gpu, &ids(batch, time, 9).0, &[batch, time]).unwrap();
    let model = Gpt::new(&gpu, cfg, 7).unwrap();
    let logits = model.forward(&x).unwrap();
    let loss = logits.mul(&logits).unwrap().mean_all().unwrap();
    let stream = (batch * time * cfg.n_embd * 4) as u64;
    let additions = crate::common::additions_in_backward(&gpu, &loss, stream);
    assert_eq!(additions, 0, "additions of the stream's size in backward");
}

/// Without checkpointing each block's MLP addition runs in the next norm's kernel
/// (`TransformerBlock::forward_open`); in one checkpointed segment the blocks run one by one,
/// each addition its own. The logits are the same, bit for bit.
#[test]
fn an_open_residual_stream_gives_the_logits_of_blocks_run_one_by_one() {
    let gpu = gpu();
    let (_, x) = ids(2, 6, 9);
    let model = Gpt::new(&gpu, GptConfig { n_layer: 3, ..TINY }, 7).unwrap();
    let open = model.forward_checkpointed(&x, 0).unwrap().to_vec().unwrap();
    let one_by_one = model.forward_checkpointed(&x, 3).unwrap().to_vec().unwrap();
    assert_eq!(open, one_by_one);
}
