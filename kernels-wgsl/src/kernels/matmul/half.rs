//! The matmul's operands of either width: [`Operand`] is an f32 [`DeviceSlice`] or a run of
//! 16-bit [`Halves`]. A launch with any 16-bit operand runs a module whose accessors read and
//! write halves: `matmul_io_f16.wgsl` (`pack2x16float` on u32 words, every adapter) or,
//! where the device has `SHADER_F16`, `array<f16>` views (`matmul_io_x_f16.wgsl`, one
//! module per combination of widths); [`crate::Gpu::f16_path`] picks), with the same body, entry points, checks and results: the
//! products and sums are f32 (a product of two halves is exact in f32, as on a tensor core) and
//! a 16-bit C is rounded once, after the epilogue.

use super::{MAIN, MATMUL_PARAMS_WGSL as PARAMS_WGSL};
use crate::error::{Error, Result};
use crate::kernels::convert::Halves;
use crate::pipeline::{Kernel, kernel, kernels, shader_source};
use crate::slice::DeviceSlice;

/// The 16-bit module on the packed path: the body and `matmul_io_f16.wgsl` (override
/// constants `A_F16`, `B_F16`, `C_F16`; u32 views, one per binding and entry point, whatever the
/// widths: naga allows no more).
const WGSL_F16: &str = concat!(
    include_str!("matmul.wgsl"),
    include_str!("matmul_epilogue.wgsl"),
    include_str!("matmul_io_f16.wgsl"),
    shader_source!("f16_bits")
);

kernels! {
    "matmul_f16", source: WGSL_F16, workgroup: 64;
    /// [`super::MAIN`] when an operand is 16-bit, packed path.
    MAIN_F16 = "main" [
        a_q: "array<vec4<u32>>",
        b_q: "array<vec4<u32>>",
        c_q: "array<vec4<u32>>",
        bias,
    ];
    /// [`super::MAIN_SCALAR`] when an operand is 16-bit, packed path.
    MAIN_SCALAR_F16 = "main_scalar" [
        a_w: "array<u32>",
        b_w: "array<u32>",
        c_atomic: "array<atomic<u32>>",
        bias,
    ];
}

/// `[main, main_scalar]` of one native 16-bit module (`enable f16;`): the body with, per
/// operand, the f32 accessors (`matmul_io_x.wgsl`) or the `f16` ones
/// (`matmul_io_x_f16.wgsl`), so each binding has one view of its own type per entry
/// point.
macro_rules! native {
    ($stem:literal, $a:literal, $b:literal, $c:literal, [$($m:ident: $mt:literal),*],
     [$($s:ident: $st:literal),*]) => {{
        const SOURCE: &str = concat!(
            "enable f16;\n",
            include_str!("matmul.wgsl"),
            include_str!("matmul_epilogue.wgsl"),
            include_str!(concat!("matmul_io_", $a, ".wgsl")),
            include_str!(concat!("matmul_io_", $b, ".wgsl")),
            include_str!(concat!("matmul_io_", $c, ".wgsl")),
            shader_source!("f16_native")
        );
        [
            kernel!($stem, "main", source: SOURCE, params: Params, [$($m: $mt,)* bias], 64),
            kernel!($stem, "main_scalar", source: SOURCE, params: Params, [$($s: $st,)* bias], 64),
        ]
    }};
}

/// The native 16-bit modules' `[main, main_scalar]`, one module per combination of widths
/// (index `a + 2·b + 4·c`, 1 for a 16-bit operand; index 0, all f32, is the f32 module's).
pub const NATIVE: [[Kernel; 2]; 8] = [
    [super::MAIN, super::MAIN_SCALAR],
    native!("matmul_f16_native_a", "a_f16", "b", "c",
        [a_h4: "array<vec4<f16>>", b_v4: "array<vec4<f32>>", c_v4: "array<vec4<f32>>"],
        [a_h: "array<f16>", b: "array<f32>", c: "array<f32>"]),
    native!("matmul_f16_native_b", "a", "b_f16", "c",
        [a_v4: "array<vec4<f32>>", b_h4: "array<vec4<f16>>", c_v4: "array<vec4<f32>>"],
        [a: "array<f32>", b_h: "array<f16>", c: "array<f32>"]),
    native!("matmul_f16_native_ab", "a_f16", "b_f16", "c",
        [a_h4: "array<vec4<f16>>", b_h4: "array<vec4<f16>>", c_v4: "array<vec4<f32>>"],
        [a_h: "array<f16>", b_h: "array<f16>", c: "array<f32>"]),
    native!("matmul_f16_native_c", "a", "b", "c_f16",
        [a_v4: "array<vec4<f32>>", b_v4: "array<vec4<f32>>", c_h4: "array<vec4<f16>>"],
        [a: "array<f32>", b: "array<f32>", c_h: "array<f16>"]),
    native!("matmul_f16_native_ac", "a_f16", "b", "c_f16",
        [a_h4: "array<vec4<f16>>", b_v4: "array<vec4<f32>>", c_h4: "array<vec4<f16>>"],
        [a_h: "array<f16>", b: "array<f32>", c_h: "array<f16>"]),
    native!("matmul_f16_native_bc", "a", "b_f16", "c_f16",
        [a_v4: "array<vec4<f32>>", b_h4: "array<vec4<f16>>", c_h4: "array<vec4<f16>>"],
        [a: "array<f32>", b_h: "array<f16>", c_h: "array<f16>"]),
    native!("matmul_f16_native_abc", "a_f16", "b_f16", "c_f16",
        [a_h4: "array<vec4<f16>>", b_h4: "array<vec4<f16>>", c_h4: "array<vec4<f16>>"],
        [a_h: "array<f16>", b_h: "array<f16>", c_h: "array<f16>"]),
];

