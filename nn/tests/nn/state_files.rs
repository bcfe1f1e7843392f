//! Safetensors state files: bit-exact round trip, an independent reader for the layout, typed
//! errors for mismatched parameters, and corrupt or hostile files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use plimsoll_autograd::{Tensor, TensorOptions};
use plimsoll_kernels_wgsl::testing::{fresh_dir, gpu};
use plimsoll_nn::state::{self, MAX_HEADER_BYTES};
use plimsoll_nn::{Error, HostTensor, Init, Linear, Module, Stored};

use crate::common::param;

/// A fresh, empty folder for one test.
fn folder(name: &str) -> PathBuf {
    fresh_dir("nn", name)
}

/// A raw safetensors file: the header JSON as given, then `data`.
fn raw_file(path: &PathBuf, header: &str, data: &[u8]) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// The sizes of the temporary files a save left in `dir` (names ending `.tmp`).
fn temporary_files(dir: &PathBuf) -> Vec<u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .collect()
}

fn metadata() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("step".to_string(), "42".to_string()),
        ("format".to_string(), "pt".to_string()),
    ])
}

/// Awkward values: signed zero, subnormals, extremes, infinities, a NaN payload.
fn awkward() -> Vec<f32> {
    vec![
        -0.0,
        f32::from_bits(1),
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::NEG_INFINITY,
        f32::from_bits(0x7FC0_1234),
        1.0 / 3.0,
        -7.25,
    ]
}

