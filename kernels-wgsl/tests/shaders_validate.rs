//! Every `shaders/*.wgsl` parses and validates with naga (the WGSL front end wgpu uses), and
//! every storage binding is `read_write` (docs/wgpu.md §4: a read-only binding of an arena buffer
//! that another binding of the same dispatch writes is a wgpu validation error).
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use naga::valid::{Capabilities, ValidationFlags, Validator};

/// The capabilities wgpu gives naga on our adapters: the defaults, plus
/// `SHADER_FLOAT16_IN_FLOAT32`, which wgpu grants when the adapter reports
/// `DownlevelFlags::SHADER_F16_IN_F32` (every Vulkan adapter, lavapipe included; see
/// wgpu-naga-bridge). `convert.wgsl` needs it for `pack2x16float` / `unpack2x16float`; no device
/// *feature* is needed (docs/wgpu.md §6).
fn capabilities() -> Capabilities {
    Capabilities::default() | Capabilities::SHADER_FLOAT16_IN_FLOAT32
}

fn shader_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "wgsl"))
        .collect();
    files.sort();
    files
}

fn parse(path: &PathBuf) -> Result<naga::Module, String> {
    let source = std::fs::read_to_string(path).map_err(|e| format!("read: {e}"))?;
    naga::front::wgsl::parse_str(&source)
        .map_err(|e| e.emit_to_string_with_path(&source, &path.display().to_string()))
}

#[test]
fn every_shader_parses_and_validates() {
    let files = shader_files();
    assert!(!files.is_empty(), "no shaders found under shaders/");
    let mut failures = Vec::new();
    for path in &files {
        let module = match parse(path) {
            Ok(module) => module,
            Err(message) => {
                failures.push(format!("{}: parse error:\n{message}", path.display()));
                continue;
            }
        };
        let mut validator = Validator::new(ValidationFlags::all(), capabilities());
        if let Err(error) = validator.validate(&module) {
            let source = std::fs::read_to_string(path).unwrap_or_default();
            failures.push(format!(
                "{}: validation error:\n{}",
                path.display(),
                error.emit_to_string_with_path(&source, &path.display().to_string())
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_storage_binding_is_read_write() {
    let mut failures = Vec::new();
    for path in &shader_files() {
        let Ok(module) = parse(path) else {
            continue; // reported by every_shader_parses_and_validates
        };
        for (_, var) in module.global_variables.iter() {
            if let naga::AddressSpace::Storage { access } = var.space
                && !access.contains(naga::StorageAccess::STORE)
            {
                failures.push(format!(
                    "{}: storage binding `{}` is not read_write",
                    path.display(),
                    var.name.as_deref().unwrap_or("?")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_uniform_params_struct_is_a_multiple_of_16_bytes() {
    let mut failures = Vec::new();
    for path in &shader_files() {
        let Ok(module) = parse(path) else {
            continue;
        };
        for (_, var) in module.global_variables.iter() {
            if var.space == naga::AddressSpace::Uniform {
                let size = module.types[var.ty].inner.size(module.to_ctx());
                if size % 16 != 0 {
                    failures.push(format!(
                        "{}: uniform `{}` is {size} bytes, not a multiple of 16",
                        path.display(),
                        var.name.as_deref().unwrap_or("?")
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
