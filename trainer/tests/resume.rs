//! Checkpoints: a run stopped at step N and resumed ends bit-identical to one that never stopped;
//! the stop flag (Ctrl-C) saves and ends the run cleanly.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;

use common::*;
use plimsoll_kernels_wgsl::testing::fresh_gpu;
use plimsoll_trainer::checkpoint_io::latest_path;
use plimsoll_trainer::{RunLength, Silent, Trainer};

#[test]
fn a_resumed_run_is_bit_identical() {
    let spec = adam_spec(&[10, 24, 24, 3]);
    let data = data(40, 10, 3); // 3 steps per epoch of 16: the run crosses epochs
    let straight = {
        let gpu = fresh_gpu();
        let mut t = Trainer::new(&gpu, config(16, 8, 7, 1e-2), &spec, data.clone(), None).unwrap();
        t.run(&mut Silent).unwrap();
        values(t.parameters())
    };
    let dir = temp_dir("resume");
    let gpu = fresh_gpu();
    let mut first = config(16, 8, 4, 1e-2);
    first.checkpoint_dir = Some(dir.clone());
    let mut t = Trainer::new(&gpu, first.clone(), &spec, data.clone(), None).unwrap();
    let summary = t.run(&mut Silent).unwrap();
    assert_eq!(summary.steps, 4);
    drop(t);
    let mut second = first;
    second.length = RunLength::Steps(7);
    let mut t = Trainer::new(&gpu, second, &spec, data, None).unwrap();
    t.resume(&latest_path(&dir)).unwrap();
    assert_eq!(t.position().step, 4);
    t.run(&mut Silent).unwrap();
    assert_eq!(values(t.parameters()), straight);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_stop_flag_saves_and_ends_the_run() {
    let dir = temp_dir("stop");
    let gpu = fresh_gpu();
    let mut config = config(16, 16, 50, 1e-2);
    config.checkpoint_dir = Some(dir.clone());
    let mut t = Trainer::new(&gpu, config, &adam_spec(&[10, 8, 3]), data(40, 10, 3), None).unwrap();
    t.step().unwrap();
    t.stop_flag().store(true, Ordering::SeqCst);
    let summary = t.run(&mut Silent).unwrap();
    assert!(summary.interrupted);
    assert_eq!(summary.steps, 1);
    assert_eq!(summary.checkpoint, Some(latest_path(&dir)));
    assert!(
        t.log()
            .iter()
            .any(|l| l.contains("interrupted after step 1"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}
