//! Every `.wgsl` file (`shaders/`, `src/kernels/<family>/`) parses and validates with naga (the
//! WGSL front end wgpu uses), and every storage binding is `read_write` (docs/wgpu.md §4: a
//! read-only binding of an arena buffer that another binding of the same dispatch writes is a
//! wgpu validation error).
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use naga::valid::{Capabilities, ValidationFlags, Validator};
use plimsoll_kernels_wgsl::kernels;

/// The capabilities wgpu gives naga on our adapters: the defaults, plus
/// `SHADER_FLOAT16_IN_FLOAT32`, which wgpu grants when the adapter reports
/// `DownlevelFlags::SHADER_F16_IN_F32` (every Vulkan adapter, lavapipe included; see
/// wgpu-naga-bridge). `convert.wgsl` needs it for `pack2x16float` / `unpack2x16float`; no device
/// *feature* is needed (docs/wgpu.md §6). `SHADER_FLOAT16` is what wgpu grants with the feature
/// `SHADER_F16`, which `convert_native.wgsl` (`enable f16;`) needs.
/// `COOPERATIVE_MATRIX` and `SUBGROUP` are what wgpu grants with `EXPERIMENTAL_COOPERATIVE_MATRIX`
/// and `SUBGROUP`, which `matmul_coop.wgsl` needs (the launchers use it only where the device
/// has them).
fn capabilities() -> Capabilities {
    Capabilities::default()
        | Capabilities::SHADER_FLOAT16_IN_FLOAT32
        | Capabilities::SHADER_FLOAT16
        | Capabilities::COOPERATIVE_MATRIX
        | Capabilities::SUBGROUP
}

/// Every `.wgsl` file under `shaders/` and under `src/kernels/` (the families in the one-place
/// layout keep their shaders beside their launchers).
fn shader_files() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("shaders"), root.join("src").join("kernels")];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "wgsl") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// One kernel per shader stem (every entry point of a stem shares its module), with the module's
/// full source: the launcher's `Params` declarations, then the file.
fn shader_modules() -> Vec<(String, String)> {
    let mut modules: Vec<(String, String)> = Vec::new();
    for kernel in kernels::ALL {
        let name = format!("shaders/{}.wgsl", kernel.stem);
        if !modules.iter().any(|(n, _)| *n == name) {
            modules.push((name, kernel.source()));
        }
    }
    modules
}

fn parse(name: &str, source: &str) -> Result<naga::Module, String> {
    naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string_with_path(source, name))
}

#[test]
fn every_shader_file_belongs_to_a_kernel() {
    for path in shader_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            kernels::ALL.iter().any(|k| k.wgsl.contains(&text)),
            "{} is not (part of) the source of any kernel in kernels::ALL (so nothing \
             validates it)",
            path.display()
        );
    }
}

