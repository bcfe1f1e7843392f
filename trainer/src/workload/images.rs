//! Image classification: [`CnnSpec`], the digits CNN; [`ResNetSpec`], torchvision's ResNet as
//! a recipe; and [`SyntheticImages`], random images made on demand (a plan of ResNet-50 at
//! 224x224 and batch 256 makes none: on a planning device a batch is its allocation alone).

use plimsoll_autograd::{Category, Gpu, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::random::mix;
use plimsoll_nn::{
    HostTensor, LoadedState, Module, Optimizer, ResNet, ResNetConfig, Sequential, Stored, loss,
};

use crate::error::{Error, Result};
use crate::model::{Classifier, OptimizerSpec, logits_sums};
use crate::task::{Batch, Data, EvalSums, Model, Recipe, host_state};

/// `len` random images of `image` (`[channels, height, width]`, values uniform in `[-1, 1)`)
/// with random labels below `classes`, each a pure function of `(seed, sample)`: nothing is held,
/// and a planning device gets a batch's allocation without a value drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticImages {
    /// Samples.
    pub len: usize,
    /// Channels, height, width.
    pub image: [usize; 3],
    /// Classes.
    pub classes: usize,
    /// The seed of every value.
    pub seed: u64,
}

impl SyntheticImages {
    /// What a held-out set's seed is the run's seed XOR-ed with (`plimsoll train resnet18`'s
    /// evaluation images).
    pub const HELD_OUT: u64 = 0x7E57;

