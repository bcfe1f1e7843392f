//! `reduce` launchers against `reference::reduce`.
// Helpers outside #[test] fns unwrap too: a failed unwrap is a failed test.

use plimsoll_kernels_wgsl::kernels::reduce::{self, AxisView};
use plimsoll_kernels_wgsl::kernels::{check_loop_limit, largest_within};
use plimsoll_kernels_wgsl::reference::reduce as cpu;
use plimsoll_kernels_wgsl::testing::{
    DEADLINE, Rng, assert_close, assert_loop_limit, gpu, loop_limit_or_skip, scratch, sum_atol,
};
use plimsoll_kernels_wgsl::{Category, Error, Gpu};

/// Integers in -3..=3 (ties are common) with a NaN every 211 elements, from index 5.
fn max_input(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            if i % 211 == 5 {
                f32::NAN
            } else {
                rng.below(7) as f32 - 3.0
            }
        })
        .collect()
}

/// Uploads `data` behind `offset` random elements and 2 more after.
fn upload_at(
    gpu: &Gpu,
    rng: &mut Rng,
    data: &[f32],
    offset: usize,
) -> plimsoll_kernels_wgsl::DeviceBuffer {
    let mut buf = rng.vec_f32(offset + data.len() + 2, -9.0, 9.0);
    buf[offset..offset + data.len()].copy_from_slice(data);
    gpu.upload(&buf, Category::Activation, "x").unwrap()
}

/// `[sentinel; at] ++ values ++ [sentinel; 3]`: what an output buffer should hold.
fn framed<T: Copy>(sentinel: T, at: usize, values: &[T]) -> Vec<T> {
    let mut v = vec![sentinel; at];
    v.extend_from_slice(values);
    v.extend([sentinel; 3]);
    v
}

#[test]
fn reduce_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(61);
    let cases: [(&[usize], usize); 7] = [
        (&[7, 33, 65], 0),
        (&[7, 33, 65], 1),
        (&[7, 33, 65], 2),
        (&[3, 1000, 5], 1), // sums of 1000 terms
        (&[70_001], 0),     // one invocation, 70_001 terms
        (&[1], 0),
        (&[257, 1], 1), // axis of extent 1
    ];
    for (shape, axis) in cases {
        let name = format!("reduce {shape:?} axis {axis}");
        let view = AxisView::of_shape(shape, axis).unwrap();
        let (n, count) = (view.input_len(), view.output_len());
        let x = rng.vec_f32(n, -2.0, 2.0);
        let x_gpu = upload_at(&gpu, &mut rng, &x, 3);
        // sum at offset 2 and mean at offset count + 5 of one buffer.
        let out_gpu = gpu
            .upload(&vec![-7.0f32; 2 * count + 8], Category::Activation, "out")
            .unwrap();
        let mean_at = count + 5;
        let x_s = x_gpu.slice(3, n as u64).unwrap();
        let sum_out = out_gpu.slice(2, count as u64).unwrap();
        let mean_out = out_gpu.slice(mean_at as u64, count as u64).unwrap();
        reduce::sum_axis(&gpu, sum_out, x_s, shape, axis).unwrap();
        reduce::mean_axis(&gpu, mean_out, x_s, shape, axis).unwrap();
        let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
        let mut want = vec![-7.0f32; 2 * count + 8];
        want[2..2 + count].copy_from_slice(&cpu::sum_axis(&x, view));
        want[mean_at..mean_at + count].copy_from_slice(&cpu::mean_axis(&x, view));
        // One tolerance for both: the mean's error is the sum's divided by axis_len.
        let atol = sum_atol(view.axis_len, 2.0);
        assert_close(&format!("{name} sum/mean"), &got, &want, atol, 1e-5);

        // max with NaNs and ties, then its backward through the returned indices.
        let xm = max_input(&mut rng, n);
        let xm_gpu = upload_at(&gpu, &mut rng, &xm, 1);
        let max_gpu = gpu
            .upload(&vec![-7.0f32; count + 5], Category::Activation, "max")
            .unwrap();
        let idx_gpu = gpu
            .upload(
                &vec![0xAAAA_AAAAu32; count + 4],
                Category::Activation,
                "idx",
            )
            .unwrap();
        let max_out = max_gpu.slice(2, count as u64).unwrap();
        let idx_s = idx_gpu.slice(1, count as u64).unwrap();
        let xm_s = xm_gpu.slice(1, n as u64).unwrap();
        reduce::max_axis(&gpu, max_out, idx_s, xm_s, shape, axis).unwrap();
        let got_max: Vec<f32> = gpu.read_all(&max_gpu, DEADLINE).unwrap();
        let got_idx: Vec<u32> = gpu.read_all(&idx_gpu, DEADLINE).unwrap();
        let (want_max, want_idx) = cpu::max_axis(&xm, view);
        assert_close(
            &format!("{name} max"),
            &got_max,
            &framed(-7.0, 2, &want_max),
            0.0,
            0.0,
        );
        assert_eq!(got_idx, framed(0xAAAA_AAAA, 1, &want_idx), "{name} arg-max");

        let dy = rng.vec_f32(count, -2.0, 2.0);
        let dy_gpu = upload_at(&gpu, &mut rng, &dy, 4);
        let dx_gpu = gpu
            .upload(&vec![-7.0f32; n + 6], Category::Gradient, "dx")
            .unwrap();
        let dx_s = dx_gpu.slice(3, n as u64).unwrap();
        let dy_s = dy_gpu.slice(4, count as u64).unwrap();
        reduce::max_backward(&gpu, dx_s, dy_s, idx_s, shape, axis).unwrap();
        let got: Vec<f32> = gpu.read_all(&dx_gpu, DEADLINE).unwrap();
        let want = framed(-7.0, 3, &cpu::max_backward(&dy, &want_idx, view));
        assert_close(&format!("{name} max_backward"), &got, &want, 0.0, 0.0);
    }
}

