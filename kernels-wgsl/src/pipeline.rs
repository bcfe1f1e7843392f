//! Compute pipelines, built once per (shader stem, entry point, override constants) and cached for
//! the device's lifetime, with explicit layouts that follow the binding convention of
//! [`crate::kernels`]:
//!
//! - `@group(0) @binding(0)`: `var<uniform> params: Params`, bound with a dynamic offset into the
//!   batch's uniform arena (see [`crate::recorder`]), [`PARAMS_BYTES`] bytes at most;
//! - `@group(0) @binding(1..=N)`: `var<storage, read_write>`, each bound to a whole segment.
//!
//! One bind-group layout (and pipeline layout) per N is shared by all kernels, so bind groups are
//! cached per (N, uniform chunk, segments) and reused by every kernel.
//! Shader modules and pipelines are created inside Validation and Internal error scopes: a bad
//! shader is an [`Error::Validation`], never a panic.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::device::Shared;
use crate::error::{Error, Result};

/// Largest `Params` struct a kernel may declare, in bytes (the uniform binding's size).
pub const PARAMS_BYTES: u64 = 256;

/// One binding of a kernel: the name and WGSL type its shader uses (`array<f32>`,
/// `array<u32>`, ...; the uniform's is its `Params` struct).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Binding {
    /// The variable's name in the shader.
    pub name: &'static str,
    /// Its WGSL type (storage bindings: the array type; the uniform: its struct).
    pub ty: &'static str,
}

/// A compute kernel: one entry point of one WGSL file. Declared as a `const` next to its launcher
/// with `kernel!`, which states its bindings; the pipeline declares them (and `Params`) in front
/// of the shader, so the binding convention lives in one place (every storage binding
/// `read_write`, docs/wgpu.md §4; the uniform at binding 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// Shader stem: `<stem>.wgsl` in `src/kernels/<family>/`, whose launcher is
    /// `kernels::<family>`.
    pub stem: &'static str,
    /// The WGSL declaration of the uniform `Params` struct(s), from `shader_params!` in the
    /// launcher: the one definition of their layout, prepended to `wgsl`.
    pub params: &'static str,
    /// The WGSL source: the family's `include_str!("<stem>.wgsl")` and the helpers it calls
    /// (without declarations).
    pub wgsl: &'static str,
    /// Entry point (`@compute fn <entry>`).
    pub entry: &'static str,
    /// The uniform at `@binding(0)`.
    pub uniform: Binding,
    /// The storage buffers at `@binding(1)` to `@binding(N)`, in order: what the launcher's
    /// `Dispatch::buffers` holds. Empty for a kernel whose WGSL declares its own bindings (tests).
    pub bindings: &'static [Binding],
    /// Number of storage bindings (`bindings.len()`, or what the WGSL declares itself).
    pub storage_bindings: u32,
    /// Invocations per workgroup (the entry point's `@workgroup_size`, x by y by z): how
    /// [`crate::kernels::launch_1d`] sizes its grid.
    pub workgroup_size: u32,
    /// Whether wgpu injects bounds checks and loop bounding into the shader module:
    /// [`RuntimeChecks::ON`] for every kernel unless its audit says otherwise.
    pub runtime_checks: RuntimeChecks,
}

impl Kernel {
    /// The kernel for entry point `entry` of `wgsl`, whose `Params` are declared by `params`,
    /// with `uniform` and the storage `bindings`, `workgroup_size` invocations per workgroup and
    /// wgpu's runtime checks on. Launchers declare theirs with `kernel!`.
    pub const fn new(
        stem: &'static str,
        params: &'static str,
        wgsl: &'static str,
        entry: &'static str,
        uniform: Binding,
        bindings: &'static [Binding],
        workgroup_size: u32,
    ) -> Kernel {
        Kernel {
            stem,
            params,
            wgsl,
            entry,
            uniform,
            bindings,
            storage_bindings: bindings.len() as u32,
            workgroup_size,
            runtime_checks: RuntimeChecks::ON,
        }
    }

