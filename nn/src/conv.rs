//! [`Conv2d`]: PyTorch's `nn.Conv2d` over NCHW images (stride, zero padding, dilation, groups),
//! weights `[out, in / groups, kh, kw]` as PyTorch lays them out, as one fused op ([`conv2d()`]:
//! the `conv2d` kernels forward, and their input, weight and bias gradients backward).

use plimsoll_autograd::{Category, DType, Derivative, Gpu, Grads, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::kernels::conv2d::{self, Conv2dDims};

use crate::error::{Error, Result};
use crate::linear::derive_seed;
use crate::module::Module;

/// How a convolution walks its input: PyTorch's `stride`, `padding`, `dilation` and `groups`
/// (`[height, width]` each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// Step between output positions (1: every position).
    pub stride: [usize; 2],
    /// Zeros added on each side.
    pub padding: [usize; 2],
    /// Step between a kernel's taps (1: a plain kernel).
    pub dilation: [usize; 2],
    /// Channel groups (1: dense; the input channels: depthwise).
    pub groups: usize,
}

impl Default for Conv2dOptions {
    /// Stride 1, no padding, no dilation, one group (PyTorch's defaults).
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl Conv2dOptions {
    /// These options with the same stride both ways.
    pub fn stride(self, stride: usize) -> Self {
        Conv2dOptions {
            stride: [stride; 2],
            ..self
        }
    }

    /// These options with the same padding on every side.
    pub fn padding(self, padding: usize) -> Self {
        Conv2dOptions {
            padding: [padding; 2],
            ..self
        }
    }

    /// These options with the same dilation both ways.
    pub fn dilation(self, dilation: usize) -> Self {
        Conv2dOptions {
            dilation: [dilation; 2],
            ..self
        }
    }

    /// These options with `groups` channel groups.
    pub fn groups(self, groups: usize) -> Self {
        Conv2dOptions { groups, ..self }
    }
}

/// `conv2d(x, weight) + bias` (PyTorch's `F.conv2d`): `x` `[N, C, H, W]`, `weight` `[O, C /
/// groups, KH, KW]`, `bias` `[O]` or none; the output is `[N, O, OH, OW]`. f16 inputs (and f16
/// weight copies) are widened.
/// Errors: shapes that do not fit together or `options` the kernel refuses, with the figures.
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv2dOptions,
) -> Result<Tensor> {
    let half = |t: &Tensor| t.dtype() == DType::F16;
    if half(x) || half(weight) || bias.is_some_and(half) {
        let bias = bias.map(Tensor::widened).transpose()?;
        return conv2d(&x.widened()?, &weight.widened()?, bias.as_ref(), options);
    }
    let dims = conv_dims(x, weight, bias, options)?;
    let [oh, ow] = dims.out_size()?;
    let shape = [x.shape()[0], weight.shape()[0], oh as usize, ow as usize];
    let mut inputs = vec![x, weight];
    inputs.extend(bias);
    let out = Tensor::empty(x.gpu(), &shape, Tensor::output_category(&inputs), "conv2d")?;
    let b = bias.map(Tensor::elements).transpose()?;
    conv2d::forward(
        x.gpu(),
        &dims,
        out.elements()?,
        x.elements()?,
        weight.elements()?,
        b,
    )?;
    Ok(Tensor::from_op(out, &inputs, || FusedConv2d {
        dims,
        x: x.detach(),
        weight: weight.detach(),
    })?)
}

