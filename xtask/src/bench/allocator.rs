//! The allocator suite (being built).

use anyhow::{Result, bail};

use super::Report;

/// Runs the allocator suite.
pub fn run() -> Result<Report> {
    bail!("the allocator suite is not written yet")
}
