//! Reductions: `sum` and `mean` over any axes, `max` over one axis (gradient to the arg-max).
//! Kernels: `reduce` (one `sum_axis`/`mean_axis` dispatch per axis, `*_all` for everything).

use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::kernels::{copy, nonfinite, reduce};

use crate::error::{Error, Result};
use crate::op::{Axes, Op};
use crate::tape::{output_category, record, records};
use crate::tensor::{DType, Shape, Tensor, numel};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Sum,
    Mean,
}

/// Sorted, distinct, in-range axes; an empty list means every axis.
fn normalise(op: &'static str, shape: &[usize], axes: &[usize]) -> Result<Axes> {
    let mut sorted: Axes = if axes.is_empty() {
        (0..shape.len()).collect()
    } else {
        axes.iter().copied().collect()
    };
    sorted.sort_unstable();
    sorted.dedup();
    if let Some(&bad) = sorted.iter().find(|&&a| a >= shape.len()) {
        return Err(Error::BadAxis {
            op,
            axis: bad,
            shape: shape.to_vec(),
        });
    }
    Ok(sorted)
}

/// `shape` with the `axes` set to 1 (keep-dims) or removed.
pub(crate) fn reduced_shape(shape: &[usize], axes: &[usize], keepdim: bool) -> Shape {
    (0..shape.len())
        .filter_map(|d| match (axes.contains(&d), keepdim) {
            (true, true) => Some(1),
            (true, false) => None,
            (false, _) => Some(shape[d]),
        })
        .collect()
}

fn reduce_axes(x: &Tensor, axes: &[usize], kind: Kind, category: Category) -> Result<Tensor> {
    let name = if kind == Kind::Sum { "sum" } else { "mean" };
    let gpu = &x.gpu;
    if axes.len() == x.rank() {
        let out = Tensor::empty(gpu, &[], category, name)?;
        let launch = if kind == Kind::Sum {
            reduce::sum_all
        } else {
            reduce::mean_all
        };
        launch(gpu, out.elements()?, x.elements()?)?;
        return Ok(out);
    }
    let mut current = x.clone();
    for (i, &axis) in axes.iter().enumerate().rev() {
        let shape = current.shape.clone();
        let mut next_shape = shape.clone();
        next_shape[axis] = 1;
        let last = i == 0;
        let cat = if last { category } else { Category::Temporary };
        let next = Tensor::empty(gpu, &next_shape, cat, name)?;
        let launch = if kind == Kind::Sum {
            reduce::sum_axis
        } else {
            reduce::mean_axis
        };
        launch(gpu, next.elements()?, current.elements()?, &shape, axis)?;
        current = next;
    }
    Ok(current)
}

fn reduction(x: &Tensor, axes: &[usize], keepdim: bool, kind: Kind) -> Result<Tensor> {
    if x.dtype == DType::F16 {
        return reduction(&x.widened()?, axes, keepdim, kind);
    }
    let name = if kind == Kind::Sum { "sum" } else { "mean" };
    x.expect_dtype(name, DType::F32)?;
    let axes = normalise(name, &x.shape, axes)?;
    let recording = records(&[x]);
    let out = reduce_axes(x, &axes, kind, output_category(recording))?;
    let out = out.view(&reduced_shape(&x.shape, &axes, keepdim), out.offset);
    record(out, &[x], || {
        let input = x.shape.clone();
        match kind {
            Kind::Sum => Op::Sum { input, axes },
            Kind::Mean => Op::Mean { input, axes },
        }
    })
}

impl Tensor {
    /// Sum over `axes` (all axes if empty), dropping them unless `keepdim`.
    pub fn sum(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        reduction(self, axes, keepdim, Kind::Sum)
    }

    /// Mean over `axes` (all axes if empty), dropping them unless `keepdim`.
    pub fn mean(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        reduction(self, axes, keepdim, Kind::Mean)
    }

