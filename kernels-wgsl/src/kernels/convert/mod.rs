//! `convert`: `f32` to IEEE binary16 and back, for 16-bit tensors ([`Halves`]: element `i` is
//! half `i` of a little-endian `[u16]`, two per `u32` word, element `2i` in the low half of word
//! `i`). Overflow becomes ±inf and NaN stays NaN, so the `nonfinite` check still sees them.
//!
//! Two paths, one storage layout, chosen by the adapter ([`Gpu::f16_path`]):
//! - [`F16Path::Native`] (`convert_native.wgsl`, `enable f16;`) binds the halves as
//!   `array<f16>`: each invocation loads or stores one 16-bit element. It needs the device
//!   feature `SHADER_F16` (lavapipe has it).
//! - [`F16Path::Packed`] (`convert.wgsl`) binds them as `array<u32>` and uses the core
//!   builtins `pack2x16float` / `unpack2x16float`: it runs on every adapter. A store writes whole
//!   words, so one invocation owns each word the run touches and keeps a neighbour's half it
//!   does not own (a run may start or end in the middle of a word).
//!
//! In one place: the two shaders (beside this file), the launchers, the CPU
//! [`reference`](mod@reference) and the tests.

use std::sync::atomic::Ordering;

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{ELEMENTWISE_WORKGROUP, launch_units};
use crate::pipeline::{Kernel, kernels, shader_params, shader_source};
use crate::slice::DeviceSlice;
use const_format::concatcp;

pub mod reference;
#[cfg(test)]
pub(crate) mod tests;

/// The packed module: `convert.wgsl` and the rounding of `shaders/f16_bits.wgsl`.
const WGSL_PACKED: &str = concatcp!(
    include_str!("convert.wgsl"),
    shader_source!("f16_bits", "indexing")
);

/// The native module: `convert_native.wgsl` (`enable f16;` first) and the rounding of
/// `shaders/f16_native.wgsl`.
const WGSL_NATIVE: &str = concatcp!(
    include_str!("convert_native.wgsl"),
    shader_source!("f16_native", "indexing")
);

kernels! {
    "convert", source: WGSL_PACKED, workgroup: ELEMENTWISE_WORKGROUP;
    /// The packed path's `f32_to_f16` entry point: bindings `src` (f32), `dst_words` (u32); one
    /// invocation per destination word.
    F32_TO_F16 = "f32_to_f16" [src, dst_words: "array<u32>"];
    /// The packed path's `f16_to_f32` entry point: bindings `src_words` (u32), `dst` (f32); one
    /// invocation per element.
    F16_TO_F32 = "f16_to_f32" [src_words: "array<u32>", dst];
}

kernels! {
    "convert_native", source: WGSL_NATIVE, workgroup: ELEMENTWISE_WORKGROUP;
    /// The native path's `f32_to_f16` entry point: bindings `src` (f32), `dst_halves` (f16).
    F32_TO_F16_NATIVE = "f32_to_f16" [src, dst_halves: "array<f16>"];
    /// The native path's `f16_to_f32` entry point: bindings `src_halves` (f16), `dst` (f32).
    F16_TO_F32_NATIVE = "f16_to_f32" [src_halves: "array<f16>", dst];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    F32_TO_F16,
    F16_TO_F32,
    F32_TO_F16_NATIVE,
    F16_TO_F32_NATIVE,
];

shader_params! {
    /// The `Params` of `convert.wgsl` and `convert_native.wgsl` (every entry point). Offsets of halves count halves from
    /// the start of their binding (word `h / 2`, low half when `h` is even).
    struct Params {
        n: u32,
        src_offset: u32,
        dst_offset: u32,
        _pad0: u32,
    }
}

impl Params {
    fn new(n: u64, src_offset: u32, dst_offset: u32) -> Params {
        Params {
            n: n as u32,
            src_offset,
            dst_offset,
            _pad0: 0,
        }
    }
}

/// How a device converts between `f32` and 16-bit storage (the layout is the same either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum F16Path {
    /// `f16` in the shader (`enable f16;`): needs the device feature `SHADER_F16`.
    Native,
    /// `pack2x16float` / `unpack2x16float` on `u32` words: every adapter.
    Packed,
}

impl std::fmt::Display for F16Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            F16Path::Native => "native f16 (SHADER_F16)",
            F16Path::Packed => "packed f16 (pack2x16float)",
        })
    }
}

