//! The matmul on cooperative matrices (tensor cores): `main_coop` of `matmul_coop.wgsl`
//! (written by `gen_coop.py`), for products with a 16-bit A or B (an f32 one rounded to f16 as
//! it is staged, as PyTorch's autocast casts it), on a device whose adapter
//! offers 16×16×16 f16 × f16 → f32 cooperative matrices with 32-lane subgroups
//! ([`crate::AdapterSummary::cooperative_matmul`]). It takes the place of `main` (the same
//! preconditions, 128 × 128 blocks of C, Params, epilogue and squares), so the launcher's
//! checks, splitting and squares layout hold unchanged; where the adapter lacks it, or
//! [`Gpu::set_cooperative_matmul`] turned it off, the 16-bit modules' `main` runs instead.

use std::sync::atomic::Ordering;

use super::{MATMUL_PARAMS_WGSL as PARAMS_WGSL, MatmulEntry};
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::convert::F16Path;
use crate::pipeline::{Kernel, kernel, shader_source};

/// `main_coop` with the accessors of A, B and C given (`"a"` or `"a_f16"`, ...), its stem and
/// bindings: one module per combination of widths.
macro_rules! coop {
    ($stem:literal, $a:literal, $b:literal, $c:literal, [$($name:ident: $ty:literal),*]) => {
        kernel!(
            $stem,
            "main_coop",
            source: concat!(
                "enable f16; enable wgpu_cooperative_matrix;\n",
                include_str!("matmul_coop.wgsl"),
                include_str!("matmul_epilogue.wgsl"),
                include_str!(concat!("matmul_coop_", $a, ".wgsl")),
                include_str!(concat!("matmul_coop_", $b, ".wgsl")),
                include_str!(concat!("matmul_coop_", $c, ".wgsl")),
                shader_source!("f16_native")
            ),
            params: Params,
            [$($name: $ty,)* bias],
            256
        )
    };
}

/// `main_coop` per combination of widths with a 16-bit A or B (16-bit operands: A; B; A and B;
/// A and C; B and C; all three). A product of f32 operands never runs on them: only a 16-bit
/// run's products do, an f32 operand rounded to f16 as autocast does.
pub const COOP: [Kernel; 6] = [
    coop!("matmul_coop_a", "a_f16", "b", "c",
        [a_h4: "array<vec4<f16>>", b_v4: "array<vec4<f32>>", c_v4: "array<vec4<f32>>"]),
    coop!("matmul_coop_b", "a", "b_f16", "c",
        [a_v4: "array<vec4<f32>>", b_h4: "array<vec4<f16>>", c_v4: "array<vec4<f32>>"]),
    coop!("matmul_coop_ab", "a_f16", "b_f16", "c",
        [a_h4: "array<vec4<f16>>", b_h4: "array<vec4<f16>>", c_v4: "array<vec4<f32>>"]),
    coop!("matmul_coop_ac", "a_f16", "b", "c_f16",
        [a_h4: "array<vec4<f16>>", b_v4: "array<vec4<f32>>", c_h4: "array<vec4<f16>>"]),
    coop!("matmul_coop_bc", "a", "b_f16", "c_f16",
        [a_v4: "array<vec4<f32>>", b_h4: "array<vec4<f16>>", c_h4: "array<vec4<f16>>"]),
    coop!("matmul_coop_abc", "a_f16", "b_f16", "c_f16",
        [a_h4: "array<vec4<f16>>", b_h4: "array<vec4<f16>>", c_h4: "array<vec4<f16>>"]),
];

/// Whether a kernel needs the device features of the cooperative matrices.
pub(crate) fn is_coop(kernel: &Kernel) -> bool {
    COOP.iter().any(|k| k.stem == kernel.stem)
}

/// Which arithmetic a device's 16-bit matmuls use ([`Gpu::matmul_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatmulPath {
    /// Cooperative matrices (tensor cores): 16×16×16 f16 × f16 → f32, for products with a
    /// 16-bit A or B that take `main` (an f32 operand rounded to f16, as autocast does); the
    /// rest as [`MatmulPath::Simt`].
    Cooperative,
    /// Every product on ordinary invocations (each element's sum in one invocation, f32).
    Simt,
}

impl MatmulPath {
    /// For logs and `run.json`.
    pub fn describe(self) -> &'static str {
        match self {
            MatmulPath::Cooperative => {
                "cooperative matrices (16x16x16 f16 x f16 -> f32) for products with a 16-bit \
                 A or B, SIMT otherwise"
            }
            MatmulPath::Simt => "SIMT (no cooperative matrices)",
        }
    }
}

impl Gpu {
    /// The arithmetic this device's 16-bit matmuls use: [`MatmulPath::Cooperative`] where the
    /// adapter has usable cooperative matrices, they are not turned off and the 16-bit path is
    /// the native one ([`F16Path::Packed`] keeps every product off them).
    pub fn matmul_path(&self) -> MatmulPath {
        if self.adapter().cooperative_matmul
            && !self.shared.coop_off.load(Ordering::Relaxed)
            && self.f16_path() == F16Path::Native
        {
            MatmulPath::Cooperative
        } else {
            MatmulPath::Simt
        }
    }

    /// Turns the cooperative-matrix matmul on (the default where the adapter has it) or off,
    /// for this device, its clones and the planning twins made afterwards (benchmarks compare
    /// the two). Turning it on where the adapter lacks it is [`Error::InvalidArgument`].
    pub fn set_cooperative_matmul(&self, on: bool) -> Result<()> {
        if on && !self.adapter().cooperative_matmul {
            return Err(Error::InvalidArgument {
                op: "set_cooperative_matmul",
                message: format!(
                    "adapter {:?} has no usable cooperative matrices (16x16x16 f16 -> f32, \
                     32-lane subgroups); 16-bit matmuls run on the SIMT path",
                    self.adapter().name
                ),
            });
        }
        self.shared.coop_off.store(!on, Ordering::Relaxed);
        Ok(())
    }
}

/// The cooperative kernel for a launch on `entry` with 16-bit flags `[c, a, b]`, when the
/// device uses them and the product qualifies (A or B 16-bit, on `main`, the native 16-bit
/// path: [`crate::kernels::convert::F16Path::Packed`] keeps every product off them); `None`
/// otherwise.
pub(super) fn coop_kernel(gpu: &Gpu, entry: MatmulEntry, [c16, a16, b16]: [bool; 3]) -> Option<Kernel> {
    let qualifies =
        entry == MatmulEntry::Main && (a16 || b16) && gpu.matmul_path() == MatmulPath::Cooperative;
    let index = match (a16, b16, c16) {
        (false, false, _) => return None,
        (true, false, false) => 0,
        (false, true, false) => 1,
        (true, true, false) => 2,
        (true, false, true) => 3,
        (false, true, true) => 4,
        (true, true, true) => 5,
    };
    qualifies.then_some(COOP[index])
}
