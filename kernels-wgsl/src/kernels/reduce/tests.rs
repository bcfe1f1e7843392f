//! The `reduce` launchers against [`reference`](super::reference) (axis and whole-tensor sums,
//! means, maxima and their backward, sums of squares, `sum_to_shape`), their argument and loop
//! limit checks, and the reference itself against hand-worked values.

use super::AxisView;
use super::reference as cpu;
use crate::buffer::DeviceBuffer;
use crate::kernels::{RowLayout, check_loop_limit, largest_within};
use crate::testing::{DEADLINE, assert_close, assert_exact, assert_loop_limit, gpu_and_rng, gpu_and_temporaries, with_loop_limit, Rng, scratch, sum_atol};
use crate::{Category, Error, Gpu, Result};

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
) -> Result<DeviceBuffer> {
    let mut buf = rng.vec_f32(offset + data.len() + 2, -9.0, 9.0);
    buf[offset..offset + data.len()].copy_from_slice(data);
    gpu.upload(&buf, Category::Activation, "x")
}

/// `[sentinel; at] ++ values ++ [sentinel; 3]`: what an output buffer should hold.
fn framed<T: Copy>(sentinel: T, at: usize, values: &[T]) -> Vec<T> {
    let mut v = vec![sentinel; at];
    v.extend_from_slice(values);
    v.extend([sentinel; 3]);
    v
}

#[test]
pub(crate) fn matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(61);
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
        let view = AxisView::of_shape(shape, axis).expect("axis in range");
        let (n, count) = (view.input_len(), view.output_len());
        let x = rng.vec_f32(n, -2.0, 2.0);
        let x_gpu = upload_at(&gpu, &mut rng, &x, 3)?;
        // sum at offset 2 and mean at offset count + 5 of one buffer.
        let out_gpu = gpu
            .upload(&vec![-7.0f32; 2 * count + 8], Category::Activation, "out")?;
        let mean_at = count + 5;
        let x_s = x_gpu.slice(3, n as u64)?;
        let sum_out = out_gpu.slice(2, count as u64)?;
        let mean_out = out_gpu.slice(mean_at as u64, count as u64)?;
        super::sum_axis(&gpu, sum_out, x_s, shape, axis)?;
        super::mean_axis(&gpu, mean_out, x_s, shape, axis)?;
        let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE)?;
        let mut want = vec![-7.0f32; 2 * count + 8];
        want[2..2 + count].copy_from_slice(&cpu::sum_axis(&x, view));
        want[mean_at..mean_at + count].copy_from_slice(&cpu::mean_axis(&x, view));
        // One tolerance for both: the mean's error is the sum's divided by axis_len.
        let atol = sum_atol(view.axis_len, 2.0);
        assert_close(&format!("{name} sum/mean"), &got, &want, atol, 1e-5);

        // max with NaNs and ties, then its backward through the returned indices.
        let xm = max_input(&mut rng, n);
        let xm_gpu = upload_at(&gpu, &mut rng, &xm, 1)?;
        let max_gpu = gpu
            .upload(&vec![-7.0f32; count + 5], Category::Activation, "max")?;
        let idx_gpu = gpu
            .upload(
                &vec![0xAAAA_AAAAu32; count + 4],
                Category::Activation,
                "idx",
            )?;
        let max_out = max_gpu.slice(2, count as u64)?;
        let idx_s = idx_gpu.slice(1, count as u64)?;
        let xm_s = xm_gpu.slice(1, n as u64)?;
        super::max_axis(&gpu, max_out, idx_s, xm_s, shape, axis)?;
        let got_max: Vec<f32> = gpu.read_all(&max_gpu, DEADLINE)?;
        let got_idx: Vec<u32> = gpu.read_all(&idx_gpu, DEADLINE)?;
        let (want_max, want_idx) = cpu::max_axis(&xm, view);
        assert_exact(&format!("{name} max"), &got_max, &framed(-7.0, 2, &want_max));
        assert_eq!(got_idx, framed(0xAAAA_AAAA, 1, &want_idx), "{name} arg-max");

        let dy = rng.vec_f32(count, -2.0, 2.0);
        let dy_gpu = upload_at(&gpu, &mut rng, &dy, 4)?;
        let dx_gpu = gpu
            .upload(&vec![-7.0f32; n + 6], Category::Gradient, "dx")?;
        let dx_s = dx_gpu.slice(3, n as u64)?;
        let dy_s = dy_gpu.slice(4, count as u64)?;
        super::max_backward(&gpu, dx_s, dy_s, idx_s, shape, axis)?;
        let got: Vec<f32> = gpu.read_all(&dx_gpu, DEADLINE)?;
        let want = framed(-7.0, 3, &cpu::max_backward(&dy, &want_idx, view));
        assert_exact(&format!("{name} max_backward"), &got, &want);
    }
    Ok(())
}

