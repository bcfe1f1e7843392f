//! A linear layer in one kernel: `x · Wᵀ + b`, optionally followed by ReLU, the bias and the
//! ReLU applied in the matmul's epilogue ([`matmul::matmul_bias`]): one pass over the output
//! instead of three (product, bias add, ReLU), and one saved activation instead of two.

use plimsoll_kernels_wgsl::kernels::matmul::{self, Epilogue, MatmulDims};

use crate::error::Result;
use crate::half::{matmul_input, output_dtype};
use crate::op::Op;
use crate::ops::matmul::expect_float;
use crate::ops::mismatch;
use crate::tape::{output_category, record, records};
use crate::tensor::{DType, Shape, Tensor, numel};

impl Tensor {
    /// `self · weightᵀ + bias`, then `max(·, 0)` when `relu`: PyTorch's `F.linear` (and
    /// `F.relu` of it) for `self` `[.., k]`, `weight` `[n, k]` (an `nn.Linear` weight, stored
    /// `[out, in]`) and `bias` `[n]`; the result is `[.., n]`. The same values as
    /// `matmul_transposed`, `add` and `relu` one after another, bit for bit, and the same
    /// gradients; the bias and ReLU run in the matmul's epilogue. With `relu` the op saves its
    /// output for backward (ReLU's derivative is `[y > 0]`), not the pre-activation.
    ///
    /// `self` and `weight` may be f16 (read as they are; under [`crate::f16_weight_copies`] an
    /// f32 weight is read through its f16 copy); the bias is added in f32.
    pub fn linear(&self, weight: &Tensor, bias: &Tensor, relu: bool) -> Result<Tensor> {
        let weight = &matmul_input(weight)?;
        expect_float("linear", [self, weight])?;
        let bias = &bias.widened()?;
        bias.expect_dtype("linear", DType::F32)?;
        let (n, k) = match (&weight.shape[..], self.shape.last()) {
            (&[n, k], Some(&k2)) if k == k2 => (n, k),
            _ => {
                return Err(mismatch(
                    "linear",
                    &self.shape,
                    &weight.shape,
                    "[.., k] x [n, k]ᵀ: a 2-D weight whose last dimension is the input's",
                ));
            }
        };
        if bias.shape[..] != [n] {
            return Err(mismatch(
                "linear",
                &weight.shape,
                &bias.shape,
                "the bias is [n], one per output feature (weight [n, k])",
            ));
        }
        let mut shape: Shape = self.shape[..self.shape.len() - 1].iter().copied().collect();
        shape.push(n);
        let m = numel(&shape) / n.max(1);
        let dims = MatmulDims {
            trans_b: true,
            batch_stride_b: n * k,
            ..MatmulDims::dense(1, m, n, k)
        };
        let inputs = [self, weight, bias];
        let category = output_category(records(&inputs));
        let dtype = output_dtype(category, numel(&shape));
        let out = Tensor::empty_typed(&self.gpu, &shape, dtype, category, "linear")?;
        let epilogue = if relu {
            Epilogue::BiasRelu
        } else {
            Epilogue::Bias
        };
        let (c, a, b) = (
            out.operand("linear")?,
            self.operand("linear")?,
            weight.operand("linear")?,
        );
        matmul::matmul_bias(&self.gpu, &dims, epilogue, c, a, b, bias.elements()?)?;
        let saved = relu.then(|| out.detach());
        record(out, &inputs, || Op::Linear {
            x: self.detach(),
            weight: weight.detach(),
            relu_output: saved,
        })
    }
}
