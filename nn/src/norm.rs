//! [`LayerNorm`] over the last axis, with a learned scale (`weight`, ones) and shift (`bias`,
//! zeros), and [`RmsNorm`] (scale only, no centering: Llama's norm).

use plimsoll_autograd::{Category, DType, Derivative, Gpu, Grads, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::kernels::layer_norm::{self, LayerNormDims};

use crate::error::{Error, Result};
use crate::module::Module;

/// `(x - mean) / sqrt(var + eps) * weight + bias` over the last axis (biased variance, as
/// PyTorch). Parameters: `weight` `[dim]`, `bias` `[dim]`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// `[dim]`, ones at creation.
    weight: Tensor,
    /// `[dim]`, zeros at creation.
    bias: Tensor,
    eps: f32,
    training: bool,
}

impl LayerNorm {
    /// A layer norm over `dim` features. Errors: `dim == 0` or `eps` not positive.
    pub fn new(gpu: &Gpu, dim: usize, eps: f32) -> Result<LayerNorm> {
        if dim == 0 || eps.is_nan() || eps <= 0.0 {
            return Err(Error::InvalidConfig {
                what: "LayerNorm::new",
                message: format!("dim {dim} must be >= 1 and eps {eps} > 0 (1e-5 is usual)"),
            });
        }
        Ok(LayerNorm {
            weight: Tensor::ones(gpu, &[dim], TensorOptions::parameter("layer_norm.weight"))?,
            bias: Tensor::zeros(gpu, &[dim], TensorOptions::parameter("layer_norm.bias"))?,
            eps,
            training: true,
        })
    }

    /// The scale, `[dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The shift, `[dim]`.
    pub fn bias(&self) -> &Tensor {
        &self.bias
    }

    /// The epsilon added to the variance.
    pub fn eps(&self) -> f32 {
        self.eps
    }

    /// `(x + branch, self.forward(x + branch))`: a residual stream's addition and this norm of
    /// its sum, as one kernel where both are f32 of one shape ([`Tensor::add_layer_norm`], which
    /// may write the sum over `branch`'s buffer); the same values and gradients as the two
    /// apart.
    pub fn add_forward(&self, x: &Tensor, branch: Tensor) -> Result<(Tensor, Tensor)> {
        self.check_input(x)?;
        Ok(x.add_layer_norm(branch, &self.weight, &self.bias, self.eps)?)
    }

    fn check_input(&self, x: &Tensor) -> Result<()> {
        let dim = self.weight.numel();
        if x.rank() == 0 || x.shape()[x.rank() - 1] != dim {
            return Err(Error::InputShape {
                module: "LayerNorm",
                expected: format!("[.., {dim}]"),
                found: x.shape().to_vec(),
            });
        }
        Ok(())
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check_input(x)?;
        Ok(x.layer_norm(&self.weight, &self.bias, self.eps)?)
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

/// `x / sqrt(mean(x²) + eps) * weight` over the last axis: PyTorch's `nn.RMSNorm` and Hugging
/// Face's `LlamaRMSNorm` (no centering, no shift). One fused op: the `layer_norm` kernels in
/// their RMSNorm mode (forward and backward), f16 inputs widened so the statistics are f32.
/// Parameters: `weight` `[dim]` (ones at creation).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `[dim]`, ones at creation.
    weight: Tensor,
    eps: f32,
    training: bool,
}

impl RmsNorm {
    /// An RMS norm over `dim` features. Errors: `dim == 0` or `eps` not positive.
    pub fn new(gpu: &Gpu, dim: usize, eps: f32) -> Result<RmsNorm> {
        if dim == 0 || eps.is_nan() || eps <= 0.0 {
            return Err(Error::InvalidConfig {
                what: "RmsNorm::new",
                message: format!("dim {dim} must be >= 1 and eps {eps} > 0 (1e-5 is usual)"),
            });
        }
        Ok(RmsNorm {
            weight: Tensor::ones(gpu, &[dim], TensorOptions::parameter("rms_norm.weight"))?,
            eps,
            training: true,
        })
    }