/// The kernel's dimensions of `conv2d(x, weight, bias)`, or the error naming what does not fit.
fn conv_dims(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv2dOptions,
) -> Result<Conv2dDims> {
    let (xs, ws) = (x.shape(), weight.shape());
    let groups = options.groups.max(1);
    let fits = x.dtype() == DType::F32
        && weight.dtype() == DType::F32
        && xs.len() == 4
        && ws.len() == 4
        && xs[1] == ws[1] * groups
        && bias.is_none_or(|b| b.shape() == [ws[0]]);
    if !fits {
        return Err(Error::InputShape {
            module: "conv2d",
            expected: format!(
                "float x [N, C, H, W] with C = weight's in / groups ({} x {groups}), weight \
                 [O, C / groups, KH, KW] (got {ws:?}), bias [O] or none (got {:?})",
                ws.get(1).copied().unwrap_or(0),
                bias.map(|b| b.shape().to_vec())
            ),
            found: xs.to_vec(),
        });
    }
    let u = |v: [usize; 2]| v.map(|v| v as u64);
    let dims = Conv2dDims {
        batch: xs[0] as u64,
        in_channels: xs[1] as u64,
        in_size: [xs[2] as u64, xs[3] as u64],
        out_channels: ws[0] as u64,
        kernel: [ws[2] as u64, ws[3] as u64],
        stride: u(options.stride),
        padding: u(options.padding),
        dilation: u(options.dilation),
        groups: options.groups as u64,
    };
    dims.check()?;
    Ok(dims)
}

/// What [`conv2d`]'s backward reads: the input and the weight.
#[derive(Debug, Clone)]
struct FusedConv2d {
    dims: Conv2dDims,
    x: Tensor,
    weight: Tensor,
}

impl Derivative for FusedConv2d {
    /// `dx`, `dweight` and (with a bias) `dbias`, each only when wanted.
    fn backward(&self, g: &Tensor, needs: &[bool]) -> plimsoll_autograd::Result<Grads> {
        let g = g.widened()?;
        let (gpu, dims) = (g.gpu(), &self.dims);
        let wants = |i: usize| needs.get(i).copied().unwrap_or(true);
        let empty = |shape: &[usize], label| Tensor::empty(gpu, shape, Category::Temporary, label);
        let mut grads = Grads::new();
        grads.push(if wants(0) {
            let dx = empty(self.x.shape(), "conv2d dx")?;
            let w = self.weight.elements()?;
            conv2d::backward_input(gpu, dims, dx.elements()?, g.elements()?, w)?;
            Some(dx)
        } else {
            None
        });
        grads.push(if wants(1) {
            let x = self.x.widened()?;
            let dw = empty(self.weight.shape(), "conv2d dweight")?;
            conv2d::backward_weight(gpu, dims, dw.elements()?, x.elements()?, g.elements()?)?;
            Some(dw)
        } else {
            None
        });
        if needs.len() > 2 {
            grads.push(if wants(2) {
                let db = empty(&[dims.out_channels as usize], "conv2d dbias")?;
                conv2d::backward_bias(gpu, dims, db.elements()?, g.elements()?)?;
                Some(db)
            } else {
                None
            });
        }
        Ok(grads)
    }

    fn saved_activations(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.x]
    }
}

/// A 2-D convolution layer (PyTorch's `nn.Conv2d`). Parameters: `weight` `[out, in / groups,
/// kh, kw]`, `bias` `[out]` (optional), both drawn as PyTorch draws them: `U(-b, b)` with `b =
/// 1 / sqrt(in / groups · kh · kw)`.
#[derive(Debug, Clone)]
pub struct Conv2d {
    weight: Tensor,
    bias: Option<Tensor>,
    options: Conv2dOptions,
    training: bool,
}

