//! [`MultiSlots`]: the segments one multi-tensor dispatch binds (`shaders/slots.wgsl`), each
//! once, at most [`MULTI_SLOTS`]. A launcher over many tensors (`optimizer::adamw_steps`,
//! `reduce::sum_squares_many`) takes its tensors in order, starts a new dispatch when the next
//! one's segments would not fit, and names each operand by its slot in a table it uploads.

use crate::device::Gpu;
use crate::pipeline::Kernel;
use crate::slice::DeviceSlice;

/// Segments one multi-tensor dispatch binds (`slot_0` to `slot_15` in `shaders/slots.wgsl`).
pub const MULTI_SLOTS: usize = 16;

/// `kernel!` for a multi-tensor entry point of workgroup size 256: the [`MULTI_SLOTS`] slots of
/// `shaders/slots.wgsl` at bindings 1 to 16, then the bindings `[..]` lists.
macro_rules! multi_tensor_kernel {
    (
        $stem:literal,
        $entry:literal,
        source: $wgsl:expr,
        $uniform:ident : $params:ident,
        [$($rest:tt)*]
    ) => {
        $crate::pipeline::kernel!(
            $stem,
            $entry,
            source: $wgsl,
            $uniform: $params,
            [slot_0: "array<vec4<f32>>", slot_1: "array<vec4<f32>>", slot_2: "array<vec4<f32>>", slot_3: "array<vec4<f32>>", slot_4: "array<vec4<f32>>", slot_5: "array<vec4<f32>>", slot_6: "array<vec4<f32>>", slot_7: "array<vec4<f32>>", slot_8: "array<vec4<f32>>", slot_9: "array<vec4<f32>>", slot_10: "array<vec4<f32>>", slot_11: "array<vec4<f32>>", slot_12: "array<vec4<f32>>", slot_13: "array<vec4<f32>>", slot_14: "array<vec4<f32>>", slot_15: "array<vec4<f32>>", $($rest)*],
            256
        )
    };
}
pub(crate) use multi_tensor_kernel;

/// How a launcher over many tensors records them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorLaunches {
    /// One launch (or two: whole vec4s, then the rest) per tensor.
    OnePerTensor,
    /// A few multi-tensor dispatches, each over up to [`MULTI_SLOTS`] segments.
    Multi,
}

impl TensorLaunches {
    /// What `gpu` uses for `kernel`, a multi-tensor kernel: the device's
    /// [`crate::GpuOptions::tensor_launches`] where set (multi-tensor only where it binds all
    /// of `kernel`'s bindings), else [`TensorLaunches::Multi`] on a GPU that binds all its
    /// storage bindings in one stage, where it records a few dispatches instead of one or two
    /// per tensor (not measured on a GPU yet); one launch per tensor on the CPU, where the
    /// slots' switches cost more than the launches they save (lavapipe, `cargo xtask bench
    /// kernels multi`: AdamW over the 6-layer width-384 GPT's 76 tensors took 137-143 ms
    /// multi-tensor against 32.6-44.1 ms with a launch per tensor), and on a device with fewer
    /// bindings.
    pub fn chosen(gpu: &Gpu, kernel: &Kernel) -> TensorLaunches {
        let wanted = gpu.shared.options.tensor_launches;
        let multi = wanted.map_or(!gpu.is_cpu(), |w| w == TensorLaunches::Multi);
        if multi && binds_all(gpu, kernel) {
            TensorLaunches::Multi
        } else {
            TensorLaunches::OnePerTensor
        }
    }
}

impl TensorLaunches {
    /// How a run's log and `run.json` say it: `one launch per tensor` or `multi-tensor`.
    pub fn describe(self) -> &'static str {
        match self {
            TensorLaunches::OnePerTensor => "one launch per tensor",
            TensorLaunches::Multi => "multi-tensor",
        }
    }
}

/// Whether `gpu` can bind every storage binding of `kernel` in one stage (a multi-tensor kernel
/// binds [`MULTI_SLOTS`] and more).
pub(crate) fn binds_all(gpu: &Gpu, kernel: &Kernel) -> bool {
    gpu.limits().max_storage_buffers_per_shader_stage >= kernel.storage_bindings
}

/// The segments bound so far, in slot order, by one slice in each.
#[derive(Default)]
pub(crate) struct MultiSlots<'a> {
    slots: Vec<DeviceSlice<'a>>,
}

impl<'a> MultiSlots<'a> {
    /// The slot of `slice`'s segment, if bound.
    fn slot(&self, slice: &DeviceSlice<'_>) -> Option<usize> {
        let uid = slice.buffer().segment_uid();
        self.slots
            .iter()
            .position(|s| s.buffer().segment_uid() == uid)
    }

    /// Whether `operands`' segments fit beside those already bound.
    pub(crate) fn fits(&self, operands: &[DeviceSlice<'_>]) -> bool {
        let mut new: Vec<u64> = Vec::with_capacity(operands.len());
        for s in operands {
            let uid = s.buffer().segment_uid();
            if self.slot(s).is_none() && !new.contains(&uid) {
                new.push(uid);
            }
        }
        self.slots.len() + new.len() <= MULTI_SLOTS
    }

    /// The slot of `slice`'s segment, binding it if it is new (after [`MultiSlots::fits`] said
    /// it fits).
    pub(crate) fn bind(&mut self, slice: DeviceSlice<'a>) -> u32 {
        let index = self.slot(&slice).unwrap_or_else(|| {
            self.slots.push(slice);
            self.slots.len() - 1
        });
        index as u32
    }

    /// The `MULTI_SLOTS` bindings: the bound segments, the first repeated in the unused slots
    /// (empty when nothing is bound).
    pub(crate) fn bindings(&self) -> Vec<DeviceSlice<'a>> {
        let mut all = self.slots.clone();
        if let Some(&first) = self.slots.first() {
            all.resize(MULTI_SLOTS, first);
        }
        all
    }
}
