//! [`DeviceBuffer`]: one block of device memory, sub-allocated from a segment, with its size,
//! category and label; freed when dropped. Uploads and fenced read-backs.
//!
//! A new buffer's contents are undefined (reused memory is not cleared); fill it first.
//!
//! A buffer can leave the device and come back ([`Gpu::evict`], [`Gpu::restore`]): evicted,
//! its block is freed and its values live in host memory, where [`Gpu::write`] and
//! [`Gpu::read`] reach them; no kernel may use it until it is restored (recording a dispatch
//! that does is [`Error::Evicted`]). Parameter streaming is built on this.
//! Uploads use `queue.write_buffer`, which is safe here because of the ordering rules in
//! [`crate::recorder`] (freed bytes keep the serial of the last batch that used them; an upload
//! into bytes the open batch uses submits it first).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use plimsoll_allocator::{Allocation, Category, Request};

use crate::device::{Gpu, Shared};
use crate::error::{Error, Result};
use crate::fence::{CallbackSlot, wait_callback, wait_fence};
use crate::pipeline::scoped;
use crate::recorder::{Batch, lock_for_submit, submit_locked};

/// Sizes and offsets of uploads, read-backs and buffers are multiples of this many bytes.
pub const WORD_BYTES: u64 = 4;

/// Where a resident buffer's block lies.
pub(crate) struct Place {
    /// The segment's buffer (bound whole by kernels).
    pub(crate) segment: wgpu::Buffer,
    allocation: Allocation,
    /// The segment's unique id (bind-group cache key).
    pub(crate) segment_uid: u64,
    offset_bytes: u64,
}

/// One block of device memory. Kernels see it as `array<f32>` or `array<u32>` (4-byte words).
/// It may also be evicted to host memory and restored ([`Gpu::evict`]).
pub struct DeviceBuffer {
    /// The block, or `None` while evicted (and during drop). Declared before `shared` so that
    /// the segment's handle drops first, while the allocator still holds the segment: a buffer
    /// that is the last `Gpu` owner then never drops the last handle of a wgpu buffer itself
    /// (see [`crate::device`]).
    place: RwLock<Option<Place>>,
    /// The values in host memory: always while evicted; after a restore, until anything
    /// writes the buffer through [`Gpu::write`] (a kernel's writes are the caller's to
    /// declare, see [`Evict::Unchanged`]).
    host: Mutex<HostCopy>,
    size_bytes: u64,
    category: Category,
    label: String,
    /// Serial of the last batch that recorded a use of this buffer or of its bytes under an earlier
    /// holder (the allocation's tag; 0: never).
    pub(crate) last_used_batch: AtomicU64,
    /// Last field: may be the last owner of the device, whose drop tears it down.
    shared: Arc<Shared>,
}

/// A buffer's values in host memory ([`Gpu::evict`]).
enum HostCopy {
    /// None kept.
    None,
    /// On their way ([`Evict::ReadBackLater`]): waited for when first needed.
    Reading(PendingRead),
    /// The values.
    Values(Vec<u8>),
    /// Their read-back failed when it was waited for (the error went to that caller).
    Lost,
}

impl HostCopy {
    fn is_none(&self) -> bool {
        matches!(self, HostCopy::None)
    }
}

/// How [`Gpu::evict`] gets the values it keeps in host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evict {
    /// Read them back from the device (fenced, within the default deadline).
    ReadBack,
    /// Keep the host copy made when the buffer was last evicted: the caller promises that no
    /// kernel has written the buffer since it was restored (a parameter between its uses).
    /// Without a host copy (the buffer was never evicted, or [`Gpu::write`] wrote it since),
    /// this reads back as [`Evict::ReadBack`] does.
    Unchanged,
    /// Start the read-backs and free the blocks at once (work recorded later runs after the
    /// copies); the values are waited for when first needed (a read, a write, a restore). A
    /// failed wait then is that caller's error, and the values are gone: for what a failed
    /// step discards anyway (gradients), so that reading them back does not stall recording.
    ReadBackLater,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("label", &self.label)
            .field("category", &self.category)
            .field("size_bytes", &self.size_bytes)
            .field("segment_uid", &self.segment_uid())
            .field("offset_bytes", &self.offset_bytes())
            .field("resident", &self.is_resident())
            .finish()
    }
}