impl Gpu {
    /// The path 16-bit conversions take: [`F16Path::Native`] where the device has
    /// `SHADER_F16` (unless [`Gpu::set_f16_path`] chose the packed one), else
    /// [`F16Path::Packed`].
    pub fn f16_path(&self) -> F16Path {
        let native = self.features().contains(wgpu::Features::SHADER_F16);
        match native && !self.shared.f16_packed.load(Ordering::Relaxed) {
            true => F16Path::Native,
            false => F16Path::Packed,
        }
    }

    /// Chooses the path of this device's 16-bit conversions (every clone, and planning twins
    /// made afterwards). [`F16Path::Native`] on a device without `SHADER_F16` is
    /// [`Error::InvalidArgument`].
    pub fn set_f16_path(&self, path: F16Path) -> Result<()> {
        if path == F16Path::Native && !self.features().contains(wgpu::Features::SHADER_F16) {
            return Err(Error::InvalidArgument {
                op: "set_f16_path",
                message: format!(
                    "adapter {:?} has no SHADER_F16; use the packed path",
                    self.adapter().name
                ),
            });
        }
        let packed = path == F16Path::Packed;
        self.shared.f16_packed.store(packed, Ordering::Relaxed);
        Ok(())
    }
}

/// A run of 16-bit elements: `len` halves from half `first` (0 or 1) of the first word of
/// `words`, which holds exactly the words the run touches (`ceil((first + len) / 2)`). A tensor
/// of 2-byte elements at an odd element offset starts in a word's high half (`first` 1).
#[derive(Debug, Clone, Copy)]
pub struct Halves<'a> {
    words: DeviceSlice<'a>,
    first: u32,
    len: u64,
}

impl<'a> Halves<'a> {
    /// The run of `len` halves from half `first` of `words`, or [`Error::InvalidArgument`] when
    /// `first > 1` or `words` is not exactly the `ceil((first + len) / 2)` words it touches.
    pub fn new(words: DeviceSlice<'a>, first: u32, len: u64) -> Result<Self> {
        if first > 1 {
            return Err(Error::InvalidArgument {
                op: "halves",
                message: format!("first half {first} of a word (0 or 1)"),
            });
        }
        words.expect_len("halves", "words", f16_words(u64::from(first) + len))?;
        Ok(Halves { words, first, len })
    }

    /// The run of `len` halves that starts at element `offset` (in halves) of `buffer`'s words.
    pub fn of(buffer: &'a crate::DeviceBuffer, offset: u64, len: u64) -> Result<Self> {
        let first = (offset % 2) as u32;
        let words = buffer.slice(offset / 2, f16_words(u64::from(first) + len))?;
        Halves::new(words, first, len)
    }

    /// The run from its `n`-th half to its end (empty when `n` is past it).
    pub fn skip(&self, n: u64) -> Result<Self> {
        let n = n.min(self.len);
        let start = u64::from(self.first) + n;
        let first = (start % 2) as u32;
        let len = self.len - n;
        let words = self.words.slice(start / 2, f16_words(u64::from(first) + len))?;
        Halves::new(words, first, len)
    }

    /// Number of halves.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the run holds no half.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The words the run touches.
    pub fn words(&self) -> DeviceSlice<'a> {
        self.words
    }

    /// The first half as the index a shader uses on its binding (the whole segment) in halves.
    pub fn index(&self) -> u32 {
        2 * self.words.index() + self.first
    }
}

/// [`Error::InvalidArgument`] unless the packed path can write `out` one whole word per
/// invocation: its first half is the low half of a word (the native path stores single halves).
pub(crate) fn expect_whole_words(gpu: &Gpu, op: &'static str, out: &Halves<'_>) -> Result<()> {
    if gpu.f16_path() == F16Path::Native || out.index().is_multiple_of(2) {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op,
        message: format!(
            "the output's first half is the high half of word {} ({:?}); the packed f16 path \
             writes whole words: give an output that starts at an even element",
            out.words().index(),
            out.words()
        ),
    })
}

