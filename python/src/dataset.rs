//! `forebay.Dataset`'s Rust half: a Parquet dataset built from Python arguments (paths,
//! columns, the normalised filter of `forebay._filters`), its scans as Python iterators of
//! pyarrow batches, and its export through the Arrow C stream interface.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_pyarrow::{FromPyArrow, ToPyArrow};
use arrow_schema::{Schema, TimeUnit};
use forebay_parquet::{
    CompareOp, DatasetSource, Literal, ParquetDataset, Predicate, ProvenancedBatch,
    RecordBatchIter, ScanStream,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

use crate::args::string_map;
use crate::errors::{detached, ForebayError, InvalidFilterError};

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
pub(crate) struct RsDataset {
    pub(crate) dataset: ParquetDataset,
}

#[pymethods]
impl RsDataset {
    #[new]
    #[pyo3(signature = (paths, columns, filter, batch_size, prefetch, num_threads, dictionary_columns, storage_options, int96_timestamp_unit="ns", file_extensions=None, schema=None, union_schema=false, fetch_ahead=None, coalesce_gap=None, hive_partitioning=false, hive_schema=None, partition_base=None))]
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
        #[pyo3(from_py_with = string_map)] storage_options: HashMap<String, String>,
        int96_timestamp_unit: &str,
        file_extensions: Option<Vec<String>>,
        schema: Option<Bound<'_, PyAny>>,
        union_schema: bool,
        fetch_ahead: Option<usize>,
        coalesce_gap: Option<u64>,
        hive_partitioning: bool,
        hive_schema: Option<Bound<'_, PyAny>>,
        partition_base: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let int96_unit = match int96_timestamp_unit {
            "s" => TimeUnit::Second,
            "ms" => TimeUnit::Millisecond,
            "us" => TimeUnit::Microsecond,
            "ns" => TimeUnit::Nanosecond,
            other => {
                return Err(PyValueError::new_err(format!(
                    "int96_timestamp_unit must be 's', 'ms', 'us' or 'ns', not {other:?}"
                )))
            }
        };
        let source = DatasetSource::Uris {
            uris: paths,
            storage_options,
        };
        let mut builder = ParquetDataset::builder(source)
            .with_batch_size(batch_size)
            .with_int96_timestamp_unit(int96_unit)
            .with_file_extensions(file_extensions);
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
        if let Some(schema) = schema {
            builder = builder.with_schema(Arc::new(Schema::from_pyarrow_bound(&schema)?));
        }
        if union_schema {
            builder = builder.with_union_schema();
        }
        if let Some(units) = fetch_ahead {
            builder = builder.with_fetch_ahead(units);
        }
        if let Some(bytes) = coalesce_gap {
            builder = builder.with_coalesce_gap(bytes);
        }
        if hive_partitioning {
            builder = builder.with_hive_partitioning();
        }
        if let Some(schema) = hive_schema {
            builder = builder.with_hive_schema(Arc::new(Schema::from_pyarrow_bound(&schema)?));
        }
        if let Some(bases) = partition_base {
            builder = builder.with_partition_base(bases);
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

    /// The hive partition columns (a schema), or None.
    fn partition_schema<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.dataset
            .partition_schema()
            .map(|s| s.as_ref().to_pyarrow(py))
            .transpose()
    }

    /// Indices (into `files()`) of the files a filter on hive partition columns rules out.
    fn files_pruned_by_partition(&self) -> Vec<usize> {
        self.dataset.files_pruned_by_partition()
    }

    /// Each file's size in bytes (from listing or HEAD), in the order of `files()`.
    fn file_sizes(&self) -> Vec<u64> {
        self.dataset.files().iter().map(|f| f.size()).collect()
    }

    fn count_rows(&self, py: Python<'_>) -> PyResult<u64> {
        let dataset = self.dataset.clone();
        detached(py, move || dataset.count_rows())
    }

    /// The same dataset, skipping the files and row groups in `finished` (JSON from
    /// `RsCommitCoordinator.finished_inputs`).
    fn with_finished_inputs(&self, py: Python<'_>, finished: &str) -> PyResult<RsDataset> {
        let finished = forebay_engine::FinishedInputs::from_json(finished)
            .map_err(|e| crate::errors::engine_err(py, e))?;
        Ok(RsDataset {
            dataset: self.dataset.with_skip(std::sync::Arc::new(finished)),
        })
    }

    /// The same dataset reading, of each file named in `ranges`, only the row groups whose
    /// first byte lies in its `(start, end)` range (a read task's share of a split file).
    fn with_byte_ranges(&self, ranges: HashMap<String, (u64, u64)>) -> RsDataset {
        let split = ranges.into_iter().fold(
            forebay_parquet::ByteRangeSplit::new(),
            |split, (uri, (start, end))| split.with_range(uri, start..end),
        );
        RsDataset {
            dataset: self.dataset.and_skip(std::sync::Arc::new(split)),
        }
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
        d.set_item("flat_decoder_chunks", m.flat_decoder_chunks)?;
        d.set_item("row_groups_pages_located", m.row_groups_pages_located)?;
        d.set_item("files_pruned_by_partition", m.files_pruned_by_partition)?;
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

/// Store bytes under a `memory://` URI (the process-wide in-memory object store).
#[pyfunction]
fn memory_put(py: Python<'_>, uri: String, data: Vec<u8>) -> PyResult<()> {
    detached(py, move || {
        forebay_parquet::source::put_memory_object(&uri, data)
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RsDataset>()?;
    m.add_class::<RsBatchIter>()?;
    m.add_function(wrap_pyfunction!(memory_put, m)?)?;
    Ok(())
}
