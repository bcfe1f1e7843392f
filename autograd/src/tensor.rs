//! [`Tensor`]: a shape, an element type and device storage shared by views, plus its place in the
//! autograd graph (nothing, a leaf's gradient slot, or the node that produced it).
//!
//! Layout: every tensor is row-major and contiguous from an element offset into its storage.
//! Views (reshape, a slice along the leading axis) share the storage with a new shape or offset;
//! transpose and permute materialise a copy (`strided_copy`). Keeping every tensor contiguous
//! means every kernel launch takes plain `(buffer, offset, len)` arguments and no op needs a
//! "make contiguous" step; the price is one copy per transpose, which is cheap next to a matmul.
//!
//! Memory categories: tensors the user creates choose theirs ([`TensorOptions`]; parameters use
//! `Category::Parameter`); outputs of ops that record a graph are `Activation` (they are what the
//! graph saves); outputs computed without recording, and every scratch tensor of backward, are
//! `Temporary`; leaf gradients are `Gradient`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use plimsoll_kernels_wgsl::kernels::{copy, fill};
use plimsoll_kernels_wgsl::random::{GOLDEN_GAMMA, mix};
use plimsoll_kernels_wgsl::{Category, DeviceBuffer, DeviceSlice, Gpu};
use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::tape::{self, Node};

/// A tensor shape: extents, outermost first.
pub type Shape = SmallVec<[usize; 6]>;

/// Element type of a tensor's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float: every differentiable op computes in it.
    F32,
    /// 32-bit unsigned integers: class targets, token ids. Never requires grad.
    U32,
    /// IEEE binary16, two per 4-byte word (`crate::half`): activations under
    /// [`crate::f16_activations`], and [`Tensor::to_f16`]. Matmuls, elementwise ops, permutes
    /// and slices read and write it themselves; other ops widen it to f32 first.
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 => 2,
        }
    }
}

/// How a user-created tensor is allocated and whether it is a leaf that collects a gradient.
#[derive(Debug, Clone, Copy)]
pub struct TensorOptions<'a> {
    /// The allocator category (`Input` by default, `Parameter` for weights).
    pub category: Category,
    /// The allocator label (who holds the memory).
    pub label: &'a str,
    /// Whether the tensor is a leaf whose gradient backward accumulates.
    pub requires_grad: bool,
}

impl Default for TensorOptions<'_> {
    fn default() -> Self {
        TensorOptions {
            category: Category::Input,
            label: "input",
            requires_grad: false,
        }
    }
}

impl<'a> TensorOptions<'a> {
    /// A trainable parameter: `Category::Parameter`, `requires_grad`, labelled `label`.
    pub fn parameter(label: &'a str) -> Self {
        TensorOptions {
            category: Category::Parameter,
            label,
            requires_grad: true,
        }
    }

    /// These options with `requires_grad` set.
    pub fn requires_grad(self, requires_grad: bool) -> Self {
        TensorOptions {
            requires_grad,
            ..self
        }
    }
}

/// Where a tensor sits in the autograd graph.
#[derive(Clone)]
pub(crate) enum Autograd {
    /// Not part of any graph (no grad required, detached, or computed under `no_grad`).
    None,
    /// A leaf that requires grad; clones share the slot.
    Leaf(Arc<GradSlot>),
    /// The output of a recorded op. The tensor keeps the node (and so the graph) alive.
    Node(Arc<Node>),
}

/// A leaf's gradient. Invariant: `grad`, when set, has the leaf's shape and its own storage.
pub(crate) struct GradSlot {
    pub(crate) gpu: Gpu,
    pub(crate) shape: Shape,
    pub(crate) category: Category,
    pub(crate) label: String,
    pub(crate) grad: Mutex<Option<Tensor>>,
    /// The gradient's squares as the matmul that last wrote it computed them
    /// ([`Tensor::want_grad_squares`]).
    pub(crate) squares: Mutex<Squares>,
}

/// Whether a leaf's gradient's squares come with it ([`Tensor::want_grad_squares`]).
#[derive(Clone, Default)]
pub(crate) enum Squares {
    /// Not asked for.
    #[default]
    Off,
    /// Asked for: the next matmul that writes the whole gradient computes them.
    Wanted,
    /// The partial sums of the squares of the gradient as it now is.
    Written(Tensor),
    /// Asked for, but something else changed the gradient after the matmul wrote them.
    Stale,
}