    /// Sum of every element, as a scalar (shape `[]`).
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// The sum of the squares of every element, as a scalar (shape `[]`), in one pass (no
    /// squared tensor). Not differentiable: for norms of gradients and the like, under
    /// [`crate::no_grad`] or on tensors that do not require grad; where it would be recorded
    /// it is [`Error::InvalidArgument`].
    pub fn sum_squares_all(&self) -> Result<Tensor> {
        self.expect_dtype("sum_squares_all", DType::F32)?;
        if records(&[self]) {
            return Err(Error::InvalidArgument {
                op: "sum_squares_all",
                message: "has no backward; call it under no_grad() or on a tensor that does not \
                          require grad (or use x.mul(&x)?.sum_all())"
                    .to_string(),
            });
        }
        let out = Tensor::empty(&self.gpu, &[], Category::Temporary, "sum_squares_all")?;
        reduce::sum_squares_all(&self.gpu, out.elements()?, self.elements()?)?;
        Ok(out)
    }

    /// `head`'s elements followed by each of `tensors`' sums of squares in partial sums, in one
    /// new tensor: a value and the squared norms of many tensors in one read-back, with no
    /// concatenation and no reduction after the partial sums. A [`SquaresOf::Tensor`] gets one
    /// sum per [`reduce::SQUARES_CHUNK`] elements (at least one), computed here; a
    /// [`SquaresOf::Partials`] (such as [`Tensor::take_grad_squares`] returns) is copied in. The
    /// ranges say where each one's partial sums are; their sum (in f64, on the host) is its sum
    /// of squares, which is not finite when the tensor holds a NaN or an infinity. Not
    /// differentiable: refused where it would be recorded.
    pub fn with_sums_of_squares(
        head: Option<&Tensor>,
        tensors: &[SquaresOf<'_>],
    ) -> Result<(Tensor, Vec<std::ops::Range<usize>>)> {
        sums_of_squares(head, tensors, false)
    }

    /// [`Tensor::with_sums_of_squares`] followed by the `nonfinite` kernel's two flag words
    /// ([`nonfinite::FLAG_WORDS`], u32 bits: `[any, first index]`) over everything before them,
    /// computed on the device: whether the head or a sum is NaN or infinite comes back in the
    /// same read-back. The flags start at `numel() - 2`.
    pub fn with_sums_of_squares_checked(
        head: Option<&Tensor>,
        tensors: &[SquaresOf<'_>],
    ) -> Result<(Tensor, Vec<std::ops::Range<usize>>)> {
        sums_of_squares(head, tensors, true)
    }
}

/// [`Tensor::with_sums_of_squares`], with the nonfinite flags after the sums when `flags`.
fn sums_of_squares(
    head: Option<&Tensor>,
    tensors: &[SquaresOf<'_>],
    flags: bool,
) -> Result<(Tensor, Vec<std::ops::Range<usize>>)> {
    let op = "with_sums_of_squares";
    let mut all: Vec<&Tensor> = head.into_iter().collect();
    all.extend(tensors.iter().map(SquaresOf::tensor));
    for t in &all {
        t.expect_dtype(op, DType::F32)?;
    }
    if records(&all) {
        return Err(Error::InvalidArgument {
            op,
            message: "has no backward; call it under no_grad() or on tensors that do not \
                      require grad"
                .to_string(),
        });
    }
    let Some(first) = all.first() else {
        return Err(Error::InvalidArgument {
            op,
            message: "no head and no tensors: nothing to read".to_string(),
        });
    };
    let gpu = first.gpu.clone();
    let start = head.map_or(0, Tensor::numel);
    let mut ranges = Vec::with_capacity(tensors.len());
    let mut end = start;
    for t in tensors {
        let len = match t {
            SquaresOf::Tensor(t) => reduce::squares_chunks(t.numel() as u64) as usize,
            SquaresOf::Partials(p) => p.numel(),
        };
        ranges.push(end..end + len);
        end += len;
    }
    let tail = if flags {
        nonfinite::FLAG_WORDS as usize
    } else {
        0
    };
    let out = Tensor::empty(&gpu, &[end + tail], Category::Temporary, op)?;
    let slots = out.elements()?;
    if let Some(head) = head {
        copy::copy(&gpu, slots.slice(0, start as u64)?, head.elements()?)?;
    }
    // Every tensor's sums (or copied partial sums) in a few dispatches.
    let sources = tensors
        .iter()
        .map(|t| {
            Ok(match t {
                SquaresOf::Tensor(t) => reduce::SquaresSource::Tensor(t.elements()?),
                SquaresOf::Partials(p) => reduce::SquaresSource::Partials(p.elements()?),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    reduce::sum_squares_many(
        &gpu,
        slots.slice(start as u64, (end - start) as u64)?,
        &sources,
    )?;
    if flags {
        let words = slots.slice(end as u64, nonfinite::FLAG_WORDS)?;
        nonfinite::check(&gpu, words, slots.slice(0, end as u64)?)?;
    }
    Ok((out, ranges))
}

impl Tensor {
    /// Mean of every element, as a scalar (shape `[]`).
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// Maximum over `axis` (NaN wins; the first index among equals), dropping it unless
    /// `keepdim`. The gradient goes to the arg-max.
    pub fn max(&self, axis: usize, keepdim: bool) -> Result<Tensor> {
        if self.dtype == DType::F16 {
            return self.widened()?.max(axis, keepdim);
        }
        self.expect_dtype("max", DType::F32)?;
        let axes = normalise("max", &self.shape, &[axis])?;
        let recording = records(&[self]);
        let kept = reduced_shape(&self.shape, &axes, true);
        let out = Tensor::empty(&self.gpu, &kept, output_category(recording), "max")?;
        let category = output_category(recording);
        let indices = Tensor::empty_typed(&self.gpu, &kept, DType::U32, category, "max indices")?;
        let (values, positions) = (out.elements()?, indices.elements()?);
        reduce::max_axis(
            &self.gpu,
            values,
            positions,
            self.elements()?,
            &self.shape,
            axis,
        )?;
        let out = out.view(&reduced_shape(&self.shape, &axes, keepdim), 0);
        record(out, &[self], || Op::Max {
            input: self.shape.clone(),
            axis,
            indices,
        })
    }
}

/// The gradient of a sum: `g` repeated over the reduced axes.
pub(crate) fn sum_grad(g: &Tensor, input: &[usize], axes: &[usize]) -> Result<Tensor> {
    let kept = g.view(&reduced_shape(input, axes, true), g.offset);
    crate::ops::shape::expand(&kept, input)
}

/// The gradient of a mean: `g / count` repeated over the reduced axes.
pub(crate) fn mean_grad(g: &Tensor, input: &[usize], axes: &[usize]) -> Result<Tensor> {
    let count: usize = axes.iter().map(|&a| input[a]).product();
    sum_grad(g, input, axes)?.mul_scalar(1.0 / count.max(1) as f32)
}

/// The gradient of a max: `g` scattered to the arg-max `indices`.
pub(crate) fn max_grad(
    g: &Tensor,
    indices: &Tensor,
    input: &[usize],
    axis: usize,
) -> Result<Tensor> {
    let dx = Tensor::empty(&g.gpu, input, Category::Temporary, "max grad")?;
    let (dy, indices) = (g.elements()?, indices.elements()?);
    reduce::max_backward(&g.gpu, dx.elements()?, dy, indices, input, axis)?;
    debug_assert_eq!(numel(input), dx.numel());
    Ok(dx)
}

/// One entry of [`Tensor::with_sums_of_squares`].
#[derive(Clone, Copy, Debug)]
pub enum SquaresOf<'a> {
    /// A tensor whose squares are summed there.
    Tensor(&'a Tensor),
    /// Partial sums of a tensor's squares computed before, copied as they are.
    Partials(&'a Tensor),
}

impl<'a> SquaresOf<'a> {
    fn tensor(&self) -> &'a Tensor {
        match *self {
            SquaresOf::Tensor(t) | SquaresOf::Partials(t) => t,
        }
    }
}
