//! `conv2d`: PyTorch's `nn.Conv2d` over NCHW tensors (stride, zero padding, dilation, groups:
//! depthwise included) and its input, weight and bias gradients, by direct summation (one
//! invocation per element written, no unfolded input) or, for one group, as the tuned matmul
//! over columns of the input's taps (`im2col`, a chunk of images at a time: the whole unfolded
//! input never exists; [`path`] chooses). The family in one place: its shader
//! (`conv2d.wgsl`, beside this file: the formulas), its launchers, its CPU
//! [`reference`](mod@reference) and its kernel tests.
//!
//! Weights are PyTorch's `[out_channels, in_channels / groups, kernel_h, kernel_w]`. The weight
//! and bias gradients sum over the batch; on an adapter with a loop limit (lavapipe) they sum
//! it in ranges of whole images, each range's sum added to the last (`accumulate`), so a batch
//! never meets the limit unless one image's output plane does.

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernels::{
    check_loop_limit, check_u32_elements, check_window, launch_units, window_positions,
};
use crate::pipeline::{Kernel, kernels, shader_params, shader_source};
use crate::slice::DeviceSlice;

/// The module: `conv2d.wgsl` and the helpers it calls.
const WGSL: &str = const_format::concatcp!(
    include_str!("conv2d.wgsl"),
    shader_source!("indexing", "window")
);

kernels! {
    "conv2d", source: WGSL, workgroup: crate::kernels::ELEMENTWISE_WORKGROUP;
    /// `y = conv2d(x, weight) + bias`, an invocation per output element.
    FORWARD = "forward" [x, weight, bias, y];
    /// `dx`, an invocation per input element.
    BACKWARD_INPUT = "backward_input" [gy, weight, dx];
    /// `dweight` (written or added to), an invocation per weight element.
    BACKWARD_WEIGHT = "backward_weight" [gy, wx, dweight];
    /// `dbias` (written or added to), an invocation per output channel.
    BACKWARD_BIAS = "backward_bias" [gy, dbias];
    /// The input's taps as columns of a matmul, an invocation per column entry.
    IM2COL = "im2col" [x, cols];
    /// `dx` from the columns' gradients, an invocation per input element.
    COL2IM = "col2im" [dcols, xgrad];
    /// `gy` permuted from `[N, O, P]` to `[O, N, P]`.
    CHANNELS_FIRST = "channels_first" [gy, gyt];
    /// `y += bias`, an invocation per output element.
    BIAS_ADD = "bias_add" [out_y, out_bias];
}

/// Every entry point of the family, in the order [`crate::kernels::ALL`] lists them.
pub const KERNELS: &[Kernel] = &[
    FORWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    BACKWARD_BIAS,
    IM2COL,
    COL2IM,
    CHANNELS_FIRST,
    BIAS_ADD,
];

shader_params! {
    /// The `Params` of `conv2d.wgsl` (shared by its entry points).
    struct Params {
        in_c: u32,
        in_h: u32,
        in_w: u32,
        out_c: u32,
        out_h: u32,
        out_w: u32,
        k_h: u32,
        k_w: u32,
        stride_h: u32,
        stride_w: u32,
        pad_h: u32,
        pad_w: u32,
        dil_h: u32,
        dil_w: u32,
        groups: u32,
        has_bias: u32,
        /// The first element this dispatch writes, and how many.
        first: u32,
        count: u32,
        /// `backward_weight`, `backward_bias`: the images summed, and whether the sum is added
        /// to what is there.
        n_first: u32,
        n_count: u32,
        accumulate: u32,
        x_offset: u32,
        w_offset: u32,
        b_offset: u32,
        y_offset: u32,
        /// The matmul path: images in this chunk, whether its columns are image-major, and
        /// the offset of the columns (or of the permuted gradient).
        nb: u32,
        image_major: u32,
        c_offset: u32,
    }
}