    /// A kernel whose WGSL declares its own uniform and `storage_bindings` storage bindings
    /// (probes and tests; the crate's kernels use `kernel!`).
    pub const fn standalone(
        stem: &'static str,
        wgsl: &'static str,
        entry: &'static str,
        storage_bindings: u32,
        workgroup_size: u32,
    ) -> Kernel {
        let uniform = Binding {
            name: "params",
            ty: "Params",
        };
        Kernel {
            storage_bindings,
            ..Kernel::new(stem, "", wgsl, entry, uniform, &[], workgroup_size)
        }
    }

    /// The shader module's source: the `Params` declarations, the bindings of every entry
    /// point of the stem (from [`crate::kernels::ALL`]; entry points may reuse a binding number
    /// under another name, WGSL allows it as long as no entry point uses both), then the file.
    pub fn source(&self) -> String {
        let mut declarations = String::new();
        let mut declared: Vec<(usize, Binding)> = Vec::new();
        let family = crate::kernels::ALL.iter().filter(|k| k.stem == self.stem);
        for kernel in family.chain(std::iter::once(self)) {
            if kernel.bindings.is_empty() {
                continue;
            }
            let storage = kernel.bindings.iter().enumerate().map(|(i, b)| (i + 1, *b));
            for (index, binding) in std::iter::once((0, kernel.uniform)).chain(storage) {
                if declared.contains(&(index, binding)) {
                    continue;
                }
                let space = if index == 0 {
                    "uniform"
                } else {
                    "storage, read_write"
                };
                declarations += &format!(
                    "@group(0) @binding({index}) var<{space}> {}: {};\n",
                    binding.name, binding.ty
                );
                declared.push((index, binding));
            }
        }
        // A directive (`enable f16;`) must precede every declaration.
        let (directives, body) = match self.needs_shader_f16() {
            true => self
                .wgsl
                .split_at(self.wgsl.find('\n').map_or(0, |i| i + 1)),
            false => ("", self.wgsl),
        };
        format!("{directives}{}\n{declarations}\n{body}", self.params)
    }

    /// Whether the shader uses `f16` arithmetic or storage (its file starts with `enable f16;`):
    /// it needs the device feature `SHADER_F16` ([`crate::Gpu::f16_path`]).
    pub fn needs_shader_f16(&self) -> bool {
        self.wgsl.starts_with("enable f16;")
    }

    /// Whether the shader reads a subgroup builtin (`@builtin(subgroup_id)`: the row kernels'
    /// subgroup-per-row modules, the cooperative matmul): it needs the device feature
    /// `SUBGROUP`.
    pub fn needs_subgroups(&self) -> bool {
        self.wgsl.contains("@builtin(subgroup_id)")
    }

    /// Whether a device with `features` can build this kernel's module (`SHADER_F16` and
    /// `SUBGROUP` where it needs them).
    pub fn runs_with(&self, features: wgpu::Features) -> bool {
        (!self.needs_shader_f16() || features.contains(wgpu::Features::SHADER_F16))
            && (!self.needs_subgroups() || features.contains(wgpu::Features::SUBGROUP))
    }
}

/// The WGSL type of a `Params` field: its Rust type's name (`u32`, `f32`, `i32`, which WGSL
/// spells the same), or the literal given after `=` in `shader_params!`.
macro_rules! wgsl_type {
    ($ty:ty) => {
        stringify!($ty)
    };
    ($ty:ty, $wgsl:literal) => {
        $wgsl
    };
}
pub(crate) use wgsl_type;

