//! pyo3 glue for the `forebay` Python package: argument conversion, the exception
//! hierarchy, zero-copy hand-off of Arrow data, and releasing the GIL around Rust work.
//! No engine logic lives here; the Python-facing API is shaped in `forebay/__init__.py`.

mod remote_spill;
mod store;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use arrow::array::{make_array, Array, ArrayData, RecordBatch};
use arrow::datatypes::DataType;
use arrow::ffi_stream::FFI_ArrowArrayStream;
use arrow_pyarrow::{FromPyArrow, ToPyArrow};
use forebay_checkpoint::{
    filter_in_parallel, CheckpointError as RsCheckpointError, CheckpointIndex, FilteredBatches,
    SharedCheckpointIndex,
};
use forebay_parquet::{
    CompareOp, DatasetSource, ErrorKind, Literal, ParquetDataset, ParquetError as RsParquetError,
    Predicate, ProvenancedBatch, RecordBatchIter, ScanStream,
};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

create_exception!(
    _forebay,
    ForebayError,
    PyException,
    "Base class of every forebay error."
);
create_exception!(
    _forebay,
    ParquetError,
    ForebayError,
    "Reading a Parquet dataset failed."
);
create_exception!(
    _forebay,
    DatasetNotFoundError,
    ParquetError,
    "A path, URI or glob matched no file."
);
create_exception!(
    _forebay,
    CorruptFileError,
    ParquetError,
    "Not a Parquet file, or corrupt/truncated data."
);
create_exception!(
    _forebay,
    ColumnNotFoundError,
    ParquetError,
    "A requested or filtered column does not exist."
);
create_exception!(
    _forebay,
    InvalidFilterError,
    ParquetError,
    "A filter is malformed or its value has the wrong type."
);
create_exception!(
    _forebay,
    SchemaMismatchError,
    ParquetError,
    "Files of one dataset have different schemas."
);
create_exception!(
    _forebay,
    StorageError,
    ParquetError,
    "An object store or file system request failed."
);

create_exception!(
    _forebay,
    CheckpointError,
    ForebayError,
    "Loading, probing or writing a checkpoint failed."
);

create_exception!(
    _forebay,
    SpillError,
    ForebayError,
    "Writing or restoring spilled objects failed (I/O error, corruption, truncation)."
);

pub(crate) fn spill_err(err: forebay_spill::SpillError) -> PyErr {
    SpillError::new_err(err.to_string())
}

fn checkpoint_err(err: RsCheckpointError) -> PyErr {
    CheckpointError::new_err(err.to_string())
}

fn to_py_err(err: RsParquetError) -> PyErr {
    let msg = err.to_string();
    match err.kind() {
        ErrorKind::NotFound => DatasetNotFoundError::new_err(msg),
        ErrorKind::Corrupt => CorruptFileError::new_err(msg),
        ErrorKind::ColumnNotFound => ColumnNotFoundError::new_err(msg),
        ErrorKind::InvalidFilter => InvalidFilterError::new_err(msg),
        ErrorKind::SchemaMismatch => SchemaMismatchError::new_err(msg),
        ErrorKind::Io => StorageError::new_err(msg),
        ErrorKind::InvalidArgument => ParquetError::new_err(msg),
    }
}

/// Run Rust work with the GIL released, turning reader errors and panics into forebay
/// exceptions.
fn detached<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> Result<T, RsParquetError> + Send,
) -> PyResult<T> {
    detached_py(py, || work().map_err(to_py_err))
}