/// The shape of a 2-D convolution (PyTorch's `nn.Conv2d` arguments and the input's shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dDims {
    /// Images in the batch (`N`).
    pub batch: u64,
    /// Input channels (`C`).
    pub in_channels: u64,
    /// Input height and width (`H`, `W`).
    pub in_size: [u64; 2],
    /// Output channels (`O`).
    pub out_channels: u64,
    /// Kernel height and width.
    pub kernel: [u64; 2],
    /// Step between output positions, in input pixels (at least 1).
    pub stride: [u64; 2],
    /// Zeros added on each side of the input.
    pub padding: [u64; 2],
    /// Step between a kernel's taps, in input pixels (at least 1; 1 is a plain kernel).
    pub dilation: [u64; 2],
    /// Channel groups: input and output channels are split into `groups` equal parts, each
    /// output part seeing only its input part (`in_channels` for depthwise).
    pub groups: u64,
}

impl Conv2dDims {
    /// Output height and width: `(in + 2 pad - dil (k - 1) - 1) / stride + 1` each, as
    /// PyTorch. Errors as [`Conv2dDims::check`].
    pub fn out_size(&self) -> Result<[u64; 2]> {
        self.check()?;
        Ok(self.out_size_unchecked())
    }

    fn out_size_unchecked(&self) -> [u64; 2] {
        [0, 1].map(|i| {
            let window = [self.kernel[i], self.stride[i], self.padding[i], self.dilation[i]];
            window_positions(self.in_size[i], window)
        })
    }

    /// Input elements `N·C·H·W`.
    pub fn input_len(&self) -> u64 {
        self.batch * self.in_channels * self.in_size[0] * self.in_size[1]
    }

    /// Weight elements `O·(C/g)·KH·KW`.
    pub fn weight_len(&self) -> u64 {
        self.out_channels * (self.in_channels / self.groups.max(1)) * self.kernel[0] * self.kernel[1]
    }

    /// Output elements `N·O·OH·OW` (0 when the shape is refused).
    pub fn output_len(&self) -> u64 {
        match self.out_size() {
            Ok([oh, ow]) => self.batch * self.out_channels * oh * ow,
            Err(_) => 0,
        }
    }

    /// Refuses zero channels, kernels, strides or dilations, channels that the groups do not
    /// divide, a kernel wider than the padded input, and tensors past `u32` indexing, each with
    /// the figures.
    pub fn check(&self) -> Result<()> {
        let invalid = |message: String| {
            Err(Error::InvalidArgument {
                op: "conv2d",
                message,
            })
        };
        let extents = [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("groups", self.groups),
            ("kernel height", self.kernel[0]),
            ("kernel width", self.kernel[1]),
            ("stride height", self.stride[0]),
            ("stride width", self.stride[1]),
            ("dilation height", self.dilation[0]),
            ("dilation width", self.dilation[1]),
        ];
        if let Some((name, _)) = extents.iter().find(|(_, v)| *v == 0) {
            return invalid(format!("{name} is 0: it must be at least 1"));
        }
        if !self.in_channels.is_multiple_of(self.groups)
            || !self.out_channels.is_multiple_of(self.groups)
        {
            return invalid(format!(
                "{} groups must divide both in_channels {} and out_channels {}",
                self.groups, self.in_channels, self.out_channels
            ));
        }
        for (i, side) in ["height", "width"].into_iter().enumerate() {
            let window = [self.kernel[i], self.padding[i], self.dilation[i]];
            check_window("conv2d", side, self.in_size[i], window)?;
        }
        let [oh, ow] = self.out_size_unchecked();
        let cg = self.in_channels / self.groups;
        check_u32_elements(
            "conv2d",
            &[
                ("input", &[self.batch, self.in_channels, self.in_size[0], self.in_size[1]]),
                ("output", &[self.batch, self.out_channels, oh, ow]),
                ("weight", &[self.out_channels, cg, self.kernel[0], self.kernel[1]]),
            ],
        )?;
        Ok(())
    }