/// Declares a kernel family's uniform `Params` struct(s) once, for both sides: the
/// `#[repr(C)]` Pod struct its launcher fills, and `const PARAMS_WGSL: &str`, the same struct in
/// WGSL, which [`Kernel::new`] takes and the pipeline prepends to the shader. A field's WGSL type
/// is its Rust type's name unless given as `field: RustType = "wgsl type"`. Each struct must be
/// padded (explicit `_pad` fields) to a multiple of 16 bytes and at most [`PARAMS_BYTES`]; a
/// compile-time assertion checks it.
macro_rules! shader_params {
    ($(
        $(#[$meta:meta])*
        struct $name:ident {
            $( $(#[$field_meta:meta])* $field:ident : $ty:ty $(= $wgsl:literal)? ),* $(,)?
        }
    )+) => {
        $(
            $(#[$meta])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
            struct $name {
                $( $(#[$field_meta])* $field: $ty ),*
            }
            const _: () = assert!(
                std::mem::size_of::<$name>() % 16 == 0
                    && std::mem::size_of::<$name>() as u64 <= $crate::pipeline::PARAMS_BYTES,
                "a Params struct must be padded to a multiple of 16 bytes, at most PARAMS_BYTES"
            );
        )+
        /// The WGSL declaration of this family's `Params` struct(s) (see `shader_params!`).
        const PARAMS_WGSL: &str = concat!($(
            "struct ", stringify!($name), " {\n",
            $( "    ", stringify!($field), ": ", $crate::pipeline::wgsl_type!($ty $(, $wgsl)?), ",\n", )*
            "}\n",
        )+);
    };
}
pub(crate) use shader_params;

/// Declares an op family once: the Rust enum with `ALL` (in code order), `name()` (PyTorch's
/// name, lower case) and `shader_code()` (the value of the family's WGSL `override OP: u32`),
/// and `WGSL`, the WGSL constants of the codes (`const Neg: u32 = 0u;`, one per variant, named
/// as it is). The family's shaders switch on those names (`case Neg: { .. }`) and take `WGSL`
/// appended to their source (`concatcp!(shader_source!(..), UnaryOp::WGSL)`), so a code is
/// written nowhere by hand: adding an op is one line here and its `case` in the shader.
macro_rules! op_family {
    (
        $(#[$meta:meta])*
        pub enum $family:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $name:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $family {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $family {
            /// Every op, in shader-code order.
            pub const ALL: [$family; [$(stringify!($variant)),+].len()] = [$($family::$variant),+];

            /// The WGSL constants of the ops' codes (`const <Variant>: u32 = <code>u;`),
            /// appended to the family's shaders, which switch on them.
            pub const WGSL: &'static str = ::const_format::concatcp!(
                $("const ", stringify!($variant), ": u32 = ", $family::$variant as u32, "u;\n"),+
            );

            /// The op's name (PyTorch's, lower case): the label of what it allocates, and
            /// error messages.
            pub fn name(self) -> &'static str {
                match self {
                    $($family::$variant => $name),+
                }
            }

            /// The value of the WGSL `override OP: u32` of the family's shaders.
            pub fn shader_code(self) -> u32 {
                self as u32
            }
        }
    };
}
pub(crate) use op_family;

/// The WGSL type of a storage binding: `array<f32>` unless given.
macro_rules! storage_type {
    () => {
        "array<f32>"
    };
    ($ty:literal) => {
        $ty
    };
}
pub(crate) use storage_type;

/// `kernel!(stem, entry, source: EXPR, params: Params, [a, b: "array<u32>", out],
/// workgroup_size)`: the [`Kernel`] for entry point `entry` of the WGSL `EXPR` (a `concatcp!` of
/// the family's `<stem>.wgsl`, beside its launcher in `src/kernels/<family>/`, and the shared
/// helper files it calls, `shader_source!("indexing", ..)`; or of one body and its accessors),
/// with the module's `PARAMS_WGSL` (from `shader_params!`), the uniform `params: Params` (or
/// `name: Struct` after the entry), and its storage bindings in order (`array<f32>` unless a type
/// is given). Every kernel of a stem takes the same source (one shader module per stem).
/// `params: Params` may be left out.
macro_rules! kernel {
    (
        $stem:literal,
        $entry:literal,
        source: $wgsl:expr,
        [$($name:ident $(: $ty:literal)?),* $(,)?],
        $wg:expr
    ) => {
        $crate::pipeline::kernel!(
            $stem,
            $entry,
            source: $wgsl,
            params: Params,
            [$($name $(: $ty)?),*],
            $wg
        )
    };
    (
        $stem:literal,
        $entry:literal,
        source: $wgsl:expr,
        $uniform:ident : $params:ident,
        [$($name:ident $(: $ty:literal)?),* $(,)?],
        $wg:expr
    ) => {
        $crate::pipeline::Kernel::new(
            $stem,
            PARAMS_WGSL,
            $wgsl,
            $entry,
            $crate::pipeline::Binding { name: stringify!($uniform), ty: stringify!($params) },
            &[$($crate::pipeline::Binding {
                name: stringify!($name),
                ty: $crate::pipeline::storage_type!($($ty)?),
            }),*],
            $wg,
        )
    };
}
pub(crate) use kernel;

/// `kernels! { "stem", source: EXPR, workgroup: EXPR; /// doc  NAME = "entry" [a, b: "array<u32>"]; .. }`:
/// the entry points of one shader module declared together, one `pub const NAME: Kernel` a line,
/// each the [`kernel!`] of its entry point and bindings with the module's stem, source and
/// workgroup size (a uniform other than `params: Params` is written after the entry:
/// `NAME = "entry" sgd_params: SgdParams, [..];`).
macro_rules! kernels {
    (
        $stem:literal, source: $wgsl:expr, workgroup: $wg:expr;
        $(
            $(#[$meta:meta])*
            $name:ident = $entry:literal $($uniform:ident : $params:ident,)? [$($binding:tt)*];
        )+
    ) => {
        $(
            $(#[$meta])*
            pub const $name: $crate::pipeline::Kernel = $crate::pipeline::kernel!(
                $stem,
                $entry,
                source: $wgsl,
                $($uniform: $params,)?
                [$($binding)*],
                $wg
            );
        )+
    };
}
pub(crate) use kernels;

/// `shader_source!("online_softmax", "indexing")`: the text of the shared helper files
/// `shaders/online_softmax.wgsl` and `shaders/indexing.wgsl`, which a family appends to its own
/// shader (`concatcp!(include_str!("softmax_rows.wgsl"), shader_source!(..))`; WGSL declarations
/// may come in any order) to make one module's source for `kernel!(.., source: ..)`. Usable from
/// any module of the crate (the paths are taken from the crate root).
macro_rules! shader_source {
    ($($file:literal),+ $(,)?) => {
        concat!($(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $file, ".wgsl"))),+)
    };
}
pub(crate) use shader_source;

/// wgpu's runtime checks on a kernel's shader module: storage accesses clamped to the bound
/// segment, loops bounded. [`RuntimeChecks::ON`] is the default and the only value code outside
/// this crate can name, so no safe caller can create an unchecked module from arbitrary WGSL.
/// Off (`create_shader_module_trusted(.., ShaderRuntimeChecks::unchecked())`) is reserved for
/// in-crate kernels whose WGSL clamps every load and guards every store, whose loops all end,
/// and whose launcher checks that every operand fits its binding (`kernels::matmul::
/// matmul_unchecked`; on lavapipe it gained only 1-3 %, see `cargo xtask bench kernels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuntimeChecks {
    on: bool,
}

impl RuntimeChecks {
    /// wgpu's checks on (`create_shader_module`).
    pub const ON: Self = Self { on: true };
    /// wgpu's checks off. Only for kernels audited as described on [`RuntimeChecks`].
    pub(crate) const OFF_AUDITED: Self = Self { on: false };

    /// Whether wgpu's checks are on.
    pub fn is_on(self) -> bool {
        self.on
    }
}

/// Values keyed by a kernel and its override constants, found without allocating: a launch
/// looks its pipeline up on every dispatch (and a planning twin notes it), so the lookup
/// compares the launch's `(&str, f64)` pairs with the stored ones in place instead of building
/// an owned key. A kernel has a handful of override sets at most, so each kernel's are a list.
#[derive(Debug)]
pub(crate) struct ByKernel<T> {
    map: HashMap<Family, Vec<(Overrides, T)>>,
    len: usize,
}

/// Override constants as stored: names and values as `f64` bits.
type Overrides = Vec<(String, u64)>;

/// A kernel's identity apart from its overrides: stem, entry point and runtime checks.
type Family = (&'static str, &'static str, RuntimeChecks);

impl<T> Default for ByKernel<T> {
    fn default() -> Self {
        ByKernel {
            map: HashMap::new(),
            len: 0,
        }
    }
}

/// Whether `stored` and `given` are the same set of constants (order aside).
fn same_overrides(stored: &[(String, u64)], given: &[(&str, f64)]) -> bool {
    stored.len() == given.len()
        && given.iter().all(|(name, value)| {
            stored
                .iter()
                .any(|(n, v)| n == name && *v == value.to_bits())
        })
}

impl<T> ByKernel<T> {
    fn family(kernel: &Kernel) -> Family {
        (kernel.stem, kernel.entry, kernel.runtime_checks)
    }

    /// The value for `kernel` with `overrides`, if stored.
    pub(crate) fn get(&self, kernel: &Kernel, overrides: &[(&str, f64)]) -> Option<&T> {
        self.map
            .get(&Self::family(kernel))?
            .iter()
            .find(|(o, _)| same_overrides(o, overrides))
            .map(|(_, v)| v)
    }

    /// The value for `kernel` with `overrides`, stored from `make` if there is none yet (an
    /// existing value is kept, and `make` not called).
    pub(crate) fn get_or_insert_with(
        &mut self,
        kernel: &Kernel,
        overrides: &[(&str, f64)],
        make: impl FnOnce() -> T,
    ) -> &mut T {
        let list = self.map.entry(Self::family(kernel)).or_default();
        let at = match list.iter().position(|(o, _)| same_overrides(o, overrides)) {
            Some(at) => at,
            None => {
                let owned = overrides
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), v.to_bits()))
                    .collect();
                list.push((owned, make()));
                self.len += 1;
                list.len() - 1
            }
        };
        &mut list[at].1
    }

    /// How many values are stored.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Forgets every value.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.len = 0;
    }
}

/// One bind-group layout per storage-binding count, and its pipeline layout.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) bind_group: wgpu::BindGroupLayout,
    pipeline: wgpu::PipelineLayout,
}

