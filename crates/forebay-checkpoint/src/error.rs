//! The one error type of this crate. Every variant names the checkpoint path, file or column
//! involved; the Python layer raises all of them as `forebay.CheckpointError`.

/// Result alias used throughout `forebay-checkpoint`.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

/// Errors from loading, probing, inserting into and writing a checkpoint index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading checkpoint files failed (missing path, not Parquet, corrupt, unreachable).
    #[error("reading checkpoint ids (column '{column}') from {path}: {source}")]
    Read {
        path: String,
        column: String,
        #[source]
        source: Box<forebay_parquet::ParquetError>,
    },

    /// The id column is absent from a checkpoint file or from a batch being filtered.
    #[error("{path}: id column '{column}' not found; available columns: {available}")]
    ColumnNotFound {
        path: String,
        column: String,
        available: String,
    },

    /// The id column's type cannot be used as an id.
    #[error("{path}: id column '{column}' has type {data_type}, which cannot be an id; use a string, binary, fixed-size binary or integer column (or a dictionary of those)")]
    UnsupportedIdType {
        path: String,
        column: String,
        data_type: String,
    },

    /// Ids of one family (strings/binary vs integers) were probed against, inserted into or
    /// merged with an index of the other family.
    #[error("{what}: ids of type {found} cannot be used with a checkpoint of {expected} ids")]
    IdTypeMismatch {
        what: String,
        expected: String,
        found: String,
    },

    /// A probe hit a shard this index did not load (it belongs to another worker).
    #[error(
        "id belongs to shard {shard}, which this index did not load (it loaded shards {loaded})"
    )]
    ShardNotLoaded { shard: usize, loaded: String },

    /// A file in `shard=<k>/` holds ids that hash to another shard: it was written with a
    /// different shard count or hash, or was moved.
    #[error("{path}: file in shard={declared} holds an id of shard {actual}; the checkpoint's layout does not match its manifest (num_shards {num_shards})")]
    ShardMismatch {
        path: String,
        declared: usize,
        actual: usize,
        num_shards: usize,
    },

    /// The checkpoint's manifest (`_forebay_checkpoint`) is unreadable or disagrees with the
    /// index being written into it.
    #[error("{path}: {reason}")]
    Manifest { path: String, reason: String },

    /// A local file system operation failed while writing or cleaning up.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// An object store request failed while writing to a remote checkpoint.
    #[error("{path}: {}", forebay_io::store_errors::explain(source))]
    Store {
        path: String,
        #[source]
        source: Box<object_store::Error>,
    },

    /// Encoding a checkpoint Parquet file or an Arrow kernel failed.
    #[error("{what}: {reason}")]
    Encode { what: String, reason: String },

    /// A shard would exceed the per-shard capacity; use more shards.
    #[error("shard {shard} would hold {ids} ids, more than {max} per shard; use more shards (num_shards)")]
    ShardTooLarge { shard: usize, ids: u64, max: u64 },

    /// The input stream being filtered failed (its message names the file).
    #[error("input to filter: {0}")]
    Input(String),

    /// A configuration value is not usable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The blocking task an async call ran on (`load_async`, `write_async`) panicked or was
    /// cancelled with its runtime.
    #[error("{what}: {reason}")]
    Task { what: String, reason: String },
}

impl CheckpointError {
    /// The error of an async call whose blocking task did not finish.
    pub(crate) fn task(what: impl Into<String>, err: tokio::task::JoinError) -> Self {
        let reason = if err.is_panic() {
            let panic = err.into_panic();
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            format!("internal error: {message}")
        } else {
            "cancelled (its runtime shut down)".into()
        };
        CheckpointError::Task {
            what: what.into(),
            reason,
        }
    }
}