/// Run Rust work with the GIL released; a panic becomes a `ForebayError`, never an abort.
fn detached_py<T: Send>(py: Python<'_>, work: impl FnOnce() -> PyResult<T> + Send) -> PyResult<T> {
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

/// A literal from the tagged tuple built by `forebay._filters` (`("int", 5)`, ...).
fn literal_from_tagged(value: &Bound<'_, PyAny>) -> PyResult<Literal> {
    let tuple = value.cast::<PyTuple>()?;
    let tag: String = tuple.get_item(0)?.extract()?;
    let item = |i: usize| tuple.get_item(i);
    Ok(match tag.as_str() {
        "bool" => Literal::Bool(item(1)?.extract()?),
        "int" => match item(1)?.extract::<i64>() {
            Ok(v) => Literal::Int(v),
            Err(_) => Literal::UInt(item(1)?.extract()?),
        },
        "float" => Literal::Float(item(1)?.extract()?),
        "str" => Literal::Str(item(1)?.extract()?),
        "bytes" => Literal::Bytes(item(1)?.extract()?),
        "date" => Literal::Date(item(1)?.extract()?),
        "timestamp" => Literal::Timestamp {
            micros: item(1)?.extract()?,
            tz: item(2)?.extract()?,
        },
        "decimal" => Literal::Decimal(item(1)?.extract()?),
        "null" => Literal::Null,
        other => {
            return Err(InvalidFilterError::new_err(format!(
                "unknown literal tag {other}"
            )))
        }
    })
}

/// A predicate from the normalised form built in Python: an OR of ANDs of
/// `(column, op, tagged_value_or_list_or_None)`.
fn predicate_from_dnf(dnf: &Bound<'_, PyAny>) -> PyResult<Predicate> {
    let mut disjuncts = Vec::new();
    for conj in dnf.try_iter()? {
        let mut terms = Vec::new();
        for term in conj?.try_iter()? {
            let term = term?;
            let column: String = term.get_item(0)?.extract()?;
            let op: String = term.get_item(1)?.extract()?;
            let value = term.get_item(2)?;
            let pred = match op.as_str() {
                "in" | "not in" => {
                    let values = value
                        .try_iter()?
                        .map(|v| literal_from_tagged(&v?))
                        .collect::<PyResult<Vec<_>>>()?;
                    Predicate::In {
                        column,
                        values,
                        negated: op == "not in",
                    }
                }
                "is null" => Predicate::IsNull {
                    column,
                    negated: false,
                },
                "is not null" => Predicate::IsNull {
                    column,
                    negated: true,
                },
                _ => {
                    let op = CompareOp::parse(&op).ok_or_else(|| {
                        InvalidFilterError::new_err(format!("unknown filter operator {op:?}"))
                    })?;
                    Predicate::Compare {
                        column,
                        op,
                        value: literal_from_tagged(&value)?,
                    }
                }
            };
            terms.push(pred);
        }
        disjuncts.push(if terms.len() == 1 {
            terms.pop().expect("one")
        } else {
            Predicate::And(terms)
        });
    }
    Ok(if disjuncts.len() == 1 {
        disjuncts.pop().expect("one")
    } else {
        Predicate::Or(disjuncts)
    })
}

/// A lazily read Parquet dataset (the Rust half of `forebay.Dataset`).
#[pyclass(module = "forebay._forebay", frozen)]
struct RsDataset {
    dataset: ParquetDataset,
}

#[pymethods]
impl RsDataset {
    #[new]
    #[pyo3(signature = (paths, columns, filter, batch_size, prefetch, num_threads, dictionary_columns, storage_options))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        paths: Vec<String>,
        columns: Option<Vec<String>>,
        filter: Option<Bound<'_, PyAny>>,
        batch_size: usize,
        prefetch: Option<usize>,
        num_threads: Option<usize>,
        dictionary_columns: Option<Vec<String>>,
        storage_options: Option<HashMap<String, String>>,
    ) -> PyResult<Self> {
        let source = DatasetSource::Uris {
            uris: paths,
            storage_options: storage_options.unwrap_or_default(),
        };
        let mut builder = ParquetDataset::builder(source).with_batch_size(batch_size);
        if let Some(columns) = columns {
            builder = builder.with_columns(columns);
        }
        if let Some(filter) = filter {
            builder = builder.with_filter(predicate_from_dnf(&filter)?);
        }
        if let Some(p) = prefetch {
            builder = builder.with_prefetch(p);
        }
        if let Some(n) = num_threads {
            builder = builder.with_num_threads(n);
        }
        if let Some(d) = dictionary_columns {
            builder = builder.with_dictionary_columns(d);
        }
        let dataset = detached(py, move || builder.build())?;
        Ok(RsDataset { dataset })
    }

    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.dataset.schema().as_ref().to_pyarrow(py)
    }

    fn files(&self) -> Vec<String> {
        self.dataset
            .files()
            .iter()
            .map(|f| f.uri().to_string())
            .collect()
    }

    fn count_rows(&self, py: Python<'_>) -> PyResult<u64> {
        let dataset = self.dataset.clone();
        detached(py, move || dataset.count_rows())
    }

    fn scan(&self) -> RsBatchIter {
        RsBatchIter {
            stream: std::sync::Mutex::new(Some(self.dataset.scan())),
        }
    }

    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.dataset.metrics();
        let d = PyDict::new(py);
        d.set_item("row_groups_total", m.row_groups_total)?;
        d.set_item(
            "row_groups_pruned_by_statistics",
            m.row_groups_pruned_by_statistics,
        )?;
        d.set_item(
            "row_groups_pruned_by_page_index",
            m.row_groups_pruned_by_page_index,
        )?;
        d.set_item("rows_pruned_by_page_index", m.rows_pruned_by_page_index)?;
        d.set_item("data_requests", m.io.data_requests)?;
        d.set_item("data_bytes", m.io.data_bytes)?;
        d.set_item("footer_requests", m.io.footer_requests)?;
        d.set_item("footer_bytes", m.io.footer_bytes)?;
        d.set_item("list_requests", m.io.list_requests)?;
        d.set_item("head_requests", m.io.head_requests)?;
        Ok(d)
    }

    /// Export a fresh scan through the Arrow C stream interface (PyCapsule protocol).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The requested schema is a hint the producer may ignore (see the Arrow spec); we
        // always produce the dataset's own schema.
        let _ = requested_schema;
        let stream = FFI_ArrowArrayStream::new(Box::new(RecordBatchIter(self.dataset.scan())));
        // The consumer moves the stream out and nulls its `release`; whatever is left is
        // released when the capsule is dropped (FFI_ArrowArrayStream's Drop).
        PyCapsule::new_with_value(py, stream, c"arrow_array_stream")
    }
}

