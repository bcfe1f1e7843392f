//! Where the training state lives (the device, host memory, the ranks' parts), checked
//! against the host and told in the run's log before step 1.

use plimsoll_autograd::Tensor;
use plimsoll_nn::Optimizer;

use crate::config::TrainConfig;
use crate::error::Result;
use crate::plan::MemoryPlan;

/// The log's lines on where `config` keeps the state of a model of `params` trained by
/// `optimizer` (a sharded optimizer's part, an offloaded optimizer's host bytes, offloaded
/// activations under `plan` with segments of `segment_len` blocks). Errors: an offloaded
/// optimizer's state the host cannot hold ([`crate::host::check`]).
pub(crate) fn notes(
    config: &TrainConfig,
    plan: Option<&MemoryPlan>,
    params: &[(String, Tensor)],
    optimizer: &dyn Optimizer,
    segment_len: usize,
) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    match (config.shard, optimizer.row_shard()) {
        (crate::config::Shard::None, _) => {}
        (shard, None) => notes.push(format!(
            "--shard {shard}: one process, nothing to divide; every parameter's state is here"
        )),
        (shard, Some(rows)) => {
            let trained: usize = params
                .iter()
                .filter(|(_, t)| t.requires_grad())
                .map(|(_, t)| t.numel())
                .sum();
            let fmt = plimsoll_allocator::format_bytes;
            let gradients = match shard {
                crate::config::Shard::Gradients => {
                    "; the gradients are reduce-scattered: only this rank's are kept for the \
                     update"
                }
                _ => "",
            };
            notes.push(format!(
                "--shard {shard}: rank {} of {} keeps the optimizer state of {} of {trained} \
                 parameters ({} on the device) and updates them, then gathers the others' \
                 updated parameters{gradients}",
                rows.rank(),
                rows.ranks(),
                rows.flat().len(),
                fmt(8 * rows.flat().len() as u64),
            ));
        }
    }
    if config.offload.optimizer_on_host() {
        // The moments are made in host memory at step 1: refuse now what the host lacks.
        let trained: u64 = params
            .iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(_, t)| t.numel() as u64)
            .sum();
        // Streamed parameters and their gradients are in host memory already.
        let moved: u64 = params
            .iter()
            .filter(|(_, t)| t.requires_grad() && t.is_resident())
            .map(|(_, t)| t.numel() as u64)
            .sum();
        let offload = config.offload;
        let bytes = crate::host::check(
            &format!("the optimizer's state in host memory (--offload {offload})"),
            trained.saturating_mul(2),
            4,
        )?;
        let fmt = plimsoll_allocator::format_bytes;
        notes.push(format!(
            "the optimizer keeps its state in host memory (--offload {offload}): {} there, \
             none on the device; each step reads {} of gradients and parameters back and \
             writes {} of parameters",
            fmt(bytes),
            fmt(moved.saturating_mul(8)),
            fmt(moved.saturating_mul(4))
        ));
    }
    if config.offload.parameters_on_host() {
        let fmt = plimsoll_allocator::format_bytes;
        let streamed: Vec<&(String, plimsoll_autograd::Tensor)> =
            params.iter().filter(|(_, t)| !t.is_resident()).collect();
        let count: u64 = streamed.iter().map(|(_, t)| t.numel() as u64).sum();
        if count > 0 && config.checkpointing == crate::config::CheckpointPolicy::None {
            notes.push(
                "--checkpointing none: streamed blocks run as checkpointed segments all the \
                 same, each block one (its parameters must come to the device for its backward)"
                    .to_string(),
            );
        }
        notes.push(match count {
            0 => "--offload parameters: this model has no blocks whose parameters can be \
                  streamed; all of them stay on the device"
                .to_string(),
            n => format!(
                "{n} parameters of the model's blocks ({}) live in host memory with their \
                 gradients: each checkpointed segment's come to the device for its forward and \
                 its recomputation, and its gradients are read back after its backward",
                fmt(4 * n)
            ),
        });
    }
    if config.offload.activations_on_host() {
        let fmt = plimsoll_allocator::format_bytes;
        notes.push(match plan.as_ref().map(|p| p.offload_activation_bytes) {
            Some(0) | None if segment_len == 0 => format!(
                "--offload {}: no checkpointed segment, so no activation goes to host memory \
                 (--checkpointing makes segments)",
                config.offload
            ),
            Some(n) => format!(
                "the inputs checkpointed segments keep go to host memory after their \
                 forward and come back for their backward: {} at most, read back and \
                 written each step",
                fmt(n)
            ),
            None => "the inputs checkpointed segments keep go to host memory after their \
                     forward and come back for their backward"
                .to_string(),
        });
    }
    Ok(notes)
}