/// `sum_squares_chunks`: one sum per `SQUARES_CHUNK`-element chunk, each against the f64 sum of its
/// chunk's squares, at a 4-aligned offset (vec4 loads) and at an odd one; a guard element on
/// each side of `out` stays untouched.
#[test]
fn sum_squares_chunks_match_reference_per_chunk() {
    let gpu = gpu();
    let mut rng = Rng::new(71);
    let chunk = reduce::SQUARES_CHUNK as usize;
    for len in [0usize, 5, chunk, chunk + 1, 3 * chunk - 3] {
        let x = rng.vec_f32(len, -2.0, 2.0);
        let chunks = reduce::squares_chunks(len as u64) as usize;
        assert_eq!(chunks, len.div_ceil(chunk).max(1), "len {len}");
        let want: Vec<f32> = (0..chunks)
            .map(|w| {
                let part = &x[(w * chunk).min(len)..((w + 1) * chunk).min(len)];
                part.iter()
                    .map(|&v| f64::from(v) * f64::from(v))
                    .sum::<f64>() as f32
            })
            .collect();
        for offset in [4usize, 3] {
            let x_gpu = upload_at(&gpu, &mut rng, &x, offset);
            let out_gpu = gpu
                .upload(&vec![-7.0f32; chunks + 2], Category::Activation, "out")
                .unwrap();
            let x_s = x_gpu.slice(offset as u64, len as u64).unwrap();
            let out_s = out_gpu.slice(1, chunks as u64).unwrap();
            reduce::sum_squares_chunks(&gpu, out_s, x_s).unwrap();
            let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
            let mut framed = vec![-7.0f32];
            framed.extend(&want);
            framed.push(-7.0);
            let name = format!("sum_squares_chunks len {len} offset {offset}");
            assert_close(&name, &got, &framed, sum_atol(chunk, 4.0), 1e-5);
        }
    }
}

