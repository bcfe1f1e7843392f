//! torchvision's ResNets: their parameter counts (torchvision's published figures), names and
//! shapes, and a forward and backward at a small image size.

use plimsoll_kernels_wgsl::testing::{Rng, gpu};
use plimsoll_nn::{Module, ResNet, ResNetConfig, parameter_count};

use crate::common::input;

/// torchvision's parameter counts (`sum(p.numel() for p in resnetN().parameters())`, 1000
/// classes), built on a planning device (no values drawn).
#[test]
fn resnets_have_torchvisions_parameter_counts() {
    let planning = gpu().planning_twin(1 << 40);
    for (depth, want) in [
        (18, 11_689_512),
        (34, 21_797_672),
        (50, 25_557_032),
        (101, 44_549_160),
    ] {
        let config = ResNetConfig::depth(depth, 1000).unwrap();
        let net = ResNet::new(&planning, config, 0).unwrap();
        assert_eq!(parameter_count(&net), want, "resnet{depth}");
        assert_eq!(
            config.parameter_count(),
            want,
            "resnet{depth}, counted without building"
        );
    }
    assert!(ResNetConfig::depth(20, 10).is_err());
}

/// ResNet-18's names and layouts as torchvision's `state_dict()` has them: the stem, a block with and one without a shortcut, the classifier,
/// and BatchNorm's running statistics as buffers.
#[test]
fn resnet18_names_and_shapes_are_torchvisions() {
    let planning = gpu().planning_twin(1 << 40);
    let net = ResNet::new(&planning, ResNetConfig::depth(18, 1000).unwrap(), 0).unwrap();
    let params: Vec<(String, Vec<usize>)> = net
        .parameters()
        .iter()
        .map(|(n, t)| (n.clone(), t.shape().to_vec()))
        .collect();
    assert_eq!(params.len(), 62);
    let shape = |name: &str| {
        params
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .1
            .clone()
    };
    assert_eq!(params[0].0, "conv1.weight");
    assert_eq!(shape("conv1.weight"), [64, 3, 7, 7]);
    assert_eq!(shape("bn1.weight"), [64]);
    assert_eq!(shape("layer1.0.conv1.weight"), [64, 64, 3, 3]);
    assert_eq!(shape("layer1.1.bn2.bias"), [64]);
    assert_eq!(shape("layer2.0.conv1.weight"), [128, 64, 3, 3]);
    assert_eq!(shape("layer2.0.downsample.0.weight"), [128, 64, 1, 1]);
    assert_eq!(shape("layer2.0.downsample.1.weight"), [128]);
    assert_eq!(shape("layer4.1.conv2.weight"), [512, 512, 3, 3]);
    assert_eq!(shape("fc.weight"), [1000, 512]);
    assert_eq!(shape("fc.bias"), [1000]);
    assert!(
        !params
            .iter()
            .any(|(n, _)| n == "layer1.0.downsample.0.weight")
    );
    let buffers: Vec<String> = net.buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        buffers.len(),
        3 * 20,
        "running mean and variance and count of 20 BatchNorms"
    );
    assert_eq!(
        buffers[..3],
        [
            "bn1.running_mean",
            "bn1.running_var",
            "bn1.num_batches_tracked"
        ]
    );
    assert!(buffers.contains(&"layer3.0.downsample.1.running_var".to_string()));
}

/// A ResNet-18 over two 32x32 images into 10 classes: logits `[2, 10]`; backward reaches the
/// stem's weight and the classifier; a training forward moves BatchNorm's statistics and an
/// evaluation forward does not.
#[test]
fn resnet18_runs_forward_and_backward() {
    let gpu = gpu();
    let net = ResNet::new(&gpu, ResNetConfig::depth(18, 10).unwrap(), 3).unwrap();
    let x = input(
        &gpu,
        &Rng::new(4).vec_f32(2 * 3 * 32 * 32, -1.0, 1.0),
        &[2, 3, 32, 32],
    );
    let logits = net.forward(&x).unwrap();
    assert_eq!(logits.shape(), [2, 10]);
    assert!(logits.to_vec().unwrap().iter().all(|v| v.is_finite()));
    logits.sum_all().unwrap().backward().unwrap();
    for (name, t) in net.parameters() {
        if name == "conv1.weight" || name == "fc.weight" {
            let g = t.grad().unwrap_or_else(|| panic!("{name} has no gradient"));
            assert!(
                g.to_vec().unwrap().iter().any(|v| *v != 0.0),
                "{name}: zero gradient"
            );
        }
    }
    let mean = |net: &ResNet| net.buffers()[0].1.to_vec().unwrap();
    let after_training = mean(&net);
    assert!(
        after_training.iter().any(|v| *v != 0.0),
        "training moved the running mean"
    );
    let mut eval = net.clone();
    eval.set_training(false);
    let _ = eval.forward(&x).unwrap();
    assert_eq!(
        mean(&eval),
        after_training,
        "evaluation leaves the statistics alone"
    );
}

/// torchvision's initialisation: each convolution's weight drawn from N(0, 2 / fan_out)
/// (`kaiming_normal_(mode="fan_out", nonlinearity="relu")`), fan_out = out · kh · kw; each
/// BatchNorm's weight 1 and bias 0. Checked on the sample mean and deviation of the stem and of
/// the largest 3x3 convolution (2.4 million values: the deviation within 1%).
#[test]
fn resnet_weights_start_as_torchvisions() {
    let gpu = gpu();
    let net = ResNet::new(&gpu, ResNetConfig::depth(18, 10).unwrap(), 5).unwrap();
    let params = net.parameters();
    let values = |name: &str| {
        let (_, t) = params.iter().find(|(n, _)| n == name).unwrap();
        t.to_vec().unwrap()
    };
    for (name, fan_out) in [
        ("conv1.weight", 64 * 7 * 7),
        ("layer4.1.conv2.weight", 512 * 3 * 3),
    ] {
        let v = values(name);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let std = (v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n)
            .sqrt();
        let want = (2.0 / fan_out as f64).sqrt();
        assert!(mean.abs() < 4.0 * want / n.sqrt(), "{name}: mean {mean}");
        let tolerance = if n > 1e6 { 0.01 } else { 0.03 };
        assert!(
            (std / want - 1.0).abs() < tolerance,
            "{name}: deviation {std}, torchvision's {want}"
        );
    }
    assert!(values("layer2.0.bn1.weight").iter().all(|&w| w == 1.0));
    assert!(
        values("layer2.0.downsample.1.bias")
            .iter()
            .all(|&b| b == 0.0)
    );
}
