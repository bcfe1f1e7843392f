//! Plimsoll's autograd (not built yet): it will hold `Tensor`, the `Op` enum, the `Tape` that releases
//! saved tensors as backward passes them, `no_grad`, `detach` and the checkpoint (recompute) mechanism.
