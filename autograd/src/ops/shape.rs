//! Shape ops: `reshape` and leading-axis `slice` are views of the same storage; `permute`,
//! `transpose`, other slices and `concat` copy through `strided_copy` (every tensor stays
//! contiguous, see [`crate::tensor`]).

use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::kernels::convert::Halves;
use plimsoll_kernels_wgsl::kernels::{copy, fill};
use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::op::{Axes, Op};
use crate::ops::mismatch;
use crate::tape::{output_category, record, records};
use crate::tensor::{DType, Shape, Tensor, numel};

/// Row-major strides of `shape`, in elements.
pub(crate) fn strides_of(shape: &[usize]) -> SmallVec<[usize; 6]> {
    let mut strides: SmallVec<[usize; 6]> = SmallVec::from_elem(1, shape.len());
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// A new contiguous tensor gathered from `x` (from element `x.offset + offset`) over `shape`
/// with `strides` (0 repeats an element: a broadcast).
pub(crate) fn gather(
    x: &Tensor,
    offset: usize,
    shape: &[usize],
    strides: &[usize],
    category: Category,
    label: &str,
) -> Result<Tensor> {
    let out = Tensor::empty_typed(&x.gpu, shape, x.dtype, category, label)?;
    let to_u32 = |v: &[usize]| -> SmallVec<[u32; 6]> { v.iter().map(|&e| e as u32).collect() };
    let (shape32, strides32) = if shape.is_empty() {
        (SmallVec::from_slice(&[1u32]), SmallVec::from_slice(&[0u32]))
    } else {
        (to_u32(shape), to_u32(strides))
    };
    if x.dtype == DType::F16 {
        // The bits as they are: an f16 copy stays f16.
        let start = x.offset + offset as u64;
        let rest = (x.numel() as u64).saturating_sub(offset as u64);
        let source = Halves::of(&x.storage, start, rest)?;
        copy::strided_copy_f16(&x.gpu, out.halves()?, source, &shape32, &strides32)?;
        return Ok(out);
    }
    let source = x.elements()?;
    let source = source.slice(offset as u64, source.len().saturating_sub(offset as u64))?;
    copy::strided_copy(&x.gpu, out.elements()?, source, &shape32, &strides32)?;
    Ok(out)
}

fn check_axis(op: &'static str, shape: &[usize], axis: usize) -> Result<()> {
    if axis >= shape.len() {
        return Err(Error::BadAxis {
            op,
            axis,
            shape: shape.to_vec(),
        });
    }
    Ok(())
}

impl Tensor {
    /// The same elements with another shape (a view: no copy).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if numel(shape) != self.numel() {
            return Err(mismatch(
                "reshape",
                &self.shape,
                shape,
                "element counts must match",
            ));
        }
        let out = self.view(shape, self.offset);
        record(out, &[self], || Op::Reshape {
            input: self.shape.clone(),
        })
    }

    /// Axes reordered: output axis `i` is input axis `perm[i]` (a copy).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let rank = self.rank();
        let mut seen = [false; 64];
        let valid = perm.len() == rank
            && perm
                .iter()
                .all(|&p| p < rank.min(64) && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(mismatch(
                "permute",
                &self.shape,
                perm,
                "perm must reorder every axis once",
            ));
        }
        let strides = strides_of(&self.shape);
        let shape: Shape = perm.iter().map(|&p| self.shape[p]).collect();
        let src_strides: SmallVec<[usize; 6]> = perm.iter().map(|&p| strides[p]).collect();
        let recording = records(&[self]);
        let out = gather(
            self,
            0,
            &shape,
            &src_strides,
            output_category(recording),
            "permute",
        )?;
        record(out, &[self], || Op::Permute {
            perm: perm.iter().copied().collect(),
        })
    }

    /// Axes `dim0` and `dim1` swapped (a copy).
    pub fn transpose(&self, dim0: usize, dim1: usize) -> Result<Tensor> {
        check_axis("transpose", &self.shape, dim0.max(dim1))?;
        let mut perm: Axes = (0..self.rank()).collect();
        perm.swap(dim0, dim1);
        self.permute(&perm)
    }

    /// Entries `start..start + len` along `axis`. A view when every axis before `axis` has
    /// extent 1 (e.g. rows of a matrix), else a copy.
    pub fn slice(&self, axis: usize, start: usize, len: usize) -> Result<Tensor> {
        check_axis("slice", &self.shape, axis)?;
        if start
            .checked_add(len)
            .is_none_or(|end| end > self.shape[axis])
        {
            return Err(Error::InvalidArgument {
                op: "slice",
                message: format!(
                    "entries {start}..{} outside axis {axis} of shape {:?}",
                    start.saturating_add(len),
                    self.shape
                ),
            });
        }
        let mut shape = self.shape.clone();
        shape[axis] = len;
        let strides = strides_of(&self.shape);
        let offset = start * strides[axis];
        let recording = records(&[self]);
        let out = if self.shape[..axis].iter().all(|&e| e == 1) {
            self.view(&shape, self.offset + offset as u64)
        } else {
            gather(
                self,
                offset,
                &shape,
                &strides,
                output_category(recording),
                "slice",
            )?
        };
        record(out, &[self], || Op::Slice {
            input: self.shape.clone(),
            axis,
            start,
        })
    }

    /// `tensors` joined along `axis` (equal extents elsewhere).
    pub fn concat(tensors: &[&Tensor], axis: usize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::InvalidArgument {
            op: "concat",
            message: "nothing to concatenate".to_string(),
        })?;
        check_axis("concat", &first.shape, axis)?;
        if tensors.iter().any(|t| t.dtype == DType::F16) {
            let wide = tensors
                .iter()
                .map(|t| t.widened())
                .collect::<Result<Vec<_>>>()?;
            return Tensor::concat(&wide.iter().collect::<Vec<_>>(), axis);
        }
        for t in tensors {
            t.expect_dtype("concat", DType::F32)?;
            let same_rank = t.rank() == first.rank();
            let fits =
                same_rank && (0..first.rank()).all(|d| d == axis || t.shape[d] == first.shape[d]);
            if !fits {
                return Err(mismatch(
                    "concat",
                    &first.shape,
                    &t.shape,
                    "extents must match except along the axis",
                ));
            }
        }
        let sizes: SmallVec<[usize; 4]> = tensors.iter().map(|t| t.shape[axis]).collect();
        let recording = records(tensors);
        let out = concat_raw(tensors, axis, output_category(recording))?;
        record(out, tensors, || Op::Concat { axis, sizes })
    }
}

