//! A node's incoming gradient while backward collects it: the sum of the dense gradients its
//! consumers sent, and apart from it the pieces that leading-axis slices of its output sent
//! (each slice's gradient and the element offset where the slice starts).
//!
//! Why pieces: a slice's gradient is zeros with `g` at the slice's place. Built one by one, the
//! three slices q, k, v of one projection cost three zero-filled full-size tensors and two
//! full-size additions; kept as pieces, the node's gradient is assembled once when backward
//! reaches it: each piece copied to its place and only the gaps zero-filled (or, with a dense
//! gradient too, each piece added to its place). With no dense gradient, or one, the values are
//! the same as before: a piece's elements get `g` (plus the dense gradient) either way. With
//! several dense gradients they are summed first and the pieces added after, where arrival
//! order interleaved them: the rounding of such elements may differ. Pieces that already lie in
//! order in one storage and tile the whole output (the fused attention's `dq`, `dk`, `dv`) are
//! the gradient as they are: a view, no copy.

use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::kernels::{copy, fill};

use crate::error::{Error, Result};
use crate::ops::elementwise::{add_into, add_raw};
use crate::tensor::Tensor;

/// The gradients sent to one node so far.
#[derive(Default)]
pub(crate) struct Pending {
    dense: Option<Tensor>,
    pieces: Vec<(usize, Tensor)>,
    /// A buffer of the node's output shape whose parts were lent to the backward of the
    /// consumers of its slices ([`Pending::lend`]), and those parts (element offset, length).
    canvas: Option<Tensor>,
    lent: Vec<(usize, usize)>,
}

impl Pending {
    /// Whether no gradient has arrived (a part may have been lent and given back).
    pub(crate) fn is_empty(&self) -> bool {
        self.dense.is_none() && self.pieces.is_empty()
    }

    /// Adds a gradient of the node's whole output.
    pub(crate) fn add_dense(&mut self, g: Tensor) -> Result<()> {
        self.dense = Some(match self.dense.take() {
            Some(previous) => add_raw(&previous, &g)?,
            None => g,
        });
        Ok(())
    }

    /// The dense gradient, taken out, when it is all there is and nothing else holds it: a whole
    /// f32 storage of `shape`, which a backward may add into in place ([`Pending::put_back`]
    /// returns one it did not use).
    pub(crate) fn take_sole_dense(&mut self, shape: &[usize]) -> Option<Tensor> {
        let d = self.dense.as_ref()?;
        let sole = self.pieces.is_empty()
            && std::sync::Arc::strong_count(&d.storage) == 1
            && d.offset == 0
            && d.dtype == crate::tensor::DType::F32
            && d.shape[..] == shape[..]
            && d.storage.len() == d.numel() as u64;
        if sole { self.dense.take() } else { None }
    }

    /// Returns a gradient [`Pending::take_sole_dense`] took and nothing added into.
    pub(crate) fn put_back(&mut self, g: Tensor) -> Result<()> {
        match self.dense.take() {
            Some(later) => self.dense = Some(add_raw(&g, &later)?),
            None => self.dense = Some(g),
        }
        Ok(())
    }

    /// Elements `offset .. offset + len` of a buffer of `shape` (made at the first call) for
    /// the gradient of the slice there to be written into, viewed as `view_shape`: when every
    /// slice's gradient is written so and arrives as a piece, the pieces tile the buffer in order
    /// and are the node's gradient without copies. `None` when the part overlaps one already
    /// lent. Errors: the buffer could not be allocated.
    pub(crate) fn lend(
        &mut self,
        gpu: &plimsoll_kernels_wgsl::Gpu,
        shape: &[usize],
        (offset, len): (usize, usize),
        view_shape: &[usize],
    ) -> Result<Option<Tensor>> {
        if self
            .lent
            .iter()
            .any(|&(o, l)| offset < o + l && o < offset + len)
        {
            return Ok(None);
        }
        let canvas = match &self.canvas {
            Some(c) => c.clone(),
            None => {
                let c = Tensor::empty(gpu, shape, Category::Temporary, "slice grad")?;
                self.canvas = Some(c.clone());
                c
            }
        };
        self.lent.push((offset, len));
        Ok(Some(canvas.view(view_shape, offset as u64)))
    }

