//! Batched matrix product `[.., m, k] · [.., k, n]`. Either operand may be a plain `[m, k]` /
//! `[k, n]` matrix shared by every batch; otherwise the batch extents must be equal.
//! Kernel: `matmul` (transposes are flags of the kernel, never copies).

use plimsoll_kernels_wgsl::Category;
use plimsoll_kernels_wgsl::kernels::matmul::{self, MatmulDims};

use crate::error::Result;
use crate::op::Op;
use crate::ops::mismatch;
use crate::tape::{Saved, attach, output_category, records};
use crate::tensor::{DType, Shape, Tensor, numel};

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

/// Records `C = op(A) · op(B)` for `batch` products into a new tensor of `shape`.
#[allow(clippy::too_many_arguments)]
fn product(
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    dims: (usize, usize, usize, usize),
    trans: (bool, bool),
    strides: (usize, usize),
    category: Category,
) -> Result<Tensor> {
    let (batch, m, n, k) = dims;
    let out = Tensor::empty(&a.gpu, shape, category, "matmul")?;
    let d = MatmulDims {
        trans_a: trans.0,
        trans_b: trans.1,
        batch_stride_a: strides.0,
        batch_stride_b: strides.1,
        batch_stride_c: m * n,
        offset_a: a.offset as usize,
        offset_b: b.offset as usize,
        offset_c: out.offset as usize,
        ..MatmulDims::dense(batch, m, n, k)
    };
    matmul::matmul(&a.gpu, &out.storage, &a.storage, &b.storage, &d)?;
    Ok(out)
}

impl Tensor {
    /// Batched matrix product (see the module docs for the shapes taken).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.expect_dtype("matmul", DType::F32)?;
        rhs.expect_dtype("matmul", DType::F32)?;
        let (p, shape) = plan(&self.shape, &rhs.shape)?;
        let recording = records(&[self, rhs]);
        let stride_a = if p.shared_lhs { 0 } else { p.m * p.k };
        let out = product(
            self,
            rhs,
            &shape,
            (p.batch, p.m, p.n, p.k),
            (false, false),
            (stride_a, p.k * p.n),
            output_category(recording),
        )?;
        if !recording {
            return Ok(out);
        }
        let op = Op::Matmul {
            lhs: self.shape.clone(),
            rhs: rhs.shape.clone(),
        };
        Ok(attach(out, op, &[self, rhs], Saved::of(&[self, rhs])))
    }
}

/// The gradients `(dA, dB) = (G · Bᵀ, Aᵀ · G)` of a matmul (`saved` = `[a, b]`), summed over
/// the batch for a shared operand.
pub(crate) fn matmul_grads(
    g: &Tensor,
    saved: &[Tensor],
    lhs: &[usize],
    rhs: &[usize],
) -> Result<(Tensor, Tensor)> {
    let (a, b) = match saved {
        [a, b, ..] => (a, b),
        _ => return Err(crate::ops::elementwise::missing_saved("matmul")),
    };
    let (p, _) = plan(lhs, rhs)?;
    let t = Category::Temporary;
    let (batch, m, n, k) = (p.batch, p.m, p.n, p.k);
    let stride_a = if p.shared_lhs { 0 } else { m * k };
    // dA[b] = G[b] · B[b]ᵀ: (m×n)·(n×k); a shared A sums the per-batch products.
    let da_shape: Shape = if p.shared_lhs {
        [batch, m, k].into_iter().collect()
    } else {
        lhs.iter().copied().collect()
    };
    let da = product(
        g,
        b,
        &da_shape,
        (batch, m, k, n),
        (false, true),
        (m * n, k * n),
        t,
    )?;
    let da = if p.shared_lhs {
        crate::ops::elementwise::sum_to(&da, lhs)?
    } else {
        da
    };
    // dB[b] = A[b]ᵀ · G[b]: (k×m)·(m×n).
    let db = product(
        a,
        g,
        rhs,
        (batch, k, n, m),
        (true, false),
        (stride_a, m * n),
        t,
    )?;
    Ok((da, db))
}
