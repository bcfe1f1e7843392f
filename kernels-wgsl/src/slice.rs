//! [`DeviceSlice`]: a run of 4-byte elements inside one [`DeviceBuffer`], the one type every
//! launcher takes for a buffer argument. Its range is checked once, when it is made
//! ([`DeviceBuffer::slice`]); after that it yields what a launch needs: the buffer to bind (its
//! whole segment, see [`crate::pipeline`]) and the element index the shader starts at
//! ([`DeviceSlice::index`]).

use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};

/// Elements `offset..offset + len` of a [`DeviceBuffer`] (4-byte elements: f32, u32 or two
/// packed f16). Invariant: `offset + len <= buffer.len()`, so every index a shader forms from
/// [`DeviceSlice::index`] below `index() + len` lies inside the buffer's block.
#[derive(Clone, Copy)]
pub struct DeviceSlice<'a> {
    buffer: &'a DeviceBuffer,
    offset: u64,
    len: u64,
}

impl std::fmt::Debug for DeviceSlice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}[{}..{}]",
            self.buffer.label(),
            self.offset,
            self.offset + self.len
        )
    }
}

impl DeviceBuffer {
    /// Elements `offset..offset + len` of this buffer, or [`Error::InvalidArgument`] naming the
    /// buffer and the range when they do not lie inside it.
    pub fn slice(&self, offset: u64, len: u64) -> Result<DeviceSlice<'_>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(DeviceSlice {
                buffer: self,
                offset,
                len,
            }),
            _ => Err(Error::InvalidArgument {
                op: "slice",
                message: format!(
                    "elements {offset}..{} outside buffer {:?} of {} elements",
                    offset.saturating_add(len),
                    self.label(),
                    self.len()
                ),
            }),
        }
    }

    /// Every element of this buffer.
    pub fn whole(&self) -> DeviceSlice<'_> {
        DeviceSlice {
            buffer: self,
            offset: 0,
            len: self.len(),
        }
    }
}

impl<'a> DeviceSlice<'a> {
    /// The buffer this slice lies in.
    pub fn buffer(&self) -> &'a DeviceBuffer {
        self.buffer
    }

    /// First element, counted from the start of the buffer.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the slice holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first element as the `u32` a shader indexes its binding (the whole segment) with:
    /// the buffer's offset in its segment plus this slice's offset.
    pub fn index(&self) -> u32 {
        // Segments are at most max_storage_buffer_binding_size bytes, so element indices fit.
        (u64::from(self.buffer.offset_elements()) + self.offset) as u32
    }

    /// Elements `offset..offset + len` of this slice (counted from its start).
    pub fn slice(&self, offset: u64, len: u64) -> Result<DeviceSlice<'a>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceSlice {
                buffer: self.buffer,
                offset: self.offset + offset,
                len,
            }),
            _ => Err(Error::InvalidArgument {
                op: "slice",
                message: format!(
                    "elements {offset}..{} outside {self:?} of {} elements",
                    offset.saturating_add(len),
                    self.len
                ),
            }),
        }
    }

    /// `Ok` when the slice holds exactly `len` elements; otherwise [`Error::InvalidArgument`]
    /// for launcher `op`, naming the argument, both lengths and the slice.
    pub fn expect_len(&self, op: &'static str, name: &str, len: u64) -> Result<()> {
        if self.len == len {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op,
            message: format!(
                "{name}: {} elements given ({self:?}), {len} needed",
                self.len
            ),
        })
    }

    /// `Ok` when the slice holds at least `len` elements (an operand read up to an extent).
    pub fn expect_at_least(&self, op: &'static str, name: &str, len: u64) -> Result<()> {
        if self.len >= len {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op,
            message: format!(
                "{name}: {} elements given ({self:?}), at least {len} needed",
                self.len
            ),
        })
    }

    /// Whether this slice and `other` share an element (same segment, overlapping ranges).
    pub fn overlaps(&self, other: &DeviceSlice<'_>) -> bool {
        let (a, b) = (u64::from(self.index()), u64::from(other.index()));
        self.buffer.segment_uid() == other.buffer.segment_uid()
            && !self.is_empty()
            && !other.is_empty()
            && a < b + other.len
            && b < a + self.len
    }
}