/// `[main, main_scalar]` of the native module for these widths (true: 16-bit).
pub fn native_kernels(a16: bool, b16: bool, c16: bool) -> [Kernel; 2] {
    NATIVE[usize::from(a16) + 2 * usize::from(b16) + 4 * usize::from(c16)]
}

/// The override constants a launch of a 16-bit module passes to `kernel` (every layout and
/// width combination but all-f32), or `None` for a kernel that is not one.
pub(crate) fn f16_overrides(kernel: &Kernel) -> Option<Vec<Vec<(&'static str, f64)>>> {
    if kernel.stem != MAIN_F16.stem {
        return None;
    }
    let main = kernel.entry == MAIN.entry;
    let mut sets = Vec::new();
    for bits in 0..32u32 {
        let on = |bit: u32| if bits & (1 << bit) != 0 { 1.0 } else { 0.0 };
        let widths = [("A_F16", on(2)), ("B_F16", on(3)), ("C_F16", on(4))];
        if (!main && bits & 3 != 0) || bits >> 2 == 0 {
            continue;
        }
        let layout = [("TRANS_A", on(0)), ("TRANS_B", on(1))];
        let layout = if main { &layout[..] } else { &[] };
        sets.push(layout.iter().chain(&widths).copied().collect());
    }
    Some(sets)
}

/// One matmul operand (A, B or C): f32 elements, or 16-bit ones. Launchers take
/// `impl Into<Operand>`, so a [`DeviceSlice`] or a [`Halves`] can be passed as it is.
#[derive(Debug, Clone, Copy)]
pub enum Operand<'a> {
    /// f32 elements.
    F32(DeviceSlice<'a>),
    /// IEEE binary16 elements, two to a word.
    F16(Halves<'a>),
}

impl<'a> From<DeviceSlice<'a>> for Operand<'a> {
    fn from(slice: DeviceSlice<'a>) -> Self {
        Operand::F32(slice)
    }
}

impl<'a> From<Halves<'a>> for Operand<'a> {
    fn from(halves: Halves<'a>) -> Self {
        Operand::F16(halves)
    }
}

impl<'a> Operand<'a> {
    /// Whether its elements are 16-bit.
    pub fn is_f16(&self) -> bool {
        matches!(self, Operand::F16(_))
    }

    /// Index of its first element in the shader's view of its binding (f32 elements, or
    /// halves).
    pub fn index(&self) -> u32 {
        match self {
            Operand::F32(s) => s.index(),
            Operand::F16(h) => h.index(),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        match self {
            Operand::F32(s) => s.len(),
            Operand::F16(h) => h.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The operand from its `n`-th element to its end (empty when `n` is past it).
    pub(crate) fn skip(&self, n: u64) -> Result<Operand<'a>> {
        Ok(match self {
            Operand::F32(s) => Operand::F32(s.slice(n.min(s.len()), s.len().saturating_sub(n))?),
            Operand::F16(h) => Operand::F16(h.skip(n)?),
        })
    }

    /// Bytes per element (4 or 2).
    pub fn element_bytes(&self) -> u64 {
        match self {
            Operand::F32(_) => 4,
            Operand::F16(_) => 2,
        }
    }

    /// The words to bind (the whole segment is bound; this is what the checks see).
    pub(crate) fn words(&self) -> DeviceSlice<'a> {
        match self {
            Operand::F32(s) => *s,
            Operand::F16(h) => h.words(),
        }
    }

    /// [`Error::InvalidArgument`] naming `name` unless it holds at least `len` elements.
    pub(crate) fn expect_at_least(&self, op: &'static str, name: &str, len: u64) -> Result<()> {
        match self {
            Operand::F32(s) => s.expect_at_least(op, name, len),
            Operand::F16(h) if h.len() >= len => Ok(()),
            Operand::F16(h) => Err(Error::InvalidArgument {
                op,
                message: format!(
                    "{name}: {} halves given ({:?}), at least {len} needed",
                    h.len(),
                    h.words()
                ),
            }),
        }
    }

    /// Whether the two share a word (two runs of halves that share only a word, each in its
    /// own half, count as overlapping: the packed path writes whole words).
    pub(crate) fn overlaps(&self, other: &Operand<'_>) -> bool {
        self.words().overlaps(&other.words())
    }
}