/// `sum_squares_chunks`: one sum per `SQUARES_CHUNK`-element chunk, each against the f64 sum of its
/// chunk's squares, at a 4-aligned offset (vec4 loads) and at an odd one, an invocation and (where
/// the device has subgroups) a subgroup per chunk; a guard element on each side of `out` stays
/// untouched.
#[test]
fn sum_squares_chunks_match_reference_per_chunk() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(71);
    let chunk = super::SQUARES_CHUNK as usize;
    for len in [0usize, 5, chunk, chunk + 1, 3 * chunk - 3] {
        let x = rng.vec_f32(len, -2.0, 2.0);
        let chunks = super::squares_chunks(len as u64) as usize;
        assert_eq!(chunks, len.div_ceil(chunk).max(1), "len {len}");
        let want: Vec<f32> = (0..chunks)
            .map(|w| {
                let part = &x[(w * chunk).min(len)..((w + 1) * chunk).min(len)];
                part.iter()
                    .map(|&v| f64::from(v) * f64::from(v))
                    .sum::<f64>() as f32
            })
            .collect();
        let mut layouts = vec![RowLayout::InvocationPerRow];
        if crate::kernels::subgroup_rows(&gpu).is_some() {
            layouts.push(RowLayout::SubgroupPerRow);
        }
        for (offset, layout) in [4usize, 3].into_iter().flat_map(|o| layouts.iter().map(move |&l| (o, l))) {
            let x_gpu = upload_at(&gpu, &mut rng, &x, offset)?;
            let out_gpu = gpu
                .upload(&vec![-7.0f32; chunks + 2], Category::Activation, "out")?;
            let x_s = x_gpu.slice(offset as u64, len as u64)?;
            let out_s = out_gpu.slice(1, chunks as u64)?;
            super::sum_squares_chunks_in(&gpu, layout, out_s, x_s)?;
            let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE)?;
            let mut framed = vec![-7.0f32];
            framed.extend(&want);
            framed.push(-7.0);
            let name = format!("sum_squares_chunks len {len} offset {offset} {layout:?}");
            assert_close(&name, &got, &framed, sum_atol(chunk, 4.0), 1e-5);
        }
        // A workgroup per chunk is not offered.
        let x_gpu = upload_at(&gpu, &mut rng, &x, 0)?;
        let out_gpu = gpu.alloc_elements(chunks as u64, Category::Activation, "out")?;
        let err = super::sum_squares_chunks_in(
            &gpu,
            RowLayout::WorkgroupPerRow,
            out_gpu.whole(),
            x_gpu.slice(0, len as u64)?,
        )
        .expect_err("must be refused");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    }
    Ok(())
}

