//! The record of a device's matmul launches ([`Gpu::record_matmuls`]), for measurements.

use crate::device::Gpu;
use crate::kernels::matmul::MatmulDims;

impl Gpu {
    /// Starts recording the shape of every matmul launched on this device from now on (each
    /// launch that passes validation, on either entry point), dropping any earlier record. For
    /// measurements such as `cargo xtask bench train`'s step efficiency, which times a step's
    /// matmuls alone; costs one lock per matmul while on.
    pub fn record_matmuls(&self) {
        *self.matmul_log() = Some(Vec::new());
    }

    /// Stops recording and returns the shapes launched since [`Gpu::record_matmuls`], in launch
    /// order (empty if it was never called).
    pub fn take_matmuls(&self) -> Vec<MatmulDims> {
        self.matmul_log().take().unwrap_or_default()
    }

    pub(crate) fn matmul_log(&self) -> std::sync::MutexGuard<'_, Option<Vec<MatmulDims>>> {
        self.shared
            .matmul_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}