/// An in-progress scan (the Rust half of iterating a `forebay.Dataset`).
#[pyclass(module = "forebay._forebay")]
struct RsBatchIter {
    stream: std::sync::Mutex<Option<ScanStream>>,
}

impl RsBatchIter {
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<ProvenancedBatch>> {
        let mut guard = self
            .stream
            .lock()
            .map_err(|_| ForebayError::new_err("scan state poisoned"))?;
        let Some(stream) = guard.as_mut() else {
            return Ok(None);
        };
        let next = detached(py, || stream.next_blocking().transpose())?;
        if next.is_none() {
            *guard = None;
        }
        Ok(next)
    }
}

#[pymethods]
impl RsBatchIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.next_batch(py)? {
            Some(b) => Ok(Some(b.batch.to_pyarrow(py)?)),
            None => Ok(None),
        }
    }

    /// `(pyarrow.RecordBatch, provenance dict)` or None at the end.
    fn next_with_provenance<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyDict>)>> {
        let Some(b) = self.next_batch(py)? else {
            return Ok(None);
        };
        let p = &b.provenance;
        let d = PyDict::new(py);
        d.set_item("file", p.file.as_ref())?;
        d.set_item("file_index", p.file_index)?;
        d.set_item("row_group", p.row_group)?;
        d.set_item("row_group_first_row", p.row_group_first_row)?;
        d.set_item("first_row", p.first_row)?;
        d.set_item("batch_index", p.batch_index)?;
        Ok(Some((b.batch.to_pyarrow(py)?, d)))
    }

    /// Stop the scan now (also happens when the iterator is garbage collected).
    fn close(&self) {
        if let Ok(mut guard) = self.stream.lock() {
            *guard = None;
        }
    }
}

/// A checkpoint index (the Rust half of `forebay.CheckpointFilter`). Probes share a read
/// lock, so many Python threads can filter at once; inserts and writes take the write lock.
#[pyclass(module = "forebay._forebay", frozen)]
struct RsCheckpointIndex {
    index: SharedCheckpointIndex,
}