/// Concatenation without recording: each piece is gathered into `[total, outer, inner]` (the
/// axis moved to the front, where every piece is one contiguous range), and that is gathered
/// back to `[outer, total, inner]`.
pub(crate) fn concat_raw(tensors: &[&Tensor], axis: usize, category: Category) -> Result<Tensor> {
    let first = tensors.first().ok_or_else(|| Error::InvalidArgument {
        op: "concat",
        message: "nothing to concatenate".to_string(),
    })?;
    let outer: usize = first.shape[..axis].iter().product();
    let inner: usize = first.shape[axis + 1..].iter().product();
    let total: usize = tensors.iter().map(|t| t.shape[axis]).sum();
    let mut shape = first.shape.clone();
    shape[axis] = total;
    let front = Tensor::empty(
        &first.gpu,
        &[total, outer, inner],
        Category::Temporary,
        "concat",
    )?;
    let mut at = 0;
    for t in tensors {
        let n = t.shape[axis];
        let piece_shape = [n as u32, outer as u32, inner as u32];
        let piece_strides = [inner as u32, (n * inner) as u32, 1];
        if n * outer * inner > 0 {
            let piece = (n * outer * inner) as u64;
            let dst = front
                .elements()?
                .slice((at * outer * inner) as u64, piece)?;
            copy::strided_copy(&t.gpu, dst, t.elements()?, &piece_shape, &piece_strides)?;
        }
        at += n;
    }
    let out = gather(
        &front,
        0,
        &[outer, total, inner],
        &[inner, outer * inner, 1],
        category,
        "concat",
    )?;
    Ok(out.view(&shape, out.offset))
}

/// `g` (keep-dims shape, extent 1 on reduced axes) repeated along those axes up to `shape`.
pub(crate) fn expand(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let strides = strides_of(&g.shape);
    let src: SmallVec<[usize; 6]> = (0..shape.len())
        .map(|d| {
            if g.shape[d] == shape[d] {
                strides[d]
            } else {
                0
            }
        })
        .collect();
    gather(g, 0, shape, &src, Category::Temporary, "expand")
}

/// The gradient of a slice: `g` placed at `start` along `axis` in zeros of `input`'s shape. A
/// leading-axis slice (every axis before `axis` of extent 1) is one contiguous run: the zeros
/// before and after it are filled in place and `g` copied between them (no temporaries);
/// otherwise zero pieces and `g` are concatenated.
pub(crate) fn pad_slice(g: &Tensor, input: &[usize], axis: usize, start: usize) -> Result<Tensor> {
    if input[..axis].iter().all(|&e| e == 1) {
        let out = Tensor::empty_typed(&g.gpu, input, g.dtype, Category::Temporary, "slice grad")?;
        let inner: usize = input[axis + 1..].iter().product();
        let (before, len) = ((start * inner) as u64, g.numel() as u64);
        let all = out.elements()?;
        let after = all.len() - before - len;
        fill::fill(&g.gpu, all.slice(0, before)?, 0.0)?;
        copy::copy(&g.gpu, all.slice(before, len)?, g.elements()?)?;
        fill::fill(&g.gpu, all.slice(before + len, after)?, 0.0)?;
        return Ok(out);
    }
    let zeros = |n: usize| -> Result<Option<Tensor>> {
        if n == 0 {
            return Ok(None);
        }
        let mut shape: Shape = input.iter().copied().collect();
        shape[axis] = n;
        let options = crate::TensorOptions {
            category: Category::Temporary,
            label: "slice grad",
            requires_grad: false,
        };
        Tensor::zeros(&g.gpu, &shape, options).map(Some)
    };
    let before = zeros(start)?;
    let after = zeros(input[axis] - start - g.shape[axis])?;
    let pieces: Vec<&Tensor> = [before.as_ref(), Some(g), after.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    concat_raw(&pieces, axis, Category::Temporary)
}

/// The gradients of a concat: `g` cut back into pieces of `sizes` along `axis`.
pub(crate) fn split(g: &Tensor, axis: usize, sizes: &[usize]) -> Result<Vec<Tensor>> {
    let mut at = 0;
    let mut out = Vec::with_capacity(sizes.len());
    for &n in sizes {
        out.push(g.slice(axis, at, n)?);
        at += n;
    }
    Ok(out)
}

/// The inverse of a permutation.
pub(crate) fn inverse(perm: &[usize]) -> Axes {
    let mut inv: Axes = SmallVec::from_elem(0, perm.len());
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}