#[derive(Default)]
struct Maps {
    modules: HashMap<(&'static str, RuntimeChecks), wgpu::ShaderModule>,
    pipelines: ByKernel<wgpu::ComputePipeline>,
    layouts: HashMap<u32, Layout>,
}

/// The device's pipeline cache.
#[derive(Default)]
pub(crate) struct PipelineCache {
    maps: Mutex<Maps>,
}

/// Runs `f` inside Validation and Internal error scopes; the first error becomes an `Err`.
pub(crate) fn scoped<T>(device: &wgpu::Device, context: &str, f: impl FnOnce() -> T) -> Result<T> {
    let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let value = f();
    let v = pollster::block_on(validation.pop());
    let i = pollster::block_on(internal.pop());
    match v.or(i) {
        Some(e) => Err(Error::from_wgpu(context, e)),
        None => Ok(value),
    }
}

fn make_layout(device: &wgpu::Device, storage_bindings: u32) -> Layout {
    let mut entries = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: true,
            min_binding_size: wgpu::BufferSize::new(PARAMS_BYTES),
        },
        count: None,
    }];
    // read_write everywhere: tensors share segments, and one buffer bound read-only and read-write
    // in one dispatch is a validation error (docs/wgpu.md §4).
    entries.extend(
        (1..=storage_bindings).map(|binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        }),
    );
    let label = format!("plimsoll params+{storage_bindings} storage");
    let bind_group = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(&label),
        entries: &entries,
    });
    let pipeline = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&label),
        bind_group_layouts: &[Some(&bind_group)],
        immediate_size: 0,
    });
    Layout {
        bind_group,
        pipeline,
    }
}

