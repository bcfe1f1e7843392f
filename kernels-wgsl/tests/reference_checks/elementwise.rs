//! The reduce reference (`unary`'s and `binary`'s are checked in their families'
//! `kernels::<stem>::tests`), and the op families' shader codes.

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