impl Conv2d {
    /// A layer from `in_channels` to `out_channels` with a `kernel[0] x kernel[1]` kernel,
    /// walking its input as `options` say, with a bias when `bias`; weights drawn from `seed`.
    /// Errors: a zero extent, or groups that do not divide both channel counts.
    pub fn new(
        gpu: &Gpu,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: Conv2dOptions,
        bias: bool,
        seed: u64,
    ) -> Result<Conv2d> {
        let groups = options.groups;
        let extents = [in_channels, out_channels, kernel[0], kernel[1], groups];
        if extents.contains(&0)
            || !in_channels.is_multiple_of(groups)
            || !out_channels.is_multiple_of(groups)
        {
            return Err(Error::InvalidConfig {
                what: "Conv2d::new",
                message: format!(
                    "in_channels {in_channels}, out_channels {out_channels}, kernel {kernel:?} \
                     and groups {groups} must all be at least 1, and groups must divide both \
                     channel counts"
                ),
            });
        }
        let fan_in = in_channels / groups * kernel[0] * kernel[1];
        let b = 1.0 / (fan_in as f32).sqrt();
        let shape = [out_channels, in_channels / groups, kernel[0], kernel[1]];
        let options_w = TensorOptions::parameter("conv2d.weight");
        let weight = Tensor::uniform(gpu, &shape, -b, b, seed, options_w)?;
        let bias = bias
            .then(|| {
                let options_b = TensorOptions::parameter("conv2d.bias");
                Tensor::uniform(gpu, &[out_channels], -b, b, derive_seed(seed, 0), options_b)
            })
            .transpose()?;
        Ok(Conv2d {
            weight,
            bias,
            options,
            training: true,
        })
    }

    /// A layer over existing parameters (loaded weights, or tensors a test chose). Errors: a
    /// weight that is not 4-D, or a bias that is not `[out]`.
    pub fn from_parts(
        weight: Tensor,
        bias: Option<Tensor>,
        options: Conv2dOptions,
    ) -> Result<Conv2d> {
        let ws = weight.shape().to_vec();
        if ws.len() != 4 || bias.as_ref().is_some_and(|b| b.shape() != [ws[0]]) {
            return Err(Error::InvalidConfig {
                what: "Conv2d::from_parts",
                message: format!(
                    "weight {ws:?} must be [out, in / groups, kh, kw] and bias {:?} [out] or none",
                    bias.as_ref().map(|b| b.shape().to_vec())
                ),
            });
        }
        Ok(Conv2d {
            weight,
            bias,
            options,
            training: true,
        })
    }

    /// The weight, `[out, in / groups, kh, kw]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// How the layer walks its input.
    pub fn options(&self) -> Conv2dOptions {
        self.options
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        conv2d(x, &self.weight, self.bias.as_ref(), self.options)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weight.clone())];
        p.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        p
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// A small convolutional classifier of `image` (`[channels, height, width]`) inputs given flat
/// (`[batch, c·h·w]`, as a table of pixels holds them) into `classes`: `Unflatten`, then per
/// entry of `widths` a 3x3 `Conv2d` (padding 1, bias), ReLU and, while the image is at least
/// 2x2, a 2x2 `MaxPool2d`; then `Flatten` and a `Linear` to the classes. Children are named by
/// index as in PyTorch's `nn.Sequential` (`1.weight`, `1.bias`, `4.weight`, ...); each layer's
/// weights are drawn from a seed derived from `seed`. Errors: an empty image, no classes.
pub fn cnn(
    gpu: &Gpu,
    image: [usize; 3],
    widths: &[usize],
    classes: usize,
    seed: u64,
) -> Result<crate::Sequential> {
    if image.contains(&0) || classes == 0 || widths.contains(&0) {
        return Err(Error::InvalidConfig {
            what: "cnn",
            message: format!(
                "image {image:?}, widths {widths:?} and {classes} classes must all be at least 1"
            ),
        });
    }
    let mut net = crate::Sequential::new().push(crate::pool::Unflatten {
        shape: image.to_vec(),
    });
    let [mut channels, mut h, mut w] = image;
    for (i, &width) in widths.iter().enumerate() {
        let options = Conv2dOptions::default().padding(1);
        let s = derive_seed(seed, 100 + i as u64);
        net = net
            .push(Conv2d::new(gpu, channels, width, [3, 3], options, true, s)?)
            .push(crate::Relu);
        if h >= 2 && w >= 2 {
            net = net.push(crate::MaxPool2d::new(2, 2, 0));
            (h, w) = (h / 2, w / 2);
        }
        channels = width;
    }
    let features = channels * h * w;
    let s = derive_seed(seed, 100 + widths.len() as u64);
    let head = crate::Linear::new(gpu, features, classes, true, crate::Init::KaimingUniform, s)?;
    Ok(net.push(crate::Flatten).push(head))
}
