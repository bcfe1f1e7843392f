//! The golden trajectory, as llm.c keeps one: ten AdamW steps of a two-layer [`Gpt`] with the
//! fused attention, against a float64 reference of the same model written outside the crates
//! (`tests/golden/gpt_f64.py`: pure Python 3, its gradients from a scalar reverse-mode autodiff,
//! so no derivative of the model is written twice).
//!
//! For each seed: the GPT is built and its parameters redrawn at unit scale ([`spread_out`]),
//! the initial parameters and ten random batches (one per step) go to the reference as JSON,
//! both train ten steps (forward, loss, backward, AdamW step, zero grads, as the trainer does),
//! and the reference's float64 losses and final parameters are compared with ours:
//! - every step's loss within [`LOSS_RTOL`] of the reference's, relative, on every seed;
//! - every final parameter within [`PARAM_TOL`]` * max(max_i |ref_i|, 1)` of the reference's,
//!   the max over that tensor's reference values, on every seed but at most one; the key
//!   biases are left out ([`is_key_bias`]) and their gradient checked instead.
//!
//! Why one seed may miss on parameters: Adam's `m / sqrt(v)` turns one rounding-level event
//! into a step-sized one. An element whose gradient is zero but for rounding at some step
//! (1e-7 of its tensor's largest) moves by about `lr` in a direction that rounding picks. Out of
//! 16 seeds tried, one (seed 10) had such an element and missed by 1.4x the tolerance; the other
//! elements of every seed stay within about 0.03x. A real formula error shows on every seed (the
//! erf GELU, an AdamW `eps` ten times too large, weight decay on the gains and biases: 4x to
//! 800x, each on all three). The worst errors of each seed are printed (`--nocapture`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::testing::{Rng, fresh_dir, gpu};
use plimsoll_nn::{AdamW, AdamWConfig, CausalLm, Gpt, GptConfig, Module, Optimizer, zero_grad};
use serde_json::{Value, json};

/// Two layers, width 16, two heads, context 8: small enough for the reference to train in about
/// two seconds per seed in pure Python.
const CONFIG: GptConfig = GptConfig {
    vocab_size: 11,
    block_size: 8,
    n_layer: 2,
    n_head: 2,
    n_embd: 16,
};
/// Sequences per batch (each of `CONFIG.block_size` tokens).
const BATCH: usize = 2;
/// AdamW steps per seed.
const STEPS: usize = 10;
/// The seeds, each of the initial parameters and the batches.
const SEEDS: [u64; 3] = [1, 2, 3];
/// Relative tolerance of each step's loss.
const LOSS_RTOL: f64 = 1e-5;
/// Tolerance of each final parameter, times its tensor's scale (see the module docs).
const PARAM_TOL: f64 = 1e-5;
/// The largest key-bias gradient allowed, relative to the largest of its `c_attn.bias` (f32
/// rounding gives about 1e-6 here).
const KEY_BIAS_GRADIENT_RTOL: f64 = 1e-5;

/// nanoGPT's Shakespeare recipe: betas (0.9, 0.99), weight decay 0.1 on matrices only; a
/// constant rate, no clipping, no dropout, no label smoothing.
fn adamw_config() -> AdamWConfig {
    AdamWConfig {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
        decay_matrices_only: true,
    }
}

/// The mean cross-entropy of `gpt` on `ids` `[n, t]` against `targets` `[n, t]`: the one place
/// the test computes the loss: the chunked output head and cross-entropy.
fn loss(gpt: &Gpt, ids: &Tensor, targets: &Tensor) -> Tensor {
    // The chunked head and loss, in chunks of 5 of the 16 rows (5, 5, 5 and 1).
    gpt.loss_checkpointed(ids, targets, 0, 0.0, LOSS_CHUNK_ROWS)
        .unwrap()
}

/// Rows per chunk of the loss: several chunks and a short last one.
const LOSS_CHUNK_ROWS: usize = 5;

/// One step's batch, `[BATCH, block_size]` row-major: random token sequences, each target the
/// token after its input.
struct Batch {
    ids: Vec<u32>,
    targets: Vec<u32>,
}

