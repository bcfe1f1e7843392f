use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, assert_close, gpu};
use plimsoll_kernels_wgsl::{Category, Error, kernels, reference};

#[test]
fn copy_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(21);
    // (src, dst) offsets: odd (the scalar kernel), then multiples of 4 (vec4s and a tail).
    for (src_at, dst_at) in [(5, 2), (4, 8)] {
        for len in [1usize, 255, 257, 1000, 1003, 70_001] {
            let src = rng.vec_f32(len + src_at, -3.0, 3.0);
            let dst0 = rng.vec_f32(len + dst_at + 5, -3.0, 3.0);
            let src_gpu = gpu.upload(&src, Category::Temporary, "copy src").unwrap();
            let dst_gpu = gpu.upload(&dst0, Category::Temporary, "copy dst").unwrap();
            let (src_s, dst_s) = (
                src_gpu.slice(src_at as u64, len as u64).unwrap(),
                dst_gpu.slice(dst_at as u64, len as u64).unwrap(),
            );
            kernels::copy::copy(&gpu, dst_s, src_s).unwrap();
            let got: Vec<f32> = gpu.read_all(&dst_gpu, DEADLINE).unwrap();
            let mut want = dst0.clone();
            reference::copy::copy(&src, src_at, &mut want, dst_at, len);
            assert_close(
                &format!("copy len {len} at {src_at} -> {dst_at}"),
                &got,
                &want,
                0.0,
                0.0,
            );
        }
    }
}

#[test]
fn strided_copy_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(31);
    // (shape of the source, permutation of its axes)
    let cases: [(&[usize], &[usize]); 10] = [
        (&[37, 53], &[1, 0]),     // transpose
        (&[3, 5, 7], &[2, 0, 1]), // permute
        (&[2, 3, 4, 5], &[3, 1, 2, 0]),
        (&[2, 3, 1, 5, 3, 2], &[5, 4, 3, 2, 1, 0]), // 6-d reversal
        (&[301], &[0]),
        // Attention's (B, T, 3, H, D) -> (3, B, H, T, D): the innermost D stays contiguous
        // (vec4s when aligned).
        (&[2, 6, 3, 4, 8], &[2, 0, 3, 1, 4]),
        (&[5, 12], &[0, 1]), // the identity: merged into one contiguous run
        (&[4, 1, 3, 8], &[2, 1, 0, 3]), // an extent of 1, and a merge of the last two
        // Runs of one vec4 (one invocation each), and of 65 (past the longest run per
        // invocation): strided_copy_v4 where aligned; runs of 2 to 64 take the rows variant.
        (&[3, 7, 4], &[1, 0, 2]),
        (&[2, 3, 260], &[1, 0, 2]),
    ];
    for ((shape, perm), (src_offset, dst_at)) in cases
        .into_iter()
        .flat_map(|case| [(case, (3, 1)), (case, (4, 4))])
    {
        let len: usize = shape.iter().product();
        let src = rng.vec_f32(len + src_offset, -3.0, 3.0);
        // Row-major strides of the source, then permuted: a gather that realises the permutation.
        let mut strides = vec![1usize; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let out_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
        let src_gpu = gpu
            .upload(&src, Category::Activation, "strided src")
            .unwrap();
        let dst_gpu = gpu
            .alloc_elements((len + dst_at) as u64, Category::Activation, "strided dst")
            .unwrap();
        kernels::fill::fill(&gpu, dst_gpu.whole(), -7.0).unwrap();
        let to_u32 = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<_>>();
        kernels::copy::strided_copy(
            &gpu,
            dst_gpu.slice(dst_at as u64, len as u64).unwrap(),
            src_gpu.slice(src_offset as u64, len as u64).unwrap(),
            &to_u32(&out_shape),
            &to_u32(&out_strides),
        )
        .unwrap();
        let got: Vec<f32> = gpu.read_all(&dst_gpu, DEADLINE).unwrap();
        let mut want = vec![-7.0; len + dst_at];
        reference::copy::strided_copy(
            &src,
            src_offset,
            &out_shape,
            &out_strides,
            &mut want,
            dst_at,
        );
        assert_close(
            &format!("strided_copy {shape:?} perm {perm:?}"),
            &got,
            &want,
            0.0,
            0.0,
        );
    }
}

#[test]
fn copy_within_one_segment_and_bad_ranges() {
    let gpu = gpu();
    let data: Vec<f32> = (0..100).map(|i| i as f32 + 0.5).collect();
    let a = gpu.upload(&data, Category::Temporary, "a").unwrap();
    let b = gpu.alloc_elements(100, Category::Temporary, "b").unwrap();
    assert_eq!(
        a.placement().0,
        b.placement().0,
        "small buffers share a segment"
    );
    kernels::copy::copy(&gpu, b.slice(0, 100).unwrap(), a.slice(0, 100).unwrap()).unwrap();
    // Same buffer, disjoint ranges.
    kernels::copy::copy(&gpu, b.slice(50, 50).unwrap(), b.slice(0, 50).unwrap()).unwrap();
    let got: Vec<f32> = gpu.read_all(&b, DEADLINE).unwrap();
    let mut want = data.clone();
    want.copy_within(0..50, 50);
    assert_close("copy same segment", &got, &want, 0.0, 0.0);
    // Source elements 1..101 of a 100-element buffer: refused when the slice is made.
    let err = a.slice(1, 100).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Source and destination of different lengths: refused by the launcher.
    let err = kernels::copy::copy(&gpu, b.whole(), a.slice(1, 99).unwrap()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // A gather whose last read (9*10 + 10*1 = element 100) lies past the source's 100 elements,
    // into a destination of the right length (110).
    let c = gpu.alloc_elements(110, Category::Temporary, "c").unwrap();
    let err =
        kernels::copy::strided_copy(&gpu, c.whole(), a.whole(), &[10, 11], &[10, 1]).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("src"),
        "{err}"
    );
    // A destination of the wrong length for the shape.
    let err =
        kernels::copy::strided_copy(&gpu, b.whole(), a.whole(), &[10, 11], &[10, 1]).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. })
            && err.to_string().contains("dst: 100 elements given")
            && err.to_string().contains("110 needed"),
        "{err}"
    );
}
