//! Pooling over NCHW images — [`MaxPool2d`], [`AvgPool2d`], [`AdaptiveAvgPool2d`] — as one
//! fused op each ([`pool2d()`]: the `pool2d` kernels forward and backward), and [`Flatten`] and
//! [`Unflatten`].

use plimsoll_autograd::{Category, DType, Derivative, Grads, Tensor};
use plimsoll_kernels_wgsl::kernels::pool2d::{self, Pool, Pool2dDims, PoolWindow};

use crate::error::{Error, Result};
use crate::module::Module;

/// `pool` over each `(n, c)` plane of `x` `[N, C, H, W]` (PyTorch's `F.max_pool2d`,
/// `F.avg_pool2d`, `F.adaptive_avg_pool2d`): `[N, C, OH, OW]`. f16 inputs are widened. Errors:
/// not 4-D, or a window the kernel refuses (with the figures).
pub fn pool2d(x: &Tensor, pool: Pool) -> Result<Tensor> {
    if x.dtype() == DType::F16 {
        return pool2d(&x.widened()?, pool);
    }
    let s = x.shape();
    if s.len() != 4 || x.dtype() != DType::F32 {
        return Err(Error::InputShape {
            module: "pool2d",
            expected: "a float [N, C, H, W] image batch".to_string(),
            found: s.to_vec(),
        });
    }
    let dims = Pool2dDims {
        planes: (s[0] * s[1]) as u64,
        in_size: [s[2] as u64, s[3] as u64],
        pool,
    };
    let [oh, ow] = dims.out_size()?;
    let shape = [s[0], s[1], oh as usize, ow as usize];
    let category = Tensor::output_category(&[x]);
    let out = Tensor::empty(x.gpu(), &shape, category, "pool2d")?;
    let idx = match pool {
        Pool::Max(_) => Some(Tensor::empty_typed(
            x.gpu(),
            &shape,
            DType::U32,
            category,
            "pool2d arg-max",
        )?),
        _ => None,
    };
    let idx_slice = idx.as_ref().map(Tensor::elements).transpose()?;
    pool2d::forward(x.gpu(), &dims, out.elements()?, idx_slice, x.elements()?)?;
    Ok(Tensor::from_op(out, &[x], || FusedPool2d { dims, idx })?)
}

/// What [`pool2d`]'s backward reads: the shape and, for max pooling, each output's arg-max.
#[derive(Debug, Clone)]
struct FusedPool2d {
    dims: Pool2dDims,
    idx: Option<Tensor>,
}

impl Derivative for FusedPool2d {
    /// `dx`: each output's gradient to its arg-max, or spread over its window.
    fn backward(&self, g: &Tensor, _needs: &[bool]) -> plimsoll_autograd::Result<Grads> {
        let g = g.widened()?;
        let s = g.shape();
        let shape = [
            s[0],
            s[1],
            self.dims.in_size[0] as usize,
            self.dims.in_size[1] as usize,
        ];
        let dx = Tensor::empty(g.gpu(), &shape, Category::Temporary, "pool2d dx")?;
        let idx = self.idx.as_ref().map(Tensor::elements).transpose()?;
        pool2d::backward(g.gpu(), &self.dims, dx.elements()?, g.elements()?, idx)?;
        Ok([Some(dx)].into_iter().collect())
    }
}

/// Implements [`Module`] for a pooling layer without parameters whose forward is `$forward`.
macro_rules! stateless_module {
    ($layer:ty, |$self:ident, $x:ident| $forward:expr) => {
        impl Module for $layer {
            fn forward(&$self, $x: &Tensor) -> Result<Tensor> {
                $forward
            }

            fn parameters(&self) -> Vec<(String, Tensor)> {
                Vec::new()
            }

            fn set_training(&mut self, _training: bool) {}

            fn is_training(&self) -> bool {
                true
            }
        }
    };
}

/// PyTorch's `nn.MaxPool2d`: the largest value of each window (padding counts as -inf; a NaN
/// wins its window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool2d {
    /// The window.
    pub window: PoolWindow,
}

impl MaxPool2d {
    /// A `k x k` window moving by `stride` with `padding` on each side (PyTorch's
    /// `MaxPool2d(k, stride, padding)`).
    pub fn new(k: usize, stride: usize, padding: usize) -> MaxPool2d {
        MaxPool2d {
            window: window(k, stride, padding),
        }
    }
}

stateless_module!(MaxPool2d, |self, x| pool2d(x, Pool::Max(self.window)));

/// PyTorch's `nn.AvgPool2d`: the mean of each window, the padding's zeros counted
/// (`count_include_pad`, PyTorch's default) or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgPool2d {
    /// The window (no dilation).
    pub window: PoolWindow,
    /// Whether padded taps count in the divisor.
    pub count_include_pad: bool,
}

impl AvgPool2d {
    /// A `k x k` window moving by `stride` with `padding` on each side, padding counted
    /// (PyTorch's `AvgPool2d(k, stride, padding)`).
    pub fn new(k: usize, stride: usize, padding: usize) -> AvgPool2d {
        AvgPool2d {
            window: window(k, stride, padding),
            count_include_pad: true,
        }
    }
}

stateless_module!(AvgPool2d, |self, x| pool2d(
    x,
    Pool::Avg {
        window: self.window,
        count_include_pad: self.count_include_pad,
    }
));

/// PyTorch's `nn.AdaptiveAvgPool2d(out_size)`: each output the mean of its share of the input
/// (`[1, 1]`: the global average a ResNet's head takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveAvgPool2d {
    /// Output height and width.
    pub out_size: [usize; 2],
}

stateless_module!(AdaptiveAvgPool2d, |self, x| pool2d(
    x,
    Pool::AdaptiveAvg {
        out_size: self.out_size.map(|v| v as u64),
    }
));

/// PyTorch's `nn.Flatten()`: every axis after the first joined into one, `[N, C, H, W]` to
/// `[N, C·H·W]` (a view: no copy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flatten;

stateless_module!(Flatten, |self, x| {
    let s = x.shape();
    match s.first() {
        Some(&n) => Ok(x.reshape(&[n, s[1..].iter().product()])?),
        None => Err(Error::InputShape {
            module: "Flatten",
            expected: "a tensor with a batch axis".to_string(),
            found: Vec::new(),
        }),
    }
});

/// PyTorch's `nn.Unflatten(1, shape)`: the axis after the first read as `shape`, `[N, C·H·W]`
/// to `[N, C, H, W]` (a view: no copy); an image classifier's first layer on flat pixels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unflatten {
    /// The shape the second axis becomes.
    pub shape: Vec<usize>,
}

stateless_module!(Unflatten, |self, x| {
    let s = x.shape();
    let want: usize = self.shape.iter().product();
    match s {
        [n, features] if *features == want => {
            let mut shape = vec![*n];
            shape.extend(&self.shape);
            Ok(x.reshape(&shape)?)
        }
        _ => Err(Error::InputShape {
            module: "Unflatten",
            expected: format!("[batch, {want}] (read as [batch, {:?}])", self.shape),
            found: s.to_vec(),
        }),
    }
});

/// A `k x k` window moving by `stride` with `padding` on each side, no dilation.
fn window(k: usize, stride: usize, padding: usize) -> PoolWindow {
    let (k, stride, padding) = (k as u64, stride as u64, padding as u64);
    PoolWindow {
        kernel: [k, k],
        stride: [stride, stride],
        padding: [padding, padding],
        dilation: [1, 1],
    }
}
