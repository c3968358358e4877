//! Reading an object in place: a [`PinnedObject`] keeps its region where it is until the last
//! view made from it (Arrow arrays, `Bytes`, Python buffers) is dropped.

use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_schema::SchemaRef;
use bytes::Bytes;

use crate::backend::Backend;
pub use crate::error::{Result, StoreError};
use crate::ipc;
pub use crate::layout::{Format, ObjectHeader, ObjectId};

/// The pin on one object: while it lives the object's region stays where it is.
pub(crate) struct Pin {
    pub(crate) backend: Backend,
    pub(crate) id: ObjectId,
    pub(crate) offset: usize,
    pub(crate) header: ObjectHeader,
    /// Process that took the pin: a forked child that inherited the view must not release
    /// the parent's pin (it would share the parent's socket to the owner).
    pub(crate) pid: u32,
}

// A pin is only ever dropped or read (its fields are immutable after creation); a panic
// elsewhere cannot leave it in a state that matters. Arrow's custom allocations ask for it.
impl std::panic::RefUnwindSafe for Pin {}

impl Drop for Pin {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            self.backend.unpin(self.id);
        }
    }
}

/// A sealed object, pinned in memory. Views made from it (`Bytes`, Arrow buffers and
/// arrays) keep the pin alive on their own.
#[derive(Clone)]
pub struct PinnedObject {
    pub(crate) pin: Arc<Pin>,
}

/// A slice of a pinned object that owns its pin (backs `Bytes`).
pub(crate) struct PinnedSlice {
    pub(crate) pin: Arc<Pin>,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

impl AsRef<[u8]> for PinnedSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the region is sealed (immutable) and pinned by `self.pin`.
        unsafe { self.pin.backend.arena().slice(self.start, self.len) }
    }
}

impl std::fmt::Debug for PinnedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedObject")
            .field("id", &self.pin.id)
            .field("offset", &self.pin.offset)
            .field("header", &self.pin.header)
            .finish()
    }
}

impl PinnedObject {
    pub fn id(&self) -> ObjectId {
        self.pin.id
    }

    pub fn format(&self) -> Format {
        self.pin.header.format
    }

    pub fn header(&self) -> &ObjectHeader {
        &self.pin.header
    }

    fn region(&self, start: usize, len: usize) -> &[u8] {
        // SAFETY: the region is sealed (immutable) and pinned by `self.pin` for as long as
        // `self` (and so the returned borrow) lives.
        unsafe { self.pin.backend.arena().slice(self.pin.offset + start, len) }
    }

    /// The metadata given at put/create.
    pub fn meta(&self) -> &[u8] {
        let h = &self.pin.header;
        self.region(h.meta_offset(), h.meta_len)
    }

    /// The object's data (64-byte aligned).
    pub fn data(&self) -> &[u8] {
        let h = &self.pin.header;
        self.region(h.data_offset(), h.data_len)
    }

    /// The data as `Bytes` that hold the pin.
    pub fn data_bytes(&self) -> Bytes {
        let h = &self.pin.header;
        Bytes::from_owner(PinnedSlice {
            pin: self.pin.clone(),
            start: self.pin.offset + h.data_offset(),
            len: h.data_len,
        })
    }

    /// The data as an Arrow buffer that holds the pin.
    pub fn data_buffer(&self) -> Buffer {
        let h = &self.pin.header;
        let ptr = self
            .pin
            .backend
            .arena()
            .ptr(self.pin.offset + h.data_offset());
        let ptr = NonNull::new(ptr).expect("mapping addresses are not null");
        // SAFETY: ptr..ptr+data_len is inside the mapping, sealed (never written again) and
        // stays mapped and in place while the pin (the allocation owner) lives.
        unsafe { Buffer::from_custom_allocation(ptr, h.data_len, self.pin.clone()) }
    }

    /// Read an Arrow object: its schema and record batches, with buffers in the mapping.
    pub fn record_batches(&self) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        if self.format() != Format::ArrowIpc {
            return Err(StoreError::Invalid {
                path: self.pin.backend.dir().to_path_buf(),
                reason: format!("object {} holds bytes, not an Arrow value", self.id()),
            });
        }
        ipc::decode(&self.data_buffer()).map_err(|source| StoreError::Arrow {
            path: self.pin.backend.dir().to_path_buf(),
            id: self.id(),
            source,
        })
    }
}