    /// The `Params` every entry point starts from (no range, no offsets).
    fn params(&self) -> Params {
        let [oh, ow] = self.out_size_unchecked();
        let u = |v: u64| v as u32;
        Params {
            in_c: u(self.in_channels),
            in_h: u(self.in_size[0]),
            in_w: u(self.in_size[1]),
            out_c: u(self.out_channels),
            out_h: u(oh),
            out_w: u(ow),
            k_h: u(self.kernel[0]),
            k_w: u(self.kernel[1]),
            stride_h: u(self.stride[0]),
            stride_w: u(self.stride[1]),
            pad_h: u(self.padding[0]),
            pad_w: u(self.padding[1]),
            dil_h: u(self.dilation[0]),
            dil_w: u(self.dilation[1]),
            groups: u(self.groups),
            ..Params::default()
        }
    }
}

/// Loop passes one `forward` invocation runs: one per tap, `(C/g)·KH·KW`, and the leaving one.
pub fn forward_loop_passes(dims: &Conv2dDims) -> u64 {
    dims.weight_len() / dims.out_channels.max(1) + 1
}

/// Loop passes one `backward_input` invocation runs: `(O/g)·KH·KW` and the leaving one.
pub fn backward_input_loop_passes(dims: &Conv2dDims) -> u64 {
    dims.out_channels / dims.groups.max(1) * dims.kernel[0] * dims.kernel[1] + 1
}

/// [`forward`] by direct summation, whatever [`path`] says (any groups; benchmarks compare).
pub fn forward_direct(
    gpu: &Gpu,
    dims: &Conv2dDims,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    weight: DeviceSlice<'_>,
    bias: Option<DeviceSlice<'_>>,
) -> Result<()> {
    let op = "conv2d::forward";
    dims.check()?;
    x.expect_len(op, "x", dims.input_len())?;
    weight.expect_len(op, "weight", dims.weight_len())?;
    y.expect_len(op, "y", dims.output_len())?;
    if let Some(b) = bias {
        b.expect_len(op, "bias", dims.out_channels)?;
    }
    if dims.output_len() > 0 {
        let taps = forward_loop_passes(dims) - 1;
        check_loop_limit(gpu, op, "in_channels / groups · kernel taps", taps, |t| t + 1)?;
    }
    let base = Params {
        has_bias: u32::from(bias.is_some()),
        x_offset: x.index(),
        w_offset: weight.index(),
        b_offset: bias.map_or(0, |b| b.index()),
        y_offset: y.index(),
        ..dims.params()
    };
    // No bias: the weight stands in for the binding, never read.
    let buffers = [x, weight, bias.unwrap_or(weight), y];
    launch_units(gpu, &FORWARD, &[], &buffers, dims.output_len(), |s, e| {
        (range(base, s, e), e - s)
    })
}

/// [`backward_input`] by direct summation, whatever [`path`] says.
pub fn backward_input_direct(
    gpu: &Gpu,
    dims: &Conv2dDims,
    dx: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
    weight: DeviceSlice<'_>,
) -> Result<()> {
    let op = "conv2d::backward_input";
    dims.check()?;
    dx.expect_len(op, "dx", dims.input_len())?;
    gy.expect_len(op, "gy", dims.output_len())?;
    weight.expect_len(op, "weight", dims.weight_len())?;
    if dims.input_len() > 0 {
        let taps = backward_input_loop_passes(dims) - 1;
        check_loop_limit(gpu, op, "out_channels / groups · kernel taps", taps, |t| t + 1)?;
    }
    let base = Params {
        x_offset: dx.index(),
        w_offset: weight.index(),
        y_offset: gy.index(),
        ..dims.params()
    };
    let buffers = [gy, weight, dx];
    launch_units(gpu, &BACKWARD_INPUT, &[], &buffers, dims.input_len(), |s, e| {
        (range(base, s, e), e - s)
    })
}