#[test]
fn reduce_all_matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(67);
    for len in [1usize, 7, 255, 257, 1000, 16_384, 16_385, 70_001] {
        let name = format!("reduce all len {len}");
        let x = rng.vec_f32(len, -2.0, 2.0);
        let x_gpu = upload_at(&gpu, &mut rng, &x, 5)?;
        let out_gpu = gpu
            .upload(&[-7.0f32; 6], Category::Activation, "out")?;
        let x_s = x_gpu.slice(5, len as u64)?;
        super::sum_all(&gpu, out_gpu.slice(1, 1)?, x_s)?;
        super::mean_all(&gpu, out_gpu.slice(3, 1)?, x_s)?;
        super::sum_squares_all(&gpu, out_gpu.slice(4, 1)?, x_s)?;
        // At a 4-aligned offset: the vec4 entry point, its last vec4 partly past the end.
        let x4_gpu = upload_at(&gpu, &mut rng, &x, 4)?;
        let x4_s = x4_gpu.slice(4, len as u64)?;
        super::sum_squares_all(&gpu, out_gpu.slice(5, 1)?, x4_s)?;
        let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE)?;
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
            let xm_gpu = upload_at(&gpu, &mut rng, &xm, 2)?;
            let max_gpu = gpu
                .upload(&[-7.0f32; 3], Category::Activation, "max")?;
            let idx_gpu = gpu.upload(&[7u32; 3], Category::Activation, "idx")?;
            let idx_s = idx_gpu.slice(2, 1)?;
            let xm_s = xm_gpu.slice(2, len as u64)?;
            super::max_all(&gpu, max_gpu.slice(1, 1)?, idx_s, xm_s)?;
            let got_max: Vec<f32> = gpu.read_all(&max_gpu, DEADLINE)?;
            let got_idx: Vec<u32> = gpu.read_all(&idx_gpu, DEADLINE)?;
            let (want_max, want_idx) = cpu::max_all(&xm);
            assert_exact(&format!("{name} max_all"), &got_max, &[-7.0, want_max, -7.0]);
            assert_eq!(got_idx, [7, 7, want_idx], "{name} max_all index");
            // The backward of max_all is max_backward over shape [len], axis 0.
            let dy_gpu = gpu
                .upload(&[0.0f32, 1.5], Category::Gradient, "dy")?;
            let dx_gpu = gpu
                .alloc_elements(len as u64 + 1, Category::Gradient, "dx")?;
            let dx_s = dx_gpu.slice(1, len as u64)?;
            let dy_s = dy_gpu.slice(1, 1)?;
            super::max_backward(&gpu, dx_s, dy_s, idx_s, &[len], 0)?;
            let got: Vec<f32> = gpu.read(&dx_gpu, 1, len as u64, DEADLINE)?;
            let want =
                cpu::max_backward(&[1.5], &[want_idx], AxisView::of_shape(&[len], 0).expect("axis in range"));
            assert_exact(&format!("{name} max_all backward"), &got, &want);
        }
    }
    Ok(())
}

#[test]
fn sum_to_shape_matches_reference() -> Result<()> {
    let (gpu, mut rng) = gpu_and_rng(71);
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
        let x_gpu = upload_at(&gpu, &mut rng, &x, 1)?;
        let out_gpu = gpu
            .upload(&vec![-7.0f32; m + 5], Category::Gradient, "out")?;
        let out_s = out_gpu.slice(2, m as u64)?;
        let x_s = x_gpu.slice(1, n as u64)?;
        super::sum_to_shape(&gpu, out_s, x_s, from, to)?;
        let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE)?;
        let want = framed(-7.0, 2, &cpu::sum_to_shape(&x, from, to).expect("the cases reduce"));
        assert_close(
            &format!("sum_to_shape {from:?} -> {to:?}"),
            &got,
            &want,
            sum_atol(n / m, 2.0),
            1e-5,
        );
    }
    Ok(())
}