/// The checks of an elementwise launch from 16-bit `x` to 16-bit `y`: [`Error::InvalidArgument`]
/// when they hold different numbers of halves, then [`expect_whole_words`] on `y`.
pub(crate) fn expect_elementwise_halves(
    gpu: &Gpu,
    op: &'static str,
    y: &Halves<'_>,
    x: &Halves<'_>,
) -> Result<()> {
    if x.len() != y.len() {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "x has {} halves, y {}; they must be equal",
                x.len(),
                y.len()
            ),
        });
    }
    expect_whole_words(gpu, op, y)
}

/// Number of `u32` words holding `len` halves: `ceil(len / 2)`.
pub fn f16_words(len: u64) -> u64 {
    len.div_ceil(2)
}

/// [`Error::InvalidArgument`] for the native path on a device without `SHADER_F16` (refused
/// when recorded, also on a planning twin, not when the pipeline is built).
fn expect_path(gpu: &Gpu, op: &'static str, path: F16Path) -> Result<()> {
    if path == F16Path::Native && !gpu.features().contains(wgpu::Features::SHADER_F16) {
        return Err(Error::InvalidArgument {
            op,
            message: "the native f16 path needs SHADER_F16, which this device lacks; use the \
                      packed path"
                .to_string(),
        });
    }
    Ok(())
}

fn expect_same_len(op: &'static str, halves: &Halves<'_>, x: &DeviceSlice<'_>) -> Result<()> {
    if halves.len() == x.len() {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op,
        message: format!(
            "{} halves and {} f32 elements ({x:?}); they must be equal",
            halves.len(),
            x.len()
        ),
    })
}

/// Records `dst = half(x)` on the device's path ([`Gpu::f16_path`]): round to nearest;
/// |x| >= 65520 gives ±inf; NaN gives a NaN. Devices may flush f16 subnormals to 0.
pub fn f32_to_f16(gpu: &Gpu, dst: Halves<'_>, x: DeviceSlice<'_>) -> Result<()> {
    f32_to_f16_on(gpu, gpu.f16_path(), dst, x)
}

/// Records `out = f32(src)` on the device's path (exact for normal halves).
pub fn f16_to_f32(gpu: &Gpu, out: DeviceSlice<'_>, src: Halves<'_>) -> Result<()> {
    f16_to_f32_on(gpu, gpu.f16_path(), out, src)
}

/// [`f32_to_f16`] on a chosen path (tests cover both on one adapter).
pub fn f32_to_f16_on(gpu: &Gpu, path: F16Path, dst: Halves<'_>, x: DeviceSlice<'_>) -> Result<()> {
    expect_same_len("f32_to_f16", &dst, &x)?;
    expect_path(gpu, "f32_to_f16", path)?;
    let (len, from, to) = (dst.len(), x.index(), dst.index());
    let buffers = [x, dst.words];
    // In ranges under a submission bound, each range with its own offsets and length.
    let range = |s: u64, e: u64| Params::new(e - s, from + s as u32, to + s as u32);
    match path {
        F16Path::Native => launch_units(gpu, &F32_TO_F16_NATIVE, &[], &buffers, len, |s, e| {
            (range(s, e), e - s)
        }),
        // One invocation per word touched: it writes the whole word. Ranges of whole words
        // (the first and last may be half-filled), so that no two touch the same word.
        F16Path::Packed => {
            let (first, end) = (u64::from(to), u64::from(to) + len);
            let words = dst.words.len();
            let base = first / 2;
            launch_units(gpu, &F32_TO_F16, &[], &buffers, words, |s, e| {
                let start = (2 * (base + s)).max(first) - first;
                let stop = (2 * (base + e)).min(end) - first;
                (range(start, stop), e - s)
            })
        }
    }
}

/// [`f16_to_f32`] on a chosen path.
pub fn f16_to_f32_on(
    gpu: &Gpu,
    path: F16Path,
    out: DeviceSlice<'_>,
    src: Halves<'_>,
) -> Result<()> {
    expect_same_len("f16_to_f32", &src, &out)?;
    expect_path(gpu, "f16_to_f32", path)?;
    let (from, to) = (src.index(), out.index());
    let kernel = match path {
        F16Path::Native => &F16_TO_F32_NATIVE,
        F16Path::Packed => &F16_TO_F32,
    };
    // In ranges under a submission bound, each range with its own offsets and length.
    launch_units(gpu, kernel, &[], &[src.words, out], src.len(), |s, e| {
        (Params::new(e - s, from + s as u32, to + s as u32), e - s)
    })
}