/// Creates `kernel`'s shader module, with wgpu's runtime checks as `kernel.runtime_checks` says.
fn create_module(device: &wgpu::Device, kernel: &Kernel) -> wgpu::ShaderModule {
    let descriptor = wgpu::ShaderModuleDescriptor {
        label: Some(kernel.stem),
        source: wgpu::ShaderSource::Wgsl(kernel.source().into()),
    };
    if kernel.runtime_checks.is_on() {
        return device.create_shader_module(descriptor);
    }
    // SAFETY: `RuntimeChecks::OFF_AUDITED` is `pub(crate)`, so only kernels of this crate reach
    // here, and each one that uses it is audited to be free of out-of-bounds accesses and endless
    // loops on its own: its WGSL clamps every load index into its operand and guards every store,
    // its loops are bounded by `Params` sizes, and its launcher returns `InvalidArgument` unless
    // every operand's extent fits its buffer (see `kernels/matmul/matmul.wgsl` and `kernels::matmul`).
    #[allow(unsafe_code)]
    unsafe {
        device.create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked())
    }
}

impl PipelineCache {
    /// Pipelines built so far.
    pub(crate) fn len(&self) -> usize {
        self.maps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pipelines
            .len()
    }

    /// The layout for `storage_bindings` storage buffers (created on first use).
    pub(crate) fn layout(&self, device: &wgpu::Device, storage_bindings: u32) -> Result<Layout> {
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = maps.layouts.get(&storage_bindings) {
            return Ok(l.clone());
        }
        let layout = scoped(device, "bind group layout", || {
            make_layout(device, storage_bindings)
        })?;
        maps.layouts.insert(storage_bindings, layout.clone());
        Ok(layout)
    }