#[test]
fn save_then_load_round_trips_bit_exactly() {
    let gpu = gpu();
    let dir = folder("round-trip");
    let path = dir.join("model.safetensors");
    let a = param(&gpu, &awkward(), &[2, 4], "a");
    let b = param(&gpu, &[0.5], &[], "b");
    let tensors = vec![("blocks.0.a".to_string(), a.clone()), ("b".to_string(), b)];
    state::save(&path, &tensors, &metadata()).unwrap();
    assert!(
        temporary_files(&dir).is_empty(),
        "the temporary file is renamed away"
    );
    let loaded = state::load(&path).unwrap();
    assert_eq!(loaded.metadata, metadata());
    let got = &loaded.tensors["blocks.0.a"];
    assert_eq!(got.shape, [2, 4]);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.data), bits(&awkward()));
    assert_eq!(loaded.tensors["b"].shape, Vec::<usize>::new());

    // Into other tensors of the same names and shapes, in place.
    let a2 = param(&gpu, &[0.0; 8], &[2, 4], "a2");
    let b2 = param(&gpu, &[0.0], &[], "b2");
    state::load_into(
        &[
            ("blocks.0.a".to_string(), a2.clone()),
            ("b".to_string(), b2.clone()),
        ],
        &loaded,
    )
    .unwrap();
    assert_eq!(bits(&a2.to_vec().unwrap()), bits(&awkward()));
    assert_eq!(b2.to_vec().unwrap(), [0.5]);

    // Saving again replaces the file.
    state::save(&path, &tensors[1..], &BTreeMap::new()).unwrap();
    let again = state::load(&path).unwrap();
    assert_eq!(again.tensors.len(), 1);
    assert!(again.metadata.is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

/// Set in the child process of [`an_interrupted_save_leaves_the_previous_file_intact`]: the
/// path it saves over.
#[cfg(unix)]
const INTERRUPTED_SAVE_PATH: &str = "PLIMSOLL_NN_TEST_INTERRUPTED_SAVE_PATH";

/// Elements of the tensor saved by the interrupted-save test: 256 KiB of data, four times what
/// the child may write.
#[cfg(unix)]
const INTERRUPTED_ELEMENTS: usize = 64 * 1024;

/// A crash in the middle of a save leaves the previous file as it was. The first save runs
/// here; the second runs in a child process (this test again, told so by
/// [`INTERRUPTED_SAVE_PATH`]) under a file-size limit of 64 KiB (`ulimit -f 128`, 512-byte
/// blocks), so the kernel kills it with SIGXFSZ a quarter of the way through writing the file:
/// a real crash mid-write, with no hook in the library. An atomic save has then written only
/// its temporary file, so the previous file still loads with the previous values, bit for bit;
/// a save that wrote to the final path would leave it truncated to 64 KiB.
#[cfg(unix)]
#[test]
fn an_interrupted_save_leaves_the_previous_file_intact() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;
    /// SIGXFSZ on Linux and the BSDs: a write past the file-size limit.
    const SIGXFSZ: i32 = 25;
    let ramp = |scale: f32| -> Vec<f32> {
        (0..INTERRUPTED_ELEMENTS)
            .map(|i| scale * (i as f32 - 1000.5))
            .collect()
    };
    if let Some(path) = std::env::var_os(INTERRUPTED_SAVE_PATH) {
        // The child: save other values over the file; the limit kills it during the write.
        let w = param(&gpu(), &ramp(-3.0), &[INTERRUPTED_ELEMENTS], "w");
        state::save(
            PathBuf::from(path).as_path(),
            &[("w".into(), w)],
            &metadata(),
        )
        .unwrap();
        return; // unreachable under the limit; the parent then reports the clean exit
    }
    let dir = folder("interrupted");
    let path = dir.join("state.safetensors");
    let previous = ramp(0.25);
    let w = param(&gpu(), &previous, &[INTERRUPTED_ELEMENTS], "w");
    state::save(&path, &[("w".into(), w)], &metadata()).unwrap();
    let full_bytes = std::fs::metadata(&path).unwrap().len();
    assert!(
        full_bytes > 4 * 65536,
        "the file ({full_bytes} B) outgrows the limit"
    );

    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -c 0 && ulimit -f 128 && exec "$0" "$@""#)
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "state_files::an_interrupted_save_leaves_the_previous_file_intact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INTERRUPTED_SAVE_PATH, &path)
        // Mesa's shader cache is a file too: under the limit it could kill the child early.
        .env("MESA_SHADER_CACHE_DISABLE", "true")
        .output()
        .unwrap();
    let child_output = format!(
        "{}{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    assert_eq!(
        child.status.signal(),
        Some(SIGXFSZ),
        "the child save must die writing past the limit ({}):\n{child_output}",
        child.status
    );

    let loaded = state::load(&path).unwrap_or_else(|e| {
        panic!("the previous file must survive the interrupted save, but it does not load: {e}")
    });
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(loaded.metadata, metadata());
    assert_eq!(loaded.tensors["w"].shape, [INTERRUPTED_ELEMENTS]);
    assert!(
        bits(&loaded.tensors["w"].data) == bits(&previous),
        "the previous file must hold the previous values bit for bit"
    );
    // The child did die mid-write: its temporary file holds exactly what the limit let through.
    assert_eq!(
        temporary_files(&dir),
        [65536],
        "the interrupted save's temporary file"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A save that fails after its temporary file exists (here the rename: the path is a folder)
/// is an error naming the step that failed, and removes the temporary file: a failed save
/// (a full disk) leaves nothing behind for the next one to trip over.
#[test]
fn a_failed_save_removes_its_temporary_file() {
    let dir = folder("failed-save");
    let path = dir.join("latest.safetensors");
    std::fs::create_dir_all(path.join("in-the-way")).unwrap();
    let w = param(&gpu(), &awkward(), &[awkward().len()], "w");
    let e = state::save(&path, &[("w".into(), w)], &metadata()).unwrap_err();
    assert!(
        matches!(e, Error::Io { action, .. } if action == "rename into place"),
        "{e}"
    );
    assert!(
        temporary_files(&dir).is_empty(),
        "the failed save left its temporary file"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn saves_to_one_path_at_once_leave_one_whole_file() {
    // Two runs sharing a checkpoint folder: each writer's file must arrive whole. With one
    // shared temporary name, a rename can move a file another writer is still filling.
    let dir = folder("concurrent");
    let path = dir.join("latest.safetensors");
    let n = 200_000;
    let values = |k: usize| vec![k as f32; n];
    std::thread::scope(|scope| {
        for k in 0..4 {
            let path = &path;
            scope.spawn(move || {
                let w = param(&gpu(), &values(k), &[n], "w");
                for _ in 0..5 {
                    state::save(path, &[("w".into(), w.clone())], &metadata()).unwrap();
                    let loaded = state::load(path).unwrap_or_else(|e| {
                        panic!("a file saved while others save must load: {e}")
                    });
                    let data = &loaded.tensors["w"].data;
                    assert!(
                        data.iter().all(|&v| v == data[0]) && data.len() == n,
                        "the file mixes two writers' values"
                    );
                }
            });
        }
    });
    assert!(
        temporary_files(&dir).is_empty(),
        "every temporary file renamed away"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn file_layout_is_plain_safetensors() {
    // An independent reader: 8-byte little-endian header length, a JSON object whose entries
    // are {dtype, shape, data_offsets} plus the "__metadata__" string map, then the data,
    // each tensor's little-endian bytes at its offsets, covering the data exactly.
    let gpu = gpu();
    let dir = folder("layout");
    let path = dir.join("layout.safetensors");
    let layer = Linear::new(&gpu, 3, 2, true, Init::XavierUniform, 9).unwrap();
    let params = layer.parameters();
    state::save(&path, &params, &metadata()).unwrap();

    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let object = header.as_object().unwrap();
    assert_eq!(object["__metadata__"]["step"], "42");
    assert_eq!(object.len(), params.len() + 1);
    let mut covered = 0;
    for (name, tensor) in &params {
        let entry = &object[name.as_str()];
        assert_eq!(entry["dtype"], "F32", "{name}");
        let shape: Vec<usize> = entry["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(shape, tensor.shape(), "{name}");
        let offsets = entry["data_offsets"].as_array().unwrap();
        let (start, end) = (
            offsets[0].as_u64().unwrap() as usize,
            offsets[1].as_u64().unwrap() as usize,
        );
        assert_eq!(end - start, 4 * tensor.numel());
        let values: Vec<f32> = data[start..end]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(values, tensor.to_vec().unwrap(), "{name}");
        covered += end - start;
    }
    assert_eq!(
        covered,
        data.len(),
        "the data section holds exactly the tensors"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A count kept as I64 (PyTorch's 0-d `num_batches_tracked`): written as little-endian i64
/// bytes under dtype "I64" with shape `[]`, read back as the same whole numbers and kind.
#[test]
fn integer_entries_are_written_and_read_as_i64() {
    let dir = folder("integers");
    let path = dir.join("counts.safetensors");
    let count = HostTensor {
        shape: vec![],
        data: vec![1234.0],
        stored: Stored::I64,
    };
    let floats = HostTensor::new(vec![2], vec![0.5, -1.25]);
    let (a, b) = (
        "bn.num_batches_tracked".to_string(),
        "bn.weight".to_string(),
    );
    let bytes = state::serialize_host(&path, [(&a, &count), (&b, &floats)], &metadata()).unwrap();
    state::write_atomic(&path, &bytes).unwrap();

    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let entry = &header[a.as_str()];
    assert_eq!(entry["dtype"], "I64");
    assert_eq!(entry["shape"], serde_json::json!([]));
    let start = entry["data_offsets"][0].as_u64().unwrap() as usize;
    let raw = &bytes[8 + n + start..8 + n + start + 8];
    assert_eq!(i64::from_le_bytes(raw.try_into().unwrap()), 1234);

    let loaded = state::load(&path).unwrap();
    assert_eq!(loaded.tensors[&a], count);
    assert_eq!(loaded.tensors[&b], floats);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn load_into_reports_missing_unexpected_and_mismatched() {
    let gpu = gpu();
    let dir = folder("mismatch");
    let path = dir.join("p.safetensors");
    let w = param(&gpu, &[1.0, 2.0, 3.0, 4.0], &[2, 2], "w");
    let b = param(&gpu, &[5.0, 6.0], &[2], "b");
    state::save(
        &path,
        &[("w".into(), w.clone()), ("b".into(), b.clone())],
        &BTreeMap::new(),
    )
    .unwrap();
    let loaded = state::load(&path).unwrap();

    let extra = param(&gpu, &[0.0], &[1], "extra");
    let with_extra = [
        ("w".to_string(), w.clone()),
        ("b".to_string(), b.clone()),
        ("extra".to_string(), extra),
    ];
    match state::load_into(&with_extra, &loaded) {
        Err(Error::Missing { names }) => assert_eq!(names, ["extra"]),
        other => panic!("expected Missing, got {other:?}"),
    }
    match state::load_into(&[("w".to_string(), w.clone())], &loaded) {
        Err(Error::Unexpected { names }) => assert_eq!(names, ["b"]),
        other => panic!("expected Unexpected, got {other:?}"),
    }
    let wide = param(&gpu, &[0.0; 4], &[4], "wide");
    let before = b.to_vec().unwrap();
    match state::load_into(
        &[("w".to_string(), wide), ("b".to_string(), b.clone())],
        &loaded,
    ) {
        Err(Error::ShapeMismatch {
            name,
            expected,
            found,
        }) => {
            assert_eq!((name.as_str(), expected, found), ("w", vec![4], vec![2, 2]));
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    assert_eq!(
        b.to_vec().unwrap(),
        before,
        "nothing is written unless everything fits"
    );

    // Prefixed subsets and uploads (optimizer state saved beside the parameters).
    let sub = loaded.strip_prefix("w");
    assert_eq!(sub.tensors.keys().collect::<Vec<_>>(), [""]);
    let up = loaded
        .to_device(
            &gpu,
            TensorOptions {
                label: "",
                ..TensorOptions::default()
            },
        )
        .unwrap();
    assert_eq!(up[1].0, "w");
    assert_eq!(up[1].1.to_vec().unwrap(), [1.0, 2.0, 3.0, 4.0]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn corrupt_and_hostile_files_are_errors() {
    let dir = folder("corrupt");
    let ok_header = r#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let ok_data = [0u8; 8];
    let ok = dir.join("ok.safetensors");
    raw_file(&ok, ok_header, &ok_data);
    assert_eq!(
        state::load(&ok).unwrap().tensors["t"].data,
        [0.0, 0.0],
        "the control file loads"
    );
    let full = std::fs::read(&ok).unwrap();

    let check = |name: &str, bytes: &[u8], expect: &dyn Fn(&Error) -> bool| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        match state::load(&path) {
            Err(e) => assert!(expect(&e), "{name}: unexpected error {e}"),
            Ok(s) => panic!("{name}: loaded {s:?}"),
        }
    };
    // Truncated: cut inside the data, inside the header, inside the length.
    check("cut-data", &full[..full.len() - 3], &|e| {
        matches!(e, Error::Corrupt { .. })
    });
    check("cut-header", &full[..20], &|e| {
        matches!(e, Error::Truncated { .. })
    });
    check("cut-length", &full[..5], &|e| {
        matches!(
            e,
            Error::Truncated {
                needed_bytes: 8,
                ..
            }
        )
    });
    check("empty", &[], &|e| matches!(e, Error::Truncated { .. }));
    // Header length past the end of the file.
    let mut past = full.clone();
    past[..8].copy_from_slice(&1000u64.to_le_bytes());
    check("length-past-end", &past, &|e| {
        matches!(
            e,
            Error::Truncated {
                needed_bytes: 1008,
                ..
            }
        )
    });
    // Absurd header length: refused before any allocation.
    let mut absurd = full.clone();
    absurd[..8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    check("absurd-length", &absurd, &|e| {
        matches!(e, Error::HeaderTooLarge { header_bytes, max_bytes, .. }
            if *header_bytes == 1 << 60 && *max_bytes == MAX_HEADER_BYTES)
    });
    check("max-length", &u64::MAX.to_le_bytes(), &|e| {
        matches!(e, Error::HeaderTooLarge { .. })
    });

    let write = |name: &str, header: &str, data: &[u8]| {
        let path = dir.join(name);
        raw_file(&path, header, data);
        state::load(&path)
    };
    let corrupt = |r: Result<state::LoadedState, Error>| matches!(r, Err(Error::Corrupt { .. }));
    // Offsets past the end of the data, or claiming huge sizes.
    assert!(corrupt(write(
        "offsets-past-end",
        r#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4000]}}"#,
        &ok_data
    )));
    assert!(corrupt(write(
        "huge-shape",
        r#"{"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}}"#,
        &ok_data
    )));
    assert!(corrupt(write(
        "huge-offsets",
        r#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551615]}}"#,
        &ok_data
    )));
    // Not JSON, not UTF-8, not an object of entries.
    assert!(corrupt(write(
        "not-json",
        "this is not json at all",
        &ok_data
    )));
    assert!(corrupt(write("not-object", "[1, 2, 3]", &ok_data)));
    let mut bad_utf8 = 4u64.to_le_bytes().to_vec();
    bad_utf8.extend_from_slice(&[0xFF, 0xFE, 0xFD, 0xFC]);
    check("not-utf8", &bad_utf8, &|e| {
        matches!(e, Error::Corrupt { .. })
    });
    // Shape and byte count disagree.
    assert!(corrupt(write(
        "shape-bytes",
        r#"{"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
        &ok_data
    )));
    // A well-formed entry of another dtype.
    match write(
        "wrong-dtype",
        r#"{"t":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}"#,
        &ok_data,
    ) {
        Err(Error::DType { name, found }) => {
            assert_eq!(name, "t");
            assert!(found.starts_with("I32"), "{found}");
        }
        other => panic!("expected DType, got {other:?}"),
    }
    // A missing file is an I/O error that names it.
    match state::load(&dir.join("absent.safetensors")) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("absent.safetensors")),
        other => panic!("expected Io, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn save_refuses_duplicate_names() {
    let gpu = gpu();
    let dir = folder("dup");
    let t = Tensor::zeros(&gpu, &[1], TensorOptions::default()).unwrap();
    let r = state::save(
        &dir.join("d.safetensors"),
        &[("x".into(), t.clone()), ("x".into(), t)],
        &BTreeMap::new(),
    );
    assert!(matches!(r, Err(Error::InvalidConfig { .. })));
    let _ = std::fs::remove_dir_all(dir);
}

/// `state::metadata` reads the `__metadata__` of a file from its header alone: the map `load`
/// gives, an empty map for a file without one, and typed errors for a damaged header.
#[test]
fn metadata_reads_the_header_alone() {
    let dir = folder("metadata-only");
    let path = dir.join("s.safetensors");
    let gpu = gpu();
    let t = Tensor::from_slice(&gpu, &[1.0f32, 2.0], &[2]).unwrap();
    state::save(&path, &[("w".to_string(), t)], &metadata()).unwrap();
    assert_eq!(
        state::metadata(&path).unwrap(),
        state::load(&path).unwrap().metadata
    );
    assert_eq!(state::metadata(&path).unwrap(), metadata());
    let bare = dir.join("bare.safetensors");
    raw_file(
        &bare,
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0; 4],
    );
    assert!(state::metadata(&bare).unwrap().is_empty());
    let bad = dir.join("bad.safetensors");
    raw_file(&bad, "{not json", &[]);
    assert!(matches!(state::metadata(&bad), Err(Error::Corrupt { .. })));
    std::fs::write(&bad, [200u8, 0, 0, 0, 0, 0, 0, 0, b'{']).unwrap();
    assert!(matches!(
        state::metadata(&bad),
        Err(Error::Truncated { .. })
    ));
    let _ = std::fs::remove_dir_all(dir);
}

/// A checkpoint altered in place after it was saved (one value's bytes changed, the header and
/// every shape left as they were: safetensors alone loads it) is refused as corrupt, naming the
/// file; the unaltered file loads, and a file written by another tool (no digest) loads too.
#[test]
fn a_file_altered_after_it_was_saved_is_refused() {
    let dir = folder("altered");
    let path = dir.join("s.safetensors");
    let gpu = gpu();
    let t = Tensor::from_slice(&gpu, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    state::save(&path, &[("w".to_string(), t)], &metadata()).unwrap();
    assert_eq!(
        state::load(&path).unwrap().tensors["w"].data,
        [1.0, 2.0, 3.0]
    );
    let mut bytes = std::fs::read(&path).unwrap();
    let end = bytes.len();
    // The last value (3.0) becomes 3.5: a valid float, a valid file.
    bytes[end - 4..].copy_from_slice(&3.5f32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    match state::load(&path) {
        Err(Error::Corrupt { path: p, reason }) => {
            assert_eq!(p, path);
            assert!(reason.contains("altered"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let bare = dir.join("bare.safetensors");
    raw_file(
        &bare,
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &2.5f32.to_le_bytes(),
    );
    assert_eq!(state::load(&bare).unwrap().tensors["w"].data, [2.5]);
    let _ = std::fs::remove_dir_all(dir);
}
