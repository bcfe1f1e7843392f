//! A run on disk: checkpoints ([`checkpoint_io`]), the run's directory and the list of runs
//! ([`run_dir`]), and the trainer's files (`trainer_files`: resuming, saving `latest` and
//! `best`, exporting the model for PyTorch).

pub mod checkpoint_io;
pub mod run_dir;
mod trainer_files;