    /// `kernel`'s shader module (one per stem and runtime-check setting), created on first use.
    /// Creation runs outside the cache's lock; two threads racing for one stem may both build
    /// it, and the first one stored is kept.
    pub(crate) fn module(&self, shared: &Shared, kernel: &Kernel) -> Result<wgpu::ShaderModule> {
        let module_key = (kernel.stem, kernel.runtime_checks);
        if let Some(m) = self.lock().modules.get(&module_key) {
            return Ok(m.clone());
        }
        let device = &shared.device;
        let context = format!("shader {}.wgsl", kernel.stem);
        let m = scoped(device, &context, || create_module(device, kernel))?;
        Ok(self.lock().modules.entry(module_key).or_insert(m).clone())
    }

    /// The pipeline for `kernel` specialised by `overrides` (WGSL `override` constants), and its
    /// bind-group layout. Built on first use, then a hash-map lookup. The build runs outside
    /// the cache's lock, so several threads can build different pipelines at once
    /// ([`crate::Gpu::compile_pipelines`]); a pipeline two threads race for is kept once.
    pub(crate) fn get(
        &self,
        shared: &Shared,
        kernel: &Kernel,
        overrides: &[(&str, f64)],
    ) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
        let device = &shared.device;
        let layout = self.layout(device, kernel.storage_bindings)?;
        if let Some(p) = self.lock().pipelines.get(kernel, overrides) {
            return Ok((p.clone(), layout.bind_group));
        }
        let module = self.module(shared, kernel)?;
        let context = format!("pipeline {}::{} {:?}", kernel.stem, kernel.entry, overrides);
        let pipeline = scoped(device, &context, || {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&context),
                layout: Some(&layout.pipeline),
                module: &module,
                entry_point: Some(kernel.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: overrides,
                    ..Default::default()
                },
                cache: None,
            })
        })?;
        let kept = self
            .lock()
            .pipelines
            .get_or_insert_with(kernel, overrides, || pipeline)
            .clone();
        Ok((kept, layout.bind_group))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A pipeline to build: a kernel and its override constants ([`crate::Gpu::compile_pipelines`]),
/// and the `Params` its launches passed (for a warm-up dispatch; empty when not known).
#[derive(Debug, Clone, PartialEq)]
pub struct WantedPipeline {
    /// The kernel.
    pub kernel: Kernel,
    /// Its WGSL `override` constants.
    pub overrides: Vec<(String, f64)>,
    /// Distinct `Params` bytes it was launched with.
    pub params: Vec<Vec<u8>>,
}

