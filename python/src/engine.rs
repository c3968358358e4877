//! Glue for running `forebay.Dataset` pipelines: the Python plan becomes a forebay-engine
//! `Pipeline`; Python functions run as the engine's map workers (the GIL is held only inside
//! each call); streams and writes are waited on in short slices with the GIL released, so
//! the Python caller sees Ctrl-C at once; engine errors become Python exceptions, a user
//! function's own exception re-raised as itself. Shaping of batches (formats, output
//! normalisation) lives in `forebay/_udf.py`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow_pyarrow::ToPyArrow;
use forebay_engine::process::{ProcessPool, RemoteError};
use forebay_engine::{
    BatchStream, Checkpoint, EngineError, IterOptions, MapFn, MapStage, MapWorker, OnChangedInput,
    ParquetSink, Pipeline, PipelineEvent, PipelineOptions, Poll, PrepareNext, RunStats,
    RunningWrite, StageFailure, WorkerContext, WriteMode,
};
use forebay_parquet::ErrorKind;

/// `(id_column, path, num_shards, delete_on_success, on_changed_input, storage_options)`.
pub(crate) type CheckpointArgs = (
    String,
    String,
    Option<usize>,
    bool,
    String,
    Option<HashMap<String, String>>,
);

/// `forebay.Checkpoint._args(...)` as the engine's checkpoint.
pub(crate) fn checkpoint_from_args(args: CheckpointArgs) -> PyResult<Checkpoint> {
    let (id_column, path, num_shards, delete, changed, options) = args;
    let on_changed = match changed.as_str() {
        "error" => OnChangedInput::Error,
        "reprocess" => OnChangedInput::Reprocess,
        other => {
            return Err(PyValueError::new_err(format!(
                "on_changed_input must be 'error' or 'reprocess', not {other:?}"
            )))
        }
    };
    let mut c = Checkpoint::new(id_column, path)
        .with_delete_on_success(delete)
        .with_on_changed_input(on_changed)
        .with_storage_options(options.unwrap_or_default());
    if let Some(n) = num_shards {
        c = c.with_num_shards(n);
    }
    Ok(c)
}
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::arrow_export::BatchExporter;
use crate::arrow_import::import_map_output;
use crate::checkpoint::RsCheckpointIndex;
use crate::dataset::RsDataset;
use crate::errors::{
    checkpoint_err_message, to_py_err, ForebayError, MemoryLimitExceeded, StageError,
    WorkerDiedError, WriteError,
};
use crate::lookahead::{NextBatchPreparer, PreparedInputs};
use crate::thread_state::KeptThreadState;

/// A Python exception raised by a user's function, carried through the engine unchanged.
#[derive(Debug)]
struct PyUserError(PyErr);

impl std::fmt::Display for PyUserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for PyUserError {}

/// A Python exception from a map call: a `StageError` the glue raised about the output
/// (wrong type, ...) or the user's own exception.
fn failure(err: PyErr) -> StageFailure {
    Python::attach(|py| {
        if err.is_instance_of::<StageError>(py) {
            StageFailure::BadOutput(err.value(py).to_string())
        } else {
            StageFailure::User(Box::new(PyUserError(err)))
        }
    })
}

/// A Python map function run on engine threads. `make_worker()` is called once per worker
/// and returns its `forebay._udf.Runner`: `prepare(pyarrow.RecordBatch)` makes the function's
/// input, `run(input)` calls the function, `finish(output)` turns what it returned into a list
/// of `pyarrow.RecordBatch`.
struct PyFunction {
    make_worker: Py<PyAny>,
}

struct PyFunctionWorker {
    prepare: Py<PyAny>,
    run: Py<PyAny>,
    finish: Py<PyAny>,
    /// Inputs made ahead by the worker's `NextBatchPreparer` (see `lookahead`).
    prepared: Arc<PreparedInputs>,
    /// Batches it converts itself go to pyarrow through this.
    exporter: BatchExporter,
    /// Declared last: dropped after the Python objects.
    _thread_state: KeptThreadState,
}

