//! 16-bit storage and matmul inputs. [`Tensor::to_f16`] and [`Tensor::to_f32`] convert
//! (recording no graph), and under [`f16_activations`] every op that records a node stores its
//! output (when it is an activation) and the activations it saves for backward as f16: half the
//! bytes of the largest part of a step's memory.
//!
//! Matmuls (`matmul`, `matmul_transposed*`, `linear`) read 16-bit operands as they are and write
//! a 16-bit output under [`f16_activations`] (the kernel's products and sums are f32, as on a
//! tensor core); their derivatives read the saved f16 operands as they are too. Under
//! [`f16_weight_copies`] they read each parameter through an f16 copy made once per update.
//! Other ops take f16 operands by widening them to f32 temporaries, and backward converts a
//! node's other saved tensors back to f32 temporaries just before its derivative runs and frees
//! them right after. Gradients, statistics and the loss are f32 throughout; what changes is that
//! activations are rounded to f16 between ops, in the forward as in the backward, and that one
//! beyond f16's 65504 becomes infinite.
//!
//! Saved for backward in f16: an op's saved tensors that are themselves activations (outputs
//! of recorded ops, `Category::Activation`) in f32. Not converted: parameters, inputs, u32 ids,
//! layer norm's per-row mean and `1/std` (statistics stay f32, as PyTorch's autocast keeps
//! them), reductions, log-probabilities and losses. One activation saved by two ops (attention's probabilities: by the softmax and by the
//! product with `v`) is converted once: the f16 copy is shared for as long as either holds it.
//!
//! The conversion takes the device's path ([`plimsoll_kernels_wgsl::Gpu::f16_path`]): native
//! `f16` where the adapter has `SHADER_F16`, packed words elsewhere; the bytes are the same.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use plimsoll_kernels_wgsl::kernels::convert::reference::f16_bits_to_f32;
use plimsoll_kernels_wgsl::kernels::convert::{self, Halves};
use plimsoll_kernels_wgsl::{Category, DeviceBuffer};

use plimsoll_kernels_wgsl::kernels::matmul::Operand;
use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::op::Op;
use crate::tensor::{DType, Tensor};

/// Where an f32 activation's elements live: its storage (by address), offset and length.
type Key = (usize, u64, usize);

/// The f16 copy of an activation, while both the activation's storage and the copy live (weak
/// references: the cache keeps neither alive, and the original's address cannot be reused
/// while the entry holds it).
struct Entry {
    original: Weak<DeviceBuffer>,
    half: Weak<DeviceBuffer>,
    offset: u64,
}

thread_local! {
    /// `Some` while an [`F16ActivationsGuard`] is alive on this thread.
    static SAVED_F16: RefCell<Option<HashMap<Key, Entry>>> = const { RefCell::new(None) };
    /// The cache's size above which the next insertion drops dead entries first.
    static PRUNE_AT: Cell<usize> = const { Cell::new(1024) };
    /// `Some` while an [`F16WeightCopiesGuard`] is alive on this thread: each parameter's f16
    /// copy (with the parameter, weakly, so a new tensor at a freed one's address misses).
    static WEIGHT_COPIES: RefCell<Option<HashMap<Key, WeightCopy>>> =
        const { RefCell::new(None) };
}

/// A parameter (weakly) and its f16 copy.
type WeightCopy = (Weak<DeviceBuffer>, Tensor);

/// Ends [`f16_weight_copies`] when dropped (unless an outer guard is still alive), freeing the
/// copies.
#[must_use = "the copies are dropped as soon as the guard is"]
#[derive(Debug)]
pub struct F16WeightCopiesGuard {
    outer: bool,
}

impl Drop for F16WeightCopiesGuard {
    fn drop(&mut self) {
        if !self.outer {
            WEIGHT_COPIES.with(|w| w.borrow_mut().take());
        }
    }
}

/// Until the guard drops, a matmul recorded under [`f16_activations`] on this thread reads each
/// parameter (an f32 tensor of `Category::Parameter`) through its f16 copy, made the first time
/// the parameter is used and reused after: once per update when the guard spans the update's
/// micro-batches, forward and backward (the trainer's step does). The copies are `Temporary`
/// memory and their gradients go to the f32 parameters. Without the guard, matmuls read f32
/// parameters directly. The optimizers of `plimsoll-nn` call [`forget_weight_copies`] before
/// they change the weights; code that writes parameters otherwise must do the same (or drop the
/// guard first).
pub fn f16_weight_copies() -> F16WeightCopiesGuard {
    let outer = WEIGHT_COPIES.with(|w| {
        let mut w = w.borrow_mut();
        let outer = w.is_some();
        w.get_or_insert_with(HashMap::new);
        outer
    });
    F16WeightCopiesGuard { outer }
}