#[test]
fn every_shader_parses_and_validates() {
    let modules = shader_modules();
    assert!(!modules.is_empty(), "no kernels in kernels::ALL");
    let mut failures = Vec::new();
    for (name, source) in &modules {
        let module = match parse(name, source) {
            Ok(module) => module,
            Err(message) => {
                failures.push(format!("{name}: parse error:\n{message}"));
                continue;
            }
        };
        let mut validator = Validator::new(ValidationFlags::all(), capabilities());
        if let Err(error) = validator.validate(&module) {
            failures.push(format!(
                "{name}: validation error:\n{}",
                error.emit_to_string_with_path(source, name)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Every `@compute` entry point of every module is a kernel of `kernels::ALL` (its family's
/// `KERNELS` lists it): one left out would be neither validated on its own nor warmed up.
#[test]
fn every_entry_point_is_listed() {
    let mut missing = Vec::new();
    for kernel in kernels::ALL {
        let name = format!("shaders/{}.wgsl", kernel.stem);
        let module = parse(&name, &kernel.source()).unwrap_or_else(|e| panic!("{e}"));
        for entry in &module.entry_points {
            let listed = kernels::ALL
                .iter()
                .any(|k| k.stem == kernel.stem && k.entry == entry.name);
            let line = format!("{}: {}", kernel.stem, entry.name);
            if !listed && !missing.contains(&line) {
                missing.push(line);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "entry points in no family's KERNELS: {}",
        missing.join(", ")
    );
}

#[test]
fn every_storage_binding_is_read_write() {
    let mut failures = Vec::new();
    for (name, source) in &shader_modules() {
        let Ok(module) = parse(name, source) else {
            continue; // reported by every_shader_parses_and_validates
        };
        for (_, var) in module.global_variables.iter() {
            if let naga::AddressSpace::Storage { access } = var.space
                && !access.contains(naga::StorageAccess::STORE)
            {
                failures.push(format!(
                    "{name}: storage binding `{}` is not read_write",
                    var.name.as_deref().unwrap_or("?")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The WGSL layout of every uniform `Params` struct is the packed `#[repr(C)]` layout of the
/// Rust struct it was generated from: a multiple of 16 bytes, and no member placed after padding
/// that Rust would not insert (e.g. a `vec4` after three `u32`s, which WGSL aligns to 16).
#[test]
fn every_uniform_params_struct_has_the_rust_layout() {
    let mut failures = Vec::new();
    for (name, source) in &shader_modules() {
        let Ok(module) = parse(name, source) else {
            continue;
        };
        for (_, var) in module.global_variables.iter() {
            if var.space != naga::AddressSpace::Uniform {
                continue;
            }
            let ty = &module.types[var.ty];
            let size = ty.inner.size(module.to_ctx());
            if size % 16 != 0 {
                failures.push(format!(
                    "{name}: uniform is {size} bytes, not a multiple of 16"
                ));
            }
            if let naga::TypeInner::Struct { members, .. } = &ty.inner {
                let mut packed = 0;
                for member in members {
                    if member.offset != packed {
                        failures.push(format!(
                            "{name}: member `{}` at WGSL offset {}, packed offset {packed}",
                            member.name.as_deref().unwrap_or("?"),
                            member.offset
                        ));
                    }
                    packed = member.offset + module.types[member.ty].inner.size(module.to_ctx());
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Each kernel's `workgroup_size` (what `launch_1d` sizes its grid with) is its entry point's
/// `@workgroup_size` (x by y by z invocations).
#[test]
fn every_kernel_states_its_entry_points_workgroup_size() {
    let mut failures = Vec::new();
    for kernel in kernels::ALL {
        let name = format!("{}::{}", kernel.stem, kernel.entry);
        let Ok(module) = parse(&name, &kernel.source()) else {
            continue;
        };
        match module.entry_points.iter().find(|e| e.name == kernel.entry) {
            None => failures.push(format!("{name}: no such entry point")),
            Some(entry) => {
                let [x, y, z] = entry.workgroup_size;
                if x * y * z != kernel.workgroup_size {
                    failures.push(format!(
                        "{name}: @workgroup_size({x}, {y}, {z}), kernel says {}",
                        kernel.workgroup_size
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What `python3 dir/script args...` writes to stdout (a shader generator beside its shader).
/// Without python3 the calling test fails and says so (CI installs it).
fn generator_output(dir: &std::path::Path, script: &str, args: &[&str]) -> String {
    let output = std::process::Command::new("python3")
        .arg(dir.join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run python3 ({e}): install python3 (CI does) to check {script}'s shader")
        });
    assert!(
        output.status.success(),
        "python3 {script} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `main` in `src/kernels/matmul/matmul.wgsl`, from its `// BEGIN main (gen_matmul.py T=..)` line
/// to its `// END main` line, is exactly what `python3 gen_matmul.py T` (beside it) writes: the
/// script is the source, the shader its pasted output. Without python3 the test fails and says so
/// (CI installs it).
#[test]
fn matmul_main_is_gen_matmul_output() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/kernels/matmul");
    let shader = std::fs::read_to_string(dir.join("matmul.wgsl")).unwrap();
    let begin = shader
        .find("// BEGIN main (gen_matmul.py T=")
        .expect("matmul.wgsl has no `// BEGIN main (gen_matmul.py T=..)` line");
    let end_marker = "// END main\n";
    let end = begin
        + shader[begin..]
            .find(end_marker)
            .expect("matmul.wgsl has no `// END main` line after its BEGIN line")
        + end_marker.len();
    let pasted = &shader[begin..end];
    let t = pasted["// BEGIN main (gen_matmul.py T=".len()..]
        .split(')')
        .next()
        .unwrap();
    let generated = generator_output(&dir, "gen_matmul.py", &[t]);
    if let Some(line) = pasted
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
    {
        panic!(
            "matmul.wgsl's main differs from gen_matmul.py {t}'s output at line {} of the block (the \
             BEGIN line is 1):\n  shader: {:?}\n  script: {:?}\nedit the script and paste its \
             output between the markers",
            line + 1,
            pasted.lines().nth(line).unwrap_or(""),
            generated.lines().nth(line).unwrap_or("")
        );
    }
    assert_eq!(
        pasted, generated,
        "matmul.wgsl's main and gen_matmul.py {t}'s output differ in length: paste the script's output between the markers"
    );
}

/// `src/kernels/matmul/matmul_coop.wgsl` is exactly what `python3 gen_coop.py` (beside it)
/// writes: the script is the source. Without python3 the test fails and says so.
#[test]
fn matmul_coop_is_gen_coop_output() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/kernels/matmul");
    let shader = std::fs::read_to_string(dir.join("matmul_coop.wgsl")).unwrap();
    let generated = generator_output(&dir, "gen_coop.py", &[]);
    assert!(
        shader == generated,
        "matmul_coop.wgsl differs from gen_coop.py's output: run `python3 \
         kernels-wgsl/src/kernels/matmul/gen_coop.py > kernels-wgsl/src/kernels/matmul/matmul_coop.wgsl`"
    );
}

/// The cooperative-matrix modules translate to SPIR-V (what wgpu's Vulkan backend does with
/// them) for every layout: lavapipe cannot build their pipelines, so this is where a backend
/// error would show before a GPU runs them.
#[test]
fn coop_modules_translate_to_spirv() {
    for kernel in kernels::matmul::COOP {
        let source = kernel.source();
        let module = parse(kernel.stem, &source).unwrap();
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            let overrides = [("TRANS_A", trans_a), ("TRANS_B", trans_b)]
                .into_iter()
                .map(|(name, on)| (name.to_string(), if on { 1.0 } else { 0.0 }))
                .collect();
            let mut validator = Validator::new(ValidationFlags::all(), capabilities());
            let info = validator.validate(&module).unwrap();
            let (module, info) =
                naga::back::pipeline_constants::process_overrides(&module, &info, None, &overrides)
                    .unwrap();
            let options = naga::back::spv::Options {
                lang_version: (1, 3),
                ..Default::default()
            };
            let pipeline = naga::back::spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: kernel.entry.to_string(),
            };
            let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
                .unwrap_or_else(|e| panic!("{}: {e}", kernel.stem));
            assert!(
                words.len() > 100,
                "{}: {} words of SPIR-V",
                kernel.stem,
                words.len()
            );
        }
    }
}
