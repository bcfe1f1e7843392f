//! CPU reference for `binary`: `out = a op b` with numpy broadcasting, the scalar forms
//! `a op s` and `s op a`, and the backward at the *output* shape.
//!
//! The backward returns `(da, db)` both shaped like the output; the gradient of a broadcast
//! operand is then [`crate::reference::reduce::sum_to_shape`] of it (a sequence of axis sums).
//! `max`/`min` propagate NaN (as PyTorch's `maximum`/`minimum`), and on ties their backward
//! gives half of `dy` to each side (as PyTorch).

/// A binary op; [`BinaryOp::shader_code`] is the value of the `OP` override in `shaders/binary.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
    /// `max(a, b)`, NaN if either is NaN
    Max,
    /// `min(a, b)`, NaN if either is NaN
    Min,
}

impl BinaryOp {
    /// Every op, in shader-code order.
    pub const ALL: [BinaryOp; 6] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
    ];

    /// The value of the WGSL `override OP: u32` in `shaders/binary.wgsl`.
    pub fn shader_code(self) -> u32 {
        self as u32
    }

    /// `a op b` for one element pair.
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Max if a.is_nan() || b.is_nan() => f32::NAN,
            BinaryOp::Max => a.max(b),
            BinaryOp::Min if a.is_nan() || b.is_nan() => f32::NAN,
            BinaryOp::Min => a.min(b),
        }
    }

    /// `(d(a op b)/da * dy, d(a op b)/db * dy)` for one element pair.
    pub fn apply_backward(self, a: f32, b: f32, dy: f32) -> (f32, f32) {
        match self {
            // d(a+b) = (1, 1)
            BinaryOp::Add => (dy, dy),
            // d(a-b) = (1, -1)
            BinaryOp::Sub => (dy, -dy),
            // d(ab) = (b, a)
            BinaryOp::Mul => (dy * b, dy * a),
            // d(a/b) = (1/b, -a/b^2)
            BinaryOp::Div => (dy / b, -dy * a / (b * b)),
            // d max = ([a>b], [b>a]), half each on a tie
            BinaryOp::Max => split_by_winner(a > b, b > a, dy),
            // d min = ([a<b], [b<a]), half each on a tie
            BinaryOp::Min => split_by_winner(a < b, b < a, dy),
        }
    }
}

/// The gradient goes to the winner; on a tie (neither wins) each side gets `dy / 2`.
fn split_by_winner(a_wins: bool, b_wins: bool, dy: f32) -> (f32, f32) {
    match (a_wins, b_wins) {
        (true, _) => (dy, 0.0),
        (_, true) => (0.0, dy),
        _ => (dy * 0.5, dy * 0.5),
    }
}

/// Row-major (C-contiguous) element strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut step = 1;
    for d in (0..shape.len()).rev() {
        strides[d] = step;
        step *= shape[d];
    }
    strides
}

/// A numpy broadcast of two operands: the output shape and, per output dimension, each
/// operand's element stride (0 where that operand is broadcast along the dimension).
/// These are exactly the `shape`/`a_strides`/`b_strides` fields of the WGSL `Params`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broadcast {
    /// Output shape, outermost first; its rank is the larger operand rank.
    pub out_shape: Vec<usize>,
    /// Stride of `a` per output dimension; 0 where `a` has extent 1 or lacks the dimension.
    pub a_strides: Vec<usize>,
    /// Stride of `b` per output dimension; 0 where `b` has extent 1 or lacks the dimension.
    pub b_strides: Vec<usize>,
}

impl Broadcast {
    /// Broadcasts contiguous operands of shapes `a_shape` and `b_shape` (numpy rules: align
    /// the trailing dimensions; extents must be equal or 1). `None` if they are incompatible.
    pub fn new(a_shape: &[usize], b_shape: &[usize]) -> Option<Broadcast> {
        let rank = a_shape.len().max(b_shape.len());
        // Left-pad both shapes with 1s to the output rank.
        let pad = |s: &[usize]| -> Vec<usize> {
            let mut p = vec![1; rank - s.len()];
            p.extend_from_slice(s);
            p
        };
        let (a, b) = (pad(a_shape), pad(b_shape));
        let (a_contig, b_contig) = (contiguous_strides(&a), contiguous_strides(&b));
        let mut out_shape = Vec::with_capacity(rank);
        let mut a_strides = Vec::with_capacity(rank);
        let mut b_strides = Vec::with_capacity(rank);
        for d in 0..rank {
            let extent = match (a[d], b[d]) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => return None,
            };
            out_shape.push(extent);
            a_strides.push(if a[d] == 1 { 0 } else { a_contig[d] });
            b_strides.push(if b[d] == 1 { 0 } else { b_contig[d] });
        }
        Some(Broadcast {
            out_shape,
            a_strides,
            b_strides,
        })
    }

    /// Number of output elements.
    pub fn len(&self) -> usize {
        self.out_shape.iter().product()
    }

    /// Whether the output has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element offsets into `a` and `b` of flat output index `i`.
    pub fn operand_offsets(&self, i: usize) -> (usize, usize) {
        let (mut rest, mut oa, mut ob) = (i, 0, 0);
        for d in (0..self.out_shape.len()).rev() {
            let idx = rest % self.out_shape[d];
            rest /= self.out_shape[d];
            oa += idx * self.a_strides[d];
            ob += idx * self.b_strides[d];
        }
        (oa, ob)
    }
}

/// `out[i] = a[ia] op b[ib]` over the broadcast output, row-major.
pub fn broadcast(op: BinaryOp, a: &[f32], b: &[f32], shape: &Broadcast) -> Vec<f32> {
    (0..shape.len())
        .map(|i| {
            let (ia, ib) = shape.operand_offsets(i);
            op.apply(a[ia], b[ib])
        })
        .collect()
}

/// `out[i] = a[i] op s`.
pub fn scalar_rhs(op: BinaryOp, a: &[f32], s: f32) -> Vec<f32> {
    a.iter().map(|&v| op.apply(v, s)).collect()
}

/// `out[i] = s op a[i]`.
pub fn scalar_lhs(op: BinaryOp, s: f32, a: &[f32]) -> Vec<f32> {
    a.iter().map(|&v| op.apply(s, v)).collect()
}

/// Backward at the output shape: `(da_full, db_full)`, each `shape.len()` long, with
/// `da_full[i] = dy[i] * d(a op b)/da` at the operands of output element `i`. Reduce each to its
/// operand's shape with [`crate::reference::reduce::sum_to_shape`].
pub fn backward(
    op: BinaryOp,
    a: &[f32],
    b: &[f32],
    dy: &[f32],
    shape: &Broadcast,
) -> (Vec<f32>, Vec<f32>) {
    (0..shape.len())
        .map(|i| {
            let (ia, ib) = shape.operand_offsets(i);
            op.apply_backward(a[ia], b[ib], dy[i])
        })
        .unzip()
}
