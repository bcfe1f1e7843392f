//! Gradient clipping: the norm against a CPU norm, and gradients in host memory counted and
//! clipped where they are.

use plimsoll_autograd::Tensor;
use plimsoll_kernels_wgsl::testing::{assert_close, gpu};
use plimsoll_nn::{Error, clip_grad_norm, grad_norm, zero_grad};

use crate::common::{param, set_grad};

#[test]
fn clip_grad_norm_matches_cpu_norm() {
    let gpu = gpu();
    let a = param(&gpu, &[0.0; 3], &[3], "a");
    let b = param(&gpu, &[0.0; 4], &[2, 2], "b");
    let c = param(&gpu, &[0.0; 2], &[2], "c"); // no gradient: counts as zero
    let params = vec![
        ("a".to_string(), a.clone()),
        ("b".to_string(), b.clone()),
        ("c".to_string(), c),
    ];
    let ga = [3.0f32, -1.0, 2.0];
    let gb = [0.5f32, -4.0, 1.5, 2.5];
    set_grad(&gpu, &a, &ga);
    set_grad(&gpu, &b, &gb);
    let norm: f64 = ga
        .iter()
        .chain(&gb)
        .map(|&v| f64::from(v).powi(2))
        .sum::<f64>()
        .sqrt();
    assert_close(
        "grad_norm",
        &[grad_norm(&params).unwrap()],
        &[norm],
        1e-6,
        1e-6,
    );
    // Under the maximum: untouched.
    assert_close(
        "norm",
        &[clip_grad_norm(&params, 100.0).unwrap()],
        &[norm],
        1e-6,
        1e-6,
    );
    assert_eq!(a.grad().unwrap().to_vec().unwrap(), ga);
    // Over it: scaled by max / (norm + 1e-6), reporting the norm before clipping.
    assert_close(
        "norm",
        &[clip_grad_norm(&params, 2.0).unwrap()],
        &[norm],
        1e-6,
        1e-6,
    );
    let k = 2.0 / (norm + 1e-6);
    let want: Vec<f64> = ga.iter().map(|&v| f64::from(v) * k).collect();
    assert_close(
        "clipped a",
        &a.grad().unwrap().to_vec().unwrap(),
        &want,
        1e-6,
        1e-5,
    );
    assert_close(
        "norm after",
        &[grad_norm(&params).unwrap()],
        &[2.0],
        1e-5,
        1e-5,
    );
    let err = clip_grad_norm(&params, 0.0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                what: "clip_grad_norm",
                ..
            }
        ) && err.to_string().contains("max_norm 0 must be positive"),
        "{err}"
    );
    zero_grad(&params);
    assert_eq!(grad_norm(&params).unwrap(), 0.0);
}

/// A gradient in host memory (parameter streaming) counts in the norm and is clipped there,
/// as the same gradient on the device is.
#[test]
fn clip_grad_norm_reaches_gradients_in_host_memory() {
    let gpu = gpu();
    let run = |evict: bool| {
        let a = param(&gpu, &[0.0; 3], &[3], "a");
        let b = param(&gpu, &[0.0; 4], &[2, 2], "b");
        set_grad(&gpu, &a, &[3.0, -1.0, 2.0]);
        set_grad(&gpu, &b, &[0.5, -4.0, 1.5, 2.5]);
        let gb = b.grad().unwrap();
        if evict {
            Tensor::evict(&[&gb], plimsoll_kernels_wgsl::Evict::ReadBack).unwrap();
        }
        let params = vec![("a".to_string(), a.clone()), ("b".to_string(), b)];
        let norm = clip_grad_norm(&params, 2.0).unwrap();
        assert_eq!(gb.is_resident(), !evict);
        let after = grad_norm(&params).unwrap();
        (
            norm,
            after,
            a.grad().unwrap().to_vec().unwrap(),
            gb.to_vec().unwrap(),
        )
    };
    let (on_device, on_host) = (run(false), run(true));
    // The clipped values bit for bit; the norms as summed (the device's in f32 partial sums).
    assert_eq!((&on_host.2, &on_host.3), (&on_device.2, &on_device.3));
    for (host, device) in [(on_host.0, on_device.0), (on_host.1, on_device.1)] {
        assert!(
            (host - device).abs() <= 1e-6 * device,
            "{on_host:?} vs {on_device:?}"
        );
    }
    assert!((on_device.1 - 2.0).abs() < 1e-5, "{on_device:?}");
}
