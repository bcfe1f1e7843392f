//! CPU reference for [`reduce`](super): sum, mean and max over one axis or over all elements, the
//! arg-max indices that `max` saves for its backward, the `max_backward` scatter, and
//! `sum_to_shape` (the backward of a broadcast).
//!
//! An axis reduction views the tensor as `[outer, axis_len, inner]` ([`AxisView`]) and writes
//! `[outer, inner]`. Sums accumulate in `f64`; the axis reductions have `*_f64` entry points
//! (autograd's gradient checks) of which the `f32` ones are thin wrappers. Max: NaN beats every
//! number (the result is NaN, as in PyTorch); among equal values the first index wins.

use super::AxisView;
use crate::kernels::{narrow, widen};

/// Whether `(v, i)` beats the current best `(best, best_i)` for max: NaN beats numbers, a larger
/// value beats a smaller one, and among equals (or NaNs) the smaller index wins.
pub fn max_beats_f64(v: f64, i: u32, best: f64, best_i: u32) -> bool {
    match (v.is_nan(), best.is_nan()) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => i < best_i,
        (false, false) => v > best || (v == best && i < best_i),
    }
}

/// [`max_beats_f64`] for `f32` values (widening keeps order and NaN).
pub fn max_beats(v: f32, i: u32, best: f32, best_i: u32) -> bool {
    max_beats_f64(f64::from(v), i, f64::from(best), best_i)
}

/// `out[o, i] = sum_k x[o, k, i]`.
pub fn sum_axis_f64(x: &[f64], view: AxisView) -> Vec<f64> {
    let mut out = Vec::with_capacity(view.output_len());
    for o in 0..view.outer {
        for i in 0..view.inner {
            out.push((0..view.axis_len).map(|k| x[view.offset(o, k, i)]).sum());
        }
    }
    out
}

/// `out[o, i] = (1/axis_len) sum_k x[o, k, i]`.
pub fn mean_axis_f64(x: &[f64], view: AxisView) -> Vec<f64> {
    let n = view.axis_len as f64;
    sum_axis_f64(x, view).into_iter().map(|s| s / n).collect()
}

/// `(values[o, i], indices[o, i]) = (max_k x[o, k, i], argmax_k)`; see [`max_beats_f64`].
pub fn max_axis_f64(x: &[f64], view: AxisView) -> (Vec<f64>, Vec<u32>) {
    let mut values = Vec::with_capacity(view.output_len());
    let mut indices = Vec::with_capacity(view.output_len());
    for o in 0..view.outer {
        for i in 0..view.inner {
            let (mut best, mut best_k) = (f64::NEG_INFINITY, u32::MAX);
            for k in 0..view.axis_len {
                let v = x[view.offset(o, k, i)];
                if max_beats_f64(v, k as u32, best, best_k) {
                    (best, best_k) = (v, k as u32);
                }
            }
            values.push(best);
            indices.push(best_k);
        }
    }
    (values, indices)
}

/// [`sum_axis_f64`] on `f32` data (accumulated in `f64`, rounded once).
pub fn sum_axis(x: &[f32], view: AxisView) -> Vec<f32> {
    narrow(&sum_axis_f64(&widen(x), view))
}

/// [`mean_axis_f64`] on `f32` data.
pub fn mean_axis(x: &[f32], view: AxisView) -> Vec<f32> {
    narrow(&mean_axis_f64(&widen(x), view))
}

/// [`max_axis_f64`] on `f32` data (every value is one of the inputs: no rounding).
pub fn max_axis(x: &[f32], view: AxisView) -> (Vec<f32>, Vec<u32>) {
    let (values, indices) = max_axis_f64(&widen(x), view);
    (narrow(&values), indices)
}

/// `sum_j x[j]` over all elements (f64 accumulation).
pub fn sum_all(x: &[f32]) -> f32 {
    x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32
}

/// `(1/n) sum_j x[j]`.
pub fn mean_all(x: &[f32]) -> f32 {
    (x.iter().map(|&v| f64::from(v)).sum::<f64>() / x.len() as f64) as f32
}

/// `(max_j x[j], argmax_j)`; `(-inf, u32::MAX)` for an empty slice.
pub fn max_all(x: &[f32]) -> (f32, u32) {
    let (mut best, mut best_i) = (f32::NEG_INFINITY, u32::MAX);
    for (i, &v) in x.iter().enumerate() {
        if max_beats(v, i as u32, best, best_i) {
            (best, best_i) = (v, i as u32);
        }
    }
    (best, best_i)
}

/// Backward of [`max_axis`]: `dx[o, k, i] = dy[o, i] if k == indices[o, i] else 0`.
pub fn max_backward(dy: &[f32], indices: &[u32], view: AxisView) -> Vec<f32> {
    let mut dx = vec![0.0; view.input_len()];
    for o in 0..view.outer {
        for i in 0..view.inner {
            let k = indices[o * view.inner + i] as usize;
            if k < view.axis_len {
                dx[view.offset(o, k, i)] = dy[o * view.inner + i];
            }
        }
    }
    dx
}

/// Sums `x` of shape `from_shape` down to `to_shape` (the gradient of a numpy broadcast from
/// `to_shape` to `from_shape`): leading extra dimensions and dimensions where `to_shape` has
/// extent 1 are summed, one [`sum_axis`] at a time, which is how the launcher composes it on the
/// GPU (`sum_axis` with `outer`/`inner` from the current shape, keeping the axis as extent 1).
/// `None` if `to_shape` does not broadcast to `from_shape`.
pub fn sum_to_shape(x: &[f32], from_shape: &[usize], to_shape: &[usize]) -> Option<Vec<f32>> {
    if to_shape.len() > from_shape.len() {
        return None;
    }
    let lead = from_shape.len() - to_shape.len();
    let mut shape = from_shape.to_vec();
    let mut data = x.to_vec();
    for d in 0..from_shape.len() {
        let target = if d < lead { 1 } else { to_shape[d - lead] };
        if shape[d] == target {
            continue;
        }
        if target != 1 {
            return None;
        }
        let view = AxisView::of_shape(&shape, d)?;
        data = sum_axis(&data, view);
        shape[d] = 1;
    }
    Some(data)
}
