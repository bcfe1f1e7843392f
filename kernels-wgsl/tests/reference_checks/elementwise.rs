//! Binary and reduce references (`unary`'s are checked in its family, `kernels::unary::tests`),
//! and the op families' shader codes.

use super::*;

/// The codes are the ops' positions in `ALL`, and each family's WGSL declares every op by its
/// variant's name with that code (the shaders' `case` labels).
#[test]
fn shader_codes_are_positions_in_all_and_declared_in_wgsl() {
    for (i, op) in UnaryOp::ALL.iter().enumerate() {
        assert_eq!(op.shader_code() as usize, i, "{op:?}");
        let line = format!("const {op:?}: u32 = {i}u;");
        assert!(UnaryOp::WGSL.contains(&line), "{line} in {}", UnaryOp::WGSL);
    }
    for (i, op) in BinaryOp::ALL.iter().enumerate() {
        assert_eq!(op.shader_code() as usize, i, "{op:?}");
        let line = format!("const {op:?}: u32 = {i}u;");
        assert!(
            BinaryOp::WGSL.contains(&line),
            "{line} in {}",
            BinaryOp::WGSL
        );
    }
    assert_eq!(UnaryOp::WGSL.lines().count(), UnaryOp::ALL.len());
    assert_eq!(BinaryOp::WGSL.lines().count(), BinaryOp::ALL.len());
}

// --------------------------------------------------------------------------------- binary

#[test]
fn binary_broadcast_hand_worked() {
    // [2,3] + [3]: b is repeated over rows; strides b = [0, 1]
    let shape = Broadcast::new(&[2, 3], &[3]).expect("compatible");
    assert_eq!(shape.out_shape, [2, 3]);
    assert_eq!(shape.a_strides, [3, 1]);
    assert_eq!(shape.b_strides, [0, 1]);
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let out = binary::broadcast(BinaryOp::Add, &a, &[10.0, 20.0, 30.0], &shape);
    assert_eq!(out, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    // [2,1] * [1,3] -> [2,3] outer product
    let shape = Broadcast::new(&[2, 1], &[1, 3]).expect("compatible");
    assert_eq!(shape.out_shape, [2, 3]);
    let out = binary::broadcast(BinaryOp::Mul, &[2.0, 3.0], &[1.0, 10.0, 100.0], &shape);
    assert_eq!(out, [2.0, 20.0, 200.0, 3.0, 30.0, 300.0]);
    assert!(Broadcast::new(&[2, 3], &[2]).is_none());
    // scalar forms: 1 - 5 = -4 and 5 - 1 = 4; max/min propagate NaN
    assert_eq!(binary::scalar_rhs(BinaryOp::Sub, &[1.0], 5.0), [-4.0]);
    assert_eq!(binary::scalar_lhs(BinaryOp::Sub, 5.0, &[1.0]), [4.0]);
    assert!(BinaryOp::Max.apply(f32::NAN, 1.0).is_nan());
    assert!(BinaryOp::Min.apply(1.0, f32::NAN).is_nan());
    // max tie: half of dy to each side (PyTorch maximum)
    assert_eq!(BinaryOp::Max.apply_backward(2.0, 2.0, 1.0), (0.5, 0.5));
}

#[test]
fn binary_backward_with_sum_to_shape_matches_finite_differences() {
    let mut rng = Rng::new(0x5eed_0001);
    let (a_shape, b_shape) = ([2usize, 1, 3], [4usize, 1]);
    let shape = Broadcast::new(&a_shape, &b_shape).expect("compatible");
    let a = rng.vec_f32(6, 0.5, 2.0);
    let b = rng.vec_f32(4, 0.5, 2.0);
    let w = rng.vec_f32(shape.len(), -1.0, 1.0);
    for op in BinaryOp::ALL {
        let (da_full, db_full) = binary::backward(op, &a, &b, &w, &shape);
        let da = reduce::sum_to_shape(&da_full, &shape.out_shape, &a_shape).expect("reducible");
        let db = reduce::sum_to_shape(&db_full, &shape.out_shape, &b_shape).expect("reducible");
        let num_a = numeric_gradient(&a, 1e-3, |a| dot(&w, &binary::broadcast(op, a, &b, &shape)));
        let num_b = numeric_gradient(&b, 1e-3, |b| dot(&w, &binary::broadcast(op, &a, b, &shape)));
        assert_close(&format!("{op:?} da"), &da, &num_a, 2e-3, 2e-3);
        assert_close(&format!("{op:?} db"), &db, &num_b, 2e-3, 2e-3);
    }
}

// --------------------------------------------------------------------------------- reduce

#[test]
fn reduce_hand_worked() {
    // x of shape [2, 3, 2] = 0..12; axis 1: view [outer 2, axis 3, inner 2]
    let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let view = AxisView::of_shape(&[2, 3, 2], 1).expect("axis in range");
    assert_eq!(
        view,
        AxisView {
            outer: 2,
            axis_len: 3,
            inner: 2
        }
    );
    // out[0,0] = 0 + 2 + 4 = 6, out[0,1] = 1 + 3 + 5 = 9, out[1,0] = 6 + 8 + 10, out[1,1] = 27
    assert_eq!(reduce::sum_axis(&x, view), [6.0, 9.0, 24.0, 27.0]);
    assert_eq!(reduce::mean_axis(&x, view), [2.0, 3.0, 8.0, 9.0]);
    let (values, indices) = reduce::max_axis(&x, view);
    assert_eq!(values, [4.0, 5.0, 10.0, 11.0]);
    assert_eq!(indices, [2, 2, 2, 2]);
    let dx = reduce::max_backward(&[1.0, 2.0, 3.0, 4.0], &indices, view);
    assert_eq!(
        dx,
        [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0]
    );
    assert_eq!(reduce::sum_all(&x), 66.0);
    assert_eq!(reduce::mean_all(&x), 5.5);
    // ties: first index; NaN wins
    assert_eq!(reduce::max_all(&[1.0, 3.0, 3.0]), (3.0, 1));
    let (v, i) = reduce::max_all(&[1.0, f32::NAN, 5.0, f32::NAN]);
    assert!(v.is_nan());
    assert_eq!(i, 1);
    // sum_to_shape: [2,3] -> [3] sums rows, -> [2,1] sums columns, -> [] sums all
    let m = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    assert_eq!(
        reduce::sum_to_shape(&m, &[2, 3], &[3]),
        Some(vec![5.0, 7.0, 9.0])
    );
    assert_eq!(
        reduce::sum_to_shape(&m, &[2, 3], &[2, 1]),
        Some(vec![6.0, 15.0])
    );
    assert_eq!(reduce::sum_to_shape(&m, &[2, 3], &[]), Some(vec![21.0]));
    assert_eq!(reduce::sum_to_shape(&m, &[2, 3], &[2]), None);
}
