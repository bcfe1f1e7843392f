//! Empty: see `[build-dependencies]` in Cargo.toml (why `syn` is named there).

fn main() {}
