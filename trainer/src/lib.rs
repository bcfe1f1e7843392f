//! Plimsoll's trainer (not built yet): it will hold the training loop with micro-batching and gradient
//! accumulation, out-of-memory recovery, memory planning, leak checks and the `plimsoll` command.