impl GradSlot {
    /// The gradient was changed other than by a matmul that computed its squares: any squares
    /// written before are no longer its squares.
    pub(crate) fn touched(&self) {
        let mut squares = lock(&self.squares);
        if matches!(*squares, Squares::Written(_)) {
            *squares = Squares::Stale;
        }
    }
}

/// Locks `m`, going on after a panic elsewhere (the data is still consistent for our uses).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GradSlot {
    /// A tensor of the slot's shape for a kernel to write a whole gradient into, then handed to
    /// [`GradSlot::land`]: a new tensor of the slot's category when the slot is empty (it then
    /// becomes the gradient: no temporary, no copy), else a temporary that `land` adds in.
    pub(crate) fn target(&self) -> Result<Tensor> {
        let empty = lock(&self.grad).is_none();
        let category = if empty {
            self.category
        } else {
            Category::Temporary
        };
        Tensor::empty(&self.gpu, &self.shape, category, &self.label)
    }

    /// Stores `written` (from [`GradSlot::target`]) as the gradient, or adds it to the one
    /// there.
    pub(crate) fn land(&self, written: Tensor) -> Result<()> {
        self.touched();
        let mut slot = lock(&self.grad);
        match slot.as_ref() {
            Some(existing) => crate::ops::elementwise::add_into(existing, &written),
            None => {
                *slot = Some(written);
                Ok(())
            }
        }
    }

    /// `grad += g` (the first gradient is copied into a buffer of the slot's category).
    pub(crate) fn accumulate(&self, g: &Tensor) -> Result<()> {
        self.touched();
        let mut slot = lock(&self.grad);
        match slot.as_ref() {
            Some(existing) => crate::ops::elementwise::add_into(existing, g)?,
            None => {
                let copy = Tensor::empty(&self.gpu, &self.shape, self.category, &self.label)?;
                copy::copy(&self.gpu, copy.elements()?, g.elements()?)?;
                *slot = Some(copy);
            }
        }
        Ok(())
    }
}

/// An n-dimensional array on the GPU, with autograd. Cheap to clone (clones share storage and
/// graph position). See the module docs for layout and memory categories.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) gpu: Gpu,
    /// Shared by views. Invariant: `offset + numel <= storage.len()` (in elements).
    pub(crate) storage: Arc<DeviceBuffer>,
    /// Element offset of element 0 in `storage`.
    pub(crate) offset: u64,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    pub(crate) autograd: Autograd,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("requires_grad", &self.requires_grad())
            .field("label", &self.storage.label())
            .finish()
    }
}

