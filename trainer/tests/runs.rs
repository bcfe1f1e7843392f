//! A run is a directory, driven through the `plimsoll` command: two runs never share one, a
//! second process on a run fails at once, a resumed run keeps its settings unless a flag
//! changes them (recorded), what cannot change is refused, a directory that cannot be written
//! is found before step 1, a crash in the middle of a save leaves a loadable checkpoint, and
//! no input however wrong ends in a panic (101) or an abort (134).

#![allow(clippy::unwrap_used)]

mod common;

use common::cli::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use plimsoll_kernels_wgsl::testing::fresh_dir;

/// A fresh, empty folder for one test.
fn folder(name: &str) -> PathBuf {
    fresh_dir("runs", name)
}

/// Waits until `path` exists (a run has started), up to a minute.
fn wait_for(path: &Path) {
    for _ in 0..600 {
        if path.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{} did not appear", path.display());
}

#[test]
fn two_runs_never_share_a_directory() {
    let dir = folder("two-runs");
    // Two runs started together without --run-dir get a directory each.
    let a = plimsoll(&dir)
        .args(["train", "digits", "--epochs", "1"])
        .output();
    let b = plimsoll(&dir)
        .args(["train", "digits", "--epochs", "1"])
        .output();
    assert!(a.unwrap().status.success() && b.unwrap().status.success());
    let runs: Vec<_> = std::fs::read_dir(dir.join("runs")).unwrap().collect();
    assert_eq!(runs.len(), 2);
    // A second process on a run in progress fails at once, naming the holder.
    let mut first = plimsoll(&dir)
        .args(["train", "digits", "--epochs", "100000", "--run-dir", "r"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&dir.join("r/run.json"));
    let pid = first.id().to_string();
    for args in [
        &["train", "digits", "--run-dir", "r"][..],
        &["train", "digits", "--resume", "r"][..],
    ] {
        let second = run(&dir, args);
        let said = text(&second);
        assert_eq!(second.status.code(), Some(1), "{said}");
        assert!(
            said.contains("another plimsoll process") && said.contains(&pid),
            "{said}"
        );
    }
    first.kill().unwrap();
    first.wait().unwrap();
    // A finished run's directory is not reused for a new run.
    let again = run(
        &dir,
        &["train", "digits", "--epochs", "1", "--run-dir", "r"],
    );
    assert!(
        text(&again).contains("holds a run already"),
        "{}",
        text(&again)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_resumed_run_keeps_its_settings_and_records_a_change() {
    let dir = folder("resume-settings");
    let first = run(
        &dir,
        &["train", "digits", "--epochs", "1", "--run-dir", "r"],
    );
    assert!(first.status.success(), "{}", text(&first));
    // The model and the seed cannot change; nothing is written.
    for (flag, value, says) in [
        ("--hidden", "64", "keeps its model"),
        ("--seed", "5", "keeps its seed"),
    ] {
        let o = run(&dir, &["train", "digits", "--resume", "r", flag, value]);
        assert!(
            !o.status.success() && text(&o).contains(says),
            "{}",
            text(&o)
        );
    }
    assert_eq!(
        json(&dir.join("r/run.json"))["resumes"],
        serde_json::json!([])
    );
    // The batch can, explicitly: recorded, and the epochs are counted in samples.
    let second = run(
        &dir,
        &words("train digits --resume r --epochs 2 --batch 128"),
    );
    let said = text(&second);
    assert!(second.status.success(), "{said}");
    assert!(said.contains("effective_batch 64 -> 128"), "{said}");
    let record = json(&dir.join("r/run.json"));
    assert_eq!(
        record["resumes"][0]["changes"]["effective_batch"],
        serde_json::json!([64, 128])
    );
    let metrics = std::fs::read_to_string(dir.join("r/metrics.jsonl")).unwrap();
    let samples: u64 = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v.get("samples").and_then(|s| s.as_u64()))
        .sum();
    assert_eq!(
        samples,
        2 * 1438,
        "two epochs of the 1,438 training samples, each seen once"
    );
    assert_eq!(json(&dir.join("r/summary.json"))["steps"], 23 + 12);
    // Nothing given: the run's own settings (batch 128 now), not the defaults.
    let third = run(&dir, &["train", "digits", "--resume", "r", "--epochs", "3"]);
    assert!(
        !text(&third).contains("effective_batch"),
        "{}",
        text(&third)
    );
    assert_eq!(json(&dir.join("r/summary.json"))["steps"], 23 + 12 + 12);
    // eval and runs read it back.
    let eval = run(&dir, &["eval", "r"]);
    assert!(
        text(&eval).contains("step 47): test accuracy"),
        "{}",
        text(&eval)
    );
    let runs = run(&dir, &["runs", "."]);
    assert!(
        text(&runs).contains("finished") && text(&runs).contains("47"),
        "{}",
        text(&runs)
    );
    // A length the run has already reached trains nothing: a usage error, nothing recorded.
    for epochs in ["3", "2"] {
        let o = run(
            &dir,
            &["train", "digits", "--resume", "r", "--epochs", epochs],
        );
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains("has already finished 3 epochs, so there is nothing to train"),
            "{}",
            text(&o)
        );
    }
    assert_eq!(
        json(&dir.join("r/run.json"))["resumes"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn what_a_run_cannot_write_is_found_before_step_1() {
    let dir = folder("unwritable");
    std::fs::write(dir.join("a-file"), "not a directory").unwrap();
    for args in [
        &["train", "digits", "--run-dir", "a-file/run"][..],
        &[
            "train",
            "digits",
            "--run-dir",
            "r",
            "--metrics-out",
            "/dev/full",
        ][..],
        &[
            "train",
            "digits",
            "--run-dir",
            "r2",
            "--metrics-out",
            "a-file/m.jsonl",
        ][..],
    ] {
        let o = run(&dir, args);
        let said = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {said}");
        assert!(
            said.contains("error: ") && !said.contains("step e1 "),
            "{args:?}: {said}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// SIGKILL at moments spread over a run that saves every step: whatever the moment, the
/// latest checkpoint loads (saves are a temporary file and a rename).
#[test]
fn a_crash_in_the_middle_of_a_save_leaves_a_loadable_checkpoint() {
    let dir = folder("crash");
    for (i, delay_ms) in [0u64, 7, 23].into_iter().enumerate() {
        let name = format!("r{i}");
        let mut child = plimsoll(&dir)
            .args(words("train digits --epochs 100000 --checkpoint-every 1"))
            .args(["--run-dir", &name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for(&dir.join(&name).join("latest.safetensors"));
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let eval = run(&dir, &["eval", &name, "--checkpoint", "latest"]);
        assert!(eval.status.success(), "{}", text(&eval));
        let runs = run(&dir, &["runs", "."]);
        assert!(text(&runs).contains("stopped"), "{}", text(&runs));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Every input from the runs issue's list, and more: an error with exit code 1 or 2 (2 for a
/// bad flag), never 101 (panic) or 134 (abort).
#[test]
fn no_input_panics_or_aborts() {
    let dir = folder("bad-inputs");
    std::fs::write(dir.join("ragged.csv"), "1,2,3,0\n1,2,1\n").unwrap();
    std::fs::write(dir.join("labels.csv"), "1,2,0\n3,4,1\n5,6,57\n").unwrap();
    let cases: &[(&[&str], i32)] = &[
        (&["train", "digits", "--hidden", "100000000"], 1),
        (&["train", "mlp-bench", "--batch", "10000000"], 1),
        (
            &["train", "mlp-bench", "--batch", "18446744073709551615"],
            2,
        ),
        (&["train", "digits", "--lr=-1"], 2),
        (&["train", "digits", "--lr", "inf"], 2),
        (&["train", "digits", "--memory-budget=-5MB"], 2),
        (&["train", "digits", "--checkpointing", "99"], 2),
        (&["train", "digits", "--epochs", "0"], 2),
        (
            &["train", "digits", "--batch", "10", "--micro-batch", "100"],
            2,
        ),
        (&["train", "shakespeare", "--heads", "3"], 2),
        (&["train", "shakespeare", "--context", "100000000"], 2),
        (&["train", "shakespeare", "--width", "1099511627776"], 1),
        (&["train", "digits", "--data", "ragged.csv"], 1),
        (&["train", "digits", "--data", "missing.csv.gz"], 1),
        (&["train", "digits", "--data", "labels.csv"], 1),
        (&["train", "shakespeare", "--data", "/dev/null"], 1),
        (&["train", "digits", "--deadline-ms", "0"], 2),
        (&["train", "digits", "--resume", "nowhere"], 2),
        (&["train", "digits", "--frobnicate"], 2),
        (&["plan", "digits", "--memory-budget", "1B"], 1),
        (&["sample", "--run", "nowhere"], 1),
        (&["eval", "nowhere"], 1),
        (&["runs", "nowhere"], 1),
    ];
    for (args, code) in cases {
        let o = run(&dir, args);
        let said = text(&o);
        assert_eq!(o.status.code(), Some(*code), "{args:?}:\n{said}");
        if args.contains(&"labels.csv") {
            assert!(
                said.contains("labels.csv:3: label 57 is outside the classes"),
                "{said}"
            );
        }
        if args.contains(&"ragged.csv") {
            assert!(
                said.contains("ragged.csv:2: 2 features, but the first row has 3"),
                "{said}"
            );
        }
        assert!(said.contains("error"), "{args:?}:\n{said}");
        assert!(!said.contains("panicked"), "{args:?}:\n{said}");
    }
    assert!(
        !dir.join("runs").exists(),
        "a refused command left a run directory behind"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `run.json` and the run's first line say which arithmetic the matmuls use: f32 SIMT in f32;
/// in f16 what the device's 16-bit matmuls use (cooperative matrices where the adapter has them);
/// and how the update and the gradient norm go out over the tensors.
#[test]
fn a_run_records_its_matmul_arithmetic() {
    let dir = folder("matmul-path");
    let gpu = plimsoll_kernels_wgsl::testing::fresh_gpu();
    let f16 = gpu.matmul_path().describe();
    use plimsoll_kernels_wgsl::kernels::{TensorLaunches, optimizer::ADAMW_MULTI};
    let launches = TensorLaunches::chosen(&gpu, &ADAMW_MULTI).describe();
    drop(gpu);
    for (precision, want) in [("f32", "SIMT f32"), ("f16", f16)] {
        let out = run(
            &dir,
            &[
                "train",
                "digits",
                "--epochs",
                "1",
                "--precision",
                precision,
                "--run-dir",
                precision,
            ],
        );
        let said = text(&out);
        assert!(out.status.success(), "{said}");
        assert!(said.contains(&format!("matmuls: {want};")), "{said}");
        let record: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(precision).join("run.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(record["matmul"], want, "{precision}");
        // And how the update and the norm go out (one launch per tensor on a CPU adapter).
        assert!(said.contains(&format!("updates: {launches};")), "{said}");
        assert_eq!(record["tensor_launches"], launches);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `train digits --model cnn` trains the small CNN (its accuracy rises past chance within two
/// epochs), records the model so that a resume and `eval` rebuild the CNN, exports its
/// parameters under `nn.Sequential`'s names; its training images are u8, cropped at random on
/// the device (`--crop-padding`), its test images plain. `--channels` or `--crop-padding` with
/// the MLP and `--hidden` with the CNN are refused before anything is written.
#[test]
fn the_digits_cnn_trains_resumes_and_evaluates() {
    let dir = folder("cnn");
    let o = run(
        &dir,
        &words(
            "train digits --model cnn --channels 8,16 --lr 0.01 --epochs 2 --crop-padding 1 \
             --run-dir c",
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    let record = json(&dir.join("c/run.json"));
    assert_eq!(
        record["train_data"],
        "1438 1x8x8 u8 images, 10 classes, random crops padded by 1"
    );
    assert_eq!(record["eval_data"], "359 1x8x8 u8 images, 10 classes");
    let model = record["model"].as_str().unwrap_or_default().to_string();
    assert!(
        model.starts_with("CNN 1x8x8, 3x3 convolutions 8-16"),
        "{record}"
    );
    let accuracy = |out: &str| -> f64 {
        let at = out.rfind("test accuracy ").expect("an accuracy") + "test accuracy ".len();
        out[at..].split('%').next().unwrap().parse().unwrap()
    };
    let first = accuracy(&text(&o));
    assert!(
        first > 30.0,
        "after two epochs (chance: 10%): {first}%\n{}",
        text(&o)
    );
    let resumed = run(&dir, &words("train digits --resume c --epochs 3"));
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert_eq!(json(&dir.join("c/summary.json"))["steps"], 3 * 23);
    let eval = run(&dir, &["eval", "c", "--checkpoint", "latest"]);
    assert!(eval.status.success(), "{}", text(&eval));
    assert_eq!(
        accuracy(&text(&eval)),
        accuracy(&text(&resumed)),
        "{}",
        text(&eval)
    );
    let exported = plimsoll_nn::state::load(&dir.join("c/model.safetensors")).unwrap();
    let names: Vec<&String> = exported.tensors.keys().collect();
    let want = [
        "1.bias", "1.weight", "4.bias", "4.weight", "8.bias", "8.weight",
    ];
    assert_eq!(
        names, want,
        "the CNN's parameters under nn.Sequential's names"
    );
    assert_eq!(exported.tensors["4.weight"].shape, [16, 8, 3, 3]);
    let o = run(&dir, &words("train digits --channels 8 --run-dir m"));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--channels") && text(&o).contains("--hidden"),
        "{}",
        text(&o)
    );
    assert!(!dir.join("m").exists());
    let o = run(
        &dir,
        &words("train digits --model cnn --hidden 64 --run-dir h"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--hidden") && text(&o).contains("--channels"),
        "{}",
        text(&o)
    );
    assert!(!dir.join("h").exists());
    let o = run(&dir, &words("train digits --crop-padding 1 --run-dir p"));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--model cnn"), "{}", text(&o));
    assert!(!dir.join("p").exists());
    let o = run(
        &dir,
        &words("train digits --model cnn --crop-padding 9 --run-dir q"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("give at most 8"), "{}", text(&o));
    assert!(!dir.join("q").exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// A ResNet at scale plans shapes-only (no image made, no kernel run): ResNet-50 at 224x224 and
/// batch 256 under 24 GiB prints a choice. A small ResNet-18 that must checkpoint to fit its
/// budget steps at the plan's predicted peak, allocated and reserved, to the byte: BatchNorm,
/// the convolutions' columns and the recomputed blocks included; its export is torchvision's
/// `state_dict()`, and its resume under the same budget fits. BatchNorm's statistics are saved
/// with the run, and a resume goes on from them.
#[test]
fn resnets_plan_at_scale_and_step_at_the_prediction() {
    let dir = folder("resnet");
    let o = run(
        &dir,
        &words("plan resnet50 --image 224 --batch 256 --memory-budget 24GiB"),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("choice: effective batch 256"),
        "{}",
        text(&o)
    );
    let o = run(
        &dir,
        &words(
            "train resnet18 --image 32 --batch 16 --steps 2 --classes 10 --eval-images 0 \
             --memory-budget 182MiB \
             --run-dir r",
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    let plan = json(&dir.join("r/plan.json"));
    assert!(
        plan["segment_len"].as_u64().unwrap_or(0) > 0,
        "checkpointing chosen: {plan}"
    );
    let metrics = std::fs::read_to_string(dir.join("r/metrics.jsonl")).unwrap();
    let peak = |key: &str| {
        metrics
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v[key].as_u64())
            .max()
            .unwrap()
    };
    assert_eq!(
        peak("peak_allocated_bytes"),
        plan["predicted_peak_bytes"],
        "{plan}"
    );
    assert_eq!(
        peak("peak_reserved_bytes"),
        plan["predicted_peak_reserved_bytes"],
        "{plan}"
    );
    // The export is torchvision's `state_dict()`: 62 parameters, and per BatchNorm its
    // running statistics and a 0-d I64 count of the forwards that moved them (one per
    // micro-batch; the checkpointed recomputations count none).
    let export = plimsoll_nn::state::load(&dir.join("r/model.safetensors")).unwrap();
    assert_eq!(export.tensors.len(), 62 + 3 * 20);
    let count = &export.tensors["layer2.0.downsample.1.num_batches_tracked"];
    let forwards = 2 * 16 / plan["micro_batch"].as_u64().unwrap() as usize;
    assert_eq!(
        (count.shape.as_slice(), count.stored, count.data.as_slice()),
        (&[][..], plimsoll_nn::Stored::I64, &[forwards as f32][..])
    );
    // A resume under the same budget plans again with the checkpoint's optimizer state
    // loaded before step 1 (where the new run made it in step 1) and the run's events from
    // where it goes on: it fits, and steps at that plan's prediction. (Planned as a new run,
    // this resume ran out of memory.)
    let o = run(&dir, &words("train resnet18 --resume r --steps 3"));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("planned again for the resumed optimizer state"),
        "{}",
        text(&o)
    );
    let plan = json(&dir.join("r/plan.json"));
    let metrics = std::fs::read_to_string(dir.join("r/metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], 3);
    for (measured, predicted) in [
        ("peak_allocated_bytes", "predicted_peak_bytes"),
        ("peak_reserved_bytes", "predicted_peak_reserved_bytes"),
    ] {
        assert_eq!(last[measured], plan[predicted], "{last} {plan}");
    }

    // BatchNorm's running statistics are saved with the run, and a resume goes on from them:
    // two steps and a resumed third hold what three steps in one run do (with room for the
    // same choice of micro-batch in both: BatchNorm's statistics depend on it).
    let base = "train resnet18 --image 32 --batch 4 --classes 10 --eval-images 0";
    let o = run(&dir, &words(&format!("{base} --steps 2 --run-dir u")));
    assert!(o.status.success(), "{}", text(&o));
    let saved = plimsoll_nn::state::load(&dir.join("u/latest.safetensors")).unwrap();
    let mean = &saved.tensors["param.bn1.running_mean"];
    assert_eq!(mean.shape, [64]);
    assert!(
        mean.data.iter().any(|v| *v != 0.0),
        "the running mean moved"
    );
    assert!(saved.tensors.contains_key("param.layer4.1.bn2.running_var"));
    assert!(
        !saved
            .tensors
            .keys()
            .any(|k| k.contains("running") && k.starts_with("optim."))
    );
    let o = run(&dir, &words("train resnet18 --resume u --steps 3"));
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&dir, &words(&format!("{base} --steps 3 --run-dir s")));
    assert!(o.status.success(), "{}", text(&o));
    let resumed = plimsoll_nn::state::load(&dir.join("u/latest.safetensors")).unwrap();
    let straight = plimsoll_nn::state::load(&dir.join("s/latest.safetensors")).unwrap();
    for name in [
        "param.bn1.running_mean",
        "param.layer3.0.bn1.running_var",
        "param.layer3.0.bn1.num_batches_tracked",
    ] {
        assert_eq!(
            resumed.tensors[name].data, straight.tensors[name].data,
            "{name}"
        );
    }
    assert_ne!(resumed.tensors["param.bn1.running_mean"].data, mean.data);
    let _ = std::fs::remove_dir_all(dir);
}

/// A plan that splits a BatchNorm model's batch says that its micro-batches normalise by their
/// own statistics; `--micro-batch-invariant` keeps the whole batch a forward (checkpointing
/// instead) and refuses a smaller `--micro-batch`. A budget too small for any step names the
/// least one that fits (a whole batch that accumulates no gradients can be leaner than
/// micro-batch 1), and that budget then plans.
#[test]
fn a_batchnorm_model_is_not_split_silently() {
    let dir = folder("bn-split");
    let base = "plan resnet18 --image 32 --batch 16 --classes 10";
    let o = run(&dir, &words(&format!("{base} --memory-budget 183MiB")));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("note: the model's BatchNorm normalises each micro-batch of"),
        "{}",
        text(&o)
    );
    let o = run(
        &dir,
        &words(&format!(
            "{base} --memory-budget 183MiB --micro-batch-invariant"
        )),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("1 micro-batch of 16"), "{}", text(&o));
    assert!(
        !text(&o).contains("note: the model's BatchNorm"),
        "{}",
        text(&o)
    );
    let o = run(
        &dir,
        &words(&format!("{base} --micro-batch 4 --micro-batch-invariant")),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("4 splits the batch of 16"),
        "{}",
        text(&o)
    );
    // A batch of 4 whose leanest step is the whole batch (no gradient accumulation), with
    // everything on the device.
    let small = "plan resnet18 --image 32 --batch 4 --classes 10 --offload none";
    let o = run(&dir, &words(&format!("{small} --memory-budget 174MiB")));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let said = text(&o);
    let at = said.find("at least ").expect("a least budget") + "at least ".len();
    let need: f64 = said[at..].split(' ').next().unwrap().parse().unwrap();
    assert!(
        need < 176.0,
        "the least budget named is {need} MiB:\n{said}"
    );
    let o = run(&dir, &words(&format!("{small} --memory-budget {need}MiB")));
    assert!(o.status.success(), "{need} MiB, as advised:\n{}", text(&o));
    // By default (`--offload auto`) the plan keeps the optimizer's state in host memory when
    // nothing fits with it on the device.
    let auto = "plan resnet18 --image 32 --batch 4 --classes 10 --memory-budget 174MiB";
    let o = run(&dir, &words(auto));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("offload: the optimizer's state in host memory"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A refusal's least budget is one that fits: never below the fixed state (parameters,
/// gradients, optimizer state). GPT-2 XL's shapes under 8 GiB with everything on the device
/// (its leanest dry runs stop at a tensor past one binding on some choices, which once made
/// the refusal name 5.61 GiB under a 22 GiB fixed state), then planned at the budget named.
#[test]
fn a_refusal_names_a_budget_that_fits() {
    let dir = folder("least-budget");
    let base = "plan gpt --model gpt2-xl --batch 8 --offload none";
    let o = run(&dir, &words(&format!("{base} --memory-budget 8GiB")));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let said = text(&o);
    let number_after = |key: &str| -> f64 {
        let at = said.find(key).expect(key) + key.len();
        said[at..].split(' ').next().unwrap().parse().unwrap()
    };
    let (need, fixed) = (number_after("at least "), number_after("fixed state "));
    assert!(
        need >= fixed,
        "{need} GiB named under a fixed state of {fixed} GiB:\n{said}"
    );
    let o = run(&dir, &words(&format!("{base} --memory-budget {need}GiB")));
    assert!(o.status.success(), "{need} GiB, as advised:\n{}", text(&o));
    let _ = std::fs::remove_dir_all(dir);
}

/// GPT-2 XL's shapes (1.48 billion parameters, 5.5 GiB of them) under 4 GiB: `--offload auto`
/// goes past the levels that keep the parameters on the device and streams the blocks'; under
/// 100 MiB even that is refused, naming a budget (not below its fixed state) that then fits.
#[test]
fn a_model_larger_than_the_budget_is_planned_with_its_parameters_streamed() {
    let dir = folder("streamed-plan");
    let base = "plan gpt --model gpt2-xl --batch 8";
    let o = run(&dir, &words(&format!("{base} --memory-budget 4GiB")));
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    assert!(said.contains("--offload parameters"), "{said}");
    assert!(said.contains("parameters of the blocks streamed"), "{said}");
    let o = run(&dir, &words(&format!("{base} --memory-budget 100MiB")));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let said = text(&o);
    let after = |key: &str| -> (f64, String) {
        let at = said.find(key).expect(key) + key.len();
        let mut words = said[at..].split(' ');
        let value = words.next().unwrap().parse().unwrap();
        (
            value,
            words
                .next()
                .unwrap()
                .trim_end_matches([')', '.'])
                .to_string(),
        )
    };
    let ((need, unit), (fixed, fixed_unit)) = (after("at least "), after("fixed state "));
    let mib = |v: f64, unit: &str| if unit == "GiB" { v * 1024.0 } else { v };
    assert!(mib(need, &unit) >= mib(fixed, &fixed_unit), "{said}");
    let o = run(
        &dir,
        &words(&format!("{base} --memory-budget {need}{unit}")),
    );
    assert!(
        o.status.success(),
        "{need} {unit}, as advised:\n{}",
        text(&o)
    );
    assert!(text(&o).contains("--offload parameters"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(dir);
}

/// "The newest run" (`eval`, `report`, `sample` with none named) is the one that started last,
/// not the last name in alphabetical order: a gpt run started after a shakespeare run is newer,
/// though "gpt-..." sorts first.
#[test]
fn the_newest_run_is_the_one_that_started_last() {
    use plimsoll_trainer::run_dir::{list, newest, newest_of};
    let root = folder("newest");
    let run = |name: &str, workload: &str, started: &str| {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let record = serde_json::json!({ "workload": workload, "started": started });
        std::fs::write(dir.join("run.json"), record.to_string()).unwrap();
        dir
    };
    // Within one second, with fractions of different lengths (jiff drops trailing zeros).
    let older = run(
        "shakespeare-20261208-021245",
        "shakespeare",
        "2026-12-08T02:12:45.5Z",
    );
    let newer = run("gpt-20261208-021245", "gpt", "2026-12-08T02:12:45.51Z");
    let oldest = run("digits-20261208-021300", "digits", "2026-12-08T02:11:00Z");
    let order: Vec<PathBuf> = list(&root).unwrap().into_iter().map(|r| r.path).collect();
    assert_eq!(order, vec![oldest, older.clone(), newer.clone()]);
    assert_eq!(newest(&root, None).unwrap(), Some(newer));
    assert_eq!(
        newest_of(&root, &["shakespeare", "digits"]).unwrap(),
        Some(older)
    );
}
