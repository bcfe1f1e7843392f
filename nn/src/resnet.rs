//! [`ResNet`]: torchvision's ResNet-18, -34, -50, -101 and -152 (He et al. 2015, v1.5: the
//! stride of a bottleneck on its 3x3) under torchvision's parameter and buffer names
//! (`conv1.weight`, `bn1.running_mean`, `layer2.0.downsample.0.weight`, `fc.bias`, ...) and
//! PyTorch's `[out, in, kh, kw]` layout: the stem (7x7 convolution of stride 2, BatchNorm, ReLU,
//! 3x3 max pooling of stride 2), four stages of residual blocks, global average pooling and a
//! linear classifier. Convolutions have no bias (BatchNorm follows each), as torchvision's.

use plimsoll_autograd::{Gpu, Tensor, TensorOptions};

use crate::conv::{Conv2d, Conv2dOptions};
use crate::error::{Error, Result};
use crate::linear::{Init, Linear, derive_seed};
use crate::module::{Module, prefixed};
use crate::norm2d::BatchNorm2d;
use crate::pool::{AdaptiveAvgPool2d, MaxPool2d};
use crate::sequential::run_blocks;

/// Which residual block a ResNet stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// Two 3x3 convolutions (ResNet-18, -34); expansion 1.
    Basic,
    /// 1x1, 3x3 (with the stride), 1x1 to 4x the width (ResNet-50 and deeper); expansion 4.
    Bottleneck,
}

impl BlockKind {
    /// Output channels over the block's width.
    pub fn expansion(self) -> usize {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }
}

/// A ResNet's shape: the block, the blocks per stage and the classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResNetConfig {
    /// The residual block.
    pub block: BlockKind,
    /// Blocks in each of the four stages.
    pub layers: [usize; 4],
    /// Classes of the classifier (ImageNet: 1000).
    pub classes: usize,
}

impl ResNetConfig {
    /// torchvision's ResNet of `depth` 18, 34, 50, 101 or 152 for `classes` classes. Errors:
    /// another depth.
    pub fn depth(depth: usize, classes: usize) -> Result<ResNetConfig> {
        let (block, layers) = match depth {
            18 => (BlockKind::Basic, [2, 2, 2, 2]),
            34 => (BlockKind::Basic, [3, 4, 6, 3]),
            50 => (BlockKind::Bottleneck, [3, 4, 6, 3]),
            101 => (BlockKind::Bottleneck, [3, 4, 23, 3]),
            152 => (BlockKind::Bottleneck, [3, 8, 36, 3]),
            _ => {
                return Err(Error::InvalidConfig {
                    what: "ResNetConfig::depth",
                    message: format!("depth {depth}: torchvision's are 18, 34, 50, 101 and 152"),
                });
            }
        };
        Ok(ResNetConfig {
            block,
            layers,
            classes,
        })
    }
}

impl ResNetConfig {
    /// Parameter elements of the network (without building it): convolutions, BatchNorm scales
    /// and shifts, the classifier.
    pub fn parameter_count(&self) -> usize {
        let conv_bn = |cin: usize, cout: usize, k: usize| cin * cout * k * k + 2 * cout;
        let expansion = self.block.expansion();
        let mut n = conv_bn(3, 64, 7);
        let mut cin = 64;
        for (i, &blocks) in self.layers.iter().enumerate() {
            let width = 64 << i;
            let out = width * expansion;
            for b in 0..blocks {
                let stride = if i > 0 && b == 0 { 2 } else { 1 };
                n += match self.block {
                    BlockKind::Basic => conv_bn(cin, width, 3) + conv_bn(width, width, 3),
                    BlockKind::Bottleneck => {
                        conv_bn(cin, width, 1) + conv_bn(width, width, 3) + conv_bn(width, out, 1)
                    }
                };
                if stride != 1 || cin != out {
                    n += conv_bn(cin, out, 1);
                }
                cin = out;
            }
        }
        n + cin * self.classes + self.classes
    }
}

/// A convolution without bias and its BatchNorm (torchvision's `convN`, `bnN` pairs).
#[derive(Debug, Clone)]
struct ConvBn {
    conv: Conv2d,
    bn: BatchNorm2d,
}

