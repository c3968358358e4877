//! `forebay.ray.write_parquet`'s commit protocol across processes: the coordinator on the
//! driver, stagers in Ray tasks (forebay-engine's `coordinator` module). Specs, staged
//! commits and finished inputs cross process boundaries as JSON strings.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_pyarrow::FromPyArrow;
use forebay_engine::{
    CommitCoordinator, CommitStager, ConsumedPositions, ParquetSink, StagedCommit, StagerSpec,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::string_map;
use crate::dataset::RsDataset;
use crate::errors::engine_err;
use crate::pipeline::CheckpointConfig;

/// The driver's side: recovery, the inputs earlier runs finished, one commit at a time.
#[pyclass(module = "forebay._forebay", frozen)]
pub(crate) struct RsCommitCoordinator {
    /// None once closed (the checkpoint's lock is released).
    inner: Mutex<Option<Arc<CommitCoordinator>>>,
}

impl RsCommitCoordinator {
    fn inner(&self) -> PyResult<Arc<CommitCoordinator>> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| PyValueError::new_err("the checkpointed write is closed"))
    }
}

#[pymethods]
impl RsCommitCoordinator {
    #[new]
    #[pyo3(signature = (dataset, checkpoint, on_changed_input, path, storage_options, compression, row_group_rows=None, shared_output=false))]
    #[allow(clippy::too_many_arguments)] // each a keyword of forebay.ray.write_parquet
    fn new(
        py: Python<'_>,
        dataset: &RsDataset,
        checkpoint: CheckpointConfig,
        on_changed_input: &str,
        path: String,
        #[pyo3(from_py_with = string_map)] storage_options: HashMap<String, String>,
        compression: &str,
        row_group_rows: Option<usize>,
        shared_output: bool,
    ) -> PyResult<Self> {
        let checkpoint = checkpoint.into_checkpoint(on_changed_input, shared_output)?;
        let mut sink = ParquetSink::new(path)
            .with_storage_options(storage_options)
            .with_compression(compression)
            .map_err(|e| engine_err(py, e))?;
        if let Some(rows) = row_group_rows {
            sink = sink.with_row_group_rows(rows);
        }
        let dataset = dataset.dataset.clone();
        let opened = py.detach(|| CommitCoordinator::open(&checkpoint, &sink, &dataset));
        Ok(RsCommitCoordinator {
            inner: Mutex::new(Some(Arc::new(opened.map_err(|e| engine_err(py, e))?))),
        })
    }

    /// The input files, in the order completions name them.
    fn files(&self) -> PyResult<Vec<String>> {
        Ok(self.inner()?.files())
    }

    /// JSON: the input files and row groups earlier runs finished.
    fn finished_inputs(&self) -> PyResult<String> {
        Ok(self.inner()?.finished_inputs().to_json())
    }

    /// JSON: what a stager needs (`RsCommitStager(spec)`).
    fn stager_spec(&self) -> PyResult<String> {
        Ok(self.inner()?.stager_spec().to_json())
    }

    fn state_uri(&self) -> PyResult<String> {
        Ok(self.inner()?.state_uri())
    }

    fn num_shards(&self) -> PyResult<usize> {
        Ok(self.inner()?.num_shards())
    }

    /// `commits_recovered`, `files_done`, `files_changed`, `ids_done` (published by
    /// forebay's commits).
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.inner()?;
        let r = inner.report();
        let d = PyDict::new(py);
        d.set_item("commits_recovered", r.commits_recovered)?;
        d.set_item("files_done", r.files_done)?;
        d.set_item("files_changed", r.files_changed.clone())?;
        d.set_item("ids_done", r.ids_done)?;
        Ok(d)
    }

    /// Whether readers drop done rows by the positions in `finished_inputs` (else by id).
    fn resumes_by_position(&self) -> PyResult<bool> {
        Ok(self.inner()?.resumes_by_position())
    }

    /// Commit a staged commit (JSON from `RsCommitStager.stage`, or None for completions
    /// only) with the row groups `(file, row_group)` and whole files it completes, and the
    /// input positions its rows hold (`[((file, row_group), [(start, end), ...]), ...]`;
    /// None: unknown).
    #[pyo3(signature = (staged, completed_units, completed_files, consumed=None))]
    fn commit(
        &self,
        py: Python<'_>,
        staged: Option<String>,
        completed_units: Vec<(usize, usize)>,
        completed_files: Vec<usize>,
        consumed: Option<ConsumedPositions>,
    ) -> PyResult<()> {
        let staged = staged
            .map(|s| StagedCommit::from_json(&s))
            .transpose()
            .map_err(|e| engine_err(py, e))?;
        let inner = self.inner()?;
        py.detach(|| inner.commit(staged, completed_units, completed_files, consumed))
            .map_err(|e| engine_err(py, e))
    }

    /// `(path, rows, bytes)` of each data file committed so far.
    fn committed(&self) -> PyResult<Vec<(String, u64, u64)>> {
        Ok(self
            .inner()?
            .committed()
            .into_iter()
            .map(|f| (f.path, f.rows, f.bytes))
            .collect())
    }

    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner()?;
        py.detach(|| inner.finish()).map_err(|e| engine_err(py, e))
    }

    /// Release the checkpoint (its lock) now rather than when garbage collected.
    fn close(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// A task's side: stage a data file and its ids, return the staged commit as JSON. The spec
/// names the output and the checkpoint; the options to open their stores come apart from it
/// (the spec never holds credentials).
#[pyclass(module = "forebay._forebay", frozen)]
pub(crate) struct RsCommitStager {
    inner: CommitStager,
}

#[pymethods]
impl RsCommitStager {
    #[new]
    fn new(
        py: Python<'_>,
        spec: &str,
        #[pyo3(from_py_with = string_map)] output_options: HashMap<String, String>,
        #[pyo3(from_py_with = string_map)] checkpoint_options: HashMap<String, String>,
    ) -> PyResult<Self> {
        let spec = StagerSpec::from_json(spec).map_err(|e| engine_err(py, e))?;
        let stager = py.detach(|| CommitStager::new(spec, &output_options, &checkpoint_options));
        Ok(RsCommitStager {
            inner: stager.map_err(|e| engine_err(py, e))?,
        })
    }

    /// Stage `batches` (pyarrow RecordBatches of one schema) as one data file.
    fn stage(&self, py: Python<'_>, batches: Vec<Bound<'_, PyAny>>) -> PyResult<String> {
        let batches = batches
            .iter()
            .map(RecordBatch::from_pyarrow_bound)
            .collect::<PyResult<Vec<_>>>()?;
        let inner = &self.inner;
        let staged = py
            .detach(|| inner.stage(&batches))
            .map_err(|e| engine_err(py, e))?;
        Ok(staged.to_json())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RsCommitCoordinator>()?;
    m.add_class::<RsCommitStager>()?;
    Ok(())
}