fn batches(seed: u64) -> Vec<Batch> {
    let mut rng = Rng::new(seed.wrapping_mul(1_000_003));
    let time = CONFIG.block_size;
    (0..STEPS)
        .map(|_| {
            let (mut ids, mut targets) = (Vec::new(), Vec::new());
            for _ in 0..BATCH {
                let seq: Vec<u32> = (0..=time)
                    .map(|_| rng.below(CONFIG.vocab_size as u64) as u32)
                    .collect();
                ids.extend_from_slice(&seq[..time]);
                targets.extend_from_slice(&seq[1..]);
            }
            Batch { ids, targets }
        })
        .collect()
}

/// A parameter by name: shape and values.
struct Named {
    name: String,
    shape: Vec<usize>,
    values: Vec<f32>,
}

fn snapshot(gpt: &Gpt) -> Vec<Named> {
    gpt.parameters()
        .into_iter()
        .map(|(name, t)| Named {
            shape: t.shape().to_vec(),
            values: t.to_vec().unwrap(),
            name,
        })
        .collect()
}

/// Redraws every parameter of `gpt` at unit scale from `seed`: matrices `U(-a, a)` with
/// `a = 2 / sqrt(columns)` (so each linear layer's outputs, and the logits, are of order 1),
/// vectors `base + U(-0.5, 0.5)` with base 1 for the layer-norm gains and 0 for the biases.
/// nanoGPT's initialisation (weights of std 0.02, zero biases, unit gains) keeps every
/// activation near zero, where the tanh and erf GELUs agree to 1e-7 and a bias or gain that
/// is read wrongly changes nothing: from it, a reference with the erf GELU passed this test.
fn spread_out(gpt: &Gpt, seed: u64) {
    let mut rng = Rng::new(seed);
    for (name, t) in gpt.parameters() {
        let values = match *t.shape() {
            [_, columns] => {
                let a = 2.0 / (columns as f32).sqrt();
                rng.vec_f32(t.numel(), -a, a)
            }
            _ => {
                let base = if name.ends_with(".weight") { 1.0 } else { 0.0 };
                rng.vec_f32(t.numel(), base - 0.5, base + 0.5)
            }
        };
        t.write_from_slice(&values).unwrap();
    }
}

/// The elements of `attn.c_attn.bias` that are the key bias (`[n_embd, 2 n_embd)`): the
/// loss does not depend on them, since `q · (k + b)` adds `q · b` to every score of a query's
/// row and softmax ignores that. Their exact gradient is 0 and the reference leaves them where
/// they start, while ours get f32 rounding (~1e-8 here) that Adam's `m / sqrt(v)` turns into
/// steps of about `lr` in random directions: they are not compared with the reference, and
/// [`key_bias_gradient_ratio`] checks their gradient instead.
fn is_key_bias(name: &str, index: usize) -> bool {
    name.ends_with("attn.c_attn.bias") && (CONFIG.n_embd..2 * CONFIG.n_embd).contains(&index)
}

/// The largest `|gradient|` of a key bias over the largest of its whole `c_attn.bias`
/// gradient, over the blocks: zero but for rounding.
fn key_bias_gradient_ratio(params: &[(String, Tensor)]) -> f64 {
    let mut worst = 0.0_f64;
    for (name, t) in params {
        if name.ends_with("attn.c_attn.bias") {
            let g = t.grad().unwrap().to_vec().unwrap();
            let (mut key, mut all) = (0.0_f64, 0.0_f64);
            for (i, &x) in g.iter().enumerate() {
                let x = f64::from(x).abs();
                all = all.max(x);
                if is_key_bias(name, i) {
                    key = key.max(x);
                }
            }
            worst = worst.max(key / all);
        }
    }
    worst
}

/// Plimsoll's side of one seed: the loss of each step, the final parameters and the largest
/// [`key_bias_gradient_ratio`] of the steps.
struct Run {
    losses: Vec<f32>,
    last: Vec<Named>,
    key_bias_ratio: f64,
}