#[test]
fn reduce_rejects_bad_axis_and_shapes() -> Result<()> {
    let (gpu, [x, out]) = gpu_and_temporaries([(60, "x"), (60, "out")])?;
    let err =
        super::sum_axis(&gpu, out.slice(0, 12)?, x.whole(), &[3, 4, 5], 3).expect_err("must be refused");
    assert!(err.to_string().contains("axis 3 out of range"), "{err}");
    // x = elements 1..61 of a 60-element buffer: the slice cannot be made ...
    let err = x.slice(1, 60).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("outside buffer"), "{err}");
    // ... and the launcher refuses the one element shorter slice that fits.
    let (max_out, max_idx) = (out.slice(0, 20)?, out.slice(20, 20)?);
    let err = super::max_axis(
        &gpu,
        max_out,
        max_idx,
        x.slice(1, 59)?,
        &[3, 4, 5],
        0,
    ).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("59 elements given"), "{err}");
    // Outputs of the wrong length.
    let err = super::max_axis(
        &gpu,
        out.slice(0, 19)?,
        max_idx,
        x.whole(),
        &[3, 4, 5],
        0,
    ).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::max_axis(
        &gpu,
        max_out,
        out.slice(20, 21)?,
        x.whole(),
        &[3, 4, 5],
        0,
    ).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::sum_axis(&gpu, out.whole(), x.whole(), &[3, 4, 5], 0).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::max_backward(
        &gpu,
        out.whole(),
        max_out,
        x.slice(0, 21)?,
        &[3, 4, 5],
        0,
    ).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::sum_all(&gpu, out.slice(0, 2)?, x.whole()).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = super::max_all(
        &gpu,
        out.slice(0, 1)?,
        out.slice(1, 0)?,
        x.whole(),
    ).expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Shapes that do not broadcast (slices of the right lengths, so the shapes are what fails).
    let err = super::sum_to_shape(
        &gpu,
        out.slice(0, 10)?,
        x.whole(),
        &[3, 4, 5],
        &[2, 5],
    ).expect_err("must be refused");
    assert!(err.to_string().contains("does not broadcast"), "{err}");
    let (out20, x20) = (out.slice(0, 20)?, x.slice(0, 20)?);
    let err = super::sum_to_shape(&gpu, out20, x20, &[4, 5], &[1, 4, 5]).expect_err("must be refused");
    assert!(err.to_string().contains("does not broadcast"), "{err}");
    Ok(())
}

#[test]
fn reduce_long_axis_is_not_truncated() -> Result<()> {
    // Lavapipe stops a shader after 65535 loop iterations: a flat loop over this axis summed
    // only its first 65535 terms. Positive terms, so the f32 sum's relative error is about
    // u sqrt(n) = 3e-5 (rms ~2e-5); rtol 1e-4 is five sigma.
    let (gpu, mut rng) = gpu_and_rng(73);
    let n = 300_000;
    let mut x = rng.vec_f32(n, 0.5, 1.5);
    x[n - 3] = 2.0; // the max sits past any truncation
    let x_gpu = upload_at(&gpu, &mut rng, &x, 1)?;
    let out = gpu.alloc_elements(2, Category::Activation, "out")?;
    let idx = gpu.alloc_elements(1, Category::Activation, "idx")?;
    let x_s = x_gpu.slice(1, n as u64)?;
    super::sum_axis(&gpu, out.slice(0, 1)?, x_s, &[n], 0)?;
    super::max_axis(&gpu, out.slice(1, 1)?, idx.whole(), x_s, &[n], 0)?;
    let got: Vec<f32> = gpu.read_all(&out, DEADLINE)?;
    let got_idx: Vec<u32> = gpu.read_all(&idx, DEADLINE)?;
    assert_close(
        "sum_axis [300_000]",
        &got,
        &[cpu::sum_all(&x), 2.0],
        0.0,
        1e-4,
    );
    assert_eq!(got_idx, [n as u32 - 3]);
    let long = super::MAX_AXIS_LEN + 1;
    // (The axis length is checked first: no slice of `long` elements is needed.)
    let err =
        super::sum_axis(&gpu, out.slice(0, 1)?, x_gpu.whole(), &[long], 0).expect_err("must be refused");
    assert!(err.to_string().contains("MAX_AXIS_LEN"), "{err}");
    Ok(())
}

