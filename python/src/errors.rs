//! The exception hierarchy under `forebay.ForebayError`, the conversions from each
//! component's Rust error into it (an engine error carrying a user function's exception
//! becomes that exception again), and the two helpers that run Rust work with the GIL
//! released (a panic becomes a `ForebayError`, never an abort across FFI).

use std::panic::{catch_unwind, AssertUnwindSafe};

use forebay_checkpoint::CheckpointError as RsCheckpointError;
use forebay_parquet::{ErrorKind, ParquetError as RsParquetError};
use forebay_store::{ErrorKind as StoreErrorKind, StoreError as RsStoreError};
// The exceptions live in module `forebay` (their `__module__`), which re-exports every one:
// tracebacks name them as users import them, and they pickle by reference (a worker
// process's error reaches the parent as its own type).
use forebay_engine::process::RemoteError;
use forebay_engine::EngineError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

create_exception!(
    forebay,
    ForebayError,
    PyException,
    "Base class of every forebay error."
);
create_exception!(
    forebay,
    ParquetError,
    ForebayError,
    "Reading a Parquet dataset failed."
);
create_exception!(
    forebay,
    DatasetNotFoundError,
    ParquetError,
    "A path, URI or glob matched no file."
);
create_exception!(
    forebay,
    CorruptFileError,
    ParquetError,
    "Not a Parquet file, or corrupt/truncated data."
);
create_exception!(
    forebay,
    ColumnNotFoundError,
    ParquetError,
    "A requested or filtered column does not exist."
);
create_exception!(
    forebay,
    InvalidFilterError,
    ParquetError,
    "A filter is malformed or its value has the wrong type."
);
create_exception!(
    forebay,
    SchemaMismatchError,
    ParquetError,
    "Files of one dataset have different schemas."
);
create_exception!(
    forebay,
    StorageError,
    ParquetError,
    "An object store or file system request failed."
);

create_exception!(
    forebay,
    CheckpointError,
    ForebayError,
    "Loading, probing or writing a checkpoint failed."
);

create_exception!(
    forebay,
    SpillError,
    ForebayError,
    "Writing or restoring spilled objects failed (I/O error, corruption, truncation)."
);

create_exception!(
    forebay,
    StoreError,
    ForebayError,
    "An object store operation failed."
);
create_exception!(
    forebay,
    ObjectNotFoundError,
    StoreError,
    "No such object in the store (never put, deleted, or from another store)."
);
create_exception!(
    forebay,
    StoreFullError,
    StoreError,
    "The store has no room: everything resident is pinned, or the object exceeds the capacity."
);

pub(crate) fn store_err(e: RsStoreError) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        StoreErrorKind::NotFound => ObjectNotFoundError::new_err(msg),
        StoreErrorKind::Full | StoreErrorKind::TooLarge => StoreFullError::new_err(msg),
        _ => StoreError::new_err(msg),
    }
}

create_exception!(
    forebay,
    StageError,
    ForebayError,
    "A pipeline stage failed: its function returned something unusable, its worker could not start, or the object store failed."
);
create_exception!(
    forebay,
    WorkerDiedError,
    StageError,
    "A worker process died while running a batch (SIGKILL, a crash in native code), with no retry left."
);
create_exception!(
    forebay,
    WriteError,
    ForebayError,
    "Writing output failed (an unusable path, a full disk, a failed upload); no partial file is left."
);
create_exception!(
    forebay,
    MemoryLimitExceeded,
    ForebayError,
    "Something that must be held in memory does not fit under the memory limit."
);

pub(crate) fn spill_err(err: forebay_spill::SpillError) -> PyErr {
    SpillError::new_err(err.to_string())
}

pub(crate) fn checkpoint_err(err: RsCheckpointError) -> PyErr {
    CheckpointError::new_err(err.to_string())
}

pub(crate) fn checkpoint_err_message(message: String) -> PyErr {
    CheckpointError::new_err(message)
}

pub(crate) fn to_py_err(err: RsParquetError) -> PyErr {
    let msg = err.to_string();
    match err.kind() {
        ErrorKind::NotFound => DatasetNotFoundError::new_err(msg),
        ErrorKind::Corrupt => CorruptFileError::new_err(msg),
        ErrorKind::ColumnNotFound => ColumnNotFoundError::new_err(msg),
        ErrorKind::InvalidFilter => InvalidFilterError::new_err(msg),
        ErrorKind::SchemaMismatch => SchemaMismatchError::new_err(msg),
        ErrorKind::Io => StorageError::new_err(msg),
        // InvalidArgument, RowFilter, TooLarge, MemoryRefused, and kinds added later.
        _ => ParquetError::new_err(msg),
    }
}