#[test]
fn reduce_all_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(67);
    for len in [1usize, 7, 255, 257, 1000, 16_384, 16_385, 70_001] {
        let name = format!("reduce all len {len}");
        let x = rng.vec_f32(len, -2.0, 2.0);
        let x_gpu = upload_at(&gpu, &mut rng, &x, 5);
        let out_gpu = gpu
            .upload(&[-7.0f32; 6], Category::Activation, "out")
            .unwrap();
        let x_s = x_gpu.slice(5, len as u64).unwrap();
        reduce::sum_all(&gpu, out_gpu.slice(1, 1).unwrap(), x_s).unwrap();
        reduce::mean_all(&gpu, out_gpu.slice(3, 1).unwrap(), x_s).unwrap();
        reduce::sum_squares_all(&gpu, out_gpu.slice(4, 1).unwrap(), x_s).unwrap();
        // At a 4-aligned offset: the vec4 entry point, its last vec4 partly past the end.
        let x4_gpu = upload_at(&gpu, &mut rng, &x, 4);
        let x4_s = x4_gpu.slice(4, len as u64).unwrap();
        reduce::sum_squares_all(&gpu, out_gpu.slice(5, 1).unwrap(), x4_s).unwrap();
        let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
        let (sum, mean) = (cpu::sum_all(&x), cpu::mean_all(&x));
        // The oracle for the squares: the plain sum of the squares, in f64.
        let squares = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() as f32;
        let want = [-7.0, sum, -7.0, mean, squares, squares];
        assert_close(
            &format!("{name} sum/mean/sum of squares"),
            &got,
            &want,
            sum_atol(len, 4.0),
            1e-5,
        );

        // Ties everywhere (integers), and once with NaNs (the first NaN wins).
        let ties: Vec<f32> = (0..len).map(|_| rng.below(7) as f32 - 3.0).collect();
        for xm in [ties, max_input(&mut rng, len)] {
            let xm_gpu = upload_at(&gpu, &mut rng, &xm, 2);
            let max_gpu = gpu
                .upload(&[-7.0f32; 3], Category::Activation, "max")
                .unwrap();
            let idx_gpu = gpu.upload(&[7u32; 3], Category::Activation, "idx").unwrap();
            let idx_s = idx_gpu.slice(2, 1).unwrap();
            let xm_s = xm_gpu.slice(2, len as u64).unwrap();
            reduce::max_all(&gpu, max_gpu.slice(1, 1).unwrap(), idx_s, xm_s).unwrap();
            let got_max: Vec<f32> = gpu.read_all(&max_gpu, DEADLINE).unwrap();
            let got_idx: Vec<u32> = gpu.read_all(&idx_gpu, DEADLINE).unwrap();
            let (want_max, want_idx) = cpu::max_all(&xm);
            assert_close(
                &format!("{name} max_all"),
                &got_max,
                &[-7.0, want_max, -7.0],
                0.0,
                0.0,
            );
            assert_eq!(got_idx, [7, 7, want_idx], "{name} max_all index");
            // The backward of max_all is max_backward over shape [len], axis 0.
            let dy_gpu = gpu
                .upload(&[0.0f32, 1.5], Category::Gradient, "dy")
                .unwrap();
            let dx_gpu = gpu
                .alloc_elements(len as u64 + 1, Category::Gradient, "dx")
                .unwrap();
            let dx_s = dx_gpu.slice(1, len as u64).unwrap();
            let dy_s = dy_gpu.slice(1, 1).unwrap();
            reduce::max_backward(&gpu, dx_s, dy_s, idx_s, &[len], 0).unwrap();
            let got: Vec<f32> = gpu.read(&dx_gpu, 1, len as u64, DEADLINE).unwrap();
            let want =
                cpu::max_backward(&[1.5], &[want_idx], AxisView::of_shape(&[len], 0).unwrap());
            assert_close(&format!("{name} max_all backward"), &got, &want, 0.0, 0.0);
        }
    }
}

