//! The host's memory: checked before a run allocates what a flag asked for, so a request too
//! large for the machine is [`Error::HostMemory`] with the figures, never an abort in the
//! allocator (`memory allocation of 25600000000 bytes failed`) or the kernel's OOM killer.

use crate::error::{Error, Result};

/// Bytes the host can still give, from `MemAvailable` in `/proc/meminfo` (Linux); `None` where
/// that is unknown (then nothing is refused up front).
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `count` elements of `element_bytes` each, or [`Error::HostMemory`] when the product
/// overflows or passes what the host has available. `what` names the request for the message.
pub fn check(what: &str, count: u64, element_bytes: u64) -> Result<u64> {
    let needed = count.checked_mul(element_bytes);
    let available = available_bytes();
    match (needed, available) {
        (Some(n), Some(a)) if n <= a => Ok(n),
        (Some(n), None) => Ok(n),
        (needed, available) => Err(Error::HostMemory {
            what: what.to_string(),
            needed_bytes: needed,
            available_bytes: available,
        }),
    }
}

/// The share of the host's available memory a run may hold by default
/// ([`crate::TrainConfig::host_memory_budget`]): the rest stays for everything else, so the
/// machine never swaps itself to a standstill.
pub const HOST_SHARE: f64 = 0.8;

/// The run's host budget: `asked`, else [`HOST_SHARE`] of what is available now (`None` where
/// that is unknown: nothing is refused up front).
pub fn budget(asked: Option<u64>) -> Option<u64> {
    asked.or_else(|| available_bytes().map(|a| (a as f64 * HOST_SHARE) as u64))
}

/// `a * b` as `u64`, saturating (a size that overflows is then refused by [`check`]).
pub fn product(a: usize, b: usize) -> u64 {
    (a as u64).saturating_mul(b as u64)
}

/// Refuses (before step 1) a run whose host memory on purpose passes its host budget
/// ([`crate::TrainConfig::host_memory_budget`]): the loader's batches, an offloaded optimizer's state,
/// offloaded activations (`activations`: at most in a step, as the plan found them), and the
/// snapshot of the training state kept for device-loss recovery.
pub(crate) fn check_run_budget(
    config: &crate::config::TrainConfig,
    activations: u64,
    train: &dyn crate::task::Data,
    params: &[(String, plimsoll_autograd::Tensor)],
    model: &dyn crate::task::Model,
    optimizer: &dyn plimsoll_nn::Optimizer,
    ranks: usize,
) -> Result<()> {
    let Some(budget) = budget(config.host_memory_budget) else {
        return Ok(());
    };
    let numel = |ts: &[(String, plimsoll_autograd::Tensor)]| {
        ts.iter().map(|(_, t)| t.numel() as u64).sum::<u64>()
    };
    let trained: u64 = params
        .iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(_, t)| t.numel() as u64)
        .sum();
    let loader = crate::plan::loader_host_bytes(train, config)?;
    let offloaded = match config.offload {
        crate::config::Offload::OptimizerState
        | crate::config::Offload::Activations
        | crate::config::Offload::Parameters => trained.saturating_mul(8),
        crate::config::Offload::None | crate::config::Offload::Auto => 0,
    };
    // Streamed parameters' values and gradients.
    let streamed = match config.offload.parameters_on_host() {
        true => numel(&model.streamed_parameters()).saturating_mul(8),
        false => 0,
    };
    // The snapshot holds the parameters, the buffers and every kind of optimizer state per
    // trained parameter, twice (the copy kept and the one the next is read into; both made at
    // step 1 when the run starts afresh).
    let kinds = optimizer.state_kinds().len() as u64;
    let state = numel(params)
        .saturating_add(numel(&model.buffers()))
        .saturating_add(trained.saturating_mul(kinds))
        .saturating_mul(4);
    let snapshots = config.max_device_losses > 0
        && ranks == 1
        && config.snapshot_every != crate::config::SnapshotEvery::Off;
    let snapshot = if snapshots {
        state.saturating_mul(2)
    } else {
        0
    };
    let needed = loader
        .saturating_add(offloaded)
        .saturating_add(streamed)
        .saturating_add(activations)
        .saturating_add(snapshot);
    if needed <= budget {
        return Ok(());
    }
    let fmt = plimsoll_allocator::format_bytes;
    Err(Error::HostBudgetTooSmall {
        needed_bytes: needed,
        budget_bytes: budget,
        default_budget: config.host_memory_budget.is_none(),
        parts: format!(
            "the loader's batches {}, the optimizer's state {}, streamed parameters and their \
             gradients {}, offloaded activations {}, the snapshot of the training state {}",
            fmt(loader),
            fmt(offloaded),
            fmt(streamed),
            fmt(activations),
            fmt(snapshot)
        ),
    })
}
