//! Image classification: [`CnnSpec`], the digits CNN; [`ResNetSpec`], torchvision's ResNet as
//! a recipe; [`ImageSet`], u8 images kept and batched as bytes and made normalised f32 on the
//! device with random crops and flips ([`ImageTransform`]); and [`SyntheticImages`], random
//! images made on demand (a plan of ResNet-50 at 224x224 and batch 256 makes none: on a planning
//! device a batch is its allocation alone).

use std::sync::Arc;

use plimsoll_autograd::grad_mode::next_seed;
use plimsoll_autograd::{Category, DType, Gpu, Tensor, TensorOptions};
use plimsoll_kernels_wgsl::kernels::augment::{self, AugmentDims, MAX_CHANNELS};
use plimsoll_kernels_wgsl::random::mix;
use plimsoll_nn::{
    HostTensor, LoadedState, Module, Optimizer, ResNet, ResNetConfig, Sequential, Stored, loss,
};

use crate::error::{Error, Result};
use crate::model::{Classifier, OptimizerSpec, logits_sums};
use crate::task::{Batch, Data, EvalSums, HostBatch, HostInputs, Model, Recipe, host_state};

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

/// How a batch of u8 images becomes the model's f32 input, on the device
/// ([`augment::augment`]): each channel normalised as `(v / 255 - mean) / std`, after
/// torchvision's `RandomCrop(size, padding=crop_padding)` and, with `flips`,
/// `RandomHorizontalFlip()`. The crops and flips are drawn from the step thread's random state
/// (dropout's, [`next_seed`]), which a checkpoint saves and a retried step restores, so a
/// resumed or retried step sees the same crops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageTransform {
    /// Channels (at most 4), height, width.
    pub image: [usize; 3],
    /// Per channel, subtracted from `v / 255` (the first `channels` are read).
    pub mean: [f32; MAX_CHANNELS],
    /// Per channel, what `v / 255 - mean` is divided by.
    pub std: [f32; MAX_CHANNELS],
    /// Zeros around each side before the random crop back to the image's size (0: no crop).
    pub crop_padding: usize,
    /// Whether half of the images, at random, are flipped left to right.
    pub flips: bool,
}

impl ImageTransform {
    /// `v / 255` for every pixel, no crop, no flip: an evaluation set's.
    pub fn plain(image: [usize; 3]) -> ImageTransform {
        ImageTransform {
            image,
            mean: [0.0; MAX_CHANNELS],
            std: [1.0; MAX_CHANNELS],
            crop_padding: 0,
            flips: false,
        }
    }

    /// Whether a batch draws anything (a crop or a flip).
    pub fn is_random(&self) -> bool {
        self.crop_padding > 0 || self.flips
    }

    /// The `n` images `pixels` (`[n, c, h, w]` bytes) uploaded four to a u32 word and made
    /// `[n, c·h·w]` f32 features on the device (`Category::Input`). A planning device gets the
    /// two allocations alone.
    pub fn upload(&self, gpu: &Gpu, pixels: &[u8], n: usize) -> Result<Tensor> {
        let dims = AugmentDims {
            images: n,
            image: self.image,
            pad: self.crop_padding,
            flips: self.flips,
            mean: self.mean,
            std: self.std,
        };
        let width: usize = self.image.iter().product();
        if pixels.len() != n * width {
            return Err(Error::invalid(
                "batch",
                format!(
                    "{} bytes for {n} images of {:?} ({} needed)",
                    pixels.len(),
                    self.image,
                    n * width
                ),
            ));
        }
        let words = dims.words() as usize;
        let packed = if gpu.is_planning() {
            Tensor::empty_typed(gpu, &[words], DType::U32, Category::Input, "batch pixels")?
        } else {
            let words: Vec<u32> = pixels
                .chunks(4)
                .map(|b| {
                    let mut word = [0u8; 4];
                    word[..b.len()].copy_from_slice(b);
                    u32::from_le_bytes(word)
                })
                .collect();
            Tensor::from_indices(gpu, &words, &[words.len()])?
        };
        let out = Tensor::empty(gpu, &[n, width], Category::Input, "batch features")?;
        let seed = if self.is_random() { next_seed() } else { 0 };
        augment::augment(gpu, &dims, seed, out.elements()?, packed.elements()?)?;
        Ok(out)
    }
}

/// Labelled u8 images (`[c, h, w]` bytes each) in host memory, a quarter of their f32 bytes,
/// batched as bytes (on the loader thread, [`Data::gather`]) and made the model's f32 input on
/// the device by [`ImageTransform`]: a training set's with random crops and flips, an
/// evaluation set's plain. Clones share the bytes.
#[derive(Debug, Clone)]
pub struct ImageSet {
    pixels: Arc<[u8]>,
    labels: Arc<[u32]>,
    classes: usize,
    transform: ImageTransform,
}