impl DeviceBuffer {
    /// Bytes asked for (the block may be larger by rounding).
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Number of 4-byte elements.
    pub fn len(&self) -> u64 {
        self.size_bytes / WORD_BYTES
    }

    /// Whether the buffer holds no element (never true: empty requests are refused).
    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }

    /// Offset of the block in its segment, in bytes (0 while evicted).
    pub fn offset_bytes(&self) -> u64 {
        self.place().as_ref().map_or(0, |p| p.offset_bytes)
    }

    /// Offset of the block in its segment, in 4-byte elements: what kernels add to their indices.
    pub fn offset_elements(&self) -> u32 {
        (self.offset_bytes() / WORD_BYTES) as u32
    }

    /// Whether the buffer has its block on the device (not evicted, [`Gpu::evict`]).
    pub fn is_resident(&self) -> bool {
        self.place().is_some()
    }

    /// The block's placement (read-locked).
    pub(crate) fn place(&self) -> RwLockReadGuard<'_, Option<Place>> {
        self.place.read().unwrap_or_else(|p| p.into_inner())
    }

    fn host(&self) -> MutexGuard<'_, HostCopy> {
        self.host.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host copy with a read on its way waited for (within `deadline`): `Values` or
    /// `None`, or the error of a read that failed now or before.
    fn host_values(&self, deadline: Duration) -> Result<MutexGuard<'_, HostCopy>> {
        let mut host = self.host();
        if matches!(*host, HostCopy::Reading(_))
            && let HostCopy::Reading(pending) = std::mem::replace(&mut *host, HostCopy::Lost)
        {
            *host = HostCopy::Values(pending.wait(deadline)?);
        }
        if matches!(*host, HostCopy::Lost) {
            return Err(Error::InvalidArgument {
                op: "evicted buffer",
                message: format!(
                    "{:?}: its read-back to host memory failed earlier, so its values are \
                     gone; run the step again",
                    self.label
                ),
            });
        }
        Ok(host)
    }

    /// Whether the buffer was allocated by the device `shared` is.
    pub(crate) fn belongs_to(&self, shared: &Shared) -> bool {
        std::ptr::eq(&*self.shared, shared)
    }

    /// The segment's unique id (`u64::MAX` while evicted; a dispatch then refuses the buffer).
    pub(crate) fn segment_uid(&self) -> u64 {
        self.place().as_ref().map_or(u64::MAX, |p| p.segment_uid)
    }

    /// The segment's buffer and the block's offset in it, or [`Error::Evicted`] naming `op`.
    pub(crate) fn resident(&self, op: &str) -> Result<(wgpu::Buffer, u64)> {
        match self.place().as_ref() {
            Some(p) => Ok((p.segment.clone(), p.offset_bytes)),
            None => Err(Error::Evicted {
                label: self.label.clone(),
                op: op.to_string(),
            }),
        }
    }

    /// What the memory holds.
    pub fn category(&self) -> Category {
        self.category
    }

    /// Who holds it.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The allocator's segment id and offset (diagnostics, tests of reuse).
    pub fn placement(&self) -> (plimsoll_allocator::SegmentId, u64) {
        let place = self.place();
        let segment = place.as_ref().map(|p| p.allocation.segment());
        (
            segment.unwrap_or(plimsoll_allocator::SegmentId(u32::MAX)),
            place.as_ref().map_or(0, |p| p.offset_bytes),
        )
    }

    fn check_range(&self, op: &'static str, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        for (what, value) in [("offset_bytes", offset_bytes), ("len_bytes", len_bytes)] {
            if !value.is_multiple_of(WORD_BYTES) {
                return Err(Error::Misaligned {
                    what,
                    value,
                    required: WORD_BYTES,
                    label: self.label.clone(),
                });
            }
        }
        if offset_bytes
            .checked_add(len_bytes)
            .is_none_or(|end| end > self.size_bytes)
        {
            return Err(Error::InvalidArgument {
                op,
                message: format!(
                    "bytes {offset_bytes}..{} outside buffer {:?} of {} bytes",
                    offset_bytes.saturating_add(len_bytes),
                    self.label,
                    self.size_bytes
                ),
            });
        }
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.release();
    }
}