fn array_from_py(obj: &Bound<'_, PyAny>) -> PyResult<arrow::array::ArrayRef> {
    Ok(make_array(ArrayData::from_pyarrow_bound(obj)?))
}

impl RsCheckpointIndex {
    fn read(&self) -> PyResult<std::sync::RwLockReadGuard<'_, CheckpointIndex>> {
        self.index
            .read()
            .map_err(|_| CheckpointError::new_err("checkpoint index poisoned by an earlier panic"))
    }
    fn write_lock(&self) -> PyResult<std::sync::RwLockWriteGuard<'_, CheckpointIndex>> {
        self.index
            .write()
            .map_err(|_| CheckpointError::new_err("checkpoint index poisoned by an earlier panic"))
    }
}

#[pymethods]
impl RsCheckpointIndex {
    #[new]
    #[pyo3(signature = (id_type, num_shards, id_column, num_threads=None))]
    fn new(
        id_type: &Bound<'_, PyAny>,
        num_shards: usize,
        id_column: String,
        num_threads: Option<usize>,
    ) -> PyResult<Self> {
        let id_type = DataType::from_pyarrow_bound(id_type)?;
        let mut index =
            CheckpointIndex::new(id_type, id_column, num_shards).map_err(checkpoint_err)?;
        if let Some(n) = num_threads {
            index = index.with_threads(n);
        }
        Ok(RsCheckpointIndex {
            index: std::sync::Arc::new(std::sync::RwLock::new(index)),
        })
    }

    #[staticmethod]
    #[pyo3(signature = (path, id_column, num_shards=None, shards=None, storage_options=None, num_threads=None))]
    fn load(
        py: Python<'_>,
        path: String,
        id_column: String,
        num_shards: Option<usize>,
        shards: Option<Vec<usize>>,
        storage_options: Option<HashMap<String, String>>,
        num_threads: Option<usize>,
    ) -> PyResult<Self> {
        let mut loader = CheckpointIndex::loader(path, id_column)
            .with_storage_options(storage_options.unwrap_or_default());
        if let Some(n) = num_shards {
            loader = loader.with_num_shards(n);
        }
        if let Some(s) = shards {
            loader = loader.with_shards(s);
        }
        if let Some(n) = num_threads {
            loader = loader.with_threads(n);
        }
        let index = detached_py(py, move || loader.load().map_err(checkpoint_err))?;
        Ok(RsCheckpointIndex {
            index: std::sync::Arc::new(std::sync::RwLock::new(index)),
        })
    }

    fn insert(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let ids = array_from_py(ids)?;
        // Locks are taken with the GIL released, so a thread waiting for the lock never
        // holds the GIL that the lock's holder needs to return.
        detached_py(py, || {
            self.write_lock()?
                .insert(ids.as_ref())
                .map_err(checkpoint_err)
        })
    }