impl ConvBn {
    fn new(
        gpu: &Gpu,
        (cin, cout): (usize, usize),
        k: usize,
        stride: usize,
        seed: u64,
    ) -> Result<Self> {
        let options = Conv2dOptions::default().stride(stride).padding(k / 2);
        // torchvision's initialisation: kaiming_normal_(mode="fan_out", nonlinearity="relu"),
        // N(0, 2 / (out · kh · kw)); BatchNorm's weight 1 and bias 0.
        let std = (2.0 / (cout * k * k) as f32).sqrt();
        let weight = Tensor::normal(
            gpu,
            &[cout, cin, k, k],
            0.0,
            std,
            seed,
            TensorOptions::parameter("conv2d.weight"),
        )?;
        Ok(ConvBn {
            conv: Conv2d::from_parts(weight, None, options)?,
            bn: BatchNorm2d::new(gpu, cout)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.bn.forward(&self.conv.forward(x)?)
    }

    /// Parameters (or buffers, with `buffers`) under `conv_name` and `bn_name`.
    fn named(&self, conv_name: &str, bn_name: &str, buffers: bool) -> Vec<(String, Tensor)> {
        match buffers {
            false => {
                let mut p = prefixed(conv_name, self.conv.parameters());
                p.extend(prefixed(bn_name, self.bn.parameters()));
                p
            }
            true => prefixed(bn_name, self.bn.buffers()),
        }
    }

    fn set_training(&mut self, training: bool) {
        self.bn.set_training(training);
    }
}

/// One residual block: `relu(convs(x) + shortcut(x))`, the shortcut a strided 1x1 convolution
/// and BatchNorm (`downsample.0`, `downsample.1`) where the shape changes.
#[derive(Debug, Clone)]
struct Block {
    /// `conv1`/`bn1`, `conv2`/`bn2` (and `conv3`/`bn3` in a bottleneck).
    convs: Vec<ConvBn>,
    downsample: Option<ConvBn>,
}

impl Block {
    fn new(
        gpu: &Gpu,
        kind: BlockKind,
        (cin, width): (usize, usize),
        stride: usize,
        seed: u64,
    ) -> Result<Block> {
        let out = width * kind.expansion();
        let s = |i| derive_seed(seed, i);
        let convs = match kind {
            BlockKind::Basic => vec![
                ConvBn::new(gpu, (cin, width), 3, stride, s(0))?,
                ConvBn::new(gpu, (width, width), 3, 1, s(1))?,
            ],
            BlockKind::Bottleneck => vec![
                ConvBn::new(gpu, (cin, width), 1, 1, s(0))?,
                ConvBn::new(gpu, (width, width), 3, stride, s(1))?,
                ConvBn::new(gpu, (width, out), 1, 1, s(2))?,
            ],
        };
        let downsample = (stride != 1 || cin != out)
            .then(|| ConvBn::new(gpu, (cin, out), 1, stride, s(3)))
            .transpose()?;
        Ok(Block { convs, downsample })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, cb) in self.convs.iter().enumerate() {
            h = cb.forward(&h)?;
            if i + 1 < self.convs.len() {
                h = h.relu()?;
            }
        }
        let shortcut = match &self.downsample {
            Some(d) => d.forward(x)?,
            None => x.clone(),
        };
        Ok(h.add(&shortcut)?.relu()?)
    }

    fn named(&self, buffers: bool) -> Vec<(String, Tensor)> {
        let mut p = Vec::new();
        for (i, cb) in self.convs.iter().enumerate() {
            let n = i + 1;
            p.extend(cb.named(&format!("conv{n}"), &format!("bn{n}"), buffers));
        }
        if let Some(d) = &self.downsample {
            p.extend(d.named("downsample.0", "downsample.1", buffers));
        }
        p
    }

    fn set_training(&mut self, training: bool) {
        for cb in self.convs.iter_mut().chain(self.downsample.as_mut()) {
            cb.set_training(training);
        }
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Block::forward(self, x)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.named(false)
    }

    fn buffers(&self) -> Vec<(String, Tensor)> {
        self.named(true)
    }

    fn set_training(&mut self, training: bool) {
        Block::set_training(self, training);
    }

    fn is_training(&self) -> bool {
        self.convs.first().is_some_and(|cb| cb.bn.is_training())
    }
}

/// torchvision's ResNet: images `[N, 3, H, W]` in, logits `[N, classes]` out.
#[derive(Debug, Clone)]
pub struct ResNet {
    stem: ConvBn,
    stages: [Vec<Block>; 4],
    fc: Linear,
    training: bool,
}

impl ResNet {
    /// The ResNet `config` describes, its weights drawn from `seed` (PyTorch's default
    /// initialisation for each layer; BatchNorm's scale ones and shift zeros). Errors: no
    /// classes, a stage without blocks.
    pub fn new(gpu: &Gpu, config: ResNetConfig, seed: u64) -> Result<ResNet> {
        if config.classes == 0 || config.layers.contains(&0) {
            return Err(Error::InvalidConfig {
                what: "ResNet::new",
                message: format!(
                    "{} classes and blocks per stage {:?} must all be at least 1",
                    config.classes, config.layers
                ),
            });
        }
        let stem = ConvBn::new(gpu, (3, 64), 7, 2, derive_seed(seed, 0))?;
        let mut cin = 64;
        let mut stages: [Vec<Block>; 4] = Default::default();
        for (i, stage) in stages.iter_mut().enumerate() {
            let width = 64 << i;
            for b in 0..config.layers[i] {
                let stride = if i > 0 && b == 0 { 2 } else { 1 };
                let s = derive_seed(seed, 100 * (i as u64 + 1) + b as u64);
                stage.push(Block::new(gpu, config.block, (cin, width), stride, s)?);
                cin = width * config.block.expansion();
            }
        }
        let fc = Linear::new(
            gpu,
            cin,
            config.classes,
            true,
            Init::KaimingUniform,
            derive_seed(seed, 1),
        )?;
        Ok(ResNet {
            stem,
            stages,
            fc,
            training: true,
        })
    }