/// Run Rust work with the GIL released, turning reader errors and panics into forebay
/// exceptions.
pub(crate) fn detached<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> Result<T, RsParquetError> + Send,
) -> PyResult<T> {
    detached_py(py, || work().map_err(to_py_err))
}

/// Run Rust work with the GIL released; a panic becomes a `ForebayError`, never an abort.
pub(crate) fn detached_py<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> PyResult<T> + Send,
) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(work))) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(ForebayError::new_err(format!(
                "internal error (please report): {what}"
            )))
        }
    }
}

/// Add the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ForebayError", py.get_type::<ForebayError>())?;
    m.add("ParquetError", py.get_type::<ParquetError>())?;
    m.add(
        "DatasetNotFoundError",
        py.get_type::<DatasetNotFoundError>(),
    )?;
    m.add("CorruptFileError", py.get_type::<CorruptFileError>())?;
    m.add("ColumnNotFoundError", py.get_type::<ColumnNotFoundError>())?;
    m.add("InvalidFilterError", py.get_type::<InvalidFilterError>())?;
    m.add("SchemaMismatchError", py.get_type::<SchemaMismatchError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    m.add("SpillError", py.get_type::<SpillError>())?;
    m.add("StoreError", py.get_type::<StoreError>())?;
    m.add("ObjectNotFoundError", py.get_type::<ObjectNotFoundError>())?;
    m.add("StoreFullError", py.get_type::<StoreFullError>())?;
    m.add("StageError", py.get_type::<StageError>())?;
    m.add("WorkerDiedError", py.get_type::<WorkerDiedError>())?;
    m.add("WriteError", py.get_type::<WriteError>())?;
    m.add("MemoryLimitExceeded", py.get_type::<MemoryLimitExceeded>())?;
    Ok(())
}

/// A Python exception raised by a user's function, carried through the engine unchanged.
#[derive(Debug)]
pub(crate) struct PyUserError(pub(crate) PyErr);

impl std::fmt::Display for PyUserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for PyUserError {}

/// Turn an engine error into the Python exception a user should see.
pub(crate) fn engine_err(py: Python<'_>, err: EngineError) -> PyErr {
    let message = err.to_string();
    match err {
        EngineError::UserFunction {
            stage,
            batch,
            error,
        } => {
            let note = format!("raised by the function of stage '{stage}' on {batch}");
            let error = match error.downcast::<PyUserError>() {
                Ok(py_error) => {
                    let exc = py_error.0;
                    let _ = exc.value(py).call_method1("add_note", (note,));
                    return exc;
                }
                Err(e) => e,
            };
            if let Some(remote) = error.downcast_ref::<RemoteError>() {
                let rebuilt = py
                    .import("forebay._udf")
                    .and_then(|m| {
                        m.call_method1(
                            "remote_exception",
                            (
                                remote.text.clone(),
                                pyo3::types::PyBytes::new(py, &remote.payload),
                                note,
                            ),
                        )
                    })
                    .map(|exc| PyErr::from_value(exc));
                return rebuilt.unwrap_or_else(|e| e);
            }
            StageError::new_err(message)
        }
        // The only row filter the bindings install is a checkpointed write's resume filter.
        EngineError::Source(e) if e.kind() == ErrorKind::RowFilter => {
            checkpoint_err_message(message)
        }
        EngineError::Source(e) => to_py_err(e),
        EngineError::WorkerDied { .. } => WorkerDiedError::new_err(message),
        EngineError::Write { .. } => WriteError::new_err(message),
        EngineError::MemoryLimit { .. } => MemoryLimitExceeded::new_err(message),
        EngineError::Checkpoint { stage, source } => {
            checkpoint_err_message(format!("stage '{stage}': {source}"))
        }
        EngineError::InvalidArgument(_) => PyValueError::new_err(message),
        EngineError::Cancelled => ForebayError::new_err("the pipeline was cancelled"),
        _ => StageError::new_err(message),
    }
}

/// A Python exception from a map call: a `StageError` the glue raised about the output
/// (wrong type, ...) or the user's own exception.
pub(crate) fn failure(err: PyErr) -> forebay_engine::StageFailure {
    Python::attach(|py| {
        if err.is_instance_of::<StageError>(py) {
            forebay_engine::StageFailure::BadOutput(err.value(py).to_string())
        } else {
            forebay_engine::StageFailure::User(Box::new(PyUserError(err)))
        }
    })
}