impl DeviceBuffer {
    /// The block's placement (write-locked).
    fn place_mut(&self) -> RwLockWriteGuard<'_, Option<Place>> {
        self.place.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Frees the block, if the buffer holds one (drop, eviction).
    fn release(&self) {
        let place = self.place_mut().take();
        if let Some(place) = place {
            self.free(place);
        }
    }

    /// Frees the block at once, tagged with the last batch that used the bytes: the next
    /// holder inherits the tag, so an upload into it while that batch is open submits the
    /// batch first (see `crate::recorder`). Our own allocation: a refusal would be an allocator
    /// bug, and there is nothing to undo. The segment's handle drops after the free.
    fn free(&self, place: Place) {
        let Place {
            segment,
            allocation,
            ..
        } = place;
        let tag = self.last_used_batch.load(Ordering::SeqCst);
        let _ = self.shared.memory().free_with_tag(allocation, tag);
        drop(segment);
    }
}

impl Gpu {
    /// Allocates `size_bytes` (a nonzero multiple of 4, at most [`Gpu::max_buffer_bytes`]).
    /// Errors: [`Error::OutOfMemory`] past the budget (with the allocator's report),
    /// [`Error::TooLarge`] over the binding limit, [`Error::Misaligned`], [`Error::Allocation`] for
    /// a zero size.
    pub fn alloc(&self, size_bytes: u64, category: Category, label: &str) -> Result<DeviceBuffer> {
        let shared = &self.shared;
        shared.health.check()?;
        if !size_bytes.is_multiple_of(WORD_BYTES) {
            return Err(Error::Misaligned {
                what: "size_bytes",
                value: size_bytes,
                required: WORD_BYTES,
                label: label.to_string(),
            });
        }
        if size_bytes > shared.max_block_bytes {
            return Err(Error::TooLarge {
                label: label.to_string(),
                requested_bytes: size_bytes,
                max_bytes: shared.max_block_bytes,
            });
        }
        let mut memory = shared.memory();
        let request = Request {
            size_bytes,
            alignment: shared.block_alignment,
            category,
            label,
        };
        #[cfg(all(feature = "fault-injection", debug_assertions))]
        if crate::fault::fires(shared, crate::fault::FaultPoint::Allocation)? {
            return Err(memory.refuse(&request).into());
        }
        let allocation = memory.allocate(request)?;
        let Some(segment) = memory.segment(allocation.segment()) else {
            let _ = memory.free(allocation);
            return Err(Error::InvalidArgument {
                op: "alloc",
                message: "allocator returned a block in an unknown segment".to_string(),
            });
        };
        let (buffer, uid) = (segment.buffer.clone(), segment.uid);
        drop(memory);
        let tag = allocation.tag();
        Ok(DeviceBuffer {
            shared: Arc::clone(shared),
            place: RwLock::new(Some(Place {
                offset_bytes: allocation.offset(),
                allocation,
                segment: buffer,
                segment_uid: uid,
            })),
            host: Mutex::new(HostCopy::None),
            size_bytes,
            category,
            label: label.to_string(),
            // The bytes' previous holders may be used by the open batch: this buffer counts as
            // used by every batch they were.
            last_used_batch: AtomicU64::new(tag),
        })
    }