impl MapFn for PyFunction {
    fn start_worker(&self, _: &WorkerContext<'_>) -> Result<Box<dyn MapWorker>, StageFailure> {
        let thread_state = KeptThreadState::new();
        let (prepare, run, finish) = Python::attach(|py| -> PyResult<_> {
            let runner = self.make_worker.call0(py)?;
            Ok((
                runner.getattr(py, "prepare")?,
                runner.getattr(py, "run")?,
                runner.getattr(py, "finish")?,
            ))
        })
        .map_err(failure)?;
        Ok(Box::new(PyFunctionWorker {
            prepare,
            run,
            finish,
            prepared: PreparedInputs::new(),
            exporter: BatchExporter::default(),
            _thread_state: thread_state,
        }))
    }
}

impl MapWorker for PyFunctionWorker {
    fn next_batch_preparer(&mut self) -> Option<Box<dyn PrepareNext>> {
        let preparer = Python::attach(|py| {
            NextBatchPreparer::new(py, self.prepared.clone(), self.prepare.clone_ref(py))
        });
        // Without a preparer the worker converts each batch itself, as it always can.
        preparer.ok().map(|p| Box::new(p) as Box<dyn PrepareNext>)
    }

    fn call(
        &mut self,
        batch: RecordBatch,
        _: &WorkerContext<'_>,
    ) -> Result<Vec<RecordBatch>, StageFailure> {
        let prepared = self.prepared.take(&batch);
        Python::attach(|py| -> PyResult<Vec<RecordBatch>> {
            let input = match prepared {
                Some(input) => input?,
                None => self
                    .prepare
                    .call1(py, (self.exporter.export(py, &batch)?,))?,
            };
            self.prepared.allow_next();
            let out = self.run.call1(py, (input,));
            self.prepared.function_returned();
            let out = self.finish.call1(py, (out?,))?;
            out.bind(py)
                .try_iter()?
                .map(|item| import_map_output(&item?, &batch))
                .collect()
        })
        .map_err(failure)
    }

    fn close(&mut self) {
        self.prepared.clear();
        // Drop the Python objects with the GIL held.
        Python::attach(|py| {
            let _ = std::mem::replace(&mut self.prepare, py.None());
            let _ = std::mem::replace(&mut self.run, py.None());
            let _ = std::mem::replace(&mut self.finish, py.None());
            self.exporter = BatchExporter::default();
        });
    }
}

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

fn stats_dict<'py>(py: Python<'py>, stats: &RunStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("wall_s", stats.wall.as_secs_f64())?;
    d.set_item("memory_limit", stats.memory_limit)?;
    d.set_item("peak_bytes", stats.peak_bytes)?;
    d.set_item("store_spilled_bytes", stats.store_spilled_bytes)?;
    let stages = PyList::empty(py);
    for s in &stats.stages {
        let sd = PyDict::new(py);
        sd.set_item("name", &s.name)?;
        sd.set_item("rows_in", s.rows_in)?;
        sd.set_item("rows_out", s.rows_out)?;
        sd.set_item("batches_in", s.batches_in)?;
        sd.set_item("batches_out", s.batches_out)?;
        sd.set_item("busy_s", s.busy.as_secs_f64())?;
        sd.set_item("peak_bytes", s.peak_bytes)?;
        sd.set_item("spilled_bytes", s.spilled_bytes)?;
        stages.append(sd)?;
    }
    d.set_item("stages", stages)?;
    Ok(d)
}

/// Events of a run, collected for the Python side to log.
#[derive(Clone, Default)]
struct EventLog(Arc<Mutex<Vec<PipelineEvent>>>);

