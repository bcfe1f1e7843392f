//! The profiler, in each of its three modes on lavapipe: every dispatch is timed once, in order,
//! with the launcher's work; a matmul with 512 times the work takes longer than a small one;
//! the kernels' total fits in the wall time (lavapipe runs them one after another); profiling
//! changes no result (the product against a CPU reference).

#![allow(clippy::unwrap_used)]

use plimsoll_kernels_wgsl::kernels::matmul::{MatmulDims, matmul};
use plimsoll_kernels_wgsl::testing::{DEADLINE, Rng, fresh_gpu};
use plimsoll_kernels_wgsl::{Category, DeviceBuffer, Error, ProfileMode};

fn dims(n: usize) -> MatmulDims {
    MatmulDims {
        batch: 1,
        m: n,
        n,
        k: n,
        trans_a: false,
        trans_b: false,
        batch_stride_a: n * n,
        batch_stride_b: n * n,
        batch_stride_c: n * n,
        alpha: 1.0,
        accumulate: false,
    }
}

fn small_slices(
    buf: &plimsoll_kernels_wgsl::DeviceBuffer,
) -> plimsoll_kernels_wgsl::DeviceSlice<'_> {
    buf.slice(0, 32 * 32).unwrap()
}

fn reference(a: &[f32], b: &[f32], n: usize) -> Vec<f32> {
    let mut c = vec![0.0f32; n * n];
    for i in 0..n {
        for k in 0..n {
            let x = f64::from(a[i * n + k]);
            for j in 0..n {
                c[i * n + j] = (f64::from(c[i * n + j]) + x * f64::from(b[k * n + j])) as f32;
            }
        }
    }
    c
}

#[test]
fn each_mode_times_every_dispatch_in_order() {
    for mode in [
        ProfileMode::InsidePasses,
        ProfileMode::PerPass,
        ProfileMode::Cpu,
    ] {
        let gpu = fresh_gpu();
        let mut rng = Rng::new(5);
        let (big, small) = (256, 32);
        let a = rng.vec_f32(big * big, -1.0, 1.0);
        let b = rng.vec_f32(big * big, -1.0, 1.0);
        let ga = gpu.upload(&a, Category::Temporary, "a").unwrap();
        let gb = gpu.upload(&b, Category::Temporary, "b").unwrap();
        let gc = gpu
            .upload(&vec![0.0f32; big * big], Category::Temporary, "c")
            .unwrap();
        // Warm-up: lavapipe compiles a pipeline at its first execution, which the first timed
        // dispatch would otherwise absorb.
        let small_matmul = |out: &DeviceBuffer, lhs: &DeviceBuffer, rhs: &DeviceBuffer| {
            matmul(
                &gpu,
                &dims(small),
                small_slices(out),
                small_slices(lhs),
                small_slices(rhs),
            )
            .unwrap()
        };
        small_matmul(&gc, &ga, &gb);
        gpu.synchronize(DEADLINE).unwrap();
        assert_eq!(gpu.begin_profile(Some(mode)).unwrap(), mode);
        assert!(gpu.is_profiling());
        // small, big, small: three dispatches in one batch.
        small_matmul(&gc, &ga, &gb);
        matmul(&gpu, &dims(big), gc.whole(), ga.whole(), gb.whole()).unwrap();
        small_matmul(&ga, &gc, &gb);
        let out: Vec<f32> = gpu.read_all(&gc, DEADLINE).unwrap();
        let profile = gpu.end_profile(DEADLINE).unwrap();
        assert!(!gpu.is_profiling());
        assert_eq!(profile.mode, mode);
        assert_eq!(profile.untimed_dispatches, 0);
        assert_eq!(profile.kernels.len(), 3, "{mode:?}: {:?}", profile.kernels);
        let flops: Vec<u64> = profile.kernels.iter().map(|k| k.flops).collect();
        let n3 = |n: usize| 2 * (n as u64).pow(3);
        assert_eq!(flops, [n3(small), n3(big), n3(small)], "{mode:?}");
        for pair in profile.kernels.windows(2) {
            assert!(
                pair[0].start_ns <= pair[1].start_ns,
                "{mode:?}: out of order"
            );
        }
        let took = |i: usize| profile.kernels[i].end_ns - profile.kernels[i].start_ns;
        assert!(
            took(1) > took(0) && took(1) > took(2),
            "{mode:?}: {:?}",
            profile.kernels
        );
        let total: u64 = (0..3).map(took).sum();
        assert!(
            total <= profile.wall_ns,
            "{mode:?}: {total} > {}",
            profile.wall_ns
        );
        let names: Vec<&str> = profile.cpu.iter().map(|s| s.name).collect();
        assert!(
            names.contains(&"submit") && names.contains(&"read-back"),
            "{names:?}"
        );
        // Profiling changed nothing: c = a b (the first small product was overwritten).
        let expected = reference(&a, &b, big);
        for (i, (x, y)) in out.iter().zip(&expected).enumerate() {
            assert!(
                (x - y).abs() <= 1e-3 * (1.0 + y.abs()),
                "{mode:?} c[{i}] {x} vs {y}"
            );
        }
    }
}

#[test]
fn profiling_twice_or_never_is_an_error() {
    let gpu = fresh_gpu();
    assert!(matches!(
        gpu.end_profile(DEADLINE),
        Err(Error::InvalidArgument { .. })
    ));
    gpu.begin_profile(None).unwrap();
    assert!(matches!(
        gpu.begin_profile(None),
        Err(Error::InvalidArgument { .. })
    ));
    let profile = gpu.end_profile(DEADLINE).unwrap();
    assert!(profile.kernels.is_empty());
}