    /// Allocates room for `len` 4-byte elements (f32 or u32).
    pub fn alloc_elements(
        &self,
        len: u64,
        category: Category,
        label: &str,
    ) -> Result<DeviceBuffer> {
        self.alloc(len.saturating_mul(WORD_BYTES), category, label)
    }

    /// Allocates a buffer holding `data`.
    pub fn upload<T: bytemuck::Pod>(
        &self,
        data: &[T],
        category: Category,
        label: &str,
    ) -> Result<DeviceBuffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let buffer = self.alloc(bytes.len() as u64, category, label)?;
        self.write(&buffer, 0, data)?;
        Ok(buffer)
    }

    /// Writes `data` at element `offset` (4-byte elements). If the open batch uses `buffer` (or
    /// used its bytes under an earlier holder), the batch is submitted first, so the write cannot overtake recorded work (docs/wgpu.md §4); that
    /// submit may wait for room within [`Gpu::default_deadline`] ([`Error::Timeout`] past it).
    pub fn write<T: bytemuck::Pod>(
        &self,
        buffer: &DeviceBuffer,
        offset: u64,
        data: &[T],
    ) -> Result<()> {
        let shared = &*self.shared;
        shared.health.check()?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let offset_bytes = offset.saturating_mul(WORD_BYTES);
        buffer.check_range("write", offset_bytes, bytes.len() as u64)?;
        if bytes.is_empty() || shared.planning {
            return Ok(());
        }
        if !buffer.is_resident() {
            // Evicted: the host copy is the value.
            let mut host = buffer.host_values(self.default_deadline())?;
            if let HostCopy::Values(values) = &mut *host {
                let at = offset_bytes as usize;
                values[at..at + bytes.len()].copy_from_slice(bytes);
            }
            return Ok(());
        }
        // Resident: a host copy is stale from now.
        *buffer.host() = HostCopy::None;
        #[cfg(all(feature = "fault-injection", debug_assertions))]
        if crate::fault::fires(shared, crate::fault::FaultPoint::Upload)? {
            return Err(Error::Validation {
                context: "write".to_string(),
                message: format!(
                    "{}: the upload of {} bytes was refused",
                    crate::device::INJECTED,
                    bytes.len()
                ),
            });
        }
        // Hold the batch lock so nothing is recorded between the flush and the write.
        let uses = |batch: &Batch| {
            batch.is_open() && buffer.last_used_batch.load(Ordering::SeqCst) >= batch.serial
        };
        let mut batch = shared.batch();
        if uses(&batch) {
            drop(batch);
            let deadline = self.default_deadline();
            batch = lock_for_submit(shared, deadline)?;
            if uses(&batch) {
                submit_locked(shared, &mut batch, Some("flush before upload"), deadline)?;
            }
        }
        let (segment, at) = buffer.resident("write")?;
        scoped(&shared.device, "write", || {
            shared
                .queue
                .write_buffer(&segment, at + offset_bytes, bytes);
        })
    }

    /// Asks for `bytes` of host memory that the run keeps on purpose for this device (`what`:
    /// an offloaded optimizer's state, an offloaded activation), before the caller allocates
    /// it (fallibly). Nothing is allocated here; it is a failure point of fault injection
    /// ([`crate::fault::FaultPoint::HostAllocation`]), where the memory is refused as the host
    /// refuses it: [`Error::HostMemory`]. Fails on a lost device.
    pub fn host_allocation(&self, what: &str, bytes: u64) -> Result<()> {
        let shared = &*self.shared;
        shared.health.check()?;
        #[cfg(all(feature = "fault-injection", debug_assertions))]
        if crate::fault::fires(shared, crate::fault::FaultPoint::HostAllocation)? {
            return Err(Error::HostMemory {
                what: what.to_string(),
                bytes,
            });
        }
        let _ = (what, bytes);
        Ok(())
    }

    /// Reads `len` elements from element `offset`, after everything recorded so far: submits the
    /// open batch with a copy to a staging buffer, waits on its fence, then for the staging
    /// buffer's map callback (which may run on another thread, see [`crate::fence`]). `deadline`
    /// covers the submit (which may wait for room), the fence and the map; past it,
    /// [`Error::Timeout`] naming the read. Safe to call from several threads on one device.
    pub fn read<T: bytemuck::Pod>(
        &self,
        buffer: &DeviceBuffer,
        offset: u64,
        len: u64,
        deadline: Duration,
    ) -> Result<Vec<T>> {
        let elem = std::mem::size_of::<T>() as u64;
        let bytes = self.read_bytes(
            buffer,
            offset.saturating_mul(elem),
            len.saturating_mul(elem),
            deadline,
        )?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// [`Gpu::read`] into `out` (`out.len()` elements from element `offset`), allocating no
    /// host memory for the values: for a copy kept and refreshed in place.
    pub fn read_into<T: bytemuck::Pod>(
        &self,
        buffer: &DeviceBuffer,
        offset: u64,
        out: &mut [T],
        deadline: Duration,
    ) -> Result<()> {
        let elem = std::mem::size_of::<T>() as u64;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let start = Instant::now();
        let pending = self.start_read_bytes(
            buffer,
            offset.saturating_mul(elem),
            bytes.len() as u64,
            deadline,
        )?;
        pending.finish_into(start, deadline, bytes)
    }

    /// Reads a whole buffer as `T` (4-byte elements).
    pub fn read_all<T: bytemuck::Pod>(
        &self,
        buffer: &DeviceBuffer,
        deadline: Duration,
    ) -> Result<Vec<T>> {
        let elem = std::mem::size_of::<T>() as u64;
        self.read(buffer, 0, buffer.size_bytes / elem, deadline)
    }

    /// Reads `len_bytes` bytes from `offset_bytes` (both multiples of 4). See [`Gpu::read`].
    pub fn read_bytes(
        &self,
        buffer: &DeviceBuffer,
        offset_bytes: u64,
        len_bytes: u64,
        deadline: Duration,
    ) -> Result<Vec<u8>> {
        let start = Instant::now();
        let pending = self.start_read_bytes(buffer, offset_bytes, len_bytes, deadline)?;
        pending.finish(start, deadline)
    }

    /// Starts reading `len_bytes` bytes from `offset_bytes` (both multiples of 4), after
    /// everything recorded so far, and returns without waiting: the copy to a staging buffer
    /// is submitted with the open batch (`deadline` covers waiting for room to submit), and
    /// [`PendingRead::wait`] waits for it. Work recorded afterwards runs after the copy, so the
    /// buffer may be freed and its bytes reused at once; the device keeps working while the
    /// host goes on recording.
    pub fn start_read_bytes(
        &self,
        buffer: &DeviceBuffer,
        offset_bytes: u64,
        len_bytes: u64,
        deadline: Duration,
    ) -> Result<PendingRead> {
        let shared = &*self.shared;
        shared.health.check()?;
        buffer.check_range("read", offset_bytes, len_bytes)?;
        let label = buffer.label.clone();
        let done = |data: Vec<u8>| PendingRead {
            gpu: self.clone(),
            label: label.clone(),
            state: PendingState::Done(data),
        };
        if !buffer.is_resident() {
            // Evicted: the values are in host memory (none on a planning device).
            let host = buffer.host_values(deadline)?;
            let at = offset_bytes as usize;
            let values = match &*host {
                HostCopy::Values(v) => v.get(at..at + len_bytes as usize),
                _ => None,
            };
            return Ok(done(
                values.map_or_else(|| vec![0; len_bytes as usize], <[u8]>::to_vec),
            ));
        }
        #[cfg(all(feature = "fault-injection", debug_assertions))]
        if crate::fault::fires(shared, crate::fault::FaultPoint::ReadBack)? {
            // What a stalled GPU gives: the batch went out, the wait ran past its deadline.
            let fence = self.flush_within("read-back", deadline)?;
            return Err(crate::fault::timeout(shared, &fence, deadline));
        }
        if len_bytes == 0 {
            return Ok(done(Vec::new()));
        }
        if shared.planning {
            // A planning device holds no data (see `crate::planning`).
            return Ok(done(vec![0; len_bytes as usize]));
        }
        let (segment, at) = buffer.resident("read")?;
        let staging = scoped(&shared.device, "read-back staging buffer", || {
            shared.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("plimsoll read-back"),
                size: len_bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        // Set by the map callback, which may run on another thread after our fence completes.
        let mapped = CallbackSlot::<std::result::Result<(), String>>::new();
        let fence = {
            // Make room before recording the copy, so a timeout leaves no orphan copy behind.
            let mut batch = lock_for_submit(shared, deadline)?;
            batch.end_pass();
            let encoder = batch.encoder(&shared.device);
            encoder.copy_buffer_to_buffer(&segment, at + offset_bytes, &staging, 0, len_bytes);
            let slot = Arc::clone(&mapped);
            encoder.map_buffer_on_submit(&staging, wgpu::MapMode::Read, .., move |r| {
                slot.set(r.map_err(|e| e.to_string()));
            });
            let submitted = format!("read {}", buffer.label);
            submit_locked(shared, &mut batch, Some(&submitted), deadline)?
        };
        Ok(PendingRead {
            gpu: self.clone(),
            label,
            state: PendingState::Submitted {
                staging,
                mapped,
                fence,
            },
        })
    }
}

impl DeviceBuffer {
    /// Host bytes this buffer holds now (its values while evicted, or the copy kept after a
    /// restore; none on a planning device).
    pub fn host_bytes(&self) -> u64 {
        match &*self.host() {
            HostCopy::Values(v) => v.len() as u64,
            HostCopy::Reading(_) => self.size_bytes,
            HostCopy::None | HostCopy::Lost => 0,
        }
    }
}

impl Gpu {
    /// Moves `buffers` to host memory and frees their blocks (those already evicted are left
    /// as they are). The values come as `how` says: read back (all reads started, then all
    /// waited for within the default deadline, or later), or the copy kept since the last
    /// restore. All or nothing: if a read or the host memory for it fails, every buffer stays
    /// resident and the error is returned. On a planning device nothing is read: only the
    /// frees count.
    pub fn evict(&self, buffers: &[&DeviceBuffer], how: Evict) -> Result<()> {
        let shared = &*self.shared;
        shared.health.check()?;
        let deadline = self.default_deadline();
        let mut reads = Vec::new();
        for (i, buffer) in buffers.iter().enumerate() {
            let needs_read = buffer.is_resident()
                && !shared.planning
                && (how != Evict::Unchanged || buffer.host().is_none());
            if needs_read {
                self.host_allocation("an evicted buffer's values", buffer.size_bytes)?;
                let pending = self.start_read_bytes(buffer, 0, buffer.size_bytes, deadline)?;
                reads.push((i, pending));
            }
        }
        let start = Instant::now();
        let mut values = Vec::with_capacity(reads.len());
        for (i, pending) in reads {
            values.push(match how {
                Evict::ReadBackLater => (i, HostCopy::Reading(pending)),
                _ => (i, HostCopy::Values(pending.finish(start, deadline)?)),
            });
        }
        for (i, copy) in values {
            *buffers[i].host() = copy;
        }
        for buffer in buffers {
            buffer.release();
        }
        Ok(())
    }

    /// Brings an evicted `buffer` back: a new block (which may fail as any allocation does,
    /// leaving it evicted) written with its host values, which are kept (a later
    /// [`Evict::Unchanged`] needs no read). Nothing to do for a resident buffer.
    pub fn restore(&self, buffer: &DeviceBuffer) -> Result<()> {
        if buffer.is_resident() {
            return Ok(());
        }
        let fresh = self.alloc(buffer.size_bytes, buffer.category, &buffer.label)?;
        if let HostCopy::Values(values) = &*buffer.host_values(self.default_deadline())? {
            self.write(&fresh, 0, values)?;
        }
        // The new block becomes the buffer's (and `fresh` drops with none to free).
        let place = fresh.place_mut().take();
        buffer.last_used_batch.store(
            fresh.last_used_batch.load(Ordering::SeqCst),
            Ordering::SeqCst,
        );
        *buffer.place_mut() = place;
        Ok(())
    }
}

/// A read-back on its way ([`Gpu::start_read_bytes`]): the copy is submitted, the bytes come
/// with [`PendingRead::wait`]. Dropped unwaited, its staging buffer goes with it.
pub struct PendingRead {
    gpu: Gpu,
    label: String,
    state: PendingState,
}

enum PendingState {
    /// Nothing to wait for (an empty read, a planning device's).
    Done(Vec<u8>),
    Submitted {
        staging: wgpu::Buffer,
        mapped: Arc<CallbackSlot<std::result::Result<(), String>>>,
        fence: crate::fence::Fence,
    },
}

impl std::fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            PendingState::Done(_) => "done",
            PendingState::Submitted { .. } => "submitted",
        };
        f.debug_struct("PendingRead")
            .field("label", &self.label)
            .field("state", &state)
            .finish()
    }
}

