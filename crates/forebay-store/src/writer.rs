//! Writing an object in place: [`ObjectWriter`] (`create` → write → `seal`).

use crate::backend::Backend;
pub use crate::error::Result;
pub use crate::layout::{ObjectHeader, ObjectId};

/// An object being written in place (`create` → write → `seal`). Dropped unsealed, its
/// memory is freed.
pub struct ObjectWriter {
    pub(crate) backend: Backend,
    pub(crate) header: ObjectHeader,
    pub(crate) offset: usize,
    pub(crate) sealed: bool,
    /// Process that created it (see `Pin::pid`).
    pub(crate) pid: u32,
}

impl ObjectWriter {
    pub fn id(&self) -> ObjectId {
        self.header.id
    }

    pub fn header(&self) -> &ObjectHeader {
        &self.header
    }

    /// The data region to fill (its initial contents are unspecified).
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (start, len) = (
            self.offset + self.header.data_offset(),
            self.header.data_len,
        );
        // SAFETY: the region is allocated to this writer alone until it is sealed or
        // aborted; `&mut self` makes this the only live slice of it.
        unsafe { self.backend.arena().slice_mut(start, len) }
    }

    pub(crate) fn meta_mut(&mut self) -> &mut [u8] {
        let (start, len) = (
            self.offset + self.header.meta_offset(),
            self.header.meta_len,
        );
        // SAFETY: as in `data_mut`.
        unsafe { self.backend.arena().slice_mut(start, len) }
    }

    /// Make the object immutable and visible to `get`.
    pub fn seal(mut self) -> Result<ObjectId> {
        self.backend.seal(self.header.id)?;
        self.sealed = true;
        Ok(self.header.id)
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if !self.sealed && std::process::id() == self.pid {
            self.backend.abort(self.header.id);
        }
    }
}