    fn contains<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = array_from_py(ids)?;
        let hits = detached_py(py, || {
            self.read()?.contains(ids.as_ref()).map_err(checkpoint_err)
        })?;
        hits.to_data().to_pyarrow(py)
    }

    /// Filter one batch; None when no row was removed (the caller keeps its input).
    fn filter_batch<'py>(
        &self,
        py: Python<'py>,
        batch: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let batch = RecordBatch::from_pyarrow_bound(batch)?;
        let out = detached_py(py, || {
            self.read()?
                .filter_or_unchanged(&batch)
                .map_err(checkpoint_err)
        })?;
        out.map(|b| b.to_pyarrow(py)).transpose()
    }

    /// Filter a dataset's scan on several threads, in scan order.
    #[pyo3(signature = (dataset, num_threads=None))]
    fn filter_scan(
        &self,
        dataset: &RsDataset,
        num_threads: Option<usize>,
    ) -> PyResult<RsFilteredIter> {
        let threads = match num_threads {
            Some(n) => n,
            None => self.read()?.threads(),
        };
        let input = dataset.dataset.scan().map(|item| item.map(|b| b.batch));
        Ok(RsFilteredIter {
            batches: std::sync::Mutex::new(Some(filter_in_parallel(
                self.index.clone(),
                input,
                threads,
            ))),
        })
    }

    /// Filter many batches in parallel; None for each batch left unchanged.
    fn filter_batches<'py>(
        &self,
        py: Python<'py>,
        batches: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let batches = batches
            .iter()
            .map(RecordBatch::from_pyarrow_bound)
            .collect::<PyResult<Vec<_>>>()?;
        let out = detached_py(py, || {
            self.read()?.filter_many(&batches).map_err(checkpoint_err)
        })?;
        out.into_iter()
            .map(|b| b.map(|b| b.to_pyarrow(py)).transpose())
            .collect()
    }

    fn merge(&self, py: Python<'_>, other: &RsCheckpointIndex) -> PyResult<()> {
        if std::ptr::eq(self, other) {
            return Ok(()); // merging an index into itself changes nothing
        }
        detached_py(py, || {
            // Lock in address order so `a.merge(b)` and `b.merge(a)` cannot deadlock.
            if (self as *const Self) < (other as *const Self) {
                let mut ours = self.write_lock()?;
                let theirs = other.read()?;
                ours.merge(&theirs).map_err(checkpoint_err)
            } else {
                let theirs = other.read()?;
                let mut ours = self.write_lock()?;
                ours.merge(&theirs).map_err(checkpoint_err)
            }
        })
    }

    #[pyo3(signature = (path, storage_options=None))]
    fn write<'py>(
        &self,
        py: Python<'py>,
        path: String,
        storage_options: Option<HashMap<String, String>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let options = storage_options.unwrap_or_default();
        let summary = detached_py(py, || {
            self.write_lock()?
                .write(&path, &options)
                .map_err(checkpoint_err)
        })?;
        let d = PyDict::new(py);
        d.set_item("files", summary.files)?;
        d.set_item("ids", summary.ids)?;
        Ok(d)
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.read()?.len())
    }

    fn memory_bytes(&self) -> PyResult<usize> {
        Ok(self.read()?.memory_bytes())
    }

    fn num_shards(&self) -> PyResult<usize> {
        Ok(self.read()?.num_shards())
    }

    fn loaded_shards(&self) -> PyResult<Vec<usize>> {
        Ok(self.read()?.loaded_shards())
    }

    fn pending_ids(&self) -> PyResult<usize> {
        Ok(self.read()?.pending_ids())
    }

    fn id_column(&self) -> PyResult<String> {
        Ok(self.read()?.id_column().to_string())
    }

    fn id_type<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.read()?.id_type().to_pyarrow(py)
    }

    fn shard_ids<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = array_from_py(ids)?;
        let shards = detached_py(py, || {
            self.read()?.shard_ids(ids.as_ref()).map_err(checkpoint_err)
        })?;
        arrow::array::UInt32Array::from(shards)
            .to_data()
            .to_pyarrow(py)
    }
}

/// Batches of a scan with checkpointed rows removed (the Rust half of
/// `CheckpointFilter.filter(dataset)`).
#[pyclass(module = "forebay._forebay")]
struct RsFilteredIter {
    batches: std::sync::Mutex<Option<FilteredBatches>>,
}

#[pymethods]
impl RsFilteredIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let next = detached_py(py, || {
            let mut guard = self
                .batches
                .lock()
                .map_err(|_| CheckpointError::new_err("filter state poisoned"))?;
            let Some(batches) = guard.as_mut() else {
                return Ok(None);
            };
            match batches.next() {
                None => {
                    *guard = None;
                    Ok(None)
                }
                Some(r) => r.map(Some).map_err(checkpoint_err),
            }
        })?;
        next.map(|b| b.to_pyarrow(py)).transpose()
    }

    fn close(&self) {
        if let Ok(mut guard) = self.batches.lock() {
            *guard = None;
        }
    }
}

/// Spill directories and their I/O threads (the Rust half of `forebay.SpillArea`).
/// Python hands buffers over as bytes-like objects, copied once into Rust at this boundary;
/// the spill path itself copies nothing (see forebay-spill's tests).
#[pyclass(module = "forebay._forebay", frozen)]
struct RsSpillArea {
    area: forebay_spill::SpillArea,
}

