use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, assert_close, gpu, scratch};
use plimsoll_kernels_wgsl::{Category, Error, kernels, reference};

#[test]
fn dropout_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(23);
    for (len, p, seed) in [
        (1usize, 0.5f32, 1u64),
        (257, 0.1, 7),
        (1000, 0.5, u64::MAX),
        (70_001, 0.9, 42),
    ] {
        let x = rng.vec_f32(len, -2.0, 2.0);
        let x_gpu = gpu.upload(&x, Category::Temporary, "x").unwrap();
        let y_gpu = scratch(&gpu, len as u64 + 3, "y");
        let y = y_gpu.slice(3, len as u64).unwrap();
        kernels::dropout::dropout(&gpu, y, x_gpu.whole(), p, seed).unwrap();
        let got: Vec<f32> = gpu.read(&y_gpu, 3, len as u64, DEADLINE).unwrap();
        let want = reference::dropout::dropout(&x, p, seed);
        assert_close(&format!("dropout len {len} p {p}"), &got, &want, 0.0, 0.0);
        if len > 1000 {
            let dropped = want.iter().filter(|&&v| v == 0.0).count() as f32 / len as f32;
            assert!((dropped - p).abs() < 0.02, "dropped {dropped}, p {p}");
        }
    }
    let buf = gpu.alloc_elements(4, Category::Temporary, "b").unwrap();
    let err = kernels::dropout::dropout(&gpu, buf.whole(), buf.whole(), 1.0, 0).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. })
            && err.to_string().contains("probability 1 outside [0, 1)"),
        "{err}"
    );
    // y and x of different lengths are refused.
    let short = buf.slice(0, 3).unwrap();
    let err = kernels::dropout::dropout(&gpu, short, buf.whole(), 0.5, 0).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. })
            && err.to_string().contains("x: 4 elements given")
            && err.to_string().contains("3 needed"),
        "{err}"
    );
}