#[test]
fn sum_to_shape_matches_reference() {
    let gpu = gpu();
    let mut rng = Rng::new(71);
    let cases: [(&[usize], &[usize]); 8] = [
        (&[4, 5, 6], &[5, 1]), // axes 0 and 2: two dispatches through a scratch buffer
        (&[4, 5, 6], &[6]),    // axes 0 and 1 merged into one
        (&[4, 5, 6], &[]),     // everything
        (&[4, 5, 6], &[4, 1, 6]), // the middle axis
        (&[4, 5, 6], &[4, 5, 6]), // nothing to sum: a copy
        (&[2, 1, 3, 1, 4, 5], &[3, 1, 1, 5]),
        (&[3, 700, 1, 2], &[3, 1, 1, 2]),
        (&[9, 8, 7, 6], &[1, 8, 1, 6]),
    ];
    for (from, to) in cases {
        let n: usize = from.iter().product();
        let m: usize = to.iter().product();
        let x = rng.vec_f32(n, -2.0, 2.0);
        let x_gpu = upload_at(&gpu, &mut rng, &x, 1);
        let out_gpu = gpu
            .upload(&vec![-7.0f32; m + 5], Category::Gradient, "out")
            .unwrap();
        let out_s = out_gpu.slice(2, m as u64).unwrap();
        let x_s = x_gpu.slice(1, n as u64).unwrap();
        reduce::sum_to_shape(&gpu, out_s, x_s, from, to).unwrap();
        let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
        let want = framed(-7.0, 2, &cpu::sum_to_shape(&x, from, to).unwrap());
        assert_close(
            &format!("sum_to_shape {from:?} -> {to:?}"),
            &got,
            &want,
            sum_atol(n / m, 2.0),
            1e-5,
        );
    }
}