/// A spill location held for Python until `free()` (or garbage collection) releases it.
pub(crate) struct FreeableLocation<T: Clone>(std::sync::Mutex<Option<T>>);

impl<T: Clone> FreeableLocation<T> {
    pub(crate) fn new(location: T) -> Self {
        FreeableLocation(std::sync::Mutex::new(Some(location)))
    }
    pub(crate) fn get(&self) -> PyResult<T> {
        self.0
            .lock()
            .map_err(|_| SpillError::new_err("location poisoned"))?
            .clone()
            .ok_or_else(|| SpillError::new_err("spilled object was already freed"))
    }
    pub(crate) fn free(&self) {
        if let Ok(mut guard) = self.0.lock() {
            *guard = None;
        }
    }
}

/// A spill round as Python hands it over: `(id, [bytes-like, ...])` per object.
pub(crate) fn spill_objects(objects: Vec<(u64, Vec<Vec<u8>>)>) -> Vec<forebay_spill::SpillObject> {
    objects
        .into_iter()
        .map(|(id, buffers)| forebay_spill::SpillObject {
            id,
            buffers: buffers.into_iter().map(bytes::Bytes::from).collect(),
        })
        .collect()
}

/// Where one spilled object lives; `free()` (or garbage collection) releases it.
#[pyclass(module = "forebay._forebay", frozen)]
struct RsSpillLocation {
    location: FreeableLocation<forebay_spill::SpillLocation>,
}

impl RsSpillLocation {
    fn get(&self) -> PyResult<forebay_spill::SpillLocation> {
        self.location.get()
    }
}

#[pymethods]
impl RsSpillLocation {
    fn path(&self) -> PyResult<String> {
        Ok(self.get()?.path().display().to_string())
    }
    fn offset(&self) -> PyResult<u64> {
        Ok(self.get()?.offset())
    }
    fn object_id(&self) -> PyResult<u64> {
        Ok(self.get()?.object_id())
    }
    fn buffer_lens(&self) -> PyResult<Vec<u64>> {
        Ok(self.get()?.buffer_lens().to_vec())
    }
    fn free(&self) {
        self.location.free()
    }
}

#[pymethods]
impl RsSpillArea {
    #[new]
    #[pyo3(signature = (directories, sync, io_threads, queue_depth, most_free_space))]
    fn new(
        directories: Vec<String>,
        sync: &str,
        io_threads: usize,
        queue_depth: usize,
        most_free_space: bool,
    ) -> PyResult<Self> {
        use forebay_spill::{DirectoryChoice, SpillConfig, SyncPolicy};
        let sync = match sync {
            "none" => SyncPolicy::None,
            "file" => SyncPolicy::PerFile,
            "object" => SyncPolicy::PerObject,
            other => {
                return Err(SpillError::new_err(format!(
                    "sync must be 'none', 'file' or 'object', not {other:?}"
                )))
            }
        };
        let config = SpillConfig::new(directories)
            .with_sync(sync)
            .with_io_threads(io_threads)
            .with_queue_depth(queue_depth)
            .with_directory_choice(if most_free_space {
                DirectoryChoice::MostFreeSpace
            } else {
                DirectoryChoice::RoundRobin
            });
        Ok(RsSpillArea {
            area: forebay_spill::SpillArea::open(config).map_err(spill_err)?,
        })
    }

    /// Spill one round: `objects` is a list of `(id, [bytes-like, ...])`.
    fn spill(
        &self,
        py: Python<'_>,
        objects: Vec<(u64, Vec<Vec<u8>>)>,
    ) -> PyResult<Vec<RsSpillLocation>> {
        let objects = spill_objects(objects);
        let locations = detached_py(py, || self.area.spill(objects).map_err(spill_err))?;
        Ok(locations
            .into_iter()
            .map(|l| RsSpillLocation {
                location: FreeableLocation::new(l),
            })
            .collect())
    }

