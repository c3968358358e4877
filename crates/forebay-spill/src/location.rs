//! What both spill targets hand back: where each object sits ([`ObjectExtent`]) and a round
//! still being written ([`PendingRound`]).
//!
//! [`SpillLocation`](crate::SpillLocation) (a local spill file) and
//! [`RemoteSpillLocation`](crate::RemoteSpillLocation) (a remote object) are each an extent
//! plus a counted handle on the file that holds it; they dereference to their extent, so
//! `location.offset()`, `location.buffer_lens()` and friends work on both.

use std::sync::Arc;

use crossbeam_channel::Receiver;

use crate::error::{Result, SpillError};
use crate::format::{head_len, object_len};

/// Where one spilled object sits in its spill file or remote object, and the lengths of its
/// buffers.
#[derive(Debug, Clone)]
pub struct ObjectExtent {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) object_id: u64,
    pub(crate) buffer_lens: Arc<[u64]>,
}

impl ObjectExtent {
    pub(crate) fn new(offset: u64, object_id: u64, buffer_lens: Arc<[u64]>) -> Self {
        Self {
            offset,
            len: object_len(&buffer_lens),
            object_id,
            buffer_lens,
        }
    }
    /// Offset of the object's header (a multiple of 64).
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Bytes the object occupies (header, length table, buffers, padding).
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True for an object without buffers.
    pub fn is_empty(&self) -> bool {
        self.buffer_lens.is_empty()
    }
    /// The caller's id of the object.
    pub fn object_id(&self) -> u64 {
        self.object_id
    }
    pub fn buffer_lens(&self) -> &[u64] {
        &self.buffer_lens
    }
    /// Sum of the buffer lengths.
    pub fn payload_len(&self) -> u64 {
        self.buffer_lens.iter().sum()
    }
    /// Bytes from the header to the first buffer (header, length table, padding).
    pub(crate) fn head_len(&self) -> u64 {
        head_len(self.buffer_lens.len())
    }
    /// Where the object ends.
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A spill round submitted to a spill target's I/O threads: wait for its locations.
pub struct PendingRound<L> {
    pub(crate) reply: Receiver<Result<Vec<L>>>,
}

impl<L> PendingRound<L> {
    /// Wait for the round: one location per object, in order, or the error that stopped it
    /// (then nothing of the round remains: a partial file is removed, a multipart upload
    /// aborted).
    pub fn wait(self) -> Result<Vec<L>> {
        self.reply.recv().map_err(|_| SpillError::Closed)?
    }
}
