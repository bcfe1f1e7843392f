//! Rotary position embeddings ([`rotary_embedding`]): RoFormer's rotation of query and key
//! features by their position, in Hugging Face Llama's "rotate half" layout, as one fused op
//! (the `rotary` kernel forward, and its inverse rotation backward).

use plimsoll_autograd::{Category, DType, Derivative, Grads, Tensor};
use plimsoll_kernels_wgsl::kernels::rotary::{self, RotaryDims};

use crate::error::{Error, Result};

/// `x` (`[.., T, D]`, `D` even) with each row's feature pair `(c, c + D/2)` turned by the angle
/// `(t + offset) * base^(-2c / D)`, `t` the row's position in its sequence: Hugging Face's
/// `apply_rotary_pos_emb` on queries or keys (`base` is its `rope_theta`, 10,000 for Llama 2).
/// The backward turns the gradient back (a rotation's transpose is its inverse). f16 inputs
/// are widened. Errors: a rank under 2, an odd head dimension, a base that is not positive,
/// positions past 2^24.
pub fn rotary_embedding(x: &Tensor, base: f32, offset: usize) -> Result<Tensor> {
    if x.dtype() == DType::F16 {
        return rotary_embedding(&x.widened()?, base, offset);
    }
    let shape = x.shape();
    let rank = shape.len();
    if rank < 2 || x.dtype() != DType::F32 {
        return Err(Error::InvalidConfig {
            what: "rotary_embedding",
            message: format!(
                "x {:?} ({:?}): need a float tensor [.., T, D]",
                shape,
                x.dtype()
            ),
        });
    }
    let (time, head_dim) = (shape[rank - 2], shape[rank - 1]);
    let dims = RotaryDims {
        rows: (x.numel() / head_dim.max(1)) as u64,
        time: time as u64,
        head_dim: head_dim as u64,
        base,
        offset: offset as u64,
    };
    let inputs = [x];
    let out = Tensor::empty(x.gpu(), shape, Tensor::output_category(&inputs), "rotary")?;
    rotary::rotary(x.gpu(), &dims, out.elements()?, x.elements()?, false)?;
    Ok(Tensor::from_op(out, &inputs, || FusedRotary { dims })?)
}

/// [`rotary_embedding`]'s backward needs only the shape and the angles.
#[derive(Debug, Clone)]
struct FusedRotary {
    dims: RotaryDims,
}

impl Derivative for FusedRotary {
    /// `dx = rope⁻¹(g)`.
    fn backward(&self, g: &Tensor, _needs: &[bool]) -> plimsoll_autograd::Result<Grads> {
        let g = g.widened()?;
        let dx = Tensor::empty(g.gpu(), g.shape(), Category::Temporary, "rotary dx")?;
        rotary::rotary(g.gpu(), &self.dims, dx.elements()?, g.elements()?, true)?;
        Ok([Some(dx)].into_iter().collect())
    }
}
