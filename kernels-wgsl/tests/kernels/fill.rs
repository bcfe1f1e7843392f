use plimsoll_kernels_wgsl::{Category, kernels, reference};

use crate::common::{DEADLINE, Rng, assert_close, gpu};

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
        kernels::fill::fill(&gpu, &buf, offset as u64, count as u64, value).unwrap();
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
    kernels::fill::fill_u32(&gpu, &buf, 0, 333, 0xDEAD_BEEF).unwrap();
    let got: Vec<u32> = gpu.read_all(&buf, DEADLINE).unwrap();
    assert!(got.iter().all(|&w| w == 0xDEAD_BEEF));
    let err = kernels::fill::fill(&gpu, &buf, 300, 34, 1.0).unwrap_err();
    assert!(err.to_string().contains("outside buffer"), "{err}");
}
