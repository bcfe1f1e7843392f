//! The image loader: u8 images batched as bytes (a quarter of their f32 bytes) and made the
//! model's input on the device, with random crops and flips drawn from the run's random state.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_nn::AdamWConfig;
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::data::DIGITS_CSV_GZ;
use plimsoll_trainer::{
    CnnSpec, Data, Dataset, ImageSet, ImageTransform, OptimizerSpec, RunLength, Silent, Trainer,
};

/// 300 of the bundled digits, pixels scaled to `[0, 1]` on the 256 levels of a byte (so that the
/// table and its u8 images hold the same values).
fn digits() -> Dataset {
    let mut d = Dataset::from_csv_gz_bytes("data/digits.csv.gz", DIGITS_CSV_GZ).unwrap();
    d.scale(1.0 / 16.0);
    for v in d.features_mut() {
        *v = (*v * 255.0).round() / 255.0;
    }
    d.split(0.79, 5).0
}

fn cnn() -> CnnSpec {
    CnnSpec {
        image: [1, 8, 8],
        widths: vec![4, 8],
        classes: 10,
        seed: 2,
        optimizer: OptimizerSpec::AdamW(AdamWConfig {
            lr: 3e-3,
            ..AdamWConfig::default()
        }),
    }
}

fn images(d: &Dataset, crop_padding: usize, flips: bool) -> ImageSet {
    let transform = ImageTransform {
        crop_padding,
        flips,
        ..ImageTransform::plain([1, 8, 8])
    };
    ImageSet::from_features(d.features(), d.labels(), 10, [1, 8, 8])
        .unwrap()
        .with_transform(transform)
        .unwrap()
}

/// Trains `data` for `steps` steps of 32 (micro-batches of 16, through the loader thread).
fn train(data: impl Data + 'static, steps: u64) -> Values {
    let gpu = fresh_gpu();
    let mut t = Trainer::new(&gpu, config(32, 16, steps, 3e-3), &cnn(), data, None).unwrap();
    t.run(&mut Silent).unwrap();
    values(t.parameters())
}

/// Plain u8 images train exactly as the table of the same values does (`v / 255` on the device
/// is the same f32 as on the host), while the loader holds a quarter of the bytes; crops
/// change the run.
#[test]
fn u8_images_train_as_their_f32_table() {
    let table = digits();
    let set = images(&table, 0, false);
    assert_eq!(set.len(), table.len());
    let host = set.gather(&[0, 5, 9]).unwrap().unwrap();
    let f32_host = table.gather(&[0, 5, 9]).unwrap().unwrap();
    assert_eq!(host.bytes() - 12, (f32_host.bytes() - 12) / 4);
    let from_table = train(table.clone(), 4);
    assert_eq!(train(set, 4), from_table);
    assert_ne!(train(images(&table, 1, true), 4), from_table);
}

/// Crops and flips come from the run's random state: two runs of one seed agree, and a run
/// stopped after two steps and resumed holds what the straight run does after five.
#[test]
fn augmented_runs_repeat_and_resume_bit_identically() {
    let table = digits();
    let set = images(&table, 2, true);
    let straight = train(set.clone(), 5);
    assert_eq!(train(set.clone(), 5), straight);
    let dir = temp_dir("images-resume");
    let gpu = fresh_gpu();
    let mut first = config(32, 16, 2, 3e-3);
    first.checkpoint_dir = Some(dir.clone());
    let mut t = Trainer::new(&gpu, first.clone(), &cnn(), set.clone(), None).unwrap();
    t.run(&mut Silent).unwrap();
    drop(t);
    let mut second = first;
    second.length = RunLength::Steps(5);
    let mut t = Trainer::new(&gpu, second, &cnn(), set, None).unwrap();
    t.resume(&latest_path(&dir)).unwrap();
    t.run(&mut Silent).unwrap();
    assert_eq!(values(t.parameters()), straight);
    let _ = std::fs::remove_dir_all(&dir);
}
