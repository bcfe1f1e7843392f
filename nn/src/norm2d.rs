//! Normalisation of NCHW images: [`BatchNorm2d`] (per channel over the batch, with running
//! statistics for evaluation) and [`GroupNorm`] (per image over groups of channels), each
//! the `layer_norm` kernels over a view of the image in which the statistics' sets are rows,
//! then a per-channel scale and shift.

use plimsoll_autograd::{Category, Gpu, Tensor, TensorOptions, is_recomputing, no_grad};
use plimsoll_kernels_wgsl::kernels::copy;

use crate::error::{Error, Result};
use crate::module::Module;

/// `rows` normalised over their `cols` (mean 0, biased variance 1), without scale or shift:
/// the layer norm with a scale of ones and a shift of zeros, neither of which learns.
fn normalise_rows(x: &Tensor, cols: usize, eps: f32) -> Result<Tensor> {
    let gpu = x.gpu();
    let constant = TensorOptions {
        category: Category::Temporary,
        label: "norm constant",
        requires_grad: false,
    };
    let ones = Tensor::ones(gpu, &[cols], constant)?;
    let zeros = Tensor::zeros(gpu, &[cols], constant)?;
    Ok(x.layer_norm(&ones, &zeros, eps)?)
}

/// `[1, C, 1, 1]`-shaped views of per-channel `weight` and `bias` applied to `x` `[N, C, ..]`.
fn scale_shift(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let mut shape = vec![1; x.rank()];
    shape[1] = weight.numel();
    Ok(x.mul(&weight.reshape(&shape)?)?
        .add(&bias.reshape(&shape)?)?)
}

/// The error of an input that is not `[N, C, ..]` with `channels` channels.
fn not_images(module: &'static str, x: &Tensor, channels: usize) -> Error {
    Error::InputShape {
        module,
        expected: format!("[batch, {channels}, height, width]"),
        found: x.shape().to_vec(),
    }
}

/// A per-channel scale of ones and shift of zeros, as parameters.
fn affine(gpu: &Gpu, channels: usize, what: &str) -> Result<(Tensor, Tensor)> {
    let weight = Tensor::ones(gpu, &[channels], TensorOptions::parameter(what))?;
    let bias = Tensor::zeros(gpu, &[channels], TensorOptions::parameter(what))?;
    Ok((weight, bias))
}

/// PyTorch's `nn.GroupNorm(groups, channels)`: each image's channels in `groups` equal groups,
/// each group normalised over its channels and pixels (biased variance), then a per-channel
/// `weight` (ones) and `bias` (zeros). Independent of the batch: the same values at any
/// micro-batch.
#[derive(Debug, Clone)]
pub struct GroupNorm {
    groups: usize,
    weight: Tensor,
    bias: Tensor,
    eps: f32,
    training: bool,
}

impl GroupNorm {
    /// `channels` in `groups` groups, `eps` added to each variance (PyTorch: 1e-5). Errors:
    /// zero groups or channels, groups that do not divide the channels, `eps` not positive.
    pub fn new(gpu: &Gpu, groups: usize, channels: usize, eps: f32) -> Result<GroupNorm> {
        if groups == 0
            || channels == 0
            || !channels.is_multiple_of(groups)
            || eps.is_nan()
            || eps <= 0.0
        {
            return Err(Error::InvalidConfig {
                what: "GroupNorm::new",
                message: format!(
                    "{groups} groups must divide {channels} channels (both at least 1) and eps \
                     {eps} must be above 0"
                ),
            });
        }
        let (weight, bias) = affine(gpu, channels, "group_norm")?;
        Ok(GroupNorm {
            groups,
            weight,
            bias,
            eps,
            training: true,
        })
    }
}

impl Module for GroupNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let channels = self.weight.numel();
        let s = x.shape().to_vec();
        if s.len() < 2 || s[1] != channels {
            return Err(not_images("GroupNorm", x, channels));
        }
        let rows = s[0] * self.groups;
        let cols = x.numel() / rows.max(1);
        let normed = normalise_rows(&x.reshape(&[rows, cols])?, cols, self.eps)?;
        scale_shift(&normed.reshape(&s)?, &self.weight, &self.bias)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".to_string(), self.weight.clone()),
            ("bias".to_string(), self.bias.clone()),
        ]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// PyTorch's `nn.BatchNorm2d(channels)`: in training, each channel normalised over the batch
/// and pixels (biased variance), then `weight` (ones) and `bias` (zeros); the running mean and
/// (unbiased) variance move towards the batch's by `momentum` (PyTorch: 0.1) at each forward,
/// except when backward recomputes a checkpointed segment ([`is_recomputing`]), so a step
/// updates them once. In evaluation the running statistics normalise instead. The statistics
/// are the batch's: a micro-batch of a split batch normalises with its own, unlike the whole
/// batch's (the layer is not micro-batch invariant).
#[derive(Debug, Clone)]
pub struct BatchNorm2d {
    weight: Tensor,
    bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
    /// Forwards that updated the running statistics (PyTorch's `num_batches_tracked`), one
    /// f32 on the device (exact to 2^24), so it is saved, restored and undone with the
    /// statistics it counts.
    batches: Tensor,
    eps: f32,
    momentum: f32,
    training: bool,
}

