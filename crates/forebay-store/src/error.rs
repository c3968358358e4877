//! The store's one error type. Messages name the store directory and the object and say
//! what to do about it.

use std::path::PathBuf;

use crate::ObjectId;

/// Errors of the object store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("object store {path}: {context}: {source}")]
    Io {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "object store {path} is full: {requested} bytes requested, {free} of {capacity} free and \
         nothing more could be evicted within {waited_ms} ms (every resident object is pinned, \
         or spilling is off); release views of objects, delete objects or create the store \
         with a larger capacity"
    )]
    Full {
        path: PathBuf,
        requested: u64,
        free: u64,
        capacity: u64,
        waited_ms: u64,
    },

    #[error(
        "object of {requested} bytes does not fit in object store {path} of capacity {capacity} \
         bytes; create the store with a larger capacity"
    )]
    TooLarge {
        path: PathBuf,
        requested: u64,
        capacity: u64,
    },

    #[error(
        "object {id} is not in object store {path} (never put, deleted, or from another store)"
    )]
    NotFound { path: PathBuf, id: ObjectId },

    #[error("object {id} in object store {path} is still being written; seal it first")]
    NotSealed { path: PathBuf, id: ObjectId },

    #[error(
        "refusing to attach to object store {path}: it is owned by uid {owner} (we are uid \
         {ours}) or readable by others (mode {mode:o}); a store is private to its user"
    )]
    ForeignOwner {
        path: PathBuf,
        owner: u32,
        ours: u32,
        mode: u32,
    },

    #[error("object store {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },

    #[error(
        "object store {path}: the owner process is gone or closed the store ({reason}); objects \
         already held stay readable, new requests cannot be served"
    )]
    OwnerGone { path: PathBuf, reason: String },

    /// An error the owner reported to an attached process (its message says it all).
    #[error("{message}")]
    Remote { kind: ErrorKind, message: String },

    #[error("object {id} in object store {path}: Arrow IPC: {source}")]
    Arrow {
        path: PathBuf,
        id: ObjectId,
        #[source]
        source: arrow_schema::ArrowError,
    },

    #[error("object {id} in object store {path}: spill: {source}")]
    Spill {
        path: PathBuf,
        id: ObjectId,
        #[source]
        source: Box<forebay_spill::SpillError>,
    },
}

/// The broad kind of an error, for callers (and the Python bindings) that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum ErrorKind {
    NotFound = 1,
    NotSealed = 2,
    /// No room within the timeout (every resident object pinned).
    Full = 3,
    /// Larger than the store's capacity.
    TooLarge = 4,
    Other = 5,
}

impl StoreError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::NotFound { .. } => ErrorKind::NotFound,
            StoreError::NotSealed { .. } => ErrorKind::NotSealed,
            StoreError::Full { .. } => ErrorKind::Full,
            StoreError::TooLarge { .. } => ErrorKind::TooLarge,
            StoreError::Remote { kind, .. } => *kind,
            _ => ErrorKind::Other,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
