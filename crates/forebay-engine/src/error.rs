//! The engine's one error type. Every variant names the stage (and, where there is one, the
//! batch or file) so that a failed run says where it failed and why.

use std::fmt;

/// Result alias used throughout `forebay-engine`.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// An error raised by a user's function, kept as the original value so that bindings can
/// re-raise it unchanged (a Python exception with its traceback, for example).
pub type UserError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Which batch a stage was working on: enough for a person to find the rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchLabel(pub String);

impl fmt::Display for BatchLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Errors of a pipeline run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// Reading the input failed (the message names the file).
    #[error("stage 'read_parquet': {0}")]
    Source(#[from] forebay_parquet::ParquetError),

    /// The user's function raised. `error` is the original error value.
    #[error("stage '{stage}': the function failed on {batch}: {error}")]
    UserFunction {
        stage: String,
        batch: BatchLabel,
        error: UserError,
    },

    /// The user's function returned something that is not a usable batch (wrong type, a
    /// batch missing a column the pipeline needs, ...).
    #[error("stage '{stage}': {reason} (on {batch})")]
    BadOutput {
        stage: String,
        batch: BatchLabel,
        reason: String,
    },

    /// A worker process died while running a batch (and no retry was left).
    #[error(
        "stage '{stage}': worker process {pid} died while processing {batch} ({how}){retries}"
    )]
    WorkerDied {
        stage: String,
        batch: BatchLabel,
        pid: u32,
        how: String,
        /// Empty, or a note on the retries that were made.
        retries: String,
    },

    /// A stage's function failed on more rows than its `max_errored_rows` allows.
    #[error(
        "stage '{stage}': the function failed on {errored} rows, more than the {limit} \
         allowed (max_errored_rows); the last: {last}"
    )]
    TooManyErroredRows {
        stage: String,
        errored: u64,
        limit: u64,
        /// The last errored row: where it came from, and its error.
        last: String,
    },

    /// A worker process could not be started or spoke nonsense.
    #[error("stage '{stage}': worker process: {reason}")]
    Worker { stage: String, reason: String },

    /// Writing output failed (the message names the file). `source`: the storage error
    /// underneath, when there is one (a [`forebay_io::DirError`], whose own source is the
    /// I/O or object-store error).
    #[error("stage '{stage}': {path}: {reason}")]
    Write {
        stage: String,
        path: String,
        reason: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },

    /// Something that must be held in memory cannot fit under the memory limit.
    #[error(
        "{what} needs {needed} bytes, more than the memory limit of {limit} bytes allows; {advice}"
    )]
    MemoryLimit {
        what: String,
        needed: u64,
        limit: u64,
        advice: String,
    },

    /// The object store that exchanges and holds batches failed.
    #[error("stage '{stage}': object store: {source}")]
    Store {
        stage: String,
        #[source]
        source: Box<forebay_store::StoreError>,
    },

    /// The checkpoint filter failed.
    #[error("stage '{stage}': {source}")]
    Checkpoint {
        stage: String,
        #[source]
        source: Box<forebay_checkpoint::CheckpointError>,
    },

    /// The run was cancelled (Ctrl-C, the consumer went away, or another stage failed).
    #[error("the pipeline was cancelled")]
    Cancelled,

    /// A configuration value is not usable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The blocking task an async call ran on panicked, or its runtime shut down.
    #[error("{what}: the blocking task did not finish: {reason}")]
    Task { what: String, reason: String },
}

impl EngineError {
    /// The stage the error happened in, when there is one.
    pub fn stage(&self) -> Option<&str> {
        match self {
            EngineError::Source(_) => Some("read_parquet"),
            EngineError::UserFunction { stage, .. }
            | EngineError::BadOutput { stage, .. }
            | EngineError::WorkerDied { stage, .. }
            | EngineError::Worker { stage, .. }
            | EngineError::TooManyErroredRows { stage, .. }
            | EngineError::Write { stage, .. }
            | EngineError::Store { stage, .. }
            | EngineError::Checkpoint { stage, .. } => Some(stage),
            _ => None,
        }
    }

    /// An error of the run's object store. A full store under a small memory limit is the
    /// limit's doing: it says which limit would do (the store gets a quarter of it).
    pub(crate) fn store(stage: &str, source: forebay_store::StoreError) -> Self {
        let in_use = match &source {
            forebay_store::StoreError::Full {
                requested,
                free,
                capacity,
                ..
            } => Some((capacity.saturating_sub(*free) + requested, *capacity)),
            // One batch larger than the whole store.
            forebay_store::StoreError::TooLarge {
                requested,
                capacity,
                ..
            } => Some((*requested, *capacity)),
            _ => None,
        };
        if let Some((needed, capacity)) = in_use {
            // Twice what was in use at once, as the store's quarter of the limit, in MiB.
            let suggested_mib = (needed * 2 * 4).div_ceil(1 << 20).max(1);
            return EngineError::MemoryLimit {
                what: format!(
                    "stage '{stage}': the run's shared-memory object store (worker processes \
                     exchange batches through it; it gets a quarter of the memory limit, \
                     {capacity} bytes here)"
                ),
                needed,
                limit: capacity * 4,
                advice: format!(
                    "raise forebay.configure(memory_limit=...) to about {suggested_mib} MiB or \
                     more, use smaller batches (batch_size), or fewer workers (concurrency)"
                ),
            };
        }
        EngineError::Store {
            stage: stage.to_string(),
            source: Box::new(source),
        }
    }

    pub(crate) fn write(stage: &str, path: impl Into<String>, reason: impl fmt::Display) -> Self {
        EngineError::Write {
            stage: stage.to_string(),
            path: path.into(),
            reason: reason.to_string(),
            source: None,
        }
    }

    /// A storage operation of `stage` failed: [`Write`](Self::Write) naming the file, with
    /// the storage error as its source.
    pub(crate) fn storage(stage: &str, error: forebay_io::DirError) -> Self {
        EngineError::Write {
            stage: stage.to_string(),
            path: error.path().to_string(),
            reason: error.reason(),
            source: Some(Box::new(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A storage failure keeps its chain: the engine's error names the file and stage, its
    /// source is the directory error, whose source is the I/O error.
    #[test]
    fn a_storage_error_keeps_its_source_chain() {
        let file = tempfile::NamedTempFile::new().unwrap();
        // A directory inside a regular file cannot be created.
        let dir = forebay_io::Dir::open(
            &file.path().join("out").display().to_string(),
            &Default::default(),
        )
        .unwrap();
        let err = EngineError::storage("write_parquet", dir.create().unwrap_err());
        assert!(err.to_string().contains("write_parquet"), "{err}");
        let dir_error = std::error::Error::source(&err).expect("the storage error");
        assert!(dir_error.downcast_ref::<forebay_io::DirError>().is_some());
        let io = dir_error.source().expect("the I/O error");
        assert!(io.downcast_ref::<std::io::Error>().is_some(), "{io:?}");
    }
}