/// [`backward_weight`] by direct summation, whatever [`path`] says.
pub fn backward_weight_direct(
    gpu: &Gpu,
    dims: &Conv2dDims,
    dweight: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
) -> Result<()> {
    let images = images_per_range(gpu, dims, "conv2d::backward_weight")?;
    backward_weight_in_ranges(gpu, dims, dweight, x, gy, images)
}

/// How the launchers compute a convolution ([`path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPath {
    /// One invocation per element written, summing its taps: any groups, no scratch memory.
    Direct,
    /// The tuned matmul over columns of the input's taps (`im2col`), a chunk of images at a
    /// time, the columns never more than [`COLUMNS_BYTES`]: one group only.
    Matmul,
}

/// The path [`forward`], [`backward_input`] and [`backward_weight`] take for `dims`: the
/// matmul for one group when one image's columns fit [`COLUMNS_BYTES`] (and a binding) and
/// its products' loops fit the adapter's loop limit, else direct summation.
pub fn path(gpu: &Gpu, dims: &Conv2dDims) -> ConvPath {
    match dims.groups == 1 && images_per_chunk(gpu, dims) > 0 {
        true => ConvPath::Matmul,
        false => ConvPath::Direct,
    }
}

/// Records `y = conv2d(x, weight) + bias` (`bias`: `[out_channels]`, or none), on [`path`]'s
/// choice.
pub fn forward(
    gpu: &Gpu,
    dims: &Conv2dDims,
    y: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    weight: DeviceSlice<'_>,
    bias: Option<DeviceSlice<'_>>,
) -> Result<()> {
    match path(gpu, dims) {
        ConvPath::Direct => forward_direct(gpu, dims, y, x, weight, bias),
        ConvPath::Matmul => forward_matmul(gpu, dims, y, x, weight, bias, None),
    }
}

/// Records `dx`, the gradient of [`forward`]'s input, from `gy` (the output's gradient), on
/// [`path`]'s choice.
pub fn backward_input(
    gpu: &Gpu,
    dims: &Conv2dDims,
    dx: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
    weight: DeviceSlice<'_>,
) -> Result<()> {
    match path(gpu, dims) {
        ConvPath::Direct => backward_input_direct(gpu, dims, dx, gy, weight),
        ConvPath::Matmul => backward_input_matmul(gpu, dims, dx, gy, weight, None),
    }
}

/// Records `dweight`, the gradient of [`forward`]'s weight, summed over the batch, on
/// [`path`]'s choice.
pub fn backward_weight(
    gpu: &Gpu,
    dims: &Conv2dDims,
    dweight: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
) -> Result<()> {
    match path(gpu, dims) {
        ConvPath::Direct => backward_weight_direct(gpu, dims, dweight, x, gy),
        ConvPath::Matmul => backward_weight_matmul(gpu, dims, dweight, x, gy, None),
    }
}

/// Records `dbias`, the gradient of [`forward`]'s bias: `gy` summed over images and positions.
pub fn backward_bias(
    gpu: &Gpu,
    dims: &Conv2dDims,
    dbias: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
) -> Result<()> {
    let images = images_per_range(gpu, dims, "conv2d::backward_bias")?;
    backward_bias_in_ranges(gpu, dims, dbias, gy, images)
}

/// `base` for the elements `s..e` a dispatch writes.
fn range(base: Params, s: u64, e: u64) -> Params {
    Params {
        first: s as u32,
        count: (e - s) as u32,
        ..base
    }
}

/// Images one weight or bias dispatch may sum: all of them without a loop limit, else as many
/// as keep `images · OH · OW + 1` passes within it. Errors: one image's output plane alone
/// passes the limit.
fn images_per_range(gpu: &Gpu, dims: &Conv2dDims, op: &'static str) -> Result<u64> {
    let [oh, ow] = dims.out_size()?;
    let plane = (oh * ow).max(1);
    match gpu.loop_iteration_limit() {
        None => Ok(dims.batch.max(1)),
        Some(limit) => {
            check_loop_limit(gpu, op, "output height · width", plane, |p| p + 1)?;
            Ok(((limit - 1) / plane).clamp(1, dims.batch.max(1)))
        }
    }
}

