//! The train suite's image part: the digits CNN (`train digits --model cnn`: 3x3 convolutions of
//! 32 and 64 channels, batch 64, u8 images made f32 on the device) and torchvision's ResNet-18
//! on synthetic 32x32 images (batch 8), each through `plimsoll-trainer`'s real step: median
//! step time over timed steps after warm-up steps, images per second, and step efficiency (the
//! step's matmuls, the convolutions' im2col products among them, timed alone over the step:
//! what the rest, the columns, pooling, BatchNorm and the optimizer, costs shows as the gap).

use std::time::Duration;

use anyhow::Result;
use plimsoll_kernels_wgsl::Gpu;
use plimsoll_nn::{AdamWConfig, LrSchedule, ResNetConfig};
use plimsoll_trainer::data::DIGITS_CSV_GZ;
use plimsoll_trainer::{
    CheckpointPolicy, CnnSpec, Data, Dataset, ImageSet, LeakPolicy, OptimizerSpec, Recipe,
    ResNetSpec, RunLength, SyntheticImages, TrainConfig, Trainer,
};

use super::Report;
use super::train::{EFFICIENCY_STEPS, median, step_efficiency, steps};

const WARMUP_STEPS: usize = 3;
const TIMED_STEPS: usize = 10;

fn config(batch: usize) -> TrainConfig {
    TrainConfig {
        effective_batch: batch,
        micro_batch: Some(batch),
        length: RunLength::Steps((WARMUP_STEPS + TIMED_STEPS + EFFICIENCY_STEPS) as u64),
        schedule: LrSchedule::Constant { lr: 1e-3 },
        checkpointing: CheckpointPolicy::None,
        fence_deadline: Duration::from_secs(300),
        leak_policy: LeakPolicy::Warn,
        ..TrainConfig::default()
    }
}

fn adamw() -> OptimizerSpec {
    OptimizerSpec::AdamW(AdamWConfig::default())
}

/// Times `recipe` on `data` in batches of `batch` and reports it under `name`.
fn bench(
    report: &mut Report,
    name: &str,
    recipe: &dyn Recipe,
    data: impl Data + 'static,
    batch: usize,
) -> Result<()> {
    let gpu = Gpu::new()?;
    let mut trainer = Trainer::new(&gpu, config(batch), recipe, data, None)?;
    let (times, [_, reserved, _]) = steps(&mut trainer, WARMUP_STEPS, TIMED_STEPS)?;
    let step_ms = median(times);
    let (matmul_ms, efficiency, products) = step_efficiency(&mut trainer, name)?;
    report.push(format!("{name}/step_median (batch {batch})"), step_ms, "ms");
    report.push(
        format!("{name}/throughput"),
        batch as f64 / (step_ms / 1e3),
        "images/s",
    );
    report.push(
        format!("{name}/step_matmuls_alone ({products} products)"),
        matmul_ms,
        "ms",
    );
    report.push(format!("{name}/step_efficiency"), efficiency, "ratio");
    report.push(format!("{name}/peak_reserved"), reserved as f64 / 1e6, "MB");
    Ok(())
}

/// Runs the image part.
pub fn run(report: &mut Report) -> Result<()> {
    let mut digits = Dataset::from_csv_gz_bytes("data/digits.csv.gz", DIGITS_CSV_GZ)?;
    digits.scale(1.0 / 16.0);
    let image = [1, 8, 8];
    let images = ImageSet::from_features(digits.features(), digits.labels(), 10, image)?;
    let cnn = CnnSpec {
        image,
        widths: vec![32, 64],
        classes: 10,
        seed: 0,
        optimizer: adamw(),
    };
    bench(report, "digits_cnn", &cnn, images, 64)?;

    let image = [3, 32, 32];
    let resnet = ResNetSpec {
        config: ResNetConfig::depth(18, 10)?,
        depth: 18,
        image,
        seed: 0,
        optimizer: adamw(),
    };
    let synthetic = SyntheticImages {
        len: 64,
        image,
        classes: 10,
        seed: 0,
    };
    bench(report, "resnet18_32px", &resnet, synthetic, 8)
}
