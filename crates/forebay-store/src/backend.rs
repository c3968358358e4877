//! The two ways a handle reaches the object table: the owner's core in this process, or a
//! client of the owner's socket.

use std::path::Path;
use std::sync::Arc;

use crate::arena::Arena;
use crate::client::ClientCore;
use crate::error::Result;
use crate::layout::{Format, ObjectId};
use crate::owner::{Creator, OwnerCore};

/// Owner or attached: the two ways a handle reaches the object table.
#[derive(Clone)]
pub(crate) enum Backend {
    Owner(Arc<OwnerCore>),
    Client(Arc<ClientCore>),
}

impl Backend {
    pub(crate) fn arena(&self) -> &Arc<Arena> {
        match self {
            Backend::Owner(c) => c.arena(),
            Backend::Client(c) => c.arena(),
        }
    }
    pub(crate) fn dir(&self) -> &Path {
        match self {
            Backend::Owner(c) => c.dir(),
            Backend::Client(c) => c.dir(),
        }
    }
    pub(crate) fn create(
        &self,
        format: Format,
        meta_len: usize,
        data_len: usize,
    ) -> Result<(ObjectId, usize)> {
        match self {
            Backend::Owner(c) => c.create(format, meta_len, data_len, Creator::Local),
            Backend::Client(c) => c.create(format, meta_len, data_len),
        }
    }
    pub(crate) fn seal(&self, id: ObjectId) -> Result<()> {
        match self {
            Backend::Owner(c) => c.seal(id, Creator::Local),
            Backend::Client(c) => c.seal(id),
        }
    }
    pub(crate) fn abort(&self, id: ObjectId) {
        match self {
            Backend::Owner(c) => c.abort(id, Creator::Local),
            Backend::Client(c) => c.abort(id),
        }
    }
    pub(crate) fn pin(&self, id: ObjectId) -> Result<usize> {
        match self {
            Backend::Owner(c) => c.pin(id),
            Backend::Client(c) => c.pin(id),
        }
    }
    pub(crate) fn unpin(&self, id: ObjectId) {
        match self {
            Backend::Owner(c) => c.unpin(id),
            Backend::Client(c) => c.unpin(id),
        }
    }
}
