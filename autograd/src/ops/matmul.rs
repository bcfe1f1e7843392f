//! Batched matrix product `[.., m, k] · [.., k, n]`. Either operand may be a plain `[m, k]` /
//! `[k, n]` matrix shared by every batch; otherwise the batch extents must be equal.
//! Kernel: `matmul` (transposes are flags of the kernel, never copies).

use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::kernels::matmul::{self, MatmulDims};

use crate::backward::Lent;
use crate::error::Result;
use crate::half::{matmul_input, output_dtype};
use crate::op::Op;
use crate::ops::mismatch;
use crate::tape::{output_category, record, records};
use crate::tensor::{DType, GradSlot, Shape, Squares, Tensor, lock, numel};

/// The operation named in dtype errors of the products' launches.
const OP: &str = "matmul";

/// [`crate::Error::DTypeMismatch`] unless each operand is f32 or f16 (what the kernel reads).
pub(crate) fn expect_float<const N: usize>(op: &'static str, operands: [&Tensor; N]) -> Result<()> {
    for t in operands {
        if t.dtype != DType::F16 {
            t.expect_dtype(op, DType::F32)?;
        }
    }
    Ok(())
}

/// How a matmul of two shapes runs: `batch` products of `m×k · k×n`; `shared_*` marks an
/// operand used by every batch (batch stride 0). A shared right operand is folded into `m`.
#[derive(Debug, Clone, Copy)]
struct Plan {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    shared_lhs: bool,
}

fn plan(lhs: &[usize], rhs: &[usize]) -> Result<(Plan, Shape)> {
    let bad = |hint| mismatch("matmul", lhs, rhs, hint);
    let (ra, rb) = (lhs.len(), rhs.len());
    if ra < 2 || rb < 2 {
        return Err(bad("both operands need at least 2 dimensions"));
    }
    let (m, k, k2, n) = (lhs[ra - 2], lhs[ra - 1], rhs[rb - 2], rhs[rb - 1]);
    if k != k2 {
        return Err(bad("inner dimensions must match: [.., m, k] x [.., k, n]"));
    }
    let (batch_a, batch_b) = (&lhs[..ra - 2], &rhs[..rb - 2]);
    let mut out: Shape;
    let p = if batch_a == batch_b {
        out = batch_a.iter().copied().collect();
        Plan {
            batch: numel(batch_a),
            m,
            n,
            k,
            shared_lhs: false,
        }
    } else if rb == 2 {
        out = batch_a.iter().copied().collect();
        Plan {
            batch: 1,
            m: numel(batch_a) * m,
            n,
            k,
            shared_lhs: false,
        }
    } else if ra == 2 {
        out = batch_b.iter().copied().collect();
        Plan {
            batch: numel(batch_b),
            m,
            n,
            k,
            shared_lhs: true,
        }
    } else {
        return Err(bad(
            "batch extents must be equal, or one operand a 2-D matrix",
        ));
    };
    out.extend([m, n]);
    Ok((p, out))
}

/// One batched product `op(A) · op(B)`: `(batch, m, n, k)`, the transpose flags and the batch
/// strides of A and B (C's batches are contiguous).
#[derive(Debug, Clone, Copy)]
struct Product {
    dims: (usize, usize, usize, usize),
    trans: (bool, bool),
    strides: (usize, usize),
    /// The kernel's scale: `alpha · op(A) · op(B)`.
    alpha: f32,
}

impl Product {
    /// Records `out = op(A) · op(B)`, or `out += op(A) · op(B)` with `accumulate` (the kernel's
    /// accumulate flag: no temporary).
    fn record(&self, a: &Tensor, b: &Tensor, out: &Tensor, accumulate: bool) -> Result<()> {
        let d = self.matmul_dims(accumulate);
        let (c, lhs, rhs) = (out.operand(OP)?, a.operand(OP)?, b.operand(OP)?);
        matmul::matmul(&a.gpu, &d, c, lhs, rhs)?;
        Ok(())
    }