// The *_all launchers loop len / 1024 + 16 times: the limit (about 67 million elements on
// lavapipe) is past what one binding holds there. The length now comes from the input slice, and
// a slice lies inside one buffer, so where no buffer of `largest + 1` elements can be allocated
// the refusal cannot be reached through the launchers: then this checks that such a buffer is
// refused (TooLarge) and that the launchers' own check (`check_loop_limit` with
// `all_loop_iterations`) refuses the length with the right hint. Where such a buffer can be
// allocated, the launchers must refuse it (the limit is checked before the output lengths).
#[test]
fn reduce_all_refuses_lengths_over_the_loop_limit() -> Result<()> {
    with_loop_limit("reduce_all_refuses_lengths_over_the_loop_limit", |gpu, limit, t| {
        let largest = largest_within(limit, super::all_loop_iterations);
        for op in ["sum_all", "mean_all", "max_all"] {
            let check = check_loop_limit(gpu, op, "len", largest + 1, super::all_loop_iterations);
            assert_loop_limit(check, "len", largest);
            check_loop_limit(gpu, op, "len", largest, super::all_loop_iterations)?;
        }
        let too_long = (largest + 1) * 4;
        if too_long > gpu.max_buffer_bytes() {
            eprintln!(
                "reduce: {} elements exceed the largest buffer ({} bytes): the launchers cannot be \
                 asked for them",
                largest + 1,
                gpu.max_buffer_bytes()
            );
            let err = gpu
                .alloc_elements(largest + 1, Category::Temporary, "long").expect_err("must be refused");
            assert!(matches!(err, Error::TooLarge { .. }), "{err}");
            return Ok(());
        }
        let long = scratch(gpu, largest + 1, "long");
        let x = long.whole();
        assert_loop_limit(super::sum_all(gpu, t.whole(), x), "len", largest);
        assert_loop_limit(super::mean_all(gpu, t.whole(), x), "len", largest);
        let max = super::max_all(gpu, t.whole(), t.whole(), x);
        assert_loop_limit(max, "len", largest);
        Ok(())
    })
}

// ------------------------------------------------------------------------------- reference

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
    assert_eq!(cpu::sum_axis(&x, view), [6.0, 9.0, 24.0, 27.0]);
    assert_eq!(cpu::mean_axis(&x, view), [2.0, 3.0, 8.0, 9.0]);
    let (values, indices) = cpu::max_axis(&x, view);
    assert_eq!(values, [4.0, 5.0, 10.0, 11.0]);
    assert_eq!(indices, [2, 2, 2, 2]);
    let dx = cpu::max_backward(&[1.0, 2.0, 3.0, 4.0], &indices, view);
    assert_eq!(
        dx,
        [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0]
    );
    assert_eq!(cpu::sum_all(&x), 66.0);
    assert_eq!(cpu::mean_all(&x), 5.5);
    // ties: first index; NaN wins
    assert_eq!(cpu::max_all(&[1.0, 3.0, 3.0]), (3.0, 1));
    let (v, i) = cpu::max_all(&[1.0, f32::NAN, 5.0, f32::NAN]);
    assert!(v.is_nan());
    assert_eq!(i, 1);
    // sum_to_shape: [2,3] -> [3] sums rows, -> [2,1] sums columns, -> [] sums all
    let m = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    assert_eq!(
        cpu::sum_to_shape(&m, &[2, 3], &[3]),
        Some(vec![5.0, 7.0, 9.0])
    );
    assert_eq!(
        cpu::sum_to_shape(&m, &[2, 3], &[2, 1]),
        Some(vec![6.0, 15.0])
    );
    assert_eq!(cpu::sum_to_shape(&m, &[2, 3], &[]), Some(vec![21.0]));
    assert_eq!(cpu::sum_to_shape(&m, &[2, 3], &[2]), None);
}