/// Trains ten steps on `batches`, as the trainer does; returns the initial parameters and the
/// run.
fn train(seed: u64, batches: &[Batch]) -> (Vec<Named>, Run) {
    let gpu = gpu();
    let mut gpt = Gpt::new(&gpu, CONFIG, seed).unwrap();
    gpt.set_memory_efficient_attention(true);
    spread_out(&gpt, seed);
    let initial = snapshot(&gpt);
    let params = gpt.parameters();
    let mut optimizer = AdamW::new(adamw_config());
    let shape = [BATCH, CONFIG.block_size];
    let mut losses = Vec::new();
    let mut key_bias_ratio = 0.0_f64;
    for batch in batches {
        let ids = Tensor::from_indices(&gpu, &batch.ids, &shape).unwrap();
        let targets = Tensor::from_indices(&gpu, &batch.targets, &shape).unwrap();
        let loss = loss(&gpt, &ids, &targets);
        loss.backward().unwrap();
        key_bias_ratio = key_bias_ratio.max(key_bias_gradient_ratio(&params));
        losses.push(loss.item().unwrap());
        optimizer.step(&params).unwrap();
        zero_grad(&params);
    }
    let run = Run {
        losses,
        last: snapshot(&gpt),
        key_bias_ratio,
    };
    (initial, run)
}

/// What the reference reads: the model's shape, the hyper-parameters, the initial parameters
/// and the batches (f32 values written as the f64 numbers they are, so both start from the
/// same bits).
fn reference_input(initial: &[Named], batches: &[Batch]) -> Value {
    let c = adamw_config();
    let rows =
        |v: &[u32]| -> Vec<Vec<u32>> { v.chunks(CONFIG.block_size).map(<[u32]>::to_vec).collect() };
    json!({
        "config": {
            "vocab_size": CONFIG.vocab_size,
            "block_size": CONFIG.block_size,
            "n_layer": CONFIG.n_layer,
            "n_head": CONFIG.n_head,
            "n_embd": CONFIG.n_embd,
        },
        "adamw": {
            "lr": f64::from(c.lr),
            "beta1": f64::from(c.beta1),
            "beta2": f64::from(c.beta2),
            "eps": f64::from(c.eps),
            "weight_decay": f64::from(c.weight_decay),
            "decay_matrices_only": c.decay_matrices_only,
        },
        "parameters": initial.iter().map(|p| json!({
            "name": p.name,
            "shape": p.shape,
            "values": p.values.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>(),
        })).collect::<Vec<_>>(),
        "batches": batches.iter().map(|b| json!({
            "ids": rows(&b.ids),
            "targets": rows(&b.targets),
        })).collect::<Vec<_>>(),
    })
}

/// Starts `python3 gpt_f64.py in out`. Panics (never skips) when python3 cannot be run.
fn start_reference(input: &Path, output: &Path) -> Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/gpt_f64.py");
    Command::new("python3")
        .arg(&script)
        .arg(input)
        .arg(output)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run python3 ({e}): the golden trajectory needs Python 3 (standard \
                 library only) for its float64 reference; install python3 (CI's .ci/run does)"
            )
        })
}

/// The reference's losses and final parameters (by name), once `child` has finished.
fn finish_reference(mut child: Child, output: &Path) -> (Vec<f64>, Vec<(String, Vec<f64>)>) {
    let status = child.wait().expect("waiting for python3");
    assert!(status.success(), "gpt_f64.py failed ({status})");
    let out: Value = serde_json::from_str(&std::fs::read_to_string(output).unwrap()).unwrap();
    let floats = |v: &Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let losses = floats(&out["losses"]);
    let params = out["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                floats(&p["values"]),
            )
        })
        .collect();
    (losses, params)
}

/// The worst element of one comparison: its error over its tolerance, and where it is.
#[derive(Debug, Default)]
struct Worst {
    ratio: f64,
    error: f64,
    tolerance: f64,
    at: String,
}

impl Worst {
    fn see(&mut self, error: f64, tolerance: f64, at: impl FnOnce() -> String) {
        let ratio = error / tolerance;
        if ratio > self.ratio || ratio.is_nan() {
            *self = Worst {
                ratio,
                error,
                tolerance,
                at: at(),
            };
        }
    }
}

/// Which checks of one seed held.
struct Outcome {
    loss_ok: bool,
    params_ok: bool,
    key_bias_ok: bool,
}

