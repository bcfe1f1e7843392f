//! A step's one read-back: the loss, every gradient's sums of squares (partial sums, as the
//! weight-gradient matmuls or the chunked reductions left them) and the `nonfinite` flags,
//! gathered into one tensor on the device ([`gather_sums`]) and read in one wait, now or later
//! ([`SumsLayout`] says where what lies). [`crate::step`] reads it before or after the update,
//! as the host or the device decides the update.

use plimsoll_autograd::ops::reduce::SquaresOf;
use plimsoll_autograd::{Tensor, no_grad};
use plimsoll_kernels_wgsl::kernels::nonfinite;

use crate::error::Result;

/// What the step's one read-back says.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReadBack {
    /// Mean loss over the batch.
    pub loss: f32,
    /// Whether the loss or a gradient is not finite: the `nonfinite` kernel's flag over the
    /// loss and the gradients' partial sums of squares (a NaN or infinity in a gradient reaches
    /// them), computed on the device and read back with them.
    pub nonfinite: bool,
    /// The first parameter (in module order) whose gradient is not finite.
    pub first_nonfinite: Option<String>,
    /// The global gradient norm.
    pub grad_norm: f32,
}

/// Where a step's read-back tensor ([`gather_sums`]) holds what: the loss first, then each
/// gradient's partial sums of squares (`ranges`, in the order of `names`), then the
/// `nonfinite` kernel's flag words. Gradients in host memory (parameter streaming) are summed
/// on the host instead: `on_host` holds (position among the names, sum of squares).
#[derive(Debug, Clone, Default)]
pub struct SumsLayout {
    ranges: Vec<std::ops::Range<usize>>,
    names: Vec<String>,
    pub(crate) on_host: Vec<(usize, f64)>,
}

/// Gathers the loss and every gradient's sums of squares in partial sums
/// ([`Tensor::with_sums_of_squares`]: those its weight-gradient matmul computed when
/// [`Tensor::want_grad_squares`] asked, [`Tensor::take_grad_squares`], else by chunks) into
/// one tensor on the device, with the `nonfinite` kernel's flags over them after the sums (a
/// NaN or infinity in a gradient propagates into its sums of squares); nothing is read yet.
pub fn gather_sums(loss_sum: &Tensor, params: &[(String, Tensor)]) -> Result<(Tensor, SumsLayout)> {
    let _no_grad = no_grad();
    // (tensor, true when it is the partial sums the weight-gradient matmul already computed)
    let mut parts: Vec<(Tensor, bool)> = Vec::new();
    let mut layout = SumsLayout::default();
    for (name, p) in params {
        let squares = p.take_grad_squares();
        if let Some(g) = p.grad() {
            match squares {
                Some(partials) => parts.push((partials, true)),
                None if !g.is_resident() => {
                    let sum = match g.gpu().is_planning() {
                        true => 0.0,
                        false => g.to_vec()?.iter().map(|&x| f64::from(x).powi(2)).sum(),
                    };
                    layout.on_host.push((layout.names.len(), sum));
                }
                None => parts.push((g, false)),
            }
            layout.names.push(name.clone());
        }
    }
    let refs: Vec<SquaresOf<'_>> = parts
        .iter()
        .map(|(t, partials)| match partials {
            true => SquaresOf::Partials(t),
            false => SquaresOf::Tensor(t),
        })
        .collect();
    let (all, ranges) = Tensor::with_sums_of_squares_checked(Some(loss_sum), &refs)?;
    layout.ranges = ranges;
    Ok((all, layout))
}

impl SumsLayout {
    /// What the read-back `values` (the whole tensor [`gather_sums`] made) say: the loss,
    /// whether it or a gradient is not finite, the first parameter whose gradient is not, and
    /// the global gradient norm (the partial sums added in f64 here).
    pub(crate) fn parse(&self, mut values: Vec<f32>) -> StepReadBack {
        let n = values.len().saturating_sub(nonfinite::FLAG_WORDS as usize);
        let nonfinite = values.get(n).is_none_or(|flag| flag.to_bits() != 0);
        values.truncate(n);
        let loss = values.first().copied().unwrap_or(f32::NAN);
        let mut squares: Vec<f64> = self
            .ranges
            .iter()
            .map(|r| {
                values
                    .get(r.clone())
                    .map_or(f64::NAN, |v| v.iter().map(|&x| f64::from(x)).sum())
            })
            .collect();
        for &(at, sum) in &self.on_host {
            squares.insert(at, sum);
        }
        let nonfinite = nonfinite || self.on_host.iter().any(|(_, sum)| !sum.is_finite());
        let first_nonfinite = squares
            .iter()
            .zip(&self.names)
            .find(|(v, _)| !v.is_finite())
            .map(|(_, name)| name.clone());
        StepReadBack {
            loss,
            nonfinite,
            first_nonfinite,
            grad_norm: squares.iter().sum::<f64>().sqrt() as f32,
        }
    }

    /// Reads `all` (the tensor [`gather_sums`] made) in one wait and parses it; a planning
    /// device's says [`PLANNED_READ_BACK`].
    pub(crate) fn read(&self, all: &Tensor) -> Result<StepReadBack> {
        match all.gpu().is_planning() {
            true => Ok(PLANNED_READ_BACK),
            false => Ok(self.parse(all.to_vec()?)),
        }
    }

    /// The partial sums' positions in the read-back tensor (after the loss, before the flags).
    pub(crate) fn partials(&self) -> std::ops::Range<usize> {
        let start = self.ranges.first().map_or(1, |r| r.start);
        start..self.ranges.last().map_or(start, |r| r.end)
    }
}

/// What a planning device's read-back says: it holds no data (its read would be zeros, and a
/// GPT-2 XL plan spent a quarter of its time copying and summing them). What the step
/// allocated is the same.
pub(crate) const PLANNED_READ_BACK: StepReadBack = StepReadBack {
    loss: 0.0,
    nonfinite: false,
    first_nonfinite: None,
    grad_norm: 0.0,
};