impl BatchNorm2d {
    /// A batch norm over `channels` with PyTorch's defaults (`eps` 1e-5, momentum 0.1), running
    /// mean 0 and variance 1. Errors: zero channels.
    pub fn new(gpu: &Gpu, channels: usize) -> Result<BatchNorm2d> {
        if channels == 0 {
            return Err(Error::InvalidConfig {
                what: "BatchNorm2d::new",
                message: "0 channels: need at least 1".to_string(),
            });
        }
        let (weight, bias) = affine(gpu, channels, "batch_norm")?;
        let stats = TensorOptions {
            category: Category::Parameter,
            label: "batch_norm running",
            requires_grad: false,
        };
        Ok(BatchNorm2d {
            weight,
            bias,
            running_mean: Tensor::zeros(gpu, &[channels], stats)?,
            running_var: Tensor::ones(gpu, &[channels], stats)?,
            batches: Tensor::zeros(gpu, &[1], stats)?,
            eps: 1e-5,
            momentum: 0.1,
            training: true,
        })
    }

    /// The running mean and (unbiased) variance, `[channels]` each: what evaluation uses.
    pub fn running_stats(&self) -> (&Tensor, &Tensor) {
        (&self.running_mean, &self.running_var)
    }

    /// Forwards in training that updated the running statistics (read back from the device).
    pub fn batches_tracked(&self) -> Result<u64> {
        let counted = self.batches.to_vec()?;
        Ok(counted.first().copied().unwrap_or(0.0) as u64)
    }

    /// Moves the running statistics towards those of `x` (`[N, C, H, W]`), recording nothing.
    /// Each statistic is a mean over the width, then the height, then the batch: no reduced
    /// axis is longer than one of the image's (a reduction refuses axes past
    /// `reduce::MAX_AXIS_LEN`).
    fn track(&self, x: &Tensor) -> Result<()> {
        let _no_grad = no_grad();
        let s = x.shape();
        let count = s[0] * s[2] * s[3];
        let per_channel = |t: &Tensor| -> Result<Tensor> {
            Ok(t.mean(&[3], true)?.mean(&[2], true)?.mean(&[0], true)?)
        };
        let mean = per_channel(x)?;
        let centred = x.sub(&mean)?;
        let var = per_channel(&centred.mul(&centred)?)?;
        let unbiased = var.mul_scalar(count as f32 / (count.max(2) - 1) as f32)?;
        let m = self.momentum;
        let moved = |running: &Tensor, batch: &Tensor| -> Result<()> {
            let batch = batch.reshape(&[batch.numel()])?;
            let next = running.mul_scalar(1.0 - m)?.add(&batch.mul_scalar(m)?)?;
            copy::copy(running.gpu(), running.elements()?, next.elements()?)?;
            Ok(())
        };
        moved(&self.running_mean, &mean)?;
        moved(&self.running_var, &unbiased)?;
        let counted = self.batches.add_scalar(1.0)?;
        copy::copy(
            self.batches.gpu(),
            self.batches.elements()?,
            counted.elements()?,
        )?;
        Ok(())
    }
}

impl Module for BatchNorm2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let channels = self.weight.numel();
        let s = x.shape().to_vec();
        if s.len() != 4 || s[1] != channels {
            return Err(not_images("BatchNorm2d", x, channels));
        }
        if !self.training {
            // (x - mean) / sqrt(var + eps) from the running statistics.
            let std = self.running_var.add_scalar(self.eps)?.sqrt()?;
            let scale = self.weight.div(&std)?;
            let shift = self.bias.sub(&self.running_mean.mul(&scale)?)?;
            return scale_shift(x, &scale, &shift);
        }
        // Each channel a row: [C, N·H·W].
        let count = s[0] * s[2] * s[3];
        if !is_recomputing() {
            self.track(x)?;
        }
        let xc = x.permute(&[1, 0, 2, 3])?.reshape(&[channels, count])?;
        let normed = normalise_rows(&xc, count, self.eps)?
            .reshape(&[channels, s[0], s[2], s[3]])?
            .permute(&[1, 0, 2, 3])?;
        scale_shift(&normed, &self.weight, &self.bias)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".to_string(), self.weight.clone()),
            ("bias".to_string(), self.bias.clone()),
        ]
    }

    /// `running_mean`, `running_var` and `num_batches_tracked` (PyTorch's names; the count is
    /// `[1]` f32 here, a 0-d i64 in PyTorch: an export converts it).
    fn buffers(&self) -> Vec<(String, Tensor)> {
        vec![
            ("running_mean".to_string(), self.running_mean.clone()),
            ("running_var".to_string(), self.running_var.clone()),
            ("num_batches_tracked".to_string(), self.batches.clone()),
        ]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
