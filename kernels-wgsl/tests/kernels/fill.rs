use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, assert_close, gpu};
use plimsoll_kernels_wgsl::{Category, Error, kernels, reference};

#[test]
fn fill_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(11);
    for len in [1usize, 255, 257, 1000, 70_001] {
        let initial = rng.vec_f32(len + 9, -3.0, 3.0);
        let buf = gpu
            .upload(&initial, Category::Temporary, "fill out")
            .unwrap();
        let (offset, count) = (3usize, len);
        let value = rng.f32_in(-5.0, 5.0);
        let out = buf.slice(offset as u64, count as u64).unwrap();
        kernels::fill::fill(&gpu, out, value).unwrap();
        let got: Vec<f32> = gpu.read_all(&buf, DEADLINE).unwrap();
        let mut want = initial.clone();
        reference::fill::fill(&mut want, offset, count, value);
        assert_close(&format!("fill len {len}"), &got, &want, 0.0, 0.0);
    }
}

#[test]
fn fill_u32_writes_exact_words_and_rejects_out_of_range() {
    let gpu = gpu();
    let buf = gpu.alloc_elements(333, Category::Input, "targets").unwrap();
    kernels::fill::fill_u32(&gpu, buf.slice(0, 333).unwrap(), 0xDEAD_BEEF).unwrap();
    let got: Vec<u32> = gpu.read_all(&buf, DEADLINE).unwrap();
    assert!(got.iter().all(|&w| w == 0xDEAD_BEEF));
    // Elements 300..334 of a 333-element buffer: refused when the slice is made.
    let err = buf.slice(300, 34).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // A sub-slice past the end of its slice is refused too.
    let tail = buf.slice(300, 33).unwrap();
    let err = tail.slice(1, 33).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}