/// [`backward_weight`] summing `images` images a dispatch, each range added to the last.
pub(crate) fn backward_weight_in_ranges(
    gpu: &Gpu,
    dims: &Conv2dDims,
    dweight: DeviceSlice<'_>,
    x: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
    images: u64,
) -> Result<()> {
    let op = "conv2d::backward_weight";
    dims.check()?;
    dweight.expect_len(op, "dweight", dims.weight_len())?;
    x.expect_len(op, "x", dims.input_len())?;
    gy.expect_len(op, "gy", dims.output_len())?;
    let base = Params {
        x_offset: x.index(),
        w_offset: dweight.index(),
        y_offset: gy.index(),
        ..dims.params()
    };
    let buffers = [gy, x, dweight];
    sum_over_images(dims, images, base, |params| {
        launch_units(gpu, &BACKWARD_WEIGHT, &[], &buffers, dims.weight_len(), |s, e| {
            (range(params, s, e), e - s)
        })
    })
}

/// [`backward_bias`] summing `images` images a dispatch, each range added to the last.
pub(crate) fn backward_bias_in_ranges(
    gpu: &Gpu,
    dims: &Conv2dDims,
    dbias: DeviceSlice<'_>,
    gy: DeviceSlice<'_>,
    images: u64,
) -> Result<()> {
    let op = "conv2d::backward_bias";
    dims.check()?;
    dbias.expect_len(op, "dbias", dims.out_channels)?;
    gy.expect_len(op, "gy", dims.output_len())?;
    let base = Params {
        b_offset: dbias.index(),
        y_offset: gy.index(),
        ..dims.params()
    };
    let buffers = [gy, dbias];
    sum_over_images(dims, images, base, |params| {
        launch_units(gpu, &BACKWARD_BIAS, &[], &buffers, dims.out_channels, |s, e| {
            (range(params, s, e), e - s)
        })
    })
}

/// Runs `launch` once per range of at most `images` images (at least one range, so an empty
/// batch writes zeros), the first range written and the others added.
fn sum_over_images(
    dims: &Conv2dDims,
    images: u64,
    base: Params,
    mut launch: impl FnMut(Params) -> Result<()>,
) -> Result<()> {
    let images = images.max(1);
    let mut first = 0;
    loop {
        let count = images.min(dims.batch - first);
        launch(Params {
            n_first: first as u32,
            n_count: count as u32,
            accumulate: u32::from(first > 0),
            ..base
        })?;
        first += count;
        if first >= dims.batch {
            return Ok(());
        }
    }
}

/// CPU reference, in `f64` (the `f32` entry points widen their inputs and round each result
/// once).
pub mod reference {
    use super::Conv2dDims;
    use crate::kernels::{narrow, widen};

