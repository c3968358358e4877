//! What can go wrong in a [`Dir`](super::Dir), and on which file or directory.

use crate::location::LocationError;

/// What went wrong, and on which file or directory (a local path or a URI).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirError {
    /// A local file system operation failed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// An object-store request failed.
    #[error("{path}: {}", crate::store_errors::explain(source))]
    Store {
        path: String,
        #[source]
        source: object_store::Error,
    },
    /// The directory's path or URI cannot be opened.
    #[error("{path}: {source}")]
    Location {
        path: String,
        #[source]
        source: LocationError,
    },
}

impl DirError {
    /// The file or directory the error is about.
    pub fn path(&self) -> &str {
        match self {
            DirError::Io { path, .. }
            | DirError::Store { path, .. }
            | DirError::Location { path, .. } => path,
        }
    }

    /// What went wrong, without the path.
    pub fn reason(&self) -> String {
        match self {
            DirError::Io { source, .. } => source.to_string(),
            DirError::Store { source, .. } => source.to_string(),
            DirError::Location { source, .. } => source.to_string(),
        }
    }
}

pub type DirResult<T> = std::result::Result<T, DirError>;
