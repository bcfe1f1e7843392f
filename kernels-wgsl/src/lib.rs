//! Plimsoll's GPU layer (being built): adapter and device, fences with deadlines, sub-allocated
//! buffers and WGSL compute kernels with CPU references.