/// Drops this thread's f16 weight copies (the weights are about to change); an alive
/// [`f16_weight_copies`] guard makes new ones on next use.
pub fn forget_weight_copies() {
    WEIGHT_COPIES.with(|w| {
        if let Some(copies) = w.borrow_mut().as_mut() {
            copies.clear();
        }
    });
}

/// Drops this thread's f16 copies of `params` (streamed parameters leaving the device: their
/// copies would keep the device memory their eviction frees).
pub(crate) fn forget_weight_copies_of(params: &[Tensor]) {
    WEIGHT_COPIES.with(|w| {
        if let Some(copies) = w.borrow_mut().as_mut() {
            let storages: Vec<usize> = params
                .iter()
                .map(|p| Arc::as_ptr(&p.storage) as usize)
                .collect();
            copies.retain(|key, _| !storages.contains(&key.0));
        }
    });
}

/// `t` as a matmul reads it: under [`f16_activations`] and [`f16_weight_copies`], a parameter's
/// f16 copy (in `t`'s place in the graph), else `t` itself.
pub(crate) fn matmul_input(t: &Tensor) -> Result<Tensor> {
    let wanted = t.dtype == DType::F32
        && t.category() == Category::Parameter
        && t.numel() > 0
        && saves_f16_activations();
    let key = key_of(t);
    let cached = WEIGHT_COPIES.with(|w| {
        let w = w.borrow();
        let copies = w.as_ref().filter(|_| wanted)?;
        let same = |(original, _): &&WeightCopy| {
            original
                .upgrade()
                .is_some_and(|o| Arc::ptr_eq(&o, &t.storage))
        };
        Some(copies.get(&key).filter(same).map(|(_, copy)| copy.clone()))
    });
    let copy = match cached {
        None => return Ok(t.clone()),
        Some(Some(copy)) => copy,
        Some(None) => {
            let copy = t.convert_to(
                DType::F16,
                Category::Temporary,
                &format!("f16 {}", t.label()),
            )?;
            WEIGHT_COPIES.with(|w| {
                if let Some(copies) = w.borrow_mut().as_mut() {
                    copies.insert(key, (Arc::downgrade(&t.storage), copy.clone()));
                }
            });
            copy
        }
    };
    let mut copy = copy;
    // The copy has the elements of `t`; a view of the parameter with another shape (the same
    // storage, offset and length) reads it with its own shape.
    copy.shape = t.shape.clone();
    copy.autograd = t.autograd.clone();
    Ok(copy)
}

/// Ends [`f16_activations`] when dropped (unless an outer guard is still alive).
#[must_use = "activations are saved in f32 again as soon as the guard is dropped"]
#[derive(Debug)]
pub struct F16ActivationsGuard {
    outer: bool,
}

impl Drop for F16ActivationsGuard {
    fn drop(&mut self) {
        if !self.outer {
            SAVED_F16.with(|s| s.borrow_mut().take());
        }
    }
}

/// Until the guard drops, ops recorded on this thread save their activations for backward in
/// f16 (see the module docs). Wrap the forward pass in it; backward needs no guard.
pub fn f16_activations() -> F16ActivationsGuard {
    let outer = SAVED_F16.with(|s| {
        let mut s = s.borrow_mut();
        let outer = s.is_some();
        s.get_or_insert_with(HashMap::new);
        outer
    });
    F16ActivationsGuard { outer }
}

/// Whether ops recorded on this thread now save their activations in f16.
pub fn saves_f16_activations() -> bool {
    SAVED_F16.with(|s| s.borrow().is_some())
}

/// Under [`f16_activations`], replaces each f32 activation `op` saved with its f16 copy.
pub(crate) fn save_in_f16(op: &mut Op) -> Result<()> {
    if !saves_f16_activations() {
        return Ok(());
    }
    for t in op.saved_activations() {
        if t.dtype != DType::F32 {
            continue;
        }
        if let Some(half) = known_half(t) {
            *t = half; // an f16 input widened for the op: saved as it came
        } else if t.category() == Category::Activation && t.numel() > 0 {
            *t = shared_half(t)?;
        }
    }
    Ok(())
}

