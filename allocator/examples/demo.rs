//! A scripted scenario on a pretend 64 MiB device: an MLP's forward and backward, a deliberate
//! fragmentation, and the out-of-memory error it causes, then the memory summary table.
//!
//! Run: `cargo run --release -p plimsoll-allocator --example demo`

use anyhow::Result;
use plimsoll_allocator::{
    AllocatorConfig, BufferAllocator, Category, Request, SimulatedSource, format_bytes,
};

const MIB: u64 = 1 << 20;

fn main() -> Result<()> {
    let config = AllocatorConfig {
        budget_bytes: 48 * MIB,
        ..AllocatorConfig::default()
    };
    let mut allocator = BufferAllocator::new(SimulatedSource::new(64 * MIB), config);

    // Parameters of a 3-layer MLP (784 -> 1024 -> 1024 -> 10), f32.
    let widths = [784u64, 1024, 1024, 10];
    let mut parameters = Vec::new();
    for (layer, pair) in widths.windows(2).enumerate() {
        let label = format!("linear{layer}.weight");
        parameters.push(allocator.allocate(Request::new(
            pair[0] * pair[1] * 4,
            Category::Parameter,
            &label,
        ))?);
    }
    // One training step, batch 512: forward saves activations, backward frees them in reverse.
    let batch = 512;
    let input = allocator.allocate(Request::new(
        batch * widths[0] * 4,
        Category::Input,
        "batch",
    ))?;
    let mut saved = Vec::new();
    for (layer, width) in widths[1..].iter().enumerate() {
        let label = format!("linear{layer}.forward");
        saved.push(allocator.allocate(Request::new(
            batch * width * 4,
            Category::Activation,
            &label,
        ))?);
    }
    let mut gradients = Vec::new();
    for (layer, pair) in widths.windows(2).enumerate().rev() {
        let label = format!("linear{layer}.weight.grad");
        gradients.push(allocator.allocate(Request::new(
            pair[0] * pair[1] * 4,
            Category::Gradient,
            &label,
        ))?);
        if let Some(activation) = saved.pop() {
            allocator.free(activation)?;
        }
    }
    allocator.free(input)?;
    println!(
        "after one step: {} allocated, {} reserved\n",
        format_bytes(allocator.stats().allocated_bytes),
        format_bytes(allocator.stats().reserved_bytes)
    );

    // Deliberate fragmentation: fill the budget with 512 KiB temporaries (they share 2 MiB segments), then free every other one.
    let mut scratch = Vec::new();
    while let Ok(block) = allocator.allocate(Request::new(MIB / 2, Category::Temporary, "scratch"))
    {
        scratch.push(block);
    }
    let mut kept = Vec::new();
    for (index, block) in scratch.into_iter().enumerate() {
        if index % 2 == 0 {
            allocator.free(block)?
        } else {
            kept.push(block)
        }
    }
    println!(
        "fragmentation now {:.2}; largest free block {}\n",
        allocator.fragmentation(),
        format_bytes(allocator.largest_free_bytes())
    );
    match allocator.allocate(Request::new(
        16 * MIB,
        Category::Activation,
        "attention.scores",
    )) {
        Ok(_) => println!("unexpectedly fitted"),
        Err(error) => println!("{error}\n"),
    }
    println!("{}", allocator.summary());
    Ok(())
}