impl ImageSet {
    /// `labels.len()` images of `transform.image` in `pixels`, labels below `classes`. Errors:
    /// a byte count that is not the images', a label out of range, more than 4 channels.
    pub fn new(
        pixels: Vec<u8>,
        labels: Vec<u32>,
        classes: usize,
        transform: ImageTransform,
    ) -> Result<ImageSet> {
        let width: usize = transform.image.iter().product();
        let [c, h, w] = transform.image;
        if c == 0 || c > MAX_CHANNELS || h == 0 || w == 0 {
            return Err(Error::invalid(
                "images",
                format!(
                    "{:?}: need 1 to {MAX_CHANNELS} channels and a height and width of at least 1",
                    transform.image
                ),
            ));
        }
        if pixels.len() != labels.len().saturating_mul(width) {
            return Err(Error::invalid(
                "images",
                format!(
                    "{} bytes for {} images of {:?} ({} needed)",
                    pixels.len(),
                    labels.len(),
                    transform.image,
                    labels.len().saturating_mul(width)
                ),
            ));
        }
        if let Some(bad) = labels.iter().find(|&&l| l as usize >= classes) {
            return Err(Error::invalid(
                "images",
                format!("label {bad} of {classes} classes"),
            ));
        }
        Ok(ImageSet {
            pixels: pixels.into(),
            labels: labels.into(),
            classes,
            transform,
        })
    }

    /// The images of a table whose features are pixels in `[0, 1]` (each rounded to the nearest
    /// of 256 levels), shaped `image`, made plain.
    pub fn from_features(
        features: &[f32],
        labels: &[u32],
        classes: usize,
        image: [usize; 3],
    ) -> Result<ImageSet> {
        let pixels = features
            .iter()
            .map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8)
            .collect();
        ImageSet::new(
            pixels,
            labels.to_vec(),
            classes,
            ImageTransform::plain(image),
        )
    }

    /// The same images made the model's input by `transform` (the same shape).
    pub fn with_transform(mut self, transform: ImageTransform) -> Result<ImageSet> {
        if transform.image != self.transform.image {
            return Err(Error::invalid(
                "images",
                format!(
                    "a transform of {:?} images for images of {:?}",
                    transform.image, self.transform.image
                ),
            ));
        }
        self.transform = transform;
        Ok(self)
    }

    /// How a batch becomes the model's input.
    pub fn transform(&self) -> &ImageTransform {
        &self.transform
    }

    fn width(&self) -> usize {
        self.transform.image.iter().product()
    }

    /// The bytes and labels of `indices`, or an error naming one past the set.
    fn bytes_of(&self, indices: &[usize]) -> Result<(Vec<u8>, Vec<u32>)> {
        if let Some(&bad) = indices.iter().find(|&&i| i >= self.labels.len()) {
            return Err(Error::invalid(
                "batch",
                format!("sample {bad} of {} images", self.labels.len()),
            ));
        }
        let w = self.width();
        let mut bytes = Vec::with_capacity(indices.len() * w);
        for &i in indices {
            bytes.extend_from_slice(&self.pixels[i * w..(i + 1) * w]);
        }
        Ok((bytes, indices.iter().map(|&i| self.labels[i]).collect()))
    }
}

impl Data for ImageSet {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn upload(&self, gpu: &Gpu, indices: &[usize]) -> Result<Batch> {
        let (bytes, labels) = self.bytes_of(indices)?;
        Ok(Batch {
            inputs: self.transform.upload(gpu, &bytes, indices.len())?,
            targets: Tensor::from_indices(gpu, &labels, &[indices.len()])?,
        })
    }

    /// The batch's bytes and labels on the host (a quarter of its f32 features).
    fn gather(&self, indices: &[usize]) -> Result<Option<HostBatch>> {
        let (bytes, targets) = self.bytes_of(indices)?;
        Ok(Some(HostBatch {
            rows: indices.len(),
            input_width: self.width(),
            inputs: HostInputs::Pixels(bytes, self.transform),
            targets,
            targets_per_row: None,
        }))
    }

    fn input_width(&self) -> usize {
        self.width()
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn describe(&self) -> String {
        let [c, h, w] = self.transform.image;
        let t = &self.transform;
        let mut augmented = Vec::new();
        if t.crop_padding > 0 {
            augmented.push(format!("random crops padded by {}", t.crop_padding));
        }
        if t.flips {
            augmented.push("random horizontal flips".to_string());
        }
        let augmented = match augmented.is_empty() {
            true => String::new(),
            false => format!(", {}", augmented.join(" and ")),
        };
        format!(
            "{} {c}x{h}x{w} u8 images, {} classes{augmented}",
            self.labels.len(),
            self.classes
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