    /// For each output element `(n, o, oh, ow)` and each of its taps inside the image, `f(out,
    /// input, weight)` with the three flat indices.
    fn for_each_tap(dims: &Conv2dDims, mut f: impl FnMut(usize, usize, usize)) {
        let d = |v: u64| v as usize;
        let [oh_n, ow_n] = dims.out_size_unchecked().map(d);
        let (n_n, c_n, o_n, g) = (
            d(dims.batch),
            d(dims.in_channels),
            d(dims.out_channels),
            d(dims.groups),
        );
        let (h, w) = (d(dims.in_size[0]), d(dims.in_size[1]));
        let ([kh, kw], [sh, sw]) = (dims.kernel.map(d), dims.stride.map(d));
        let ([ph, pw], [dh, dw]) = (dims.padding.map(d), dims.dilation.map(d));
        let (cg, og) = (c_n / g, o_n / g);
        for n in 0..n_n {
            for o in 0..o_n {
                for oh in 0..oh_n {
                    for ow in 0..ow_n {
                        let out = ((n * o_n + o) * oh_n + oh) * ow_n + ow;
                        for c in 0..cg {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let (ih, iw) = (oh * sh + ky * dh, ow * sw + kx * dw);
                                    if ih < ph || iw < pw || ih - ph >= h || iw - pw >= w {
                                        continue;
                                    }
                                    let ci = (o / og) * cg + c;
                                    let input = ((n * c_n + ci) * h + ih - ph) * w + iw - pw;
                                    let weight = ((o * cg + c) * kh + ky) * kw + kx;
                                    f(out, input, weight);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// `y = conv2d(x, weight) + bias`.
    pub fn forward_f64(
        dims: &Conv2dDims,
        x: &[f64],
        weight: &[f64],
        bias: Option<&[f64]>,
    ) -> Vec<f64> {
        let [oh, ow] = dims.out_size_unchecked();
        let plane = (oh * ow) as usize;
        let mut y = vec![0.0; dims.batch as usize * dims.out_channels as usize * plane];
        if let Some(b) = bias {
            for (i, v) in y.iter_mut().enumerate() {
                *v = b[(i / plane) % dims.out_channels as usize];
            }
        }
        for_each_tap(dims, |out, input, w| y[out] += x[input] * weight[w]);
        y
    }

    /// The input's gradient given the output's, `gy`.
    pub fn backward_input_f64(dims: &Conv2dDims, gy: &[f64], weight: &[f64]) -> Vec<f64> {
        let mut dx = vec![0.0; dims.input_len() as usize];
        for_each_tap(dims, |out, input, w| dx[input] += gy[out] * weight[w]);
        dx
    }

    /// The weight's gradient given the output's, summed over the batch.
    pub fn backward_weight_f64(dims: &Conv2dDims, x: &[f64], gy: &[f64]) -> Vec<f64> {
        let mut dw = vec![0.0; dims.weight_len() as usize];
        for_each_tap(dims, |out, input, w| dw[w] += gy[out] * x[input]);
        dw
    }

    /// The bias's gradient: `gy` summed over images and positions.
    pub fn backward_bias_f64(dims: &Conv2dDims, gy: &[f64]) -> Vec<f64> {
        let [oh, ow] = dims.out_size_unchecked();
        let plane = (oh * ow) as usize;
        let mut db = vec![0.0; dims.out_channels as usize];
        for (i, g) in gy.iter().enumerate() {
            db[(i / plane) % dims.out_channels as usize] += g;
        }
        db
    }

    /// [`forward_f64`] in `f32`.
    pub fn forward(dims: &Conv2dDims, x: &[f32], weight: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        let bias = bias.map(widen);
        narrow(&forward_f64(dims, &widen(x), &widen(weight), bias.as_deref()))
    }

    /// [`backward_input_f64`] in `f32`.
    pub fn backward_input(dims: &Conv2dDims, gy: &[f32], weight: &[f32]) -> Vec<f32> {
        narrow(&backward_input_f64(dims, &widen(gy), &widen(weight)))
    }

    /// [`backward_weight_f64`] in `f32`.
    pub fn backward_weight(dims: &Conv2dDims, x: &[f32], gy: &[f32]) -> Vec<f32> {
        narrow(&backward_weight_f64(dims, &widen(x), &widen(gy)))
    }

    /// [`backward_bias_f64`] in `f32`.
    pub fn backward_bias(dims: &Conv2dDims, gy: &[f32]) -> Vec<f32> {
        narrow(&backward_bias_f64(dims, &widen(gy)))
    }
}

mod matmul_path;
#[cfg(test)]
pub(crate) mod tests;

pub use matmul_path::COLUMNS_BYTES;
pub(crate) use matmul_path::{
    backward_input_matmul, backward_weight_matmul, forward_matmul, images_per_chunk,
};
