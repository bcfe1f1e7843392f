//! Kernel launchers, one module per family, named by the family's stem.
//!
//! # How to add a kernel family `<stem>`
//!
//! One stem everywhere: `shaders/<stem>.wgsl`, `src/kernels/<stem>.rs`, `src/reference/<stem>.rs`,
//! `tests/kernels/<stem>.rs` with a test `<stem>_matches_reference`. `fill` and `copy` are the
//! worked examples; copy their shape.
//!
//! 1. **Shader** `shaders/<stem>.wgsl`. Start with a comment giving the binding layout, the
//!    workgroup size and why, and the bounds check. Bindings, always in this order:
//!    ```wgsl
//!    struct Params { offset_a: u32, len: u32, alpha: f32, _pad: u32 } // u32/i32/f32 scalars (or
//!                                  // vec4<u32> arrays), padded to a multiple of 16 bytes, <= 256
//!    @group(0) @binding(0) var<uniform> params: Params;
//!    @group(0) @binding(1) var<storage, read_write> a: array<f32>;   // ALWAYS read_write
//!    @group(0) @binding(2) var<storage, read_write> out: array<f32>;
//!    ```
//!    - Every storage binding is `read_write`, inputs included: tensors share segment buffers and
//!      wgpu rejects one buffer bound read-only and read-write in one dispatch.
//!    - Each binding is a whole *segment*, not the tensor: the launcher passes element offsets
//!      (`buffer.offset_elements() + offset`) in `Params`, and the shader adds them.
//!    - Integer data (indices, targets) and packed f16 (`pack2x16float`) use `array<u32>`.
//!    - Use `@workgroup_size(256)` for elementwise work and compute the index as
//!      `let i = gid.x + gid.y * groups.x * 256u;` with `@builtin(num_workgroups) groups`, so
//!      [`grid_1d`] can spread large launches over a 2-D grid. Return when `i >= params.len`.
//!    - Specialise with WGSL `override` constants (tile sizes, flags) rather than string edits;
//!      they are part of the pipeline cache key.
//! 2. **Launcher** `src/kernels/<stem>.rs`:
//!    - a `const KERNEL: Kernel = Kernel { stem, wgsl: include_str!("../../shaders/<stem>.wgsl"),
//!      entry, storage_bindings, runtime_checks: RuntimeChecks::ON }` per entry point;
//!    - a `#[repr(C)] #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)] struct Params`
//!      matching the WGSL struct field for field (padding included);
//!    - `pub fn <stem>(gpu: &Gpu, out: &DeviceBuffer, out_offset: u64, a: &DeviceBuffer,
//!      a_offset: u64, len: u64, ...) -> Result<()>`: buffers, element offsets and explicit sizes,
//!      never tensors. Check every range with [`check_range`] (an `Err`, not a panic), return `Ok`
//!      early for empty work, then call [`Gpu::dispatch`] with the grid from [`grid_1d`].
//!      Launchers only *record*; the caller flushes, waits and reads back.
//!    - Add `pub mod <stem>;` below.
//! 3. **Reference** `src/reference/<stem>.rs`: plain loops on `&[f32]`, same argument order.
//! 4. **Test** `tests/kernels/<stem>.rs` (add `mod <stem>;` to `tests/kernels/main.rs`):
//!    ```ignore
//!    use crate::common::{assert_close, gpu, Rng, DEADLINE};
//!    #[test]
//!    fn stem_matches_reference() {
//!        let gpu = gpu();                                  // fails (never skips) without adapter
//!        let mut rng = Rng::new(7);
//!        for len in [1, 255, 257, 1000, 70_001] {         // odd sizes, not multiples of 256
//!            let a = rng.vec_f32(len, -2.0, 2.0);          // seeded, never all zeros
//!            let a_gpu = gpu.upload(&a, Category::Temporary, "a").unwrap();
//!            // ... launch, then:
//!            let got: Vec<f32> = gpu.read_all(&out_gpu, DEADLINE).unwrap();
//!            assert_close("stem", &got, &want, 1e-6, 1e-6); // atol + rtol*|want|, first mismatch
//!        }
//!    }
//!    ```

use crate::buffer::DeviceBuffer;
use crate::device::Gpu;
use crate::error::{Error, Result};

pub mod binary;
pub mod convert;
pub mod copy;
pub mod cross_entropy;
pub mod dropout;
pub mod embedding;
pub mod fill;
pub mod layer_norm;
pub mod matmul;
pub mod nonfinite;
pub mod optimizer;
pub mod reduce;
pub mod softmax;
pub mod unary;

/// Workgroup size of the elementwise kernels (matches `@workgroup_size(256)` in their WGSL).
pub const ELEMENTWISE_WORKGROUP: u32 = 256;

/// Workgroup counts covering `len` invocations in groups of `workgroup_size`: `[x, y, 1]` with `x`
/// at most the device's `max_compute_workgroups_per_dimension`; shaders index
/// `gid.x + gid.y * num_workgroups.x * workgroup_size` and bounds-check against `len`.
pub fn grid_1d(gpu: &Gpu, len: u64, workgroup_size: u32) -> Result<[u32; 3]> {
    let max = u64::from(gpu.limits().max_compute_workgroups_per_dimension.max(1));
    let groups = len.div_ceil(u64::from(workgroup_size.max(1))).max(1);
    let x = groups.min(max);
    let y = groups.div_ceil(x);
    if y > max {
        return Err(Error::InvalidArgument {
            op: "grid_1d",
            message: format!("{len} invocations need {groups} workgroups, more than {max}^2"),
        });
    }
    Ok([x as u32, y as u32, 1])
}

/// Checks that elements `offset..offset + len` lie inside `buffer`, for launcher `op`.
pub fn check_range(
    op: &'static str,
    name: &str,
    buffer: &DeviceBuffer,
    offset: u64,
    len: u64,
) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= buffer.len() => Ok(()),
        _ => Err(Error::InvalidArgument {
            op,
            message: format!(
                "{name}: elements {offset}..{} outside buffer {:?} of {} elements",
                offset.saturating_add(len),
                buffer.label(),
                buffer.len()
            ),
        }),
    }
}

/// `buffer.offset_elements() + offset` as the `u32` a shader indexes with.
pub fn segment_index(buffer: &DeviceBuffer, offset: u64) -> u32 {
    // Segments are at most max_storage_buffer_binding_size bytes, so element indices fit in u32.
    (u64::from(buffer.offset_elements()) + offset) as u32
}
