//! The tiny GPT's model files: the exported `model.safetensors` is nanoGPT's state dict (or Hugging
//! Face's), loads back with `--init-from` and refuses bad files by name; and weights past one
//! binding, kept in parts on the device, train, export, load and resume as they do whole.

#![allow(clippy::unwrap_used)]

mod common;

use common::gpt::*;
use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_nn::{GptConfig, LoadedState};
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::{GptSpec, RunLength, Silent, Trainer};

/// The exported `model.safetensors` is what nanoGPT's `GPT(config).state_dict()` holds for this
/// configuration (its names, in PyTorch's `[out, in]` layout, `lm_head.weight` beside the tied
/// `transformer.wte.weight`), with the trained values.
#[test]
fn the_exported_gpt_has_nanogpts_state_dict() {
    let gpu = fresh_gpu();
    let dir = temp_dir("gpt-export");
    let mut config = config(6, 6, 2, 0.05);
    config.checkpoint_dir = Some(dir.clone());
    let mut trainer = Trainer::new(&gpu, config, &spec(sgd()), windows(200), None).unwrap();
    trainer.run(&mut Silent).unwrap();
    let saved = plimsoll_nn::state::load(&dir.join(plimsoll_trainer::MODEL_FILE)).unwrap();
    // Transcribed from nanoGPT's model.py (n_layer 2, n_embd C = 32, bias=True, flash
    // attention, so no `attn.bias` mask buffer): name -> shape.
    let c = 32;
    let mut want: Vec<(String, Vec<usize>)> = vec![
        ("transformer.wte.weight".into(), vec![VOCAB, c]),
        ("transformer.wpe.weight".into(), vec![CONTEXT, c]),
        ("transformer.ln_f.weight".into(), vec![c]),
        ("transformer.ln_f.bias".into(), vec![c]),
        ("lm_head.weight".into(), vec![VOCAB, c]),
    ];
    for i in 0..2 {
        for (name, shape) in [
            ("ln_1.weight", vec![c]),
            ("ln_1.bias", vec![c]),
            ("attn.c_attn.weight", vec![3 * c, c]),
            ("attn.c_attn.bias", vec![3 * c]),
            ("attn.c_proj.weight", vec![c, c]),
            ("attn.c_proj.bias", vec![c]),
            ("ln_2.weight", vec![c]),
            ("ln_2.bias", vec![c]),
            ("mlp.c_fc.weight", vec![4 * c, c]),
            ("mlp.c_fc.bias", vec![4 * c]),
            ("mlp.c_proj.weight", vec![c, 4 * c]),
            ("mlp.c_proj.bias", vec![c]),
        ] {
            want.push((format!("transformer.h.{i}.{name}"), shape));
        }
    }
    want.sort();
    let mut got: Vec<(String, Vec<usize>)> = saved
        .tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.shape.clone()))
        .collect();
    got.sort();
    assert_eq!(got, want);
    assert_eq!(saved.metadata.get("format").map(String::as_str), Some("pt"));
    for (name, values) in values(trainer.parameters()) {
        assert_eq!(saved.tensors[&name].data, values, "{name}");
    }
    assert_eq!(
        saved.tensors["lm_head.weight"].data, saved.tensors["transformer.wte.weight"].data,
        "the head is tied"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Trains `spec` 2 steps with a run directory; the exported `model.safetensors`, the
/// `config.json` beside it (if any) and the trained parameters.
fn exported(spec: &GptSpec, name: &str) -> (LoadedState, Option<serde_json::Value>, Values) {
    let gpu = fresh_gpu();
    let dir = temp_dir(name);
    let mut config = config(6, 6, 2, 0.05);
    config.checkpoint_dir = Some(dir.clone());
    let mut trainer = Trainer::new(&gpu, config, spec, windows(200), None).unwrap();
    trainer.run(&mut Silent).unwrap();
    let saved = plimsoll_nn::state::load(&dir.join(plimsoll_trainer::MODEL_FILE)).unwrap();
    let json = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    (saved, json, values(trainer.parameters()))
}

/// `--export hf` writes a GPT as Hugging Face's `GPT2LMHeadModel` (nanoGPT's names, the four
/// block weights `[in, out]`, a `config.json` of `model_type` gpt2), and a Llama as
/// `LlamaForCausalLM`; `--init-from` reads either layout back into a fresh model (every value
/// equal), and refuses a file with a missing or mis-shaped entry by name, changing nothing.
#[test]
fn hugging_face_exports_load_back_and_bad_files_are_refused_by_name() {
    let gpt = GptSpec {
        export: plimsoll_trainer::ExportLayout::HuggingFace,
        ..spec(sgd())
    };
    let (saved, json, trained) = exported(&gpt, "gpt-export-hf");
    let json = json.expect("a config.json");
    assert_eq!(json["model_type"], "gpt2");
    assert_eq!(json["n_embd"], 32);
    let c = 32;
    for (name, shape) in [
        ("transformer.h.1.attn.c_attn.weight", vec![c, 3 * c]),
        ("transformer.h.1.attn.c_proj.weight", vec![c, c]),
        ("transformer.h.0.mlp.c_fc.weight", vec![c, 4 * c]),
        ("transformer.h.0.mlp.c_proj.weight", vec![4 * c, c]),
        ("transformer.h.0.attn.c_attn.bias", vec![3 * c]),
        ("lm_head.weight", vec![VOCAB, c]),
    ] {
        assert_eq!(saved.tensors[name].shape, shape, "{name}");
    }
    // [in, out]: element (k, o) of the file is (o, k) of the trained [out, in] weight.
    let trained_map: std::collections::BTreeMap<_, _> = trained.iter().cloned().collect();
    let w = &trained_map["transformer.h.0.mlp.c_fc.weight"];
    let file = &saved.tensors["transformer.h.0.mlp.c_fc.weight"].data;
    assert_eq!(file[4 * c + 7], w[7 * c + 1]);

    let llama = GptSpec {
        arch: plimsoll_trainer::Arch::Llama(plimsoll_trainer::LlamaShape {
            kv_heads: 1,
            mlp_width: 40,
            rope_theta: 10_000.0,
            tie_embeddings: false,
        }),
        ..spec(sgd())
    };
    let (llama_saved, llama_json, llama_trained) = exported(&llama, "llama-export");
    let llama_json = llama_json.expect("a Llama's config.json");
    assert_eq!(llama_json["model_type"], "llama");
    assert_eq!(llama_json["num_key_value_heads"], 1);
    assert_eq!(
        llama_saved.tensors["model.layers.0.self_attn.k_proj.weight"].shape,
        vec![16, 32]
    );

    // Each file back into a fresh model of a different seed: every value is the trained one.
    let (nano_saved, _, nano_trained) = exported(&spec(sgd()), "gpt-export-nano");
    for (spec, source, want, name) in [
        (gpt, &saved, trained, "gpt-init-hf"),
        (spec(sgd()), &nano_saved, nano_trained, "gpt-init-nano"),
        (llama, &llama_saved, llama_trained, "llama-init"),
    ] {
        let dir = temp_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("weights.safetensors");
        write_state(&file, source);
        let gpu = fresh_gpu();
        let fresh = GptSpec { seed: 99, ..spec };
        let mut t = Trainer::new(&gpu, config(6, 6, 2, 0.05), &fresh, windows(200), None).unwrap();
        t.init_from(&file).unwrap();
        assert_eq!(values(t.parameters()), want, "{name}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    // A file without one entry, and one with an entry of another shape: refused by name,
    // and the model keeps its values.
    let dir = temp_dir("init-bad");
    std::fs::create_dir_all(&dir).unwrap();
    let gpu = fresh_gpu();
    let mut t = Trainer::new(&gpu, config(6, 6, 2, 0.05), &llama, windows(200), None).unwrap();
    let before = values(t.parameters());
    let mut missing = llama_saved.clone();
    missing.tensors.remove("model.norm.weight");
    let mut misshaped = llama_saved.clone();
    misshaped
        .tensors
        .get_mut("model.layers.1.mlp.up_proj.weight")
        .unwrap()
        .shape = vec![32, 40];
    for (state, needle) in [
        (missing, "model.norm.weight"),
        (misshaped, "model.layers.1.mlp.up_proj.weight"),
    ] {
        let file = dir.join("bad.safetensors");
        write_state(&file, &state);
        let err = t.init_from(&file).expect_err("must be refused");
        assert!(err.to_string().contains(needle), "{err}");
        assert_eq!(values(t.parameters()), before);
    }
    // An untied head into a model that ties it: refused (its trained head is not dropped).
    let tied = GptSpec {
        arch: plimsoll_trainer::Arch::Llama(plimsoll_trainer::LlamaShape {
            tie_embeddings: true,
            kv_heads: 1,
            mlp_width: 40,
            rope_theta: 10_000.0,
        }),
        ..spec(sgd())
    };
    let mut t = Trainer::new(&gpu, config(6, 6, 2, 0.05), &tied, windows(200), None).unwrap();
    let before = values(t.parameters());
    let file = dir.join("untied.safetensors");
    write_state(&file, &llama_saved);
    let err = t
        .init_from(&file)
        .expect_err("an untied head into a tied model");
    assert!(err.to_string().contains("table of its own"), "{err}");
    assert_eq!(values(t.parameters()), before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `state` written as a safetensors file (f32, no metadata).
fn write_state(path: &std::path::Path, state: &LoadedState) {
    let gpu = fresh_gpu();
    let tensors = state
        .to_device(&gpu, plimsoll_autograd::TensorOptions::default())
        .unwrap();
    plimsoll_nn::state::save(path, &tensors, &Default::default()).unwrap();
}

/// A token table past one binding (kept in parts on the device) is exported whole, under its
/// own name, in both layouts (what nanoGPT and Hugging Face read), and `--init-from` cuts it
/// back into the parts of a model on such a device, every value equal.
#[test]
fn tables_in_parts_are_exported_whole_and_loaded_back_into_parts() {
    use plimsoll_kernels_wgsl::GpuOptions;
    use plimsoll_kernels_wgsl::testing::gpu_with;
    // A vocabulary of 600 (padded past the data's 13) and width 8: the token table is 19,200
    // bytes, three parts under a binding of 8 KiB, while every other tensor fits one (the
    // loss in chunks of 2 rows: 4,800 bytes of logits).
    let (vocab, width) = (600, 8);
    let small = || {
        gpu_with(GpuOptions {
            max_binding_bytes: Some(8 << 10),
            ..GpuOptions::from_env()
        })
    };
    let tiny = GptSpec {
        config: GptConfig {
            vocab_size: vocab,
            n_embd: width,
            n_head: 2,
            n_layer: 1,
            ..spec(sgd()).config
        },
        loss: plimsoll_trainer::LossHead::Chunked(2),
        ..spec(sgd())
    };
    for (export, name) in [
        (plimsoll_trainer::ExportLayout::NanoGpt, "parts-nano"),
        (plimsoll_trainer::ExportLayout::HuggingFace, "parts-hf"),
    ] {
        let spec = GptSpec { export, ..tiny };
        let dir = temp_dir(name);
        let mut cfg = config(6, 6, 2, 0.05);
        cfg.checkpoint_dir = Some(dir.clone());
        let gpu = small();
        let mut trainer = Trainer::new(&gpu, cfg, &spec, windows(200), None).unwrap();
        let parts = trainer
            .parameters()
            .iter()
            .filter(|(n, _)| n.contains("wte"))
            .count();
        assert_eq!(parts, 3, "the table is kept in parts");
        trainer.run(&mut Silent).unwrap();
        let file = dir.join(plimsoll_trainer::MODEL_FILE);
        let saved = plimsoll_nn::state::load(&file).unwrap();
        assert_eq!(
            saved.tensors["transformer.wte.weight"].shape,
            vec![vocab, width]
        );
        assert_eq!(saved.tensors["lm_head.weight"].shape, vec![vocab, width]);
        assert!(!saved.tensors.keys().any(|k| k.contains(".part")), "{name}");
        let trained = values(trainer.parameters());
        let gpu = small();
        let fresh = GptSpec { seed: 5, ..spec };
        let mut t = Trainer::new(&gpu, config(6, 6, 2, 0.05), &fresh, windows(200), None).unwrap();
        t.init_from(&file).unwrap();
        assert_eq!(values(t.parameters()), trained, "{name}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A checkpoint moves between devices that keep the token table differently: a run stopped on
/// a device that binds 8 KiB (the table in three parts, with its SGD momentum) and resumed on
/// one that holds it whole ends where the same run on the first device alone does (the parts
/// joined for the comparison). The parts are drawn from their own seeds, so the first device
/// defines the start.
#[test]
fn a_checkpoint_resumes_on_a_device_that_splits_the_table_differently() {
    use plimsoll_kernels_wgsl::GpuOptions;
    use plimsoll_kernels_wgsl::testing::gpu_with;
    let small = || {
        gpu_with(GpuOptions {
            max_binding_bytes: Some(8 << 10),
            ..GpuOptions::from_env()
        })
    };
    let spec = GptSpec {
        config: GptConfig {
            vocab_size: 600,
            n_embd: 8,
            n_head: 2,
            n_layer: 1,
            ..spec(sgd()).config
        },
        loss: plimsoll_trainer::LossHead::Chunked(2),
        ..spec(sgd())
    };
    // The parameters with each table's parts joined under its own name.
    let joined = |v: Values| -> Values {
        let mut out: Values = Vec::new();
        for (name, data) in v {
            match name.rsplit_once(".part") {
                Some((base, i)) if i != "0" => {
                    let last = out.last_mut().expect("part 0 first");
                    assert_eq!(last.0, base);
                    last.1.extend(data);
                }
                Some((base, _)) => out.push((base.to_string(), data)),
                None => out.push((name, data)),
            }
        }
        out
    };
    let straight = {
        let gpu = small();
        let mut t = Trainer::new(&gpu, config(6, 6, 5, 0.05), &spec, windows(200), None).unwrap();
        assert_eq!(
            t.parameters()
                .iter()
                .filter(|(n, _)| n.contains("wte"))
                .count(),
            3
        );
        t.run(&mut Silent).unwrap();
        joined(values(t.parameters()))
    };
    let dir = temp_dir("resume-across-splits");
    let mut first = config(6, 6, 2, 0.05);
    first.checkpoint_dir = Some(dir.clone());
    let gpu = small();
    let mut t = Trainer::new(&gpu, first.clone(), &spec, windows(200), None).unwrap();
    t.run(&mut Silent).unwrap();
    drop(t);
    let mut second = first;
    second.length = RunLength::Steps(5);
    let gpu = fresh_gpu();
    let mut t = Trainer::new(&gpu, second, &spec, windows(200), None).unwrap();
    t.resume(&latest_path(&dir)).unwrap();
    t.run(&mut Silent).unwrap();
    assert!(!t.parameters().iter().any(|(n, _)| n.contains(".part")));
    assert_params_close(&values(t.parameters()), &straight, 1e-5);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Weights past one binding are kept in parts, not only token tables: under a binding of
/// 8 KiB the width-32 GPT's `c_attn` (12 KiB), `c_fc` and MLP `c_proj` (16 KiB each) are two
/// parts each. Started from the same values as the GPT on an unlimited device (`--init-from`
/// cuts them), three steps of each at micro-batch 1 give the same parameters.
#[test]
fn weights_past_one_binding_train_in_parts_as_they_do_whole() {
    use plimsoll_kernels_wgsl::GpuOptions;
    use plimsoll_kernels_wgsl::testing::gpu_with;
    let small = gpu_with(GpuOptions {
        max_binding_bytes: Some(8 << 10),
        ..GpuOptions::from_env()
    });
    let spec = GptSpec {
        config: GptConfig {
            n_layer: 1,
            ..spec(sgd()).config
        },
        ..spec(sgd())
    };
    let whole_gpu = fresh_gpu();
    let mut whole =
        Trainer::new(&whole_gpu, config(6, 1, 3, 0.05), &spec, windows(200), None).unwrap();
    let mut split = Trainer::new(&small, config(6, 1, 3, 0.05), &spec, windows(200), None).unwrap();
    let names: Vec<&str> = split.parameters().iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        "transformer.h.0.attn.c_attn.weight.part1",
        "transformer.h.0.mlp.c_fc.weight.part1",
        "transformer.h.0.mlp.c_fc.bias.part1",
        "transformer.h.0.mlp.c_proj.weight.part1",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let dir = temp_dir("linear-parts");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("start.safetensors");
    let start = LoadedState {
        tensors: values(whole.parameters())
            .into_iter()
            .zip(whole.parameters())
            .map(|((n, data), (_, t))| {
                let shape = t.shape().to_vec();
                (n, plimsoll_nn::HostTensor::new(shape, data))
            })
            .collect(),
        metadata: Default::default(),
    };
    write_state(&file, &start);
    split.init_from(&file).unwrap();
    whole.run(&mut Silent).unwrap();
    split.run(&mut Silent).unwrap();
    // The split run's parameters with each weight's parts joined (rows in order).
    let mut joined: std::collections::BTreeMap<String, Vec<f32>> = Default::default();
    for (name, data) in values(split.parameters()) {
        let base = name
            .rsplit_once(".part")
            .map_or(name.clone(), |(b, _)| b.to_string());
        joined.entry(base).or_default().extend(data);
    }
    let joined: Values = values(whole.parameters())
        .into_iter()
        .map(|(n, _)| (n.clone(), joined.remove(&n).unwrap()))
        .collect();
    assert_params_close(&joined, &values(whole.parameters()), 1e-5);
    let _ = std::fs::remove_dir_all(&dir);
}