/// Compares one seed with the reference; returns its report and which checks held. The report
/// lists each tensor's worst element when the parameters missed.
fn compare(
    seed: u64,
    run: &Run,
    ref_losses: &[f64],
    ref_params: &[(String, Vec<f64>)],
) -> (String, Outcome) {
    assert_eq!(run.losses.len(), ref_losses.len(), "seed {seed}: steps");
    let mut loss_worst = Worst::default();
    for (step, (&got, &want)) in run.losses.iter().zip(ref_losses).enumerate() {
        let error = (f64::from(got) - want).abs();
        loss_worst.see(error, LOSS_RTOL * want.abs(), || {
            format!("step {} ({got} vs {want:.9})", step + 1)
        });
    }
    assert_eq!(run.last.len(), ref_params.len(), "seed {seed}: parameters");
    let mut param_worst = Worst::default();
    let mut lines = Vec::new();
    for (p, (ref_name, want)) in run.last.iter().zip(ref_params) {
        assert_eq!(&p.name, ref_name, "seed {seed}: parameter order");
        let scale = want.iter().fold(1.0_f64, |m, x| m.max(x.abs()));
        let tolerance = PARAM_TOL * scale;
        let mut tensor_worst = Worst::default();
        for (i, (&got, &w)) in p.values.iter().zip(want).enumerate() {
            if !is_key_bias(&p.name, i) {
                let error = (f64::from(got) - w).abs();
                tensor_worst.see(error, tolerance, || {
                    format!("{}[{i}] ({got} vs {w:.9})", p.name)
                });
            }
        }
        lines.push(format!(
            "    {:<36} error {:.2e} (tolerance {:.1e}) at {}",
            p.name, tensor_worst.error, tensor_worst.tolerance, tensor_worst.at
        ));
        if tensor_worst.ratio > param_worst.ratio || tensor_worst.ratio.is_nan() {
            param_worst = tensor_worst;
        }
    }
    let verdict = |ok: bool| if ok { "ok" } else { "OUT OF TOLERANCE" };
    let (loss_ok, params_ok) = (loss_worst.ratio <= 1.0, param_worst.ratio <= 1.0);
    let key_bias_ok = run.key_bias_ratio <= KEY_BIAS_GRADIENT_RTOL;
    let mut report = format!(
        "seed {seed}\n  loss: {}, worst relative error {:.2e} (tolerance {LOSS_RTOL:.0e}) at {}\n  \
         parameters: {}, worst error {:.2e} = {:.3} x tolerance at {}\n  \
         key bias: {}, largest gradient {:.1e} of its tensor's (tolerance \
         {KEY_BIAS_GRADIENT_RTOL:.0e})",
        verdict(loss_ok),
        loss_worst.error / (loss_worst.tolerance / LOSS_RTOL),
        loss_worst.at,
        verdict(params_ok),
        param_worst.error,
        param_worst.ratio,
        param_worst.at,
        verdict(key_bias_ok),
        run.key_bias_ratio,
    );
    if !params_ok {
        report = format!("{report}\n{}", lines.join("\n"));
    }
    let outcome = Outcome {
        loss_ok,
        params_ok,
        key_bias_ok,
    };
    (report, outcome)
}

#[test]
fn ten_adamw_steps_of_a_two_layer_gpt_match_a_float64_reference() {
    let dir: PathBuf = fresh_dir("nn", "golden_trajectory");
    // Each seed's reference runs (on the CPU) while the next seed trains.
    let mut started = Vec::new();
    for seed in SEEDS {
        let batches = batches(seed);
        let (initial, run) = train(seed, &batches);
        let input = dir.join(format!("seed{seed}.in.json"));
        let output = dir.join(format!("seed{seed}.out.json"));
        std::fs::write(&input, reference_input(&initial, &batches).to_string()).unwrap();
        let child = start_reference(&input, &output);
        started.push((seed, run, output, child));
    }
    let (mut reports, mut outcomes) = (Vec::new(), Vec::new());
    for (seed, run, output, child) in started {
        let (ref_losses, ref_params) = finish_reference(child, &output);
        let (report, outcome) = compare(seed, &run, &ref_losses, &ref_params);
        println!("{report}");
        reports.push(report);
        outcomes.push(outcome);
    }
    let params_missed = outcomes.iter().filter(|o| !o.params_ok).count();
    let passed = outcomes.iter().all(|o| o.loss_ok && o.key_bias_ok) && params_missed <= 1;
    if passed && params_missed == 1 {
        println!("one seed's parameters missed: allowed, as an unlucky seed (see the module docs)");
    }
    assert!(
        passed,
        "the GPT's trajectory left the float64 reference's (a loss or a key-bias gradient out \
         of tolerance, or the parameters of {params_missed} of {} seeds; inputs and outputs in \
         {}):\n{}",
        SEEDS.len(),
        dir.display(),
        reports.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