#[test]
fn reduce_rejects_bad_axis_and_shapes() {
    let gpu = gpu();
    let x = gpu.alloc_elements(60, Category::Temporary, "x").unwrap();
    let out = gpu.alloc_elements(60, Category::Temporary, "out").unwrap();
    let err =
        reduce::sum_axis(&gpu, out.slice(0, 12).unwrap(), x.whole(), &[3, 4, 5], 3).unwrap_err();
    assert!(err.to_string().contains("axis 3 out of range"), "{err}");
    // x = elements 1..61 of a 60-element buffer: the slice cannot be made ...
    let err = x.slice(1, 60).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the launcher refuses the one element shorter slice that fits.
    let (max_out, max_idx) = (out.slice(0, 20).unwrap(), out.slice(20, 20).unwrap());
    let err = reduce::max_axis(
        &gpu,
        max_out,
        max_idx,
        x.slice(1, 59).unwrap(),
        &[3, 4, 5],
        0,
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("59 elements given"), "{err}");
    // Outputs of the wrong length.
    let err = reduce::max_axis(
        &gpu,
        out.slice(0, 19).unwrap(),
        max_idx,
        x.whole(),
        &[3, 4, 5],
        0,
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = reduce::max_axis(
        &gpu,
        max_out,
        out.slice(20, 21).unwrap(),
        x.whole(),
        &[3, 4, 5],
        0,
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = reduce::sum_axis(&gpu, out.whole(), x.whole(), &[3, 4, 5], 0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = reduce::max_backward(
        &gpu,
        out.whole(),
        max_out,
        x.slice(0, 21).unwrap(),
        &[3, 4, 5],
        0,
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = reduce::sum_all(&gpu, out.slice(0, 2).unwrap(), x.whole()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = reduce::max_all(
        &gpu,
        out.slice(0, 1).unwrap(),
        out.slice(1, 0).unwrap(),
        x.whole(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Shapes that do not broadcast (slices of the right lengths, so the shapes are what fails).
    let err = reduce::sum_to_shape(
        &gpu,
        out.slice(0, 10).unwrap(),
        x.whole(),
        &[3, 4, 5],
        &[2, 5],
    )
    .unwrap_err();
    assert!(err.to_string().contains("does not broadcast"), "{err}");
    let (out20, x20) = (out.slice(0, 20).unwrap(), x.slice(0, 20).unwrap());
    let err = reduce::sum_to_shape(&gpu, out20, x20, &[4, 5], &[1, 4, 5]).unwrap_err();
    assert!(err.to_string().contains("does not broadcast"), "{err}");
}

#[test]
fn reduce_long_axis_is_not_truncated() {
    // Lavapipe stops a shader after 65535 loop iterations: a flat loop over this axis summed
    // only its first 65535 terms. Positive terms, so the f32 sum's relative error is about
    // u sqrt(n) = 3e-5 (rms ~2e-5); rtol 1e-4 is five sigma.
    let gpu = gpu();
    let mut rng = Rng::new(73);
    let n = 300_000;
    let mut x = rng.vec_f32(n, 0.5, 1.5);
    x[n - 3] = 2.0; // the max sits past any truncation
    let x_gpu = upload_at(&gpu, &mut rng, &x, 1);
    let out = gpu.alloc_elements(2, Category::Activation, "out").unwrap();
    let idx = gpu.alloc_elements(1, Category::Activation, "idx").unwrap();
    let x_s = x_gpu.slice(1, n as u64).unwrap();
    reduce::sum_axis(&gpu, out.slice(0, 1).unwrap(), x_s, &[n], 0).unwrap();
    reduce::max_axis(&gpu, out.slice(1, 1).unwrap(), idx.whole(), x_s, &[n], 0).unwrap();
    let got: Vec<f32> = gpu.read_all(&out, DEADLINE).unwrap();
    let got_idx: Vec<u32> = gpu.read_all(&idx, DEADLINE).unwrap();
    assert_close(
        "sum_axis [300_000]",
        &got,
        &[cpu::sum_all(&x), 2.0],
        0.0,
        1e-4,
    );
    assert_eq!(got_idx, [n as u32 - 3]);
    let long = reduce::MAX_AXIS_LEN + 1;
    // (The axis length is checked first: no slice of `long` elements is needed.)
    let err =
        reduce::sum_axis(&gpu, out.slice(0, 1).unwrap(), x_gpu.whole(), &[long], 0).unwrap_err();
    assert!(err.to_string().contains("MAX_AXIS_LEN"), "{err}");
}

// The *_all launchers loop len / 1024 + 16 times: the limit (about 67 million elements on
// lavapipe) is past what one binding holds there. The length now comes from the input slice, and
// a slice lies inside one buffer, so where no buffer of `largest + 1` elements can be allocated
// the refusal cannot be reached through the launchers: then this checks that such a buffer is
// refused (TooLarge) and that the launchers' own check (`check_loop_limit` with
// `all_loop_iterations`) refuses the length with the right hint. Where such a buffer can be
// allocated, the launchers must refuse it (the limit is checked before the output lengths).
#[test]
fn reduce_all_refuses_lengths_over_the_loop_limit() {
    let gpu = gpu();
    let Some(limit) = loop_limit_or_skip(&gpu, "reduce_all_refuses_lengths_over_the_loop_limit")
    else {
        return;
    };
    let largest = largest_within(limit, reduce::all_loop_iterations);
    for op in ["sum_all", "mean_all", "max_all"] {
        let check = check_loop_limit(&gpu, op, "len", largest + 1, reduce::all_loop_iterations);
        assert_loop_limit(check, "len", largest);
        check_loop_limit(&gpu, op, "len", largest, reduce::all_loop_iterations).unwrap();
    }
    let t = gpu.alloc_elements(1, Category::Temporary, "tiny").unwrap();
    let too_long = (largest + 1) * 4;
    if too_long > gpu.max_buffer_bytes() {
        eprintln!(
            "reduce: {} elements exceed the largest buffer ({} bytes): the launchers cannot be \
             asked for them",
            largest + 1,
            gpu.max_buffer_bytes()
        );
        let err = gpu
            .alloc_elements(largest + 1, Category::Temporary, "long")
            .unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        return;
    }
    let long = scratch(&gpu, largest + 1, "long");
    let x = long.whole();
    assert_loop_limit(reduce::sum_all(&gpu, t.whole(), x), "len", largest);
    assert_loop_limit(reduce::mean_all(&gpu, t.whole(), x), "len", largest);
    let max = reduce::max_all(&gpu, t.whole(), t.whole(), x);
    assert_loop_limit(max, "len", largest);
}