    /// Gives back a part [`Pending::lend`] lent and nothing wrote (it may be lent again).
    pub(crate) fn unlend(&mut self, offset: usize) {
        self.lent.retain(|&(o, _)| o != offset);
    }

    /// Adds the gradient of a contiguous part of the node's output that starts at element
    /// `offset` (a slice along an axis with only extent-1 axes before it).
    pub(crate) fn add_piece(&mut self, offset: usize, g: Tensor) {
        self.pieces.push((offset, g));
    }

    /// The node's gradient, of `shape`. Errors: nothing was sent (a bug in the walk).
    pub(crate) fn into_tensor(self, shape: &[usize]) -> Result<Tensor> {
        let Pending {
            dense, mut pieces, ..
        } = self;
        if pieces.is_empty() {
            return dense.ok_or_else(|| Error::InvalidArgument {
                op: "backward",
                message: "a node's pending gradient has nothing in it (a bug)".to_string(),
            });
        }
        pieces.sort_by_key(|(offset, _)| *offset); // stable: equal offsets keep their order
        if dense.is_none()
            && let Some(whole) = adjacent_in_one_storage(&pieces, shape)
        {
            return Ok(whole);
        }
        let gpu = pieces[0].1.gpu.clone();
        let fresh = || Tensor::empty(&gpu, shape, Category::Temporary, "slice grad");
        let out = match dense {
            // Added into in place only when nothing else holds its storage.
            Some(d) if std::sync::Arc::strong_count(&d.storage) == 1 => d,
            Some(d) => {
                let out = fresh()?;
                copy::copy(&gpu, out.elements()?, d.elements()?)?;
                out
            }
            None => {
                let out = fresh()?;
                let all = out.elements()?;
                let disjoint = pieces.windows(2).all(|w| w[0].0 + w[0].1.numel() <= w[1].0);
                if !disjoint {
                    fill::fill(&gpu, all, 0.0)?;
                } else {
                    let mut at = 0u64;
                    for (offset, piece) in &pieces {
                        let (offset, len) = (*offset as u64, piece.numel() as u64);
                        if offset > at {
                            fill::fill(&gpu, all.slice(at, offset - at)?, 0.0)?;
                        }
                        copy::copy(&gpu, all.slice(offset, len)?, piece.elements()?)?;
                        at = offset + len;
                    }
                    if at < all.len() {
                        fill::fill(&gpu, all.slice(at, all.len() - at)?, 0.0)?;
                    }
                    return Ok(out);
                }
                out
            }
        };
        let flat = out.reshape(&[out.numel()])?;
        for (offset, piece) in &pieces {
            let len = piece.numel();
            add_into(&flat.slice(0, *offset, len)?, &piece.reshape(&[len])?)?;
        }
        Ok(out)
    }
}

/// The node's gradient without a copy when `pieces` (sorted by offset) tile all of `shape` and
/// are, in that order, all of one f32 storage (a backward that writes the gradients of the
/// slices of one tensor into one allocation, as the fused attention's does for q, k and v): a
/// view of that storage. `None` otherwise.
fn adjacent_in_one_storage(pieces: &[(usize, Tensor)], shape: &[usize]) -> Option<Tensor> {
    let (_, first) = pieces.first()?;
    let base = first.offset.checked_sub(pieces[0].0 as u64)?;
    let mut end = 0usize;
    for (offset, piece) in pieces {
        let same = std::sync::Arc::ptr_eq(&piece.storage, &first.storage)
            && piece.dtype == first.dtype
            && *offset == end
            && piece.offset == base + *offset as u64;
        if !same {
            return None;
        }
        end += piece.numel();
    }
    // The whole of an f32 storage of its own, as a gradient must be (`GradSlot`'s invariant).
    let whole = end == shape.iter().product::<usize>()
        && base == 0
        && first.dtype == crate::tensor::DType::F32
        && first.storage.len() == end as u64;
    whole.then(|| first.view(shape, base))
}