    /// [`Product::record`] that also computes the squares of what it leaves in `out`, into a
    /// new temporary of partial sums ([`matmul::matmul_squares`]), which it returns.
    fn record_squares(
        &self,
        a: &Tensor,
        b: &Tensor,
        out: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        let d = self.matmul_dims(accumulate);
        let (c, lhs, rhs) = (out.operand(OP)?, a.operand(OP)?, b.operand(OP)?);
        let len = matmul::squares_len(&d, matmul::launch_entry(&d, [c, lhs, rhs]));
        let squares = Tensor::empty(&a.gpu, &[len as usize], Category::Temporary, "grad squares")?;
        matmul::matmul_squares(&a.gpu, &d, c, lhs, rhs, squares.elements()?)?;
        Ok(squares)
    }

    /// The kernel's description of this product.
    fn matmul_dims(&self, accumulate: bool) -> MatmulDims {
        let (batch, m, n, k) = self.dims;
        MatmulDims {
            trans_a: self.trans.0,
            trans_b: self.trans.1,
            batch_stride_a: self.strides.0,
            batch_stride_b: self.strides.1,
            batch_stride_c: m * n,
            accumulate,
            alpha: self.alpha,
            ..MatmulDims::dense(batch, m, n, k)
        }
    }

    /// `op(A) · op(B)` in a new tensor of `shape` (f16 when [`output_dtype`] says so).
    fn new_tensor(
        &self,
        a: &Tensor,
        b: &Tensor,
        shape: &[usize],
        category: Category,
    ) -> Result<Tensor> {
        let dtype = output_dtype(category, crate::tensor::numel(shape));
        let out = Tensor::empty_typed(&a.gpu, shape, dtype, category, "matmul")?;
        self.record(a, b, &out, false)?;
        Ok(out)
    }

    /// The gradient `op(A) · op(B)` of an operand of `shape`: with `leaf` (the operand is a leaf
    /// whose gradient slot has that shape), written straight into the slot, added to an existing
    /// gradient by the kernel's accumulate flag, or else into a new tensor of the slot's category
    /// that becomes the gradient (neither a temporary nor a copy); returns `None` then. Otherwise
    /// the gradient to pass on: into `lent` when the walk lent a buffer of the shape (added into
    /// a [`Lent::Sum`] with alpha 1, written into a [`Lent::Blank`]), else a new `Temporary`.
    fn gradient(
        &self,
        a: &Tensor,
        b: &Tensor,
        shape: &[usize],
        leaf: Option<&GradSlot>,
        lent: &mut Option<Lent>,
    ) -> Result<Option<Tensor>> {
        let Some(slot) = leaf.filter(|slot| slot.shape[..] == shape[..]) else {
            // A lent buffer of the shape: added into by the accumulate flag (with alpha 1 only:
            // another alpha may round differently from a product then an addition), or
            // written. Else a new temporary.
            let fits = |t: &Tensor| t.shape[..] == shape[..] && t.dtype == DType::F32;
            return match lent.take_if(|l| match l {
                Lent::Sum(t) => fits(t) && self.alpha == 1.0,
                Lent::Blank(t) => fits(t),
            }) {
                Some(Lent::Sum(t)) => {
                    self.record(a, b, &t, true)?;
                    Ok(Some(t))
                }
                Some(Lent::Blank(t)) => {
                    self.record(a, b, &t, false)?;
                    Ok(Some(t))
                }
                None => self.new_tensor(a, b, shape, Category::Temporary).map(Some),
            };
        };
        let mut grad = lock(&slot.grad);
        let mut squares = lock(&slot.squares);
        // Asked for the squares (and not already stale): this matmul leaves the whole gradient
        // (written fresh, or accumulated: C then holds old + new), so its squares are the
        // gradient's.
        let wanted = matches!(*squares, Squares::Wanted | Squares::Written(_));
        let fresh = match grad.as_ref() {
            Some(existing) => {
                if wanted {
                    *squares = Squares::Written(self.record_squares(a, b, existing, true)?);
                } else {
                    self.record(a, b, existing, true)?;
                }
                None
            }
            None => {
                let out = Tensor::empty(&slot.gpu, &slot.shape, slot.category, &slot.label)?;
                if wanted {
                    *squares = Squares::Written(self.record_squares(a, b, &out, false)?);
                } else {
                    self.record(a, b, &out, false)?;
                }
                Some(out)
            }
        };
        if let Some(out) = fresh {
            *grad = Some(out);
        }
        Ok(None)
    }
}