    fn named(&self, buffers: bool) -> Vec<(String, Tensor)> {
        let mut p = self.stem.named("conv1", "bn1", buffers);
        for (i, stage) in self.stages.iter().enumerate() {
            for (b, block) in stage.iter().enumerate() {
                p.extend(prefixed(
                    &format!("layer{}.{b}", i + 1),
                    block.named(buffers),
                ));
            }
        }
        if !buffers {
            p.extend(prefixed("fc", self.fc.parameters()));
        }
        p
    }
}

impl ResNet {
    /// Logits of `x`, each run of `segment_len` residual blocks through autograd's checkpoint
    /// (0: none; BatchNorm's statistics move once however often a block runs).
    pub fn forward_checkpointed(&self, x: &Tensor, segment_len: usize) -> Result<Tensor> {
        let s = x.shape();
        if s.len() != 4 || s[1] != 3 {
            return Err(Error::InputShape {
                module: "ResNet",
                expected: "[batch, 3, height, width] images".to_string(),
                found: s.to_vec(),
            });
        }
        let mut h = self.stem.forward(x)?.relu()?;
        h = MaxPool2d::new(3, 2, 1).forward(&h)?;
        let blocks: Vec<Block> = self.stages.iter().flatten().cloned().collect();
        h = run_blocks(&blocks, h, segment_len, "ResNet::forward_checkpointed")?;
        let pooled = AdaptiveAvgPool2d { out_size: [1, 1] }.forward(&h)?;
        let n = pooled.shape()[0];
        self.fc
            .forward(&pooled.reshape(&[n, pooled.numel() / n.max(1)])?)
    }
}

impl Module for ResNet {
    /// Logits without checkpointing ([`ResNet::forward_checkpointed`]).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_checkpointed(x, 0)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.named(false)
    }

    fn buffers(&self) -> Vec<(String, Tensor)> {
        self.named(true)
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
        self.stem.set_training(training);
        for block in self.stages.iter_mut().flatten() {
            block.set_training(training);
        }
    }

    fn is_training(&self) -> bool {
        self.training
    }
}
