//! The image layers (convolution, pooling, normalisation) against f64 CPU references: forward, and the parameter and input
//! gradients by central differences of the reference.

use plimsoll_kernels_wgsl::kernels::conv2d::{Conv2dDims, reference};
use plimsoll_kernels_wgsl::kernels::pool2d::{self, Pool, Pool2dDims, PoolWindow};
use plimsoll_kernels_wgsl::testing::{Rng, assert_close, gpu, to_f64};
use plimsoll_nn::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, Conv2d, Conv2dOptions, Error, Flatten, GroupNorm,
    MaxPool2d, Module, Sequential, cnn, conv2d,
};

use crate::common::{Params, check_module, input};

/// The kernel's dimensions of `layer` on an `[n, c, h, w]` input.
fn dims_of(layer: &Conv2d, x: [usize; 4]) -> Conv2dDims {
    let ws = layer.weight().shape();
    let o = layer.options();
    let u = |v: [usize; 2]| v.map(|v| v as u64);
    Conv2dDims {
        batch: x[0] as u64,
        in_channels: x[1] as u64,
        in_size: [x[2] as u64, x[3] as u64],
        out_channels: ws[0] as u64,
        kernel: [ws[2] as u64, ws[3] as u64],
        stride: u(o.stride),
        padding: u(o.padding),
        dilation: u(o.dilation),
        groups: o.groups as u64,
    }
}

/// `Conv2d` with and without a bias, strided, padded, dilated and grouped: the forward and every
/// gradient against the reference and its finite differences; parameters under PyTorch's
/// names and layout.
#[test]
fn conv2d_matches_reference() {
    let gpu = gpu();
    let cases = [
        (4, 6, [3, 3], Conv2dOptions::default().padding(1), true),
        (
            4,
            6,
            [3, 3],
            Conv2dOptions::default().stride(2).padding(1),
            false,
        ),
        (
            4,
            4,
            [3, 2],
            Conv2dOptions::default().dilation(2).padding(2).groups(2),
            true,
        ),
        (
            3,
            3,
            [3, 3],
            Conv2dOptions::default().padding(1).groups(3),
            true,
        ),
        (4, 2, [1, 1], Conv2dOptions::default(), true),
    ];
    for (i, (c, o, kernel, options, bias)) in cases.into_iter().enumerate() {
        let layer = Conv2d::new(&gpu, c, o, kernel, options, bias, 10 + i as u64).unwrap();
        let names: Vec<String> = layer.parameters().into_iter().map(|(n, _)| n).collect();
        let want_names = if bias {
            vec!["weight", "bias"]
        } else {
            vec!["weight"]
        };
        assert_eq!(names, want_names);
        assert_eq!(
            layer.weight().shape(),
            [o, c / options.groups, kernel[0], kernel[1]]
        );
        let shape = [2, c, 6, 5];
        let x = input(
            &gpu,
            &Rng::new(20 + i as u64).vec_f32(2 * c * 30, -1.0, 1.0),
            &shape,
        );
        let dims = dims_of(&layer, shape);
        check_module(&layer, &x, true, &|p: &Params, x: &[f64]| {
            reference::forward_f64(&dims, x, &p["weight"], p.get("bias").map(|b| &b[..]))
        });
    }
}

/// PyTorch's initialisation: every weight and bias within `1 / sqrt(in / groups · kh · kw)`,
/// the same seed giving the same layer.
#[test]
fn conv2d_init_is_bounded_and_seeded() {
    let gpu = gpu();
    let options = Conv2dOptions::default().groups(2);
    let layer = Conv2d::new(&gpu, 8, 4, [3, 3], options, true, 5).unwrap();
    let again = Conv2d::new(&gpu, 8, 4, [3, 3], options, true, 5).unwrap();
    let bound = 1.0 / ((8 / 2 * 9) as f32).sqrt();
    for ((name, t), (_, u)) in layer.parameters().into_iter().zip(again.parameters()) {
        let (v, w) = (t.to_vec().unwrap(), u.to_vec().unwrap());
        assert!(
            v.iter().all(|x| x.abs() <= bound),
            "{name} outside ±{bound}"
        );
        assert!(
            v.iter().any(|x| x.abs() > bound / 2.0),
            "{name} drawn too narrowly"
        );
        assert_eq!(v, w, "{name}: the same seed must give the same values");
    }
}