impl Tensor {
    /// Batched matrix product (see the module docs for the shapes taken).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let (lhs, rhs) = (&matmul_input(self)?, &matmul_input(rhs)?);
        expect_float("matmul", [lhs, rhs])?;
        lhs.matmul_inner(rhs)
    }

    /// [`Tensor::matmul`] of `self` and `rhs` as they are (f32 or f16 each).
    fn matmul_inner(&self, rhs: &Tensor) -> Result<Tensor> {
        let (p, shape) = plan(&self.shape, &rhs.shape)?;
        let recording = records(&[self, rhs]);
        let stride_a = if p.shared_lhs { 0 } else { p.m * p.k };
        let product = Product {
            dims: (p.batch, p.m, p.n, p.k),
            trans: (false, false),
            strides: (stride_a, p.k * p.n),
            alpha: 1.0,
        };
        let out = product.new_tensor(self, rhs, &shape, output_category(recording))?;
        record(out, &[self, rhs], || Op::Matmul {
            a: self.detach(),
            b: rhs.detach(),
        })
    }

    /// `self · rhsᵀ`: for a `[.., k]` tensor and a `[n, k]` matrix shared by every row,
    /// `[.., n]` (PyTorch's `x @ W.T` for an `nn.Linear` weight `W` stored `[out, in]`); or, for
    /// `[.., m, k]` and `[.., n, k]` with equal batch dimensions, the batched `[.., m, n]`
    /// (attention's `q @ k.transpose(-2, -1)`). The transpose is the kernel's flag, never a copy.
    pub fn matmul_transposed(&self, rhs: &Tensor) -> Result<Tensor> {
        self.matmul_transposed_scaled(rhs, 1.0)
    }

    /// `alpha · self · rhsᵀ` ([`Tensor::matmul_transposed`] scaled by the kernel: attention's
    /// `q · kᵀ / sqrt(d)` with no pass to scale q, forward or backward).
    pub fn matmul_transposed_scaled(&self, rhs: &Tensor, alpha: f32) -> Result<Tensor> {
        let (lhs, rhs) = (&matmul_input(self)?, &matmul_input(rhs)?);
        expect_float("matmul_transposed", [lhs, rhs])?;
        lhs.matmul_transposed_inner(rhs, alpha)
    }

    /// [`Tensor::matmul_transposed_scaled`] of `self` and `rhs` as they are.
    fn matmul_transposed_inner(&self, rhs: &Tensor, alpha: f32) -> Result<Tensor> {
        let t = transposed_plan(&self.shape, &rhs.shape)?;
        let mut shape: Shape = self.shape[..self.shape.len() - 1].iter().copied().collect();
        shape.push(t.n);
        let product = Product {
            dims: (t.batch, t.m, t.n, t.k),
            trans: (false, true),
            strides: (t.m * t.k, t.n * t.k),
            alpha,
        };
        let category = output_category(records(&[self, rhs]));
        let out = product.new_tensor(self, rhs, &shape, category)?;
        record(out, &[self, rhs], || Op::MatmulTransposed {
            a: self.detach(),
            b: rhs.detach(),
            alpha,
        })
    }
}

/// `batch` products of `m×k · (n×k)ᵀ`: a shared `[n, k]` matrix folds every row of the left
/// operand into `m` (batch 1).
struct TransposedPlan {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
}

/// The plan of `[.., k] · [n, k]ᵀ` or `[.., m, k] · [.., n, k]ᵀ`, or the mismatch.
fn transposed_plan(lhs: &[usize], rhs: &[usize]) -> Result<TransposedPlan> {
    let bad = |hint| mismatch("matmul_transposed", lhs, rhs, hint);
    let (ra, rb) = (lhs.len(), rhs.len());
    match (lhs.last(), rhs) {
        (Some(&k), &[n, k2]) if k == k2 => Ok(TransposedPlan {
            batch: 1,
            m: numel(lhs) / k.max(1),
            n,
            k,
        }),
        (Some(_), &[_, _]) => Err(bad("[.., k] x [n, k]ᵀ: the last dimensions must match")),
        _ if ra == rb
            && ra >= 3
            && lhs[..ra - 2] == rhs[..rb - 2]
            && lhs[ra - 1] == rhs[rb - 1] =>
        {
            Ok(TransposedPlan {
                batch: numel(&lhs[..ra - 2]),
                m: lhs[ra - 2],
                n: rhs[rb - 2],
                k: lhs[ra - 1],
            })
        }
        _ => Err(bad(
            "[.., k] x [n, k]ᵀ with a 2-D right operand, or [.., m, k] x [.., n, k]ᵀ with equal \
             batch dimensions",
        )),
    }
}