impl PendingRead {
    /// The bytes, waiting at most `deadline` for the copy's fence and the staging buffer's map
    /// callback; past it, [`Error::Timeout`] naming the read.
    pub fn wait(self, deadline: Duration) -> Result<Vec<u8>> {
        self.finish(Instant::now(), deadline)
    }

    /// [`PendingRead::wait`], the bytes as `T`s (4-byte elements).
    pub fn wait_as<T: bytemuck::Pod>(self, deadline: Duration) -> Result<Vec<T>> {
        Ok(bytemuck::pod_collect_to_vec(&self.wait(deadline)?))
    }

    /// [`PendingRead::wait`], its deadline counted from `start`.
    fn finish(self, start: Instant, deadline: Duration) -> Result<Vec<u8>> {
        self.finish_with(start, deadline, <[u8]>::to_vec)
    }

    /// The bytes written into `out`, which must be as long as the read (else
    /// [`Error::InvalidArgument`]): no host memory is allocated for them.
    fn finish_into(self, start: Instant, deadline: Duration, out: &mut [u8]) -> Result<()> {
        let label = self.label.clone();
        self.finish_with(start, deadline, |bytes| {
            if bytes.len() != out.len() {
                return Err(Error::InvalidArgument {
                    op: "read_into",
                    message: format!(
                        "{label}: {} bytes read into a slice of {}",
                        bytes.len(),
                        out.len()
                    ),
                });
            }
            out.copy_from_slice(bytes);
            Ok(())
        })?
    }

    /// `take` given the bytes once they are here, its deadline counted from `start`.
    fn finish_with<R>(
        self,
        start: Instant,
        deadline: Duration,
        take: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let (staging, mapped, fence) = match self.state {
            PendingState::Done(data) => return Ok(take(&data)),
            PendingState::Submitted {
                staging,
                mapped,
                fence,
            } => (staging, mapped, fence),
        };
        let shared = &*self.gpu.shared;
        let waited = Instant::now();
        wait_fence(shared, &fence, start, deadline)?;
        crate::profile::cpu_span(shared, "wait", fence.label(), waited);
        // The fence completing does not mean the map callback has run: another thread's poll may
        // have retired our submission and not yet run its callbacks (see `crate::fence`).
        let map_error = |message: String| Error::Map {
            label: self.label.clone(),
            message,
        };
        wait_callback(shared, &fence, &mapped, start, deadline)?.map_err(map_error)?;
        let data = {
            let range = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| map_error(e.to_string()))?;
            take(&range)
        };
        staging.unmap();
        crate::profile::cpu_span(shared, "read-back", &self.label, start);
        Ok(data)
    }
}