impl EventLog {
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        let out = PyList::empty(py);
        for e in events {
            let (level, text) = match e {
                PipelineEvent::Started {
                    stages,
                    memory_limit,
                } => (
                    "debug",
                    format!(
                        "pipeline started: {} (memory limit {memory_limit} bytes)",
                        stages.join(" -> ")
                    ),
                ),
                PipelineEvent::WorkerStarted { stage, pid } => (
                    "debug",
                    format!("stage '{stage}': worker process {pid} started"),
                ),
                PipelineEvent::WorkerDied {
                    stage,
                    pid,
                    how,
                    retrying,
                } => (
                    "warning",
                    format!(
                        "stage '{stage}': worker process {pid} died ({how}){}",
                        if retrying {
                            "; retrying its batch on a new worker"
                        } else {
                            ""
                        }
                    ),
                ),
                PipelineEvent::Spilled { stage, bytes } => (
                    "info",
                    format!("stage '{stage}': moved {bytes} bytes of held batches out of memory"),
                ),
                PipelineEvent::FileWritten { path, rows, bytes } => (
                    "debug",
                    format!("wrote {path} ({rows} rows, {bytes} bytes)"),
                ),
                PipelineEvent::Warning { message } => ("warning", message.clone()),
                PipelineEvent::Finished {
                    rows,
                    seconds,
                    error,
                } => match error {
                    None => (
                        "info",
                        format!("pipeline finished: {rows} rows in {seconds:.3} s"),
                    ),
                    Some(e) => (
                        "info",
                        format!("pipeline stopped after {seconds:.3} s: {e}"),
                    ),
                },
            };
            out.append((level, text))?;
        }
        Ok(out)
    }
}

/// A pipeline being described (the Rust half of running a `forebay.Dataset`).
#[pyclass(module = "forebay._forebay", frozen)]
pub(crate) struct RsPipeline {
    pipeline: Mutex<Option<Pipeline>>,
    events: EventLog,
}

impl RsPipeline {
    fn with(&self, f: impl FnOnce(Pipeline) -> PyResult<Pipeline>) -> PyResult<()> {
        let mut slot = self.pipeline.lock().unwrap_or_else(|p| p.into_inner());
        let pipeline = slot
            .take()
            .ok_or_else(|| ForebayError::new_err("this pipeline already ran"))?;
        *slot = Some(f(pipeline)?);
        Ok(())
    }

    fn take(&self) -> PyResult<Pipeline> {
        self.pipeline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| ForebayError::new_err("this pipeline already ran"))
    }
}

fn stage(
    name: String,
    function: impl MapFn,
    concurrency: usize,
    batch_size: Option<usize>,
    required_columns: Vec<String>,
) -> MapStage {
    let mut stage = MapStage::new(name, function)
        .with_concurrency(concurrency)
        .with_required_columns(required_columns);
    if let Some(n) = batch_size {
        stage = stage.with_batch_size(n);
    }
    stage
}

#[pymethods]
impl RsPipeline {
    #[new]
    #[pyo3(signature = (dataset, memory_limit, preserve_order, progress, spill_dir=None))]
    fn new(
        dataset: &RsDataset,
        memory_limit: usize,
        preserve_order: bool,
        progress: bool,
        spill_dir: Option<String>,
    ) -> Self {
        let events = EventLog::default();
        let sink = events.clone();
        let options = PipelineOptions {
            memory_limit,
            preserve_order,
            progress,
            spill_dir: spill_dir.map(Into::into),
            events: Some(Arc::new(move |e: &PipelineEvent| {
                sink.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(e.clone())
            })),
            ..Default::default()
        };
        let pipeline = Pipeline::new(forebay_engine::Source::Parquet(dataset.dataset.clone()))
            .with_options(options);
        RsPipeline {
            pipeline: Mutex::new(Some(pipeline)),
            events,
        }
    }

    /// A Python function on `concurrency` engine threads.
    #[pyo3(signature = (name, make_worker, concurrency, batch_size, required_columns))]
    fn add_threads(
        &self,
        name: String,
        make_worker: Py<PyAny>,
        concurrency: usize,
        batch_size: Option<usize>,
        required_columns: Vec<String>,
    ) -> PyResult<()> {
        let function = PyFunction { make_worker };
        self.with(|p| {
            Ok(p.map(stage(
                name,
                function,
                concurrency,
                batch_size,
                required_columns,
            )))
        })
    }

