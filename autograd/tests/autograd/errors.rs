//! Typed errors: second backward, non-scalar backward, mismatched shapes, no graph.

use plimsoll_autograd::ops::reduce::SquaresOf;
use plimsoll_autograd::{Error, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::testing::gpu;

use crate::common::param;

#[test]
fn second_backward_without_retain_graph_is_backward_twice() {
    let gpu = gpu();
    let w = param(&gpu, &[1.0, 2.0, 3.0], &[3]);
    let loss = w.mul(&w).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    assert!(matches!(loss.backward(), Err(Error::BackwardTwice)));
}

#[test]
fn retain_graph_allows_a_second_backward_and_accumulates() {
    let gpu = gpu();
    let w = param(&gpu, &[1.0, 2.0, 3.0], &[3]);
    let loss = w.mul(&w).unwrap().sum_all().unwrap();
    loss.backward_with(None, true).unwrap();
    loss.backward().unwrap();
    // d(Σ w²)/dw = 2w, twice.
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![4.0, 8.0, 12.0]);
    assert!(matches!(loss.backward(), Err(Error::BackwardTwice)));
}

#[test]
fn backward_from_non_scalar_needs_a_seed() {
    let gpu = gpu();
    let w = param(&gpu, &[1.0, 2.0], &[2]);
    let y = w.mul_scalar(3.0).unwrap();
    match y.backward() {
        Err(Error::NonScalarBackward { shape }) => assert_eq!(shape.as_slice(), &[2]),
        other => panic!("expected NonScalarBackward, got {other:?}"),
    }
    let seed = Tensor::from_slice(&gpu, &[1.0, -1.0], &[2]).unwrap();
    y.backward_with(Some(&seed), false).unwrap();
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![3.0, -3.0]);
    let bad_seed = Tensor::from_slice(&gpu, &[1.0, 1.0, 1.0], &[3]).unwrap();
    let y = w.mul_scalar(3.0).unwrap();
    assert!(matches!(
        y.backward_with(Some(&bad_seed), false),
        Err(Error::SeedShape { .. })
    ));
}