    /// Restore with preadv into fresh buffers; returns a list of `bytes`.
    fn restore<'py>(
        &self,
        py: Python<'py>,
        location: &RsSpillLocation,
    ) -> PyResult<Vec<Bound<'py, pyo3::types::PyBytes>>> {
        let loc = location.get()?;
        let buffers = detached_py(py, || self.area.restore(&loc).map_err(spill_err))?;
        Ok(buffers
            .iter()
            .map(|b| pyo3::types::PyBytes::new(py, b))
            .collect())
    }

    /// Map read-only and verify; returns each buffer as a pyarrow UInt8Array over the mapping.
    fn restore_mapped<'py>(
        &self,
        py: Python<'py>,
        location: &RsSpillLocation,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let loc = location.get()?;
        let mapped = detached_py(py, || self.area.map(&loc).map_err(spill_err))?;
        mapped
            .buffers()
            .into_iter()
            .map(|b| {
                let len = b.len();
                let buffer = arrow::buffer::Buffer::from(b);
                let array = arrow::array::UInt8Array::new(
                    arrow::buffer::ScalarBuffer::new(buffer, 0, len),
                    None,
                );
                array.to_data().to_pyarrow(py)
            })
            .collect()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.area.stats();
        let d = PyDict::new(py);
        d.set_item("rounds", s.rounds)?;
        d.set_item("failed_rounds", s.failed_rounds)?;
        d.set_item("objects_spilled", s.objects_spilled)?;
        d.set_item("bytes_spilled", s.bytes_spilled)?;
        d.set_item("files_created", s.files_created)?;
        d.set_item("files_deleted", s.files_deleted)?;
        d.set_item("stale_files_removed", s.stale_files_removed)?;
        d.set_item("objects_restored", s.objects_restored)?;
        d.set_item("bytes_restored", s.bytes_restored)?;
        Ok(d)
    }
}

/// Store bytes under a `memory://` URI (the process-wide in-memory object store).
#[pyfunction]
fn memory_put(py: Python<'_>, uri: String, data: Vec<u8>) -> PyResult<()> {
    detached(py, move || {
        forebay_parquet::source::put_memory_object(&uri, data)
    })
}

/// Keep glibc from handing freed heap memory back to the kernel after every batch.
///
/// Scanning allocates and frees ~0.5-2 MB Arrow buffers per batch. With glibc's defaults the
/// top of a thread's heap is trimmed as soon as 2x the (dynamic) mmap threshold is free, so
/// the next batch faults the same pages in again, zeroed: ~10 % of a 2-column scan was page
/// faults and memset, and the scan got 1.6x faster without it (BENCHMARKS.md). Settings:
/// trim only beyond 32 MB free at the top of a heap; blocks of 4 MB and more get their own
/// mapping, returned when freed (the checkpoint loader's big per-shard vectors: keeping
/// those in the heaps raised the load's peak from 1.55x to 2.1x the index). The loader's
/// explicit `malloc_trim` still returns everything free. (mimalloc as the global allocator
/// was tried: scans as fast, the checkpoint load 2x slower and 2x the memory.)
/// A user's own `MALLOC_TRIM_THRESHOLD_` / `MALLOC_MMAP_THRESHOLD_` (glibc's environment
/// tunables) win over these defaults.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (env, param, value) in [
        ("MALLOC_TRIM_THRESHOLD_", libc::M_TRIM_THRESHOLD, 32 << 20),
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 4 << 20),
    ] {
        if std::env::var_os(env).is_none() {
            // SAFETY: mallopt only sets allocator parameters; it is safe to call any time.
            unsafe { libc::mallopt(param, value) };
        }
    }
}

#[pymodule]
fn _forebay(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    tune_malloc();
    m.add_class::<RsDataset>()?;
    m.add_class::<RsBatchIter>()?;
    m.add_class::<RsCheckpointIndex>()?;
    m.add_class::<RsFilteredIter>()?;
    m.add_class::<RsSpillArea>()?;
    m.add_class::<RsSpillLocation>()?;
    m.add_function(wrap_pyfunction!(memory_put, m)?)?;
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
    store::register(m)?;
    remote_spill::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