/// Wrong inputs are typed errors with the shapes: a 3-D input, channels the weight does not
/// take, groups that do not divide the channels, a kernel larger than the padded image.
#[test]
fn conv2d_refuses_bad_inputs_with_the_shapes() {
    let gpu = gpu();
    let layer = Conv2d::new(&gpu, 3, 4, [3, 3], Conv2dOptions::default(), true, 1).unwrap();
    let flat = input(&gpu, &[0.0; 3 * 25], &[3, 5, 5]);
    let err = layer.forward(&flat).unwrap_err();
    assert!(matches!(err, Error::InputShape { .. }), "{err}");
    assert!(err.to_string().contains("[3, 5, 5]"), "{err}");
    let two_channels = input(&gpu, &[0.0; 2 * 25], &[1, 2, 5, 5]);
    let err = layer.forward(&two_channels).unwrap_err();
    assert!(matches!(err, Error::InputShape { .. }), "{err}");
    let small = input(&gpu, &[0.0; 3 * 4], &[1, 3, 2, 2]);
    let err = layer.forward(&small).unwrap_err();
    assert!(
        err.to_string().contains("the window spans 3 pixels"),
        "{err}"
    );
    let err = Conv2d::new(
        &gpu,
        3,
        4,
        [3, 3],
        Conv2dOptions::default().groups(2),
        true,
        1,
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    assert!(err.to_string().contains("groups 2"), "{err}");
}

/// The pooling layers against the reference and its finite differences (input gradients: they
/// have no parameters), and `Flatten`'s shape.
#[test]
fn pooling_matches_reference() {
    let gpu = gpu();
    let layers: Vec<(Box<dyn Module>, Pool)> = vec![
        (
            Box::new(MaxPool2d::new(2, 2, 0)),
            Pool::Max(PoolWindow::square(2)),
        ),
        (
            Box::new(MaxPool2d::new(3, 2, 1)),
            Pool::Max(PoolWindow {
                kernel: [3, 3],
                stride: [2, 2],
                padding: [1, 1],
                dilation: [1, 1],
            }),
        ),
        (
            Box::new(AvgPool2d::new(3, 1, 1)),
            Pool::Avg {
                window: PoolWindow {
                    kernel: [3, 3],
                    stride: [1, 1],
                    padding: [1, 1],
                    dilation: [1, 1],
                },
                count_include_pad: true,
            },
        ),
        (
            Box::new(AdaptiveAvgPool2d { out_size: [1, 1] }),
            Pool::AdaptiveAvg { out_size: [1, 1] },
        ),
        (
            Box::new(AdaptiveAvgPool2d { out_size: [2, 3] }),
            Pool::AdaptiveAvg { out_size: [2, 3] },
        ),
    ];
    for (i, (layer, pool)) in layers.into_iter().enumerate() {
        assert!(layer.parameters().is_empty());
        let shape = [2, 3, 6, 5];
        let x = input(
            &gpu,
            &Rng::new(30 + i as u64).vec_f32(180, -1.0, 1.0),
            &shape,
        );
        let dims = Pool2dDims {
            planes: 6,
            in_size: [6, 5],
            pool,
        };
        check_module(layer.as_ref(), &x, true, &|_: &Params, x: &[f64]| {
            pool2d::reference::forward_f64(&dims, x).0
        });
    }
    let x = input(&gpu, &[0.5; 2 * 3 * 4 * 5], &[2, 3, 4, 5]);
    assert_eq!(Flatten.forward(&x).unwrap().shape(), [2, 60]);
}

/// The small CNN on flat 8x8 images: PyTorch `nn.Sequential`'s names, the shapes through it,
/// and the same seed giving the same network; `Unflatten` refuses a row of the wrong width.
#[test]
fn cnn_names_shapes_and_seeds() {
    let gpu = gpu();
    let net = cnn(&gpu, [1, 8, 8], &[16, 32], 10, 7).unwrap();
    let params = net.parameters();
    let shapes: Vec<(String, Vec<usize>)> = params
        .iter()
        .map(|(n, t)| (n.clone(), t.shape().to_vec()))
        .collect();
    let want: Vec<(String, Vec<usize>)> = [
        ("1.weight", vec![16, 1, 3, 3]),
        ("1.bias", vec![16]),
        ("4.weight", vec![32, 16, 3, 3]),
        ("4.bias", vec![32]),
        ("8.weight", vec![10, 128]),
        ("8.bias", vec![10]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    assert_eq!(shapes, want);
    let x = input(&gpu, &Rng::new(3).vec_f32(5 * 64, 0.0, 1.0), &[5, 64]);
    let y = net.forward(&x).unwrap();
    assert_eq!(y.shape(), [5, 10]);
    let again = cnn(&gpu, [1, 8, 8], &[16, 32], 10, 7).unwrap();
    assert_eq!(
        y.to_vec().unwrap(),
        again.forward(&x).unwrap().to_vec().unwrap()
    );
    let wrong = input(&gpu, &[0.0; 2 * 63], &[2, 63]);
    let err = net.forward(&wrong).unwrap_err();
    assert!(matches!(err, Error::InputShape { .. }), "{err}");
    assert!(err.to_string().contains("[2, 63]"), "{err}");
}

/// Per-set normalisation of `x` (f64): each of `sets(i)`'s members normalised by its set's mean
/// and biased variance, then `w[channel(i)]`, `b[channel(i)]`.
fn normalised(
    x: &[f64],
    set_of: impl Fn(usize) -> usize,
    channel_of: impl Fn(usize) -> usize,
    (w, b): (&[f64], &[f64]),
) -> Vec<f64> {
    let sets = (0..x.len()).map(&set_of).max().map_or(0, |m| m + 1);
    let (mut sum, mut sq, mut count) = (vec![0.0; sets], vec![0.0; sets], vec![0.0; sets]);
    for (i, &v) in x.iter().enumerate() {
        sum[set_of(i)] += v;
        count[set_of(i)] += 1.0;
    }
    let mean: Vec<f64> = sum.iter().zip(&count).map(|(s, c)| s / c).collect();
    for (i, &v) in x.iter().enumerate() {
        sq[set_of(i)] += (v - mean[set_of(i)]).powi(2);
    }
    (0..x.len())
        .map(|i| {
            let (s, c) = (set_of(i), channel_of(i));
            (x[i] - mean[s]) / (sq[s] / count[s] + 1e-5).sqrt() * w[c] + b[c]
        })
        .collect()
}

/// Random values in a module's parameters (a scale of ones would hide a swapped scale).
fn randomise(module: &dyn Module, seed: u64) {
    let mut rng = Rng::new(seed);
    for (_, p) in module.parameters() {
        p.write_from_slice(&rng.vec_f32(p.numel(), 0.5, 1.5))
            .unwrap();
    }
}

/// GroupNorm: each image's groups normalised over their channels and pixels, then the
/// per-channel scale and shift; forward and gradients against the reference.
#[test]
fn group_norm_matches_reference() {
    let gpu = gpu();
    let (n, c, hw, groups) = (2, 6, 12, 3);
    let layer = GroupNorm::new(&gpu, groups, c, 1e-5).unwrap();
    randomise(&layer, 40);
    let x = input(
        &gpu,
        &Rng::new(41).vec_f32(n * c * hw, -2.0, 2.0),
        &[n, c, 3, 4],
    );
    check_module(&layer, &x, true, &|p: &Params, x: &[f64]| {
        let set = |i: usize| (i / (c * hw)) * groups + (i / hw % c) / (c / groups);
        normalised(x, set, |i| i / hw % c, (&p["weight"], &p["bias"]))
    });
    let err = GroupNorm::new(&gpu, 4, 6, 1e-5).unwrap_err();
    assert!(
        err.to_string().contains("4 groups must divide 6 channels"),
        "{err}"
    );
}

/// BatchNorm2d in training: each channel normalised over the batch and pixels (forward and
/// gradients against the reference); the running mean and unbiased variance moved by 0.1
/// towards the batch's. In evaluation the running statistics normalise. A checkpointed
/// segment, run again by backward, updates them once.
#[test]
fn batch_norm_matches_reference_and_tracks_once() {
    let gpu = gpu();
    let (n, c, hw) = (3, 4, 10);
    let layer = BatchNorm2d::new(&gpu, c).unwrap();
    randomise(&layer, 50);
    let data = Rng::new(51).vec_f32(n * c * hw, -2.0, 3.0);
    let x = input(&gpu, &data, &[n, c, 2, 5]);
    check_module(&layer, &x, true, &|p: &Params, x: &[f64]| {
        normalised(
            x,
            |i| i / hw % c,
            |i| i / hw % c,
            (&p["weight"], &p["bias"]),
        )
    });
    assert_eq!(layer.batches_tracked().unwrap(), 1);
    let m = n * hw;
    let channel = |ch: usize| -> Vec<f64> {
        (0..data.len())
            .filter(|i| i / hw % c == ch)
            .map(|i| f64::from(data[i]))
            .collect()
    };
    let (mut want_mean, mut want_var) = (Vec::new(), Vec::new());
    for ch in 0..c {
        let v = channel(ch);
        let mean = v.iter().sum::<f64>() / m as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (m - 1) as f64;
        want_mean.push(0.1 * mean);
        want_var.push(0.9 + 0.1 * var);
    }
    let (rm, rv) = layer.running_stats();
    assert_close(
        "running mean",
        &rm.to_vec().unwrap(),
        &want_mean,
        1e-5,
        1e-5,
    );
    assert_close("running var", &rv.to_vec().unwrap(), &want_var, 1e-5, 1e-5);

    // Evaluation: the running statistics, not the batch's.
    let mut eval = layer.clone();
    eval.set_training(false);
    let weights: Vec<Vec<f64>> = eval
        .parameters()
        .iter()
        .map(|(_, t)| to_f64(&t.to_vec().unwrap()))
        .collect();
    let want: Vec<f64> = (0..data.len())
        .map(|i| {
            let ch = i / hw % c;
            (f64::from(data[i]) - want_mean[ch]) / (want_var[ch] + 1e-5).sqrt() * weights[0][ch]
                + weights[1][ch]
        })
        .collect();
    let got = eval.forward(&x).unwrap().to_vec().unwrap();
    assert_close("evaluation", &got, &want, 1e-4, 1e-4);
    assert_eq!(
        eval.batches_tracked().unwrap(),
        1,
        "evaluation tracks nothing"
    );

    // Checkpointed: the forward tracks, the recomputation in backward does not.
    let fresh = BatchNorm2d::new(&gpu, c).unwrap();
    let net = Sequential::new().push(fresh.clone());
    let y = net.forward_checkpointed(&x, 1).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(
        fresh.batches_tracked().unwrap(),
        1,
        "tracked once for one checkpointed step"
    );
    let (rm2, _) = fresh.running_stats();
    assert_close(
        "running mean (checkpointed)",
        &rm2.to_vec().unwrap(),
        &want_mean,
        1e-5,
        1e-5,
    );
}

/// `conv2d` over f16 copies of its input, weight and bias (mixed precision's weight copies)
/// gives the f32 result of the rounded values, with an f16 or an f32 input.
#[test]
fn conv2d_takes_f16_operands() {
    let gpu = gpu();
    let mut rng = Rng::new(90);
    let x = input(&gpu, &rng.vec_f32(2 * 3 * 25, -1.0, 1.0), &[2, 3, 5, 5]);
    let w = input(&gpu, &rng.vec_f32(4 * 3 * 9, -1.0, 1.0), &[4, 3, 3, 3]);
    let b = input(&gpu, &rng.vec_f32(4, -1.0, 1.0), &[4]);
    let options = Conv2dOptions::default().padding(1);
    let halves = [&x, &w, &b].map(|t| t.to_f16().unwrap());
    let rounded = halves.each_ref().map(|t| t.to_f32().unwrap());
    let want = conv2d(&rounded[0], &rounded[1], Some(&rounded[2]), options).unwrap();
    let got = conv2d(&halves[0], &halves[1], Some(&halves[2]), options).unwrap();
    assert_eq!(got.shape(), [2, 4, 5, 5]);
    assert_close(
        "f16 operands",
        &got.to_vec().unwrap(),
        &want.to_vec().unwrap(),
        1e-6,
        1e-6,
    );
    // An f32 input with f16 weight copies (the mixed-precision case).
    let want = conv2d(&x, &rounded[1], Some(&rounded[2]), options).unwrap();
    let got = conv2d(&x, &halves[1], Some(&halves[2]), options).unwrap();
    let (got, want) = (got.to_vec().unwrap(), want.to_vec().unwrap());
    assert_close("f16 weights", &got, &want, 1e-6, 1e-6);
}