impl WantedPipeline {
    /// `kernel` with `overrides` (no `Params` known).
    pub fn new(kernel: Kernel, overrides: &[(&str, f64)]) -> WantedPipeline {
        WantedPipeline {
            kernel,
            overrides: overrides
                .iter()
                .map(|(k, v)| ((*k).to_string(), *v))
                .collect(),
            params: Vec::new(),
        }
    }
}

/// What [`crate::Gpu::compile_pipelines`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compiled {
    /// Pipelines it was asked for (built now, or found already built).
    pub built: usize,
    /// Threads it built them on.
    pub threads: usize,
}

/// The pipelines planning twins' launches asked for, each once, in the order first asked, with
/// the distinct `Params` each was launched with (at most [`Wanted::PARAMS_PER_PIPELINE`]).
#[derive(Debug, Default)]
pub(crate) struct Wanted {
    seen: Mutex<WantedState>,
}

#[derive(Debug, Default)]
struct WantedState {
    index: ByKernel<usize>,
    pipelines: Vec<WantedPipeline>,
}

impl Wanted {
    /// Most distinct `Params` kept per pipeline (a warm-up dispatches each once, on one
    /// workgroup). Params differ by their offsets too, so the first launches of a pipeline can
    /// fill many slots before a launch that changes a branch (an accumulate bit, a transpose
    /// flag) comes; 64 leaves room for those in the workloads here.
    pub(crate) const PARAMS_PER_PIPELINE: usize = 64;

    /// Notes a launch's pipeline and its `Params`.
    pub(crate) fn note(&self, kernel: &Kernel, overrides: &[(&str, f64)], params: &[u8]) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *seen;
        let at = *state.index.get_or_insert_with(kernel, overrides, || {
            state
                .pipelines
                .push(WantedPipeline::new(*kernel, overrides));
            state.pipelines.len() - 1
        });
        let params_seen = &mut state.pipelines[at].params;
        if params_seen.len() < Self::PARAMS_PER_PIPELINE && !params_seen.iter().any(|p| p == params)
        {
            params_seen.push(params.to_vec());
        }
    }

    /// The pipelines noted so far; forgets them.
    pub(crate) fn take(&self) -> Vec<WantedPipeline> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.index.clear();
        std::mem::take(&mut seen.pipelines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Kernel = Kernel::standalone("a", "", "main", 1, 64);
    const A_OTHER_ENTRY: Kernel = Kernel::standalone("a", "", "other", 1, 64);

    /// Against a naive oracle: a `Vec` of owned keys (sorted overrides) searched linearly.
    #[test]
    fn by_kernel_finds_a_value_by_its_kernel_and_override_set_in_any_order() {
        let mut map = ByKernel::default();
        let mut naive: Vec<((&str, Overrides), u32)> = Vec::new();
        let cases: [(Kernel, &[(&str, f64)]); 6] = [
            (A, &[]),
            (A, &[("x", 1.0)]),
            (A, &[("x", 2.0)]),
            (A, &[("x", 1.0), ("y", 3.0)]),
            (A, &[("y", 3.0), ("x", 1.0)]),
            (A_OTHER_ENTRY, &[("x", 1.0)]),
        ];
        for (i, (kernel, overrides)) in cases.iter().enumerate() {
            let mut key: Vec<(String, u64)> = overrides
                .iter()
                .map(|(k, v)| ((*k).to_string(), v.to_bits()))
                .collect();
            key.sort();
            let key = (kernel.entry, key);
            let expected = match naive.iter().find(|(k, _)| *k == key) {
                Some((_, v)) => *v,
                None => {
                    naive.push((key, i as u32));
                    i as u32
                }
            };
            let got = *map.get_or_insert_with(kernel, overrides, || i as u32);
            assert_eq!(got, expected, "case {i}");
            assert_eq!(map.get(kernel, overrides), Some(&expected), "case {i}");
        }
        assert_eq!(map.len(), naive.len());
        assert_eq!(map.get(&A, &[("x", 4.0)]), None);
        map.clear();
        assert_eq!((map.len(), map.get(&A, &[])), (0, None));
    }
}