    /// The scale, `[dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The epsilon added to the mean square.
    pub fn eps(&self) -> f32 {
        self.eps
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dim = self.weight.numel();
        if x.rank() == 0 || x.shape()[x.rank() - 1] != dim {
            return Err(Error::InputShape {
                module: "RmsNorm",
                expected: format!("[.., {dim}]"),
                found: x.shape().to_vec(),
            });
        }
        rms_norm(x, &self.weight, self.eps)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    fn is_training(&self) -> bool {
        self.training
    }
}

/// `x / sqrt(mean(x²) + eps) * weight` over the last axis of `x` (`weight` `[cols]`), recorded
/// as one op whose backward is the `layer_norm` kernels' RMSNorm backward. Errors: a weight that
/// is not `[cols]`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    if x.dtype() == DType::F16 || weight.dtype() == DType::F16 {
        return rms_norm(&x.widened()?, &weight.widened()?, eps);
    }
    let cols = x.shape().last().copied().unwrap_or(0);
    if x.rank() == 0 || weight.shape() != [cols] {
        return Err(Error::InvalidConfig {
            what: "rms_norm",
            message: format!(
                "x {:?} and weight {:?}: the weight must be [cols] of x's last axis",
                x.shape(),
                weight.shape()
            ),
        });
    }
    let rows = x.numel() / cols.max(1);
    let dims = LayerNormDims {
        rows: rows as u64,
        cols: cols as u64,
        eps,
        rms: true,
    };
    let inputs = [x, weight];
    let category = Tensor::output_category(&inputs);
    let gpu = x.gpu();
    let out = Tensor::empty(gpu, x.shape(), category, "rms_norm")?;
    // The kernels' mean, which RMSNorm writes as 0: kept for the backward, which reads it.
    let mean = Tensor::empty(gpu, &[rows], category, "rms_norm mean")?;
    let rstd = Tensor::empty(gpu, &[rows], category, "rms_norm rstd")?;
    let (w, m) = (weight.elements()?, mean.elements()?);
    layer_norm::forward(
        gpu,
        &dims,
        [out.elements()?, m, rstd.elements()?],
        x.elements()?,
        w,
        w,
    )?;
    Ok(Tensor::from_op(out, &inputs, || FusedRmsNorm {
        dims,
        x: x.detach(),
        weight: weight.detach(),
        mean,
        rstd,
    })?)
}

/// What [`rms_norm`]'s backward reads: the input, the scale and each row's statistics.
#[derive(Debug, Clone)]
struct FusedRmsNorm {
    dims: LayerNormDims,
    x: Tensor,
    weight: Tensor,
    /// Zeros (the kernels' row means, which RMSNorm does not take).
    mean: Tensor,
    rstd: Tensor,
}

impl Derivative for FusedRmsNorm {
    /// `dx` and `dweight` by the `layer_norm` backward kernels in RMSNorm mode (the mean taken
    /// as 0; the shift's gradient they also write is scratch).
    fn backward(&self, g: &Tensor, needs: &[bool]) -> plimsoll_autograd::Result<Grads> {
        self.backward_into(g, needs, &mut [])
    }

    /// With `into[0]` (a residual stream's gradient so far), `dx` is added into it by the
    /// kernel.
    fn backward_into(
        &self,
        g: &Tensor,
        needs: &[bool],
        into: &mut [Option<Tensor>],
    ) -> plimsoll_autograd::Result<Grads> {
        let (g, x) = (g.widened()?, self.x.widened()?);
        let gpu = g.gpu();
        let cols = self.dims.cols as usize;
        let sum = into
            .get_mut(0)
            .and_then(|t| t.take_if(|t| t.shape() == self.x.shape()));
        let (dx, launch): (_, fn(_, _, _, _, _) -> _) = match sum {
            Some(sum) => (sum, layer_norm::backward_adding),
            None => (
                Tensor::empty(gpu, self.x.shape(), Category::Temporary, "rms_norm dx")?,
                layer_norm::backward,
            ),
        };
        let dweight = Tensor::empty(gpu, &[cols], Category::Temporary, "rms_norm dweight")?;
        let scratch = Tensor::empty(gpu, &[cols], Category::Temporary, "rms_norm dshift")?;
        launch(
            gpu,
            &self.dims,
            [dx.elements()?, dweight.elements()?, scratch.elements()?],
            [
                x.elements()?,
                self.weight.elements()?,
                self.mean.elements()?,
                self.rstd.elements()?,
            ],
            g.elements()?,
        )?;
        let keep = |t: Tensor, i: usize| needs.get(i).copied().unwrap_or(true).then_some(t);
        Ok([keep(dx, 0), keep(dweight, 1)].into_iter().collect())
    }

    fn saved_activations(&mut self) -> Vec<&mut Tensor> {
        vec![&mut self.x]
    }
}