/// Replaces each f16 tensor `op` saved with an f32 temporary (before its derivative runs),
/// except those its derivative reads in f16 itself: a matmul's operands (its derivatives are
/// matmuls, which take 16-bit operands) and a custom op's that says it reads them
/// ([`crate::Derivative::reads_saved_f16`]).
pub(crate) fn restore_f32(op: &mut Op) -> Result<()> {
    let saved: SmallVec<[&mut Tensor; 4]> = match op {
        Op::Matmul { .. } | Op::MatmulTransposed { .. } => return Ok(()),
        Op::Custom(derivative) if derivative.reads_saved_f16() => return Ok(()),
        Op::Linear { relu_output, .. } => relu_output.iter_mut().collect(),
        _ => op.saved_activations(),
    };
    for t in saved {
        if t.dtype == DType::F16 {
            *t = t.convert_to(DType::F32, Category::Temporary, "saved f16 as f32")?;
        }
    }
    Ok(())
}

/// Where `t`'s elements live.
fn key_of(t: &Tensor) -> Key {
    (Arc::as_ptr(&t.storage) as usize, t.offset, t.numel())
}

/// The f16 tensor (with `t`'s shape) known to hold `t`'s values: the copy made of it, or the
/// f16 input it was widened from.
fn known_half(t: &Tensor) -> Option<Tensor> {
    let (storage, offset) = SAVED_F16.with(|s| {
        let s = s.borrow();
        let entry = s.as_ref()?.get(&key_of(t))?;
        entry.original.upgrade()?;
        Some((entry.half.upgrade()?, entry.offset))
    })?;
    Some(t.with_storage(storage, offset, DType::F16))
}

/// Records (while [`f16_activations`] is on) that `half` holds `wide`'s values.
fn remember(wide: &Tensor, half: &Tensor) {
    SAVED_F16.with(|s| {
        if let Some(map) = s.borrow_mut().as_mut() {
            // Entries whose copy or original is gone can never hit again; pruned when the map
            // has doubled since the last time, so inserting stays O(1) amortised.
            if map.len() >= PRUNE_AT.with(Cell::get) {
                map.retain(|_, e| e.half.strong_count() > 0 && e.original.strong_count() > 0);
                PRUNE_AT.with(|p| p.set((2 * map.len()).max(1024)));
            }
            let entry = Entry {
                original: Arc::downgrade(&wide.storage),
                half: Arc::downgrade(&half.storage),
                offset: half.offset,
            };
            map.insert(key_of(wide), entry);
        }
    });
}

/// `t`'s f16 copy: the one already known, or a new one (an activation, remembered).
fn shared_half(t: &Tensor) -> Result<Tensor> {
    if let Some(half) = known_half(t) {
        return Ok(half);
    }
    let label = format!("f16 {}", t.label());
    let half = t.convert_to(DType::F16, Category::Activation, &label)?;
    remember(t, &half);
    Ok(half)
}

/// The element type of a new op output of `numel` elements in `category`: f16 under
/// [`f16_activations`] for an activation (the output of a recorded op) of more than one
/// element (as [`output_in_f16`] decides), else f32. For ops whose kernels write 16-bit outputs
/// themselves (no f32 output then converted).
pub(crate) fn output_dtype(category: Category, numel: usize) -> DType {
    match saves_f16_activations() && category == Category::Activation && numel > 1 {
        true => DType::F16,
        false => DType::F32,
    }
}

/// Whether any of `tensors` is f16 (ops then run on [`Tensor::widened`] copies).
pub(crate) fn any_f16(tensors: &[&Tensor]) -> bool {
    tensors.iter().any(|t| t.dtype == DType::F16)
}

/// Under [`f16_activations`], an op's output in f16 (when the op makes activations: not a
/// view, a reduction, a log-probability or a loss; nor a single element), so the f32 output is
/// freed as soon as the op has run.
pub(crate) fn output_in_f16(op: &Op, output: Tensor) -> Result<Tensor> {
    let keep = !saves_f16_activations()
        || !op.outputs_activation()
        || output.dtype != DType::F32
        || output.numel() <= 1;
    if keep {
        return Ok(output);
    }
    shared_half(&output)
}

