//! The one error type of this crate. Every variant names the spill file and, for restores,
//! the object's offset in it; the Python layer raises them as `forebay.SpillError`.

use std::path::PathBuf;

/// Result alias used throughout `forebay-spill`.
pub type Result<T, E = SpillError> = std::result::Result<T, E>;

/// Errors from writing, restoring and managing spill files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpillError {
    /// A write, sync, create or read failed (ENOSPC, EIO, EFBIG, permissions...). Nothing
    /// was registered: a failed spill returns no locations and removes its partial file.
    #[error("{}: {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The object at `offset` does not match what was written: bad magic or header checksum,
    /// lengths that disagree with the location, or a payload checksum mismatch.
    #[error("{}: corrupt spilled object at offset {offset}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },

    /// The file ends before the object at `offset` does.
    #[error("{}: spill file truncated: object at offset {offset} needs {needed} bytes, the file ends first", path.display())]
    Truncated {
        path: PathBuf,
        offset: u64,
        needed: u64,
    },

    /// The caller's destination buffers do not have the object's buffer sizes.
    #[error("restore of the object at {}:{offset}: {reason}", path.display())]
    DestinationMismatch {
        path: PathBuf,
        offset: u64,
        reason: String,
    },

    /// A request to a remote spill target failed (network, credentials, permissions, a
    /// missing object, ...). A failed round leaves nothing behind (multipart uploads are
    /// aborted) and returns no locations.
    #[error("{uri}: {action}: {}", forebay_io::store_errors::explain(source))]
    Remote {
        uri: String,
        action: String,
        #[source]
        source: object_store::Error,
    },

    /// The spill area was shut down, or its I/O threads are gone.
    #[error("spill area is closed")]
    Closed,

    /// A configuration value is not usable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}