    /// Value `j` of sample `i`.
    fn value(&self, i: usize, j: usize) -> f32 {
        let bits = mix(self.seed ^ mix((i as u64) << 32 ^ j as u64));
        (bits >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// The label of sample `i`.
    fn label(&self, i: usize) -> u32 {
        (mix(self.seed.wrapping_add(0x9E37) ^ i as u64) % self.classes.max(1) as u64) as u32
    }
}

impl Data for SyntheticImages {
    fn len(&self) -> usize {
        self.len
    }

    /// The samples `indices` as `[n, c·h·w]` f32 pixels and `[n]` labels.
    fn upload(&self, gpu: &Gpu, indices: &[usize]) -> Result<Batch> {
        if let Some(&bad) = indices.iter().find(|&&i| i >= self.len) {
            return Err(Error::invalid(
                "batch",
                format!("sample {bad} of {} synthetic images", self.len),
            ));
        }
        let width = self.input_width();
        let shape = [indices.len(), width];
        let options = TensorOptions {
            category: Category::Input,
            label: "batch features",
            requires_grad: false,
        };
        let inputs = if gpu.is_planning() {
            Tensor::unwritten(gpu, &shape, options)?
        } else {
            let values: Vec<f32> = indices
                .iter()
                .flat_map(|&i| (0..width).map(move |j| self.value(i, j)))
                .collect();
            Tensor::from_slice_with(gpu, &values, &shape, options)?
        };
        let labels: Vec<u32> = indices.iter().map(|&i| self.label(i)).collect();
        let targets = Tensor::from_indices(gpu, &labels, &[indices.len()])?;
        Ok(Batch { inputs, targets })
    }

    fn input_width(&self) -> usize {
        self.image.iter().product()
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn describe(&self) -> String {
        let [c, h, w] = self.image;
        format!(
            "{} synthetic {c}x{h}x{w} images, {} classes",
            self.len, self.classes
        )
    }
}

/// A small CNN classifier of images given as flat pixels ([`plimsoll_nn::cnn`]: 3x3
/// convolutions of `widths` channels, ReLU and 2x2 max pooling, a linear head) and its optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct CnnSpec {
    /// The image: channels, height, width (their product is the data's feature count).
    pub image: [usize; 3],
    /// Each convolution's output channels.
    pub widths: Vec<usize>,
    /// Classes.
    pub classes: usize,
    /// Initialisation seed.
    pub seed: u64,
    /// The optimizer.
    pub optimizer: OptimizerSpec,
}

impl CnnSpec {
    /// Builds the network alone.
    pub fn network(&self, gpu: &Gpu) -> Result<Sequential> {
        Ok(plimsoll_nn::cnn(
            gpu,
            self.image,
            &self.widths,
            self.classes,
            self.seed,
        )?)
    }

    /// The image's side after the convolutions' poolings, as [`plimsoll_nn::cnn`] halves it.
    fn pooled(&self) -> [usize; 2] {
        let [_, mut h, mut w] = self.image;
        for _ in &self.widths {
            if h >= 2 && w >= 2 {
                (h, w) = (h / 2, w / 2);
            }
        }
        [h, w]
    }
}

impl Recipe for CnnSpec {
    fn build(&self, gpu: &Gpu) -> Result<(Box<dyn Model>, Box<dyn Optimizer>)> {
        let model = Classifier {
            net: self.network(gpu)?,
        };
        Ok((Box::new(model), self.optimizer.build()))
    }

    fn blocks(&self) -> usize {
        // Unflatten, conv and ReLU (and pooling) per width, Flatten, the head.
        let [_, mut h, mut w] = self.image;
        let mut children = 1;
        for _ in &self.widths {
            children += 2;
            if h >= 2 && w >= 2 {
                children += 1;
                (h, w) = (h / 2, w / 2);
            }
        }
        children + 2
    }

    fn parameter_count(&self) -> usize {
        let mut channels = self.image[0];
        let mut n = 0usize;
        for &width in &self.widths {
            n = n.saturating_add(width.saturating_mul(channels * 9 + 1));
            channels = width;
        }
        let [h, w] = self.pooled();
        let features = channels.saturating_mul(h * w);
        n.saturating_add(self.classes.saturating_mul(features + 1))
    }

    fn check(&self, data: &dyn Data) -> Result<()> {
        let (features, classes) = (data.input_width(), data.classes());
        let pixels: usize = self.image.iter().product();
        if pixels != features || self.classes < classes {
            return Err(Error::invalid(
                "model",
                format!(
                    "a CNN of {:?} images into {} classes does not fit data with {features} \
                     features and {classes} classes",
                    self.image, self.classes
                ),
            ));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let widths: Vec<String> = self.widths.iter().map(usize::to_string).collect();
        let [c, h, w] = self.image;
        format!(
            "CNN {c}x{h}x{w}, 3x3 convolutions {} with ReLU and 2x2 max pooling, {} classes, \
             seed {}; {}",
            widths.join("-"),
            self.classes,
            self.seed,
            self.optimizer
        )
    }
}

/// torchvision's ResNet of `config` over `image` inputs, and its optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct ResNetSpec {
    /// The depth's blocks and the classes.
    pub config: ResNetConfig,
    /// The network's depth (18, 34, 50, 101, 152), for messages.
    pub depth: usize,
    /// Channels (3), height and width of an image.
    pub image: [usize; 3],
    /// Initialisation seed.
    pub seed: u64,
    /// The optimizer.
    pub optimizer: OptimizerSpec,
}

impl Recipe for ResNetSpec {
    fn build(&self, gpu: &Gpu) -> Result<(Box<dyn Model>, Box<dyn Optimizer>)> {
        let model = ImageClassifier {
            net: ResNet::new(gpu, self.config, self.seed)?,
            image: self.image,
        };
        Ok((Box::new(model), self.optimizer.build()))
    }

    /// The residual blocks: what checkpointing recomputes.
    fn blocks(&self) -> usize {
        self.config.layers.iter().sum()
    }

    fn parameter_count(&self) -> usize {
        self.config.parameter_count()
    }

    fn check(&self, data: &dyn Data) -> Result<()> {
        let pixels: usize = self.image.iter().product();
        if self.image[0] != 3
            || data.input_width() != pixels
            || data.classes() > self.config.classes
        {
            return Err(Error::invalid(
                "model",
                format!(
                    "a ResNet of {:?} images into {} classes does not fit {}",
                    self.image,
                    self.config.classes,
                    data.describe()
                ),
            ));
        }
        Ok(())
    }

    /// False: BatchNorm normalises each micro-batch by its own statistics.
    fn micro_batch_invariant(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        let [c, h, w] = self.image;
        format!(
            "ResNet-{} (torchvision's), {c}x{h}x{w} images, {} classes, seed {}; {}",
            self.depth, self.config.classes, self.seed, self.optimizer
        )
    }
}

/// A built ResNet over flat pixels: each batch read as images, cross-entropy of the logits.
pub struct ImageClassifier {
    net: ResNet,
    image: [usize; 3],
}

impl ImageClassifier {
    /// The batch's pixels as `[n, c, h, w]` images.
    fn images(&self, batch: &Batch) -> Result<Tensor> {
        let n = batch.inputs.shape().first().copied().unwrap_or(0);
        let [c, h, w] = self.image;
        Ok(batch.inputs.reshape(&[n, c, h, w])?)
    }
}

impl Model for ImageClassifier {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.net.parameters()
    }

    fn loss(&self, batch: &Batch, segment_len: usize, label_smoothing: f32) -> Result<Tensor> {
        let logits = self
            .net
            .forward_checkpointed(&self.images(batch)?, segment_len)?;
        Ok(loss::cross_entropy(
            &logits,
            &batch.targets,
            label_smoothing,
        )?)
    }

    fn evaluate(&self, batch: &Batch) -> Result<EvalSums> {
        logits_sums(self.net.forward(&self.images(batch)?)?, &batch.targets)
    }

    fn set_training(&mut self, training: bool) {
        self.net.set_training(training);
    }

    fn buffers(&self) -> Vec<(String, Tensor)> {
        self.net.buffers()
    }

    /// torchvision's `state_dict()`: the parameters, then BatchNorm's running statistics and
    /// counts.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut entries = self.net.parameters();
        entries.extend(self.net.buffers());
        entries
    }

    /// [`Model::state_dict`] on the host, each `num_batches_tracked` a 0-d I64 as PyTorch keeps
    /// it (`[1]` f32 on the device), so `load_state_dict(..., strict=True)` takes the file.
    fn export_entries(&self) -> Result<Vec<(String, HostTensor)>> {
        let mut entries = host_state(self.state_dict())?;
        for (name, t) in &mut entries {
            if is_count(name) {
                t.shape = Vec::new();
                t.stored = Stored::I64;
            }
        }
        Ok(entries)
    }

    /// An export's (or torchvision's) counts back to the `[1]` f32 the device keeps.
    fn import_state(&self, mut loaded: LoadedState) -> Result<LoadedState> {
        for (name, t) in &mut loaded.tensors {
            if is_count(name) && t.data.len() == 1 {
                t.shape = vec![1];
                t.stored = Stored::F32;
            }
        }
        Ok(loaded)
    }
}

/// Whether `name` is a BatchNorm's count of the batches it tracked.
fn is_count(name: &str) -> bool {
    name.ends_with("num_batches_tracked")
}