impl Tensor {
    /// This f32 tensor in f16 (round to nearest; |x| >= 65520 becomes ±inf, NaN stays NaN), a
    /// `Temporary` that records no graph. Errors: [`Error::DTypeMismatch`] unless f32.
    pub fn to_f16(&self) -> Result<Tensor> {
        self.convert_to(DType::F16, Category::Temporary, "to_f16")
    }

    /// This f16 tensor in f32 (exact), a `Temporary` that records no graph. Errors:
    /// [`Error::DTypeMismatch`] unless f16.
    pub fn to_f32(&self) -> Result<Tensor> {
        self.convert_to(DType::F32, Category::Temporary, "to_f32")
    }

    /// This tensor with f32 elements and the same place in the graph: itself unless f16, else
    /// an f32 temporary (remembered under [`f16_activations`] as the f16's copy, so an op that
    /// saves it saves the f16). Ops call it on f16 inputs and compute in f32.
    pub fn widened(&self) -> Result<Tensor> {
        if self.dtype != DType::F16 {
            return Ok(self.clone());
        }
        let mut wide = self.convert_to(DType::F32, Category::Temporary, "f16 input as f32")?;
        wide.autograd = self.autograd.clone();
        remember(&wide, self);
        Ok(wide)
    }

    /// The tensor as a matmul operand: its f32 elements, or its halves when f16. Errors:
    /// [`Error::DTypeMismatch`] for u32 tensors.
    pub(crate) fn operand(&self, op: &'static str) -> Result<Operand<'_>> {
        match self.dtype {
            DType::F16 => Ok(Operand::F16(self.halves()?)),
            _ => {
                self.expect_dtype(op, DType::F32)?;
                Ok(Operand::F32(self.elements()?))
            }
        }
    }

    /// The 16-bit elements of an f16 tensor, for launchers.
    pub fn halves(&self) -> Result<Halves<'_>> {
        self.expect_dtype("halves", DType::F16)?;
        Ok(Halves::of(&self.storage, self.offset, self.numel() as u64)?)
    }

    /// A new tensor of `dtype` (f16 or f32) with this one's values and shape, in `category`.
    pub(crate) fn convert_to(
        &self,
        dtype: DType,
        category: Category,
        label: &str,
    ) -> Result<Tensor> {
        let from = match dtype {
            DType::F16 => DType::F32,
            _ => DType::F16,
        };
        let op = match dtype {
            DType::F16 => "to_f16",
            _ => "to_f32",
        };
        self.expect_dtype(op, from)?;
        let out = Tensor::empty_typed(&self.gpu, &self.shape, dtype, category, label)?;
        match dtype {
            DType::F16 => convert::f32_to_f16(&self.gpu, out.halves()?, self.elements()?)?,
            _ => convert::f16_to_f32(&self.gpu, out.elements()?, self.halves()?)?,
        }
        Ok(out)
    }

    /// Errors unless the tensor has 4-byte elements (what [`Tensor::elements`] yields).
    pub(crate) fn expect_4_bytes(&self, op: &'static str) -> Result<()> {
        if self.dtype == DType::F16 {
            return Err(Error::DTypeMismatch {
                op,
                expected: DType::F32,
                got: DType::F16,
            });
        }
        Ok(())
    }

    /// Reads an f16 tensor back as f32 (the words it touches, decoded on the host).
    pub(crate) fn halves_to_vec(&self, deadline: Duration) -> Result<Vec<f32>> {
        let words = self.halves()?.words();
        let raw: Vec<u32> = self
            .gpu
            .read(&self.storage, words.offset(), words.len(), deadline)?;
        let first = (self.offset % 2) as usize;
        Ok((first..first + self.numel())
            .map(|h| {
                let word = raw.get(h / 2).copied().unwrap_or(0);
                f16_bits_to_f32((word >> (16 * (h % 2))) as u16)
            })
            .collect())
    }

    /// A tensor of this one's shape over `storage` from `offset`, of `dtype`, in no graph.
    fn with_storage(&self, storage: Arc<DeviceBuffer>, offset: u64, dtype: DType) -> Tensor {
        Tensor {
            gpu: self.gpu.clone(),
            storage,
            offset,
            shape: self.shape.clone(),
            dtype,
            autograd: crate::tensor::Autograd::None,
        }
    }
}