/// `sum_squares_many` over sources in more segments than one dispatch binds (tensors at
/// aligned and unaligned offsets, empty, over several chunks; partial sums copied) writes what
/// one launch per source writes (`sum_squares_chunks` with an invocation per chunk, `copy`),
/// bit for bit, the reference's values, and nothing around `out`.
#[test]
fn sum_squares_many_matches_one_launch_per_source() -> Result<()> {
    use super::SquaresSource;
    // Small segments: each source of more than 1024 elements gets one of its own.
    let gpu = crate::testing::gpu_with(crate::GpuOptions {
        small_segment_bytes: Some(4096),
        ..crate::GpuOptions::from_env()
    });
    let mut rng = Rng::new(72);
    let chunk = super::SQUARES_CHUNK as usize;
    // (length, offset, copied)
    let mut shapes = vec![(0, 0, false), (5, 3, false), (7, 0, true), (chunk + 1, 4, false)];
    for i in 0..20 {
        shapes.push((1025 + 97 * i, [0, 4, 1, 2][i % 4], i % 5 == 4));
    }
    let mut uploads = Vec::new();
    let mut want: Vec<f32> = Vec::new();
    for &(len, offset, copied) in &shapes {
        let x = rng.vec_f32(len, -2.0, 2.0);
        uploads.push((upload_at(&gpu, &mut rng, &x, offset)?, offset, len, copied));
        if copied {
            want.extend(&x);
        } else {
            want.extend((0..super::squares_chunks(len as u64) as usize).map(|w| {
                let part = &x[(w * chunk).min(len)..((w + 1) * chunk).min(len)];
                part.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() as f32
            }));
        }
    }
    let mut sources = Vec::new();
    for (buffer, offset, len, copied) in &uploads {
        let s = buffer.slice(*offset as u64, *len as u64)?;
        sources.push(if *copied { SquaresSource::Partials(s) } else { SquaresSource::Tensor(s) });
    }
    let segments: std::collections::BTreeSet<_> =
        uploads.iter().map(|u| u.0.placement().0).collect();
    assert!(segments.len() > crate::kernels::MULTI_SLOTS, "{} segments", segments.len());
    let n = want.len();
    let many = gpu.upload(&vec![-7.0f32; n + 2], Category::Activation, "many")?;
    let multi = crate::kernels::TensorLaunches::Multi;
    super::sum_squares_many_in(&gpu, multi, many.slice(1, n as u64)?, &sources)?;
    let one = gpu.upload(&vec![-7.0f32; n + 2], Category::Activation, "one")?;
    let mut at = 1;
    for source in &sources {
        let k = source.outputs();
        let into = one.slice(at, k)?;
        match source {
            SquaresSource::Tensor(x) => {
                super::sum_squares_chunks_in(&gpu, RowLayout::InvocationPerRow, into, *x)?
            }
            SquaresSource::Partials(p) => crate::kernels::copy::copy(&gpu, into, *p)?,
        }
        at += k;
    }
    let got: Vec<f32> = gpu.read_all(&many, DEADLINE)?;
    let by_one: Vec<f32> = gpu.read_all(&one, DEADLINE)?;
    assert_exact("sum_squares_many against one launch per source", &got, &by_one);
    let mut framed = vec![-7.0f32];
    framed.extend(&want);
    framed.push(-7.0);
    assert_close("sum_squares_many", &got, &framed, sum_atol(chunk, 4.0), 1e-5);
    // `out` must be exactly as long as the outputs.
    let err = super::sum_squares_many_in(&gpu, multi, many.slice(0, n as u64 + 1)?, &sources)
        .expect_err("must be refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    Ok(())
}