    /// A function in `concurrency` worker processes started with `command`; `init` is sent
    /// to each worker as it starts.
    #[pyo3(signature = (name, command, init, concurrency, batch_size, max_retries, required_columns, env))]
    #[allow(clippy::too_many_arguments)]
    fn add_processes(
        &self,
        name: String,
        command: Vec<String>,
        init: Vec<u8>,
        concurrency: usize,
        batch_size: Option<usize>,
        max_retries: usize,
        required_columns: Vec<String>,
        env: HashMap<String, String>,
    ) -> PyResult<()> {
        let env = env
            .into_iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect();
        let pool = ProcessPool::new(command.into_iter().map(OsString::from).collect(), init)
            .with_max_retries(max_retries)
            .with_env(env);
        self.with(|p| Ok(p.map(stage(name, pool, concurrency, batch_size, required_columns))))
    }

    fn add_limit(&self, rows: u64) -> PyResult<()> {
        self.with(|p| Ok(p.limit(rows)))
    }

    fn add_checkpoint_filter(&self, index: &RsCheckpointIndex, concurrency: usize) -> PyResult<()> {
        let stage = MapStage::checkpoint_filter(index.shared()).with_concurrency(concurrency);
        self.with(|p| Ok(p.map(stage)))
    }

    #[pyo3(signature = (batch_size, prefetch_batches, drop_last, shuffle_rows=None, shuffle_seed=None))]
    fn iter(
        &self,
        py: Python<'_>,
        batch_size: Option<usize>,
        prefetch_batches: usize,
        drop_last: bool,
        shuffle_rows: Option<usize>,
        shuffle_seed: Option<u64>,
    ) -> PyResult<RsBatchStream> {
        let pipeline = self.take()?;
        let options = IterOptions {
            batch_size,
            prefetch_batches,
            drop_last,
            local_shuffle: shuffle_rows.map(|n| (n, shuffle_seed)),
        };
        let stream = py
            .detach(|| pipeline.iter(options))
            .map_err(|e| engine_err(py, e))?;
        Ok(RsBatchStream {
            stream: Mutex::new(stream),
            events: self.events.clone(),
        })
    }

    /// `checkpoint`: `(id_column, path, num_shards, delete_on_success, on_changed_input,
    /// storage_options)` for an exactly-once, resumable write.
    #[pyo3(signature = (path, storage_options, compression, rows_per_file, concurrency, mode, checkpoint=None))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        py: Python<'_>,
        path: String,
        storage_options: Option<HashMap<String, String>>,
        compression: &str,
        rows_per_file: Option<usize>,
        concurrency: usize,
        mode: &str,
        checkpoint: Option<CheckpointArgs>,
    ) -> PyResult<RsRunningWrite> {
        let mode = match mode {
            "append" => WriteMode::Append,
            "overwrite" => WriteMode::Overwrite,
            "error" | "errorifexists" => WriteMode::ErrorIfExists,
            other => {
                return Err(PyValueError::new_err(format!(
                    "mode must be 'append', 'overwrite' or 'error', not {other:?}"
                )))
            }
        };
        let mut sink = ParquetSink::new(path)
            .with_storage_options(storage_options.unwrap_or_default())
            .with_compression(compression)
            .map_err(|e| engine_err(py, e))?
            .with_concurrency(concurrency)
            .with_mode(mode);
        if let Some(rows) = rows_per_file {
            sink = sink.with_rows_per_file(rows);
        }
        let checkpoint = checkpoint.map(checkpoint_from_args).transpose()?;
        let pipeline = self.take()?;
        let running = py
            .detach(|| match checkpoint {
                Some(c) => pipeline.start_write_checkpointed(sink, c),
                None => pipeline.start_write(sink),
            })
            .map_err(|e| engine_err(py, e))?;
        Ok(RsRunningWrite {
            running: Mutex::new(running),
            events: self.events.clone(),
        })
    }
}

/// A running pipeline's output (the Rust half of `Dataset.iter_batches`).
#[pyclass(module = "forebay._forebay", frozen)]
pub(crate) struct RsBatchStream {
    stream: Mutex<BatchStream>,
    events: EventLog,
}