/// Number of elements of `shape` (1 for a scalar `[]`).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl Tensor {
    /// An f32 tensor whose contents are whatever its memory held: the output of an op whose
    /// kernel writes every element before anyone reads it (an op defined outside this crate
    /// with [`Tensor::from_op`] allocates its output so, in [`Tensor::output_category`]). Not
    /// a gradient leaf.
    pub fn empty(gpu: &Gpu, shape: &[usize], category: Category, label: &str) -> Result<Self> {
        Self::empty_typed(gpu, shape, DType::F32, category, label)
    }

    /// [`Tensor::empty`] of another element type: a u32 tensor an op's kernel writes (arg-max
    /// positions an op saves for its backward), or f16.
    pub fn empty_typed(
        gpu: &Gpu,
        shape: &[usize],
        dtype: DType,
        category: Category,
        label: &str,
    ) -> Result<Self> {
        // The allocator refuses empty blocks; an empty tensor still owns one word.
        let words = (numel(shape) * dtype.size_bytes()).div_ceil(4).max(1);
        let storage = gpu.alloc_elements(words as u64, category, label)?;
        Ok(Tensor {
            gpu: gpu.clone(),
            storage: Arc::new(storage),
            offset: 0,
            shape: shape.iter().copied().collect(),
            dtype,
            autograd: Autograd::None,
        })
    }

    fn checked_len(op: &'static str, shape: &[usize], len: usize) -> Result<()> {
        if numel(shape) != len {
            return Err(Error::InvalidArgument {
                op,
                message: format!(
                    "{len} values for shape {shape:?} ({} elements)",
                    numel(shape)
                ),
            });
        }
        Ok(())
    }

    fn with_options(mut self, options: &TensorOptions<'_>) -> Self {
        if options.requires_grad && self.dtype == DType::F32 {
            self = self.into_leaf(Category::Gradient);
        }
        self
    }

    /// Makes this tensor a fresh leaf that requires grad, with gradients in `category`.
    pub(crate) fn into_leaf(mut self, category: Category) -> Self {
        self.autograd = Autograd::Leaf(Arc::new(GradSlot {
            gpu: self.gpu.clone(),
            shape: self.shape.clone(),
            category,
            label: format!("grad {}", self.storage.label()),
            grad: Mutex::new(None),
            squares: Mutex::new(Squares::Off),
        }));
        self
    }

    /// An f32 tensor holding `data` (row-major) with `shape`, as `Category::Input`.
    pub fn from_slice(gpu: &Gpu, data: &[f32], shape: &[usize]) -> Result<Self> {
        Self::from_slice_with(gpu, data, shape, TensorOptions::default())
    }

    /// An f32 tensor holding `data` with `shape`, allocated and marked as `options` says.
    pub fn from_slice_with(
        gpu: &Gpu,
        data: &[f32],
        shape: &[usize],
        options: TensorOptions<'_>,
    ) -> Result<Self> {
        Self::checked_len("from_slice", shape, data.len())?;
        let t = Self::empty(gpu, shape, options.category, options.label)?;
        gpu.write(&t.storage, 0, data)?;
        Ok(t.with_options(&options))
    }

    /// A u32 tensor (class targets, token ids) holding `data` with `shape`, as `Category::Input`.
    pub fn from_indices(gpu: &Gpu, data: &[u32], shape: &[usize]) -> Result<Self> {
        Self::checked_len("from_indices", shape, data.len())?;
        let t = Self::empty_typed(gpu, shape, DType::U32, Category::Input, "indices")?;
        gpu.write(&t.storage, 0, data)?;
        Ok(t)
    }

    /// A tensor of `shape` filled with `value`.
    pub fn full(
        gpu: &Gpu,
        shape: &[usize],
        value: f32,
        options: TensorOptions<'_>,
    ) -> Result<Self> {
        let t = Self::empty(gpu, shape, options.category, options.label)?;
        fill::fill(gpu, t.elements()?, value)?;
        Ok(t.with_options(&options))
    }

    /// A tensor of zeros.
    pub fn zeros(gpu: &Gpu, shape: &[usize], options: TensorOptions<'_>) -> Result<Self> {
        Self::full(gpu, shape, 0.0, options)
    }

    /// A tensor of ones.
    pub fn ones(gpu: &Gpu, shape: &[usize], options: TensorOptions<'_>) -> Result<Self> {
        Self::full(gpu, shape, 1.0, options)
    }

    /// Uniform values in `[low, high)`, from `seed` (SplitMix64 on the host: the same seed gives
    /// the same tensor on every machine).
    pub fn uniform(
        gpu: &Gpu,
        shape: &[usize],
        low: f32,
        high: f32,
        seed: u64,
        options: TensorOptions<'_>,
    ) -> Result<Self> {
        if gpu.is_planning() {
            return Self::unwritten(gpu, shape, options);
        }
        let data = Self::uniform_values(numel(shape), low, high, seed);
        Self::from_slice_with(gpu, &data, shape, options)
    }

    /// On a planning device ([`Gpu::is_planning`]) a tensor whose values nobody will read: its
    /// allocation as [`Tensor::from_slice_with`] makes it, with no host values drawn (a plan of
    /// a 1.5B-parameter model would otherwise spend its time in the random number generator
    /// and hold gigabytes of host memory).
    pub fn unwritten(gpu: &Gpu, shape: &[usize], options: TensorOptions<'_>) -> Result<Self> {
        let t = Self::empty(gpu, shape, options.category, options.label)?;
        Ok(t.with_options(&options))
    }

    /// The `len` host values [`Tensor::uniform`] fills a tensor with, in row-major order (for a
    /// caller that lays them out itself, e.g. a layer keeping its initialisation across a change
    /// of weight layout).
    pub fn uniform_values(len: usize, low: f32, high: f32, seed: u64) -> Vec<f32> {
        (0..len as u64)
            .map(|i| low + (high - low) * unit_f32(seed, i))
            .collect()
    }

    /// Normal values with `mean` and `std`, from `seed` (Box-Muller over [`Tensor::uniform`]'s
    /// stream).
    pub fn normal(
        gpu: &Gpu,
        shape: &[usize],
        mean: f32,
        std: f32,
        seed: u64,
        options: TensorOptions<'_>,
    ) -> Result<Self> {
        if gpu.is_planning() {
            return Self::unwritten(gpu, shape, options);
        }
        let data: Vec<f32> = (0..numel(shape) as u64)
            .map(|i| {
                let u1 = 1.0 - f64::from(unit_f32(seed, 2 * i)); // (0, 1]: log is finite
                let u2 = f64::from(unit_f32(seed, 2 * i + 1));
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                mean + std * z as f32
            })
            .collect();
        Self::from_slice_with(gpu, &data, shape, options)
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The allocator category of the storage.
    pub fn category(&self) -> Category {
        self.storage.category()
    }

    /// Whether backward will compute a gradient through this tensor.
    pub fn requires_grad(&self) -> bool {
        !matches!(self.autograd, Autograd::None)
    }

    /// Whether this is a leaf (not produced by a recorded op).
    pub fn is_leaf(&self) -> bool {
        !matches!(self.autograd, Autograd::Node(_))
    }

    /// Whether an op over `inputs` records a node now (grad mode on and some input requires a
    /// gradient): an op defined outside this crate allocates its output as an `Activation`
    /// when it does and a `Temporary` otherwise ([`Tensor::output_category`]).
    pub fn records(inputs: &[&Tensor]) -> bool {
        crate::tape::records(inputs)
    }

    /// The category of an op's output: `Activation` when it records ([`Tensor::records`]),
    /// `Temporary` otherwise.
    pub fn output_category(inputs: &[&Tensor]) -> Category {
        crate::tape::output_category(crate::tape::records(inputs))
    }

    /// `output`, computed by the caller's kernels from `inputs`, made the output of a recorded
    /// [`crate::Op::Custom`] node whose backward is `derivative()`'s, when an op over `inputs`
    /// records; otherwise `output` as it is, and the derivative (with the tensors it would
    /// save) is never built. The derivative saves what its backward reads, detached
    /// ([`Tensor::detach`]).
    pub fn from_op<D: crate::op::Derivative + Clone + 'static>(
        output: Tensor,
        inputs: &[&Tensor],
        derivative: impl FnOnce() -> D,
    ) -> Result<Tensor> {
        crate::tape::record(output, inputs, || {
            crate::op::Op::Custom(Box::new(derivative()))
        })
    }

    /// The same data cut from the graph: no gradient flows through the result.
    pub fn detach(&self) -> Tensor {
        Tensor {
            autograd: Autograd::None,
            ..self.clone()
        }
    }

    /// A leaf's accumulated gradient (a handle to it: later backwards add into the same storage),
    /// or `None` if none has been computed since the last [`Tensor::clear_grad`], or for
    /// non-leaves.
    pub fn grad(&self) -> Option<Tensor> {
        match &self.autograd {
            Autograd::Leaf(slot) => lock(&slot.grad).clone(),
            _ => None,
        }
    }

    /// Sets a leaf's gradient to `data` (row-major, `numel()` values): written in place into the
    /// gradient it has, or into a new one allocated as backward would (its category and label).
    /// Data-parallel training uses it to install the gradients summed across processes.
    /// Errors: [`Error::InvalidArgument`] for a tensor that is not a leaf requiring grad, or when
    /// `data.len() != numel()`; out-of-memory for a new gradient (the tensor is then unchanged).
    pub fn set_grad_from_slice(&self, data: &[f32]) -> Result<()> {
        let Autograd::Leaf(slot) = &self.autograd else {
            return Err(Error::InvalidArgument {
                op: "set_grad_from_slice",
                message: "only a leaf that requires grad has a gradient to set".into(),
            });
        };
        Self::checked_len("set_grad_from_slice", &self.shape, data.len())?;
        slot.touched();
        if let Some(g) = self.grad() {
            return g.write_from_slice(data);
        }
        let options = TensorOptions {
            category: slot.category,
            label: &slot.label,
            ..TensorOptions::default()
        };
        let grad = Tensor::from_slice_with(&slot.gpu, data, &slot.shape, options)?;
        *lock(&slot.grad) = Some(grad);
        Ok(())
    }

    /// Tells a leaf that its gradient was (or, on a planning device, would have been) changed
    /// outside autograd: squares computed for it before ([`Tensor::want_grad_squares`]) are
    /// stale, as after [`Tensor::set_grad_from_slice`]. No effect on other tensors.
    pub fn grad_changed(&self) {
        if let Autograd::Leaf(slot) = &self.autograd {
            slot.touched();
        }
    }

    /// Sets a leaf's gradient to none, freeing its memory (once no `grad()` handle is alive).
    pub fn clear_grad(&self) {
        if let Autograd::Leaf(slot) = &self.autograd {
            lock(&slot.grad).take();
            *lock(&slot.squares) = Squares::Off;
        }
    }

    /// Asks the next matmul that writes this leaf's whole gradient (the weight gradient of a
    /// linear layer or a matmul, fresh or accumulated) to compute the squares of the gradient it
    /// leaves, in partial sums ([`Tensor::take_grad_squares`]): a gradient norm with no pass
    /// over the gradient. Anything else autograd does to the gradient afterwards (another
    /// backward's contribution, `set_grad_from_slice`) makes them stale; a write in place
    /// through the [`Tensor::grad`] handle (such as `nn::clip_grad_norm`'s scaling) is not
    /// seen, so read them before any. No effect on a tensor that is not a leaf requiring grad.
    pub fn want_grad_squares(&self) {
        if let Autograd::Leaf(slot) = &self.autograd {
            *lock(&slot.squares) = Squares::Wanted;
        }
    }

    /// The partial sums of the squares of this leaf's gradient as it now is, when the matmul
    /// that last wrote it computed them after [`Tensor::want_grad_squares`] and nothing changed
    /// it since (their sum is the gradient's squared norm); `None` otherwise. Either way the
    /// request ends.
    pub fn take_grad_squares(&self) -> Option<Tensor> {
        let Autograd::Leaf(slot) = &self.autograd else {
            return None;
        };
        match std::mem::take(&mut *lock(&slot.squares)) {
            Squares::Written(partials) => Some(partials),
            _ => None,
        }
    }

    /// The tensor's `numel()` contiguous elements in its storage: what kernel launchers take
    /// (`plimsoll-nn`'s fused optimizers update parameters in place through it). 4-byte
    /// elements (f32 or u32; an f16 tensor is [`Tensor::halves`]).
    pub fn elements(&self) -> Result<DeviceSlice<'_>> {
        self.expect_4_bytes("elements")?;
        Ok(self.storage.slice(self.offset, self.numel() as u64)?)
    }

    /// Whether the storage is on the device (not evicted to host memory, [`Tensor::evict`]).
    pub fn is_resident(&self) -> bool {
        self.storage.is_resident()
    }

    /// Moves the storage of each of `tensors` to host memory and frees its device block
    /// ([`plimsoll_kernels_wgsl::Gpu::evict`]: all or none; every view of a storage goes with
    /// it). Reads and writes ([`Tensor::to_vec`], [`Tensor::write_from_slice`]) then reach the
    /// host values; an op given it is an error until [`Tensor::restore`].
    pub fn evict(tensors: &[&Tensor], how: plimsoll_kernels_wgsl::Evict) -> Result<()> {
        let Some(first) = tensors.first() else {
            return Ok(());
        };
        let buffers: Vec<&DeviceBuffer> = tensors.iter().map(|t| &*t.storage).collect();
        Ok(first.gpu.evict(&buffers, how)?)
    }

    /// Brings an evicted storage back to the device ([`plimsoll_kernels_wgsl::Gpu::restore`]);
    /// nothing for a resident one.
    pub fn restore(&self) -> Result<()> {
        Ok(self.gpu.restore(&self.storage)?)
    }

    /// Host bytes the storage holds ([`plimsoll_kernels_wgsl::DeviceBuffer::host_bytes`]).
    pub fn host_bytes(&self) -> u64 {
        self.storage.host_bytes()
    }

    /// The allocator label of the storage (who holds the memory).
    pub fn label(&self) -> &str {
        self.storage.label()
    }

    /// Overwrites this f32 tensor's elements, in place, with `data` (row-major, `numel()`
    /// values), through the queue in order after every recorded launch (loading saved state
    /// into existing parameters). Views share storage: every view sees the new values. Records
    /// no graph. Errors: [`Error::DTypeMismatch`] unless f32, [`Error::InvalidArgument`] when
    /// `data.len() != numel()`.
    pub fn write_from_slice(&self, data: &[f32]) -> Result<()> {
        self.expect_dtype("write_from_slice", DType::F32)?;
        Self::checked_len("write_from_slice", &self.shape, data.len())?;
        self.gpu.write(&self.storage, self.offset, data)?;
        Ok(())
    }

    /// Reads the values back as f32 (an f16 tensor's exactly) within the default deadline.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        self.to_vec_within(self.gpu.default_deadline())
    }

    /// Reads the f32 values back, waiting at most `deadline` for the GPU.
    pub fn to_vec_within(&self, deadline: Duration) -> Result<Vec<f32>> {
        if self.dtype == DType::F16 {
            return self.halves_to_vec(deadline);
        }
        self.expect_dtype("to_vec", DType::F32)?;
        Ok(self
            .gpu
            .read(&self.storage, self.offset, self.numel() as u64, deadline)?)
    }

    /// Reads the f32 values back into `out` (as long as the tensor) within the default
    /// deadline, allocating no host memory for them: a host copy refreshed in place. An f16
    /// tensor's values are read as [`Tensor::to_vec`] reads them, then copied.
    pub fn read_into(&self, out: &mut [f32]) -> Result<()> {
        Self::checked_len("read_into", &self.shape, out.len())?;
        if self.dtype == DType::F16 {
            out.copy_from_slice(&self.to_vec()?);
            return Ok(());
        }
        self.expect_dtype("read_into", DType::F32)?;
        let deadline = self.gpu.default_deadline();
        Ok(self
            .gpu
            .read_into(&self.storage, self.offset, out, deadline)?)
    }

    /// Starts reading the f32 values back and returns without waiting
    /// ([`Gpu::start_read_bytes`]): the copy goes out with the open batch, work recorded
    /// afterwards runs after it (so this tensor may be dropped at once), and
    /// [`plimsoll_kernels_wgsl::PendingRead::wait_as`] gives the values.
    pub fn start_read(&self) -> Result<plimsoll_kernels_wgsl::PendingRead> {
        self.expect_dtype("start_read", DType::F32)?;
        Ok(self.gpu.start_read_bytes(
            &self.storage,
            self.offset * 4,
            self.numel() as u64 * 4,
            self.gpu.default_deadline(),
        )?)
    }

    /// Reads u32 values back (targets, ids) within the GPU's default deadline.
    pub fn to_vec_u32(&self) -> Result<Vec<u32>> {
        self.expect_dtype("to_vec_u32", DType::U32)?;
        let deadline = self.gpu.default_deadline();
        Ok(self
            .gpu
            .read(&self.storage, self.offset, self.numel() as u64, deadline)?)
    }

    /// The value of a one-element tensor, within the GPU's default deadline.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(Error::NotAScalar {
                shape: self.shape.to_vec(),
                len: self.numel(),
            });
        }
        Ok(self.to_vec()?.first().copied().unwrap_or(f32::NAN))
    }

    /// Back-propagates from this one-element tensor (seed 1) into every leaf that requires grad;
    /// frees the graph as it goes. Errors: [`Error::NonScalarBackward`], [`Error::BackwardTwice`],
    /// [`Error::NoGraph`].
    pub fn backward(&self) -> Result<()> {
        tape::backward(self, None, false)
    }

    /// [`Tensor::backward`] with an explicit seed gradient (of this tensor's shape), optionally
    /// keeping the graph (`retain_graph`) for another backward.
    pub fn backward_with(&self, seed: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        tape::backward(self, seed, retain_graph)
    }

    /// Errors unless the tensor holds `dtype`.
    pub(crate) fn expect_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if self.dtype != dtype {
            return Err(Error::DTypeMismatch {
                op,
                expected: dtype,
                got: self.dtype,
            });
        }
        Ok(())
    }

    /// A view of the same storage with another shape (same element count, checked by callers).
    pub(crate) fn view(&self, shape: &[usize], offset: u64) -> Tensor {
        Tensor {
            gpu: self.gpu.clone(),
            storage: Arc::clone(&self.storage),
            offset,
            shape: shape.iter().copied().collect(),
            dtype: self.dtype,
            autograd: Autograd::None,
        }
    }
}

/// Uniform `[0, 1)` value number `index` of the stream `seed` (24 random bits).
fn unit_f32(seed: u64, index: u64) -> f32 {
    let bits = mix(mix(seed) ^ index.wrapping_mul(GOLDEN_GAMMA));
    (bits >> 40) as f32 / (1u64 << 24) as f32
}