#[test]
fn mismatched_shapes_are_shape_mismatch_errors() {
    let gpu = gpu();
    let a = Tensor::zeros(&gpu, &[2, 3], TensorOptions::default()).unwrap();
    let b = Tensor::zeros(&gpu, &[4, 5], TensorOptions::default()).unwrap();
    let is_mismatch = |r: plimsoll_autograd::Result<Tensor>, name: &str| match r {
        Err(Error::ShapeMismatch { op, .. }) => assert_eq!(op, name),
        other => panic!("{name}: expected ShapeMismatch, got {other:?}"),
    };
    is_mismatch(a.add(&b), "add");
    is_mismatch(a.sub(&b), "sub");
    is_mismatch(a.mul(&b), "mul");
    is_mismatch(a.div(&b), "div");
    is_mismatch(a.matmul(&b), "matmul");
    is_mismatch(a.reshape(&[7]), "reshape");
    is_mismatch(a.permute(&[0, 0]), "permute");
    is_mismatch(Tensor::concat(&[&a, &b], 0), "concat");
    let gamma = Tensor::zeros(&gpu, &[4], TensorOptions::default()).unwrap();
    is_mismatch(a.layer_norm(&gamma, &gamma, 1e-5), "layer_norm");
    let targets = Tensor::from_indices(&gpu, &[0, 1, 2], &[3]).unwrap();
    is_mismatch(a.cross_entropy(&targets, 0.0), "cross_entropy");
    assert!(matches!(a.sum(&[2], false), Err(Error::BadAxis { .. })));
    assert!(matches!(
        a.slice(1, 2, 2),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(a.dropout(1.0), Err(Error::InvalidArgument { .. })));
    let ids = Tensor::from_indices(&gpu, &[0], &[1]).unwrap();
    assert!(matches!(a.add(&ids), Err(Error::DTypeMismatch { .. })));
}

#[test]
fn backward_without_graph_and_detach() {
    let gpu = gpu();
    let x = Tensor::from_slice(&gpu, &[1.0], &[1]).unwrap();
    assert!(matches!(x.backward(), Err(Error::NoGraph)));
    let w = param(&gpu, &[2.0], &[1]);
    let y = w.mul(&w).unwrap().detach();
    assert!(!y.requires_grad());
    assert!(matches!(
        y.sum_all().unwrap().backward(),
        Err(Error::NoGraph)
    ));
    {
        let _g = plimsoll_autograd::no_grad();
        assert!(!w.mul(&w).unwrap().requires_grad());
    }
    assert!(w.mul(&w).unwrap().requires_grad());
}

/// `sum_squares_all` has no backward: refused where it would be recorded, and under `no_grad`
/// it equals `x * x` summed (the oracle).
#[test]
fn sum_squares_all_is_refused_on_the_tape_and_matches_the_product_off_it() {
    let gpu = gpu();
    let w = param(&gpu, &[1.0, -2.0, 3.5], &[3]);
    assert!(matches!(
        w.sum_squares_all(),
        Err(Error::InvalidArgument {
            op: "sum_squares_all",
            ..
        })
    ));
    let _no_grad = plimsoll_autograd::no_grad();
    let fused = w.sum_squares_all().unwrap().item().unwrap();
    let product = w.mul(&w).unwrap().sum_all().unwrap().item().unwrap();
    assert_eq!(fused, product);
    assert_eq!(fused, 1.0 + 4.0 + 12.25);
}

/// `with_sums_of_squares`: the head's elements first, then each tensor's sums of squares by
/// chunks at the ranges it returns; each range's sum equals the tensor's sum of squares in f64
/// (the oracle), a tensor over one chunk gets several, a NaN shows in its own range only, and
/// it is refused where it would be recorded.
#[test]
fn with_sums_of_squares_puts_each_tensor_in_its_range() {
    let gpu = gpu();
    let chunk = plimsoll_kernels_wgsl::kernels::reduce::SQUARES_CHUNK as usize;
    let long: Vec<f32> = (0..2 * chunk + 5)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut with_nan = vec![0.5f32; 9];
    with_nan[4] = f32::NAN;
    let head = param(&gpu, &[3.0, -1.5], &[2]);
    let small = param(&gpu, &[1.0, -2.0, 3.5], &[3]);
    let big = param(&gpu, &long, &[long.len()]);
    let nan = param(&gpu, &with_nan, &[9]);
    assert!(matches!(
        Tensor::with_sums_of_squares(Some(&head), &[SquaresOf::Tensor(&small)]),
        Err(Error::InvalidArgument {
            op: "with_sums_of_squares",
            ..
        })
    ));
    let _no_grad = plimsoll_autograd::no_grad();
    let parts = [&small, &big, &nan].map(SquaresOf::Tensor);
    let (all, ranges) = Tensor::with_sums_of_squares(Some(&head), &parts).unwrap();
    assert_eq!(ranges, vec![2..3, 3..6, 6..7]);
    let values = all.to_vec().unwrap();
    assert_eq!(values.len(), 7);
    assert_eq!(&values[..2], &[3.0, -1.5]);
    let sum = |r: &std::ops::Range<usize>| -> f64 {
        values[r.clone()].iter().map(|&v| f64::from(v)).sum()
    };
    let want = |x: &[f32]| x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
    assert_eq!(sum(&ranges[0]), 17.25);
    let (got, oracle) = (sum(&ranges[1]), want(&long));
    assert!(
        (got - oracle).abs() <= 1e-5 * oracle,
        "{got} against {oracle}"
    );
    assert!(sum(&ranges[2]).is_nan());
    let (none, empty) = Tensor::with_sums_of_squares(None, &[SquaresOf::Tensor(&small)]).unwrap();
    assert_eq!(none.to_vec().unwrap(), vec![17.25]);
    assert_eq!((empty.len(), empty[0].clone()), (1, 0..1));
    // The checked form: the same values, then the nonfinite flags [any, first index] as u32
    // bits, on the device: the NaN's range starts at 6.
    let (checked, same) = Tensor::with_sums_of_squares_checked(Some(&head), &parts).unwrap();
    assert_eq!(same, ranges);
    let flagged = checked.to_vec().unwrap();
    assert_eq!(flagged.len(), 9);
    assert_eq!(&flagged[..2], &values[..2]);
    assert_eq!([flagged[7].to_bits(), flagged[8].to_bits()], [1, 6]);
    let finite = [&small, &big].map(SquaresOf::Tensor);
    let (clean, _) = Tensor::with_sums_of_squares_checked(Some(&head), &finite).unwrap();
    let clean = clean.to_vec().unwrap();
    assert_eq!(clean[clean.len() - 2].to_bits(), 0, "nothing non-finite");
}