#[pymethods]
impl RsBatchStream {
    /// Wait up to `timeout` seconds with the GIL released: `(0, [RecordBatch, ...])` (the
    /// zero-copy pieces of one output batch), `(1, None)` while nothing is ready, `(2, None)`
    /// at the end; raises the run's error.
    fn poll<'py>(
        &self,
        py: Python<'py>,
        timeout: f64,
    ) -> PyResult<(u8, Option<Bound<'py, PyList>>)> {
        let polled = py.detach(|| {
            self.stream
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .next_timeout(Duration::from_secs_f64(timeout.max(0.0)))
        });
        match polled {
            Ok(Poll::Batch(pieces)) => {
                let list = PyList::empty(py);
                for b in pieces {
                    list.append(b.to_pyarrow(py)?)?;
                }
                Ok((0, Some(list)))
            }
            Ok(Poll::Pending) => Ok((1, None)),
            Ok(Poll::Done) => Ok((2, None)),
            Err(e) => Err(engine_err(py, e)),
        }
    }

    /// Stop the run (threads stop, worker processes are killed, partial files removed).
    fn cancel(&self, py: Python<'_>) {
        py.detach(|| {
            self.stream
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .cancel()
        });
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let stats = self
            .stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stats();
        stats.map(|s| stats_dict(py, &s)).transpose()
    }

    /// The memory pool now: `{"limit", "used", "holders": {name: bytes}}` (None after the end).
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(m) = self
            .stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .memory()
        else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("limit", m.limit)?;
        d.set_item("used", m.used)?;
        d.set_item("peak", m.peak)?;
        let holders = PyDict::new(py);
        for c in m.consumers {
            holders.set_item(c.name, c.held)?;
        }
        d.set_item("holders", holders)?;
        Ok(Some(d))
    }

    /// `[(level, message), ...]` since the last call.
    fn drain_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.events.drain(py)
    }
}

/// A running write (the Rust half of `Dataset.write_parquet`).
#[pyclass(module = "forebay._forebay", frozen)]
pub(crate) struct RsRunningWrite {
    running: Mutex<RunningWrite>,
    events: EventLog,
}

#[pymethods]
impl RsRunningWrite {
    /// Wait up to `timeout` seconds with the GIL released; the result dict once finished.
    fn wait<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Option<Bound<'py, PyDict>>> {
        let done = py.detach(|| {
            self.running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .wait_timeout(Duration::from_secs_f64(timeout.max(0.0)))
        });
        match done {
            None => Ok(None),
            Some(Err(e)) => Err(engine_err(py, e)),
            Some(Ok(stats)) => {
                let d = PyDict::new(py);
                d.set_item("rows", stats.rows)?;
                d.set_item("files", stats.files.len())?;
                d.set_item("bytes", stats.bytes)?;
                d.set_item("seconds", stats.seconds)?;
                let paths: Vec<String> = stats.files.iter().map(|f| f.path.clone()).collect();
                d.set_item("paths", paths)?;
                if let Some(r) = stats.resume {
                    let resume = PyDict::new(py);
                    resume.set_item("commits_recovered", r.report.commits_recovered)?;
                    resume.set_item("ids_done_before", r.report.ids_done)?;
                    resume.set_item("files_done_before", r.report.files_done)?;
                    resume.set_item("files_changed", r.report.files_changed)?;
                    resume.set_item("rows_skipped_by_id", r.rows_skipped_by_id)?;
                    resume.set_item("files_skipped", r.files_skipped)?;
                    resume.set_item("row_groups_skipped", r.row_groups_skipped)?;
                    resume.set_item("bytes_read", r.bytes_read)?;
                    d.set_item("resume", resume)?;
                }
                Ok(Some(d))
            }
        }
    }

    fn cancel(&self, py: Python<'_>) {
        py.detach(|| {
            self.running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .cancel()
        });
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let stats = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stats();
        stats.map(|s| stats_dict(py, &s)).transpose()
    }

    fn drain_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.events.drain(py)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RsPipeline>()?;
    m.add_class::<RsBatchStream>()?;
    m.add_class::<RsRunningWrite>()?;
    Ok(())
}
