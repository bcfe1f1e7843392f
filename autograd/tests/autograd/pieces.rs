//! A node's gradient assembled from the pieces its leading-axis slices send (q, k, v of one
//! projection): disjoint pieces with gaps, overlapping pieces, pieces on top of a dense gradient,
//! and a dense gradient whose storage another node shares (it must not be added into in place).
//! The oracle is the hand-worked gradient: `y = s x`, `L = Σ_i Σ w_i ⊙ slice_i(y) (+ Σ w_d ⊙ y)`,
//! so `dL/dx = s (Σ_i w_i placed at slice i + w_d)`; every value is a small integer, so the
//! result is exact.

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::testing::gpu;

use crate::common::param;

/// Rows of `x` ([4, 3]): 0..12.
fn x_values() -> Vec<f32> {
    (0..12).map(|v| v as f32).collect()
}

/// The weights for a slice of `rows` rows starting at `start`: `10 * (k + 1)` for slice `k`,
/// element by element plus the element's index.
fn weights(k: usize, rows: usize) -> Vec<f32> {
    (0..rows * 3).map(|i| (10 * (k + 1) + i) as f32).collect()
}

/// `dL/dx` for slices `(start, rows)` of `y = 2 x` ([4, 3]) weighted by [`weights`], plus
/// `dense` (a weight for the whole `y`) when given; checked against the hand-worked sum.
fn check(slices: &[(usize, usize)], dense: Option<&[f32]>) {
    let gpu = gpu();
    let x = param(&gpu, &x_values(), &[4, 3]);
    let y = x.mul_scalar(2.0).unwrap();
    let mut want = vec![0.0f32; 12];
    let mut loss: Option<Tensor> = None;
    let mut add = |term: Tensor| {
        loss = Some(match loss.take() {
            Some(l) => l.add(&term).unwrap(),
            None => term,
        });
    };
    for (k, &(start, rows)) in slices.iter().enumerate() {
        let w = weights(k, rows);
        let wt = Tensor::from_slice(&gpu, &w, &[rows, 3]).unwrap();
        add(y
            .slice(0, start, rows)
            .unwrap()
            .mul(&wt)
            .unwrap()
            .sum_all()
            .unwrap());
        for (i, v) in w.iter().enumerate() {
            want[start * 3 + i] += 2.0 * v;
        }
    }
    if let Some(d) = dense {
        let wt = Tensor::from_slice(&gpu, d, &[4, 3]).unwrap();
        add(y.mul(&wt).unwrap().sum_all().unwrap());
        for (i, v) in d.iter().enumerate() {
            want[i] += 2.0 * v;
        }
    }
    loss.unwrap().backward().unwrap();
    let got = x.grad().unwrap().to_vec().unwrap();
    assert_eq!(got, want, "slices {slices:?}, dense {dense:?}");
}

#[test]
fn slice_gradients_are_assembled_in_place() {
    check(&[(0, 1), (1, 1), (2, 2)], None); // covering, as q, k, v
    check(&[(2, 2), (0, 1)], None); // out of order, a gap at row 1
    check(&[(1, 1)], None); // one piece, gaps on both sides
    check(&[(0, 2), (1, 2), (1, 1)], None); // overlapping
    let dense: Vec<f32> = (0..12).map(|v| (100 + v) as f32).collect();
    check(&[(0, 1), (3, 1)], Some(&dense)); // pieces added onto a dense gradient
}

/// `w = y + o` sends the same gradient storage to `y` and to `o`; `y`'s slice piece is then
/// added to `y`'s gradient, which must leave `o`'s (and so `dL/dx2`) untouched. `o` is made
/// first, so backward reaches `y` (and assembles its pieces) while `o`'s gradient still waits.
#[test]
fn a_shared_dense_gradient_is_not_added_into() {
    let gpu = gpu();
    let x2 = param(&gpu, &x_values(), &[4, 3]);
    let o = x2.mul_scalar(3.0).unwrap();
    let x1 = param(&gpu, &x_values(), &[4, 3]);
    let y = x1.mul_scalar(2.0).unwrap();
    let wd: Vec<f32> = (0..12).map(|v| (100 + v) as f32).collect();
    let wd_t = Tensor::from_slice(&gpu, &wd, &[4, 3]).unwrap();
    let wa = Tensor::from_slice(&gpu, &[1.0, 2.0, 3.0], &[1, 3]).unwrap();
    let dense = y.add(&o).unwrap().mul(&wd_t).unwrap().sum_all().unwrap();
    let piece = y
        .slice(0, 1, 1)
        .unwrap()
        .mul(&wa)
        .unwrap()
        .sum_all()
        .unwrap();
    dense.add(&piece).unwrap().backward().unwrap();
    let mut want1: Vec<f32> = wd.iter().map(|v| 2.0 * v).collect();
    for (i, v) in [1.0f32, 2.0, 3.0].iter().enumerate() {
        want1[3 + i] += 2.0 * v;
    }
    let want2: Vec<f32> = wd.iter().map(|v| 3.0 * v).collect();
    assert_eq!(x1.grad().unwrap().to_vec().unwrap(), want1);
    assert_eq!(x2.grad().unwrap().to_vec().unwrap(), want2);
}