/// The gradients of `alpha · a · bᵀ` (`a` `[.., k]`, `b` `[n, k]`, `g` `[.., n]`), with the rows
/// of `a` folded into one matrix: `dA = alpha · G · B`, `dB = alpha · Gᵀ · A`; leaf slots are
/// written straight into, as [`matmul_grads`] does.
pub(crate) fn matmul_transposed_grads(
    g: &Tensor,
    [a, b]: [&Tensor; 2],
    alpha: f32,
    needs: &[bool],
    leaves: &[Option<&GradSlot>],
    lent: &mut [Option<Lent>],
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let leaf = |i: usize| leaves.get(i).copied().flatten();
    let mut spare = [None, None];
    let lent = if lent.len() >= 2 {
        lent
    } else {
        &mut spare[..]
    };
    let need = |i: usize| needs.get(i).copied().unwrap_or(true);
    let TransposedPlan { batch, m, n, k } = transposed_plan(&a.shape, &b.shape)?;
    // dA[b] = G[b] · B[b]: (m×n)·(n×k) (a shared B: batch 1, every row in m).
    let da_product = Product {
        dims: (batch, m, k, n),
        trans: (false, false),
        strides: (m * n, n * k),
        alpha,
    };
    let da = match need(0) {
        true => da_product.gradient(g, b, &a.shape, leaf(0), &mut lent[0])?,
        false => None,
    };
    // dB[b] = G[b]ᵀ · A[b]: (n×m)·(m×k).
    let db_product = Product {
        dims: (batch, n, k, m),
        trans: (true, false),
        strides: (m * n, m * k),
        alpha,
    };
    let db = match need(1) {
        true => db_product.gradient(g, a, &b.shape, leaf(1), &mut lent[1])?,
        false => None,
    };
    Ok((da, db))
}

/// The gradients `(dA, dB) = (G · Bᵀ, Aᵀ · G)` of a matmul of `a` and `b`, summed over
/// the batch for a shared operand; an operand whose `needs` is false gets none (no product). Transposes are the kernel's flags, never copies. `leaves[i]`
/// is operand `i`'s gradient slot when it is a leaf: its gradient is then written (or accumulated)
/// straight into the slot and returned as `None` (see `Product::gradient`), except a shared A's,
/// which needs a sum over the batch first.
pub(crate) fn matmul_grads(
    g: &Tensor,
    a: &Tensor,
    b: &Tensor,
    needs: &[bool],
    leaves: &[Option<&GradSlot>],
    lent: &mut [Option<Lent>],
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let (lhs, rhs) = (&a.shape[..], &b.shape[..]);
    let leaf = |i: usize| leaves.get(i).copied().flatten();
    let mut spare = [None, None];
    let lent = if lent.len() >= 2 {
        lent
    } else {
        &mut spare[..]
    };
    let need = |i: usize| needs.get(i).copied().unwrap_or(true);
    let (p, _) = plan(lhs, rhs)?;
    let (batch, m, n, k) = (p.batch, p.m, p.n, p.k);
    let stride_a = if p.shared_lhs { 0 } else { m * k };
    // dA[b] = G[b] · B[b]ᵀ: (m×n)·(n×k); a shared A sums the per-batch products.
    let da_product = Product {
        dims: (batch, m, k, n),
        trans: (false, true),
        strides: (m * n, k * n),
        alpha: 1.0,
    };
    let da = if !need(0) {
        None
    } else if p.shared_lhs {
        let da_shape = [batch, m, k];
        let da = da_product.new_tensor(g, b, &da_shape, Category::Temporary)?;
        Some(crate::ops::elementwise::sum_to(&da, lhs)?)
    } else {
        da_product.gradient(g, b, lhs, leaf(0), &mut lent[0])?
    };
    // dB[b] = A[b]ᵀ · G[b]: (k×m)·(m×n).
    let db_product = Product {
        dims: (batch, k, n, m),
        trans: (true, false),
        strides: (stride_a, m * n),
        alpha: 1.0,
    };
    let db = match need(1) {
        true => db_product.gradient(a, g, rhs, leaf(1), &mut lent[1])?,
        false => None,
    };
    Ok((da, db))
}
