//! Glue for running `forebay.Dataset` pipelines: the Python plan becomes a forebay-engine
//! `Pipeline` ([`RsPipeline`]); streams and writes are waited on in short slices with the GIL
//! released, so the Python caller sees Ctrl-C at once. Python functions run as the engine's
//! map workers (`udf`, `lookahead`), what a run reports goes back as Python values (`report`),
//! and engine errors become Python exceptions (`errors::engine_err`). Shaping of batches
//! (formats, output normalisation) lives in `forebay/_udf.py`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_pyarrow::ToPyArrow;
use forebay_engine::process::ProcessPool;
use forebay_engine::{
    BatchStream, Checkpoint, IterOptions, MapFn, MapStage, OnChangedInput, ParquetSink, Pipeline,
    PipelineEvent, PipelineOptions, Poll, RunningWrite, WriteMode,
};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::args::{fspath, string_map};
use crate::checkpoint::RsCheckpointIndex;
use crate::dataset::RsDataset;
use crate::errors::engine_err;
use crate::errors::ForebayError;
use crate::report::{stats_dict, EventLog};
use crate::udf::PyFunction;

/// A `forebay.Checkpoint`, read by attribute name (`python/forebay/_checkpoint_config.py`
/// checks the values when it is made).
#[derive(FromPyObject)]
pub(crate) struct CheckpointConfig {
    #[pyo3(attribute)]
    id_column: Option<String>,
    #[pyo3(attribute, from_py_with = fspath)]
    path: String,
    #[pyo3(attribute)]
    num_shards: Option<usize>,
    #[pyo3(attribute)]
    delete_on_success: bool,
    #[pyo3(attribute, from_py_with = string_map)]
    storage_options: HashMap<String, String>,
    /// Seconds (checked by the dataclass).
    #[pyo3(attribute)]
    commit_interval: Option<f64>,
}

impl CheckpointConfig {
    /// The engine's checkpoint, with what the write does with changed inputs (`"error"` or
    /// `"reprocess"`).
    /// `shared_output`: the write was asked to append (`mode="append"` given): it may add
    /// to an output other checkpoints committed into.
    pub(crate) fn into_checkpoint(
        self,
        on_changed_input: &str,
        shared_output: bool,
    ) -> PyResult<Checkpoint> {
        let on_changed = match on_changed_input {
            "error" => OnChangedInput::Error,
            "reprocess" => OnChangedInput::Reprocess,
            other => {
                return Err(PyValueError::new_err(format!(
                    "on_changed_input must be 'error' or 'reprocess', not {other:?}"
                )))
            }
        };
        let commit_interval = self
            .commit_interval
            .map(|s| {
                Duration::try_from_secs_f64(s).map_err(|_| {
                    PyValueError::new_err(format!(
                        "Checkpoint: commit_interval must be a finite number of seconds above 0, not {s}"
                    ))
                })
            })
            .transpose()?;
        let c = match self.id_column {
            Some(id_column) => Checkpoint::new(id_column, self.path),
            None => Checkpoint::by_position(self.path),
        };
        let mut c = c
            .with_delete_on_success(self.delete_on_success)
            .with_on_changed_input(on_changed)
            .with_shared_output(shared_output)
            .with_commit_interval(commit_interval)
            .with_storage_options(self.storage_options);
        if let Some(n) = self.num_shards {
            c = c.with_num_shards(n);
        }
        Ok(c)
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
    max_errored_rows: Option<u64>,
    dead_letter: bool,
) -> MapStage {
    let mut stage = MapStage::new(name, function)
        .with_concurrency(concurrency)
        .with_required_columns(required_columns);
    if let Some(n) = batch_size {
        stage = stage.with_batch_size(n);
    }
    if let Some(n) = max_errored_rows {
        stage = stage.with_max_errored_rows(n);
    }
    if dead_letter {
        stage = stage.with_dead_letter();
    }
    stage
}

fn fingerprinted(stage: MapStage, fingerprint: Option<String>) -> MapStage {
    match fingerprint {
        Some(f) => stage.with_fingerprint(f),
        None => stage,
    }
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
            // Python's process is the run's: count its memory (Python objects, the model)
            // against the limit.
            process_memory: true,
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

    /// A Python function on `concurrency` engine threads. `max_errored_rows`: rows the
    /// function may fail on (when its runner sets them aside) before the run fails;
    /// `dead_letter`: those rows are written beside the output; `fingerprint`: what
    /// identifies its transform (`MapStage::with_fingerprint`).
    #[pyo3(signature = (name, make_worker, concurrency, batch_size, required_columns, max_errored_rows=None, dead_letter=false, fingerprint=None))]
    #[allow(clippy::too_many_arguments)]
    fn add_threads(
        &self,
        name: String,
        make_worker: Py<PyAny>,
        concurrency: usize,
        batch_size: Option<usize>,
        required_columns: Vec<String>,
        max_errored_rows: Option<u64>,
        dead_letter: bool,
        fingerprint: Option<String>,
    ) -> PyResult<()> {
        let function = PyFunction { make_worker };
        let stage = stage(
            name,
            function,
            concurrency,
            batch_size,
            required_columns,
            max_errored_rows,
            dead_letter,
        );
        self.with(|p| Ok(p.map(fingerprinted(stage, fingerprint))))
    }

    /// A function in `concurrency` worker processes started with `command`; `init` is sent
    /// to each worker as it starts.
    /// `env_of_each_worker`: more environment for worker `i` (and its replacements), e.g.
    /// its devices.
    #[pyo3(signature = (name, command, init, concurrency, batch_size, max_retries, required_columns, env, max_errored_rows=None, env_of_each_worker=Vec::new(), dead_letter=false, fingerprint=None))]
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
        max_errored_rows: Option<u64>,
        env_of_each_worker: Vec<HashMap<String, String>>,
        dead_letter: bool,
        fingerprint: Option<String>,
    ) -> PyResult<()> {
        let os_env = |env: HashMap<String, String>| {
            env.into_iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect::<Vec<_>>()
        };
        let pool = ProcessPool::new(command.into_iter().map(OsString::from).collect(), init)
            .with_max_retries(max_retries)
            .with_env(os_env(env))
            .with_env_of_each_worker(env_of_each_worker.into_iter().map(os_env).collect());
        let stage = stage(
            name,
            pool,
            concurrency,
            batch_size,
            required_columns,
            max_errored_rows,
            dead_letter,
        );
        self.with(|p| Ok(p.map(fingerprinted(stage, fingerprint))))
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

    /// `checkpoint`: a `forebay.Checkpoint`, for an exactly-once, resumable write;
    /// `on_changed_input` applies with it. `mode` None: append, and with a checkpoint refuse
    /// an output other checkpoints committed into (`"append"` given: allow it).
    #[pyo3(signature = (path, storage_options, compression, rows_per_file, concurrency, mode, checkpoint=None, on_changed_input="error"))]
    #[allow(clippy::too_many_arguments)] // each a keyword of Dataset.write_parquet
    fn write(
        &self,
        py: Python<'_>,
        path: String,
        #[pyo3(from_py_with = string_map)] storage_options: HashMap<String, String>,
        compression: &str,
        rows_per_file: Option<usize>,
        concurrency: usize,
        mode: Option<&str>,
        checkpoint: Option<CheckpointConfig>,
        on_changed_input: &str,
    ) -> PyResult<RsRunningWrite> {
        let shared_output = mode == Some("append");
        let mode = match mode.unwrap_or("append") {
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
            .with_storage_options(storage_options)
            .with_compression(compression)
            .map_err(|e| engine_err(py, e))?
            .with_concurrency(concurrency)
            .with_mode(mode);
        if let Some(rows) = rows_per_file {
            sink = sink.with_rows_per_file(rows);
        }
        let checkpoint = checkpoint
            .map(|c| c.into_checkpoint(on_changed_input, shared_output))
            .transpose()?;
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

/// What `RsBatchStream.poll` returns: a state, the pieces of one batch, the rest of a run.
type Polled<'py> = (
    u8,
    Option<Bound<'py, PyList>>,
    Option<(Bound<'py, PyAny>, usize)>,
);

#[pymethods]
impl RsBatchStream {
    /// Wait up to `timeout` seconds with the GIL released: `(0, [RecordBatch, ...], run)`
    /// (the zero-copy pieces of one output batch, then `None` or `(RecordBatch, rows)`: the
    /// next batches of the same input batch as one, for the caller to cut into batches of
    /// `rows` rows; see `BatchStream::take_rest_of_run`), `(1, None, None)` while nothing is
    /// ready, `(2, None, None)` at the end; raises the run's error.
    fn poll<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Polled<'py>> {
        let (polled, rest_of_run) = py.detach(|| {
            let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
            let polled = stream.next_timeout(Duration::from_secs_f64(timeout.max(0.0)));
            let rest_of_run = match polled {
                Ok(Poll::Batch(_)) => stream.take_rest_of_run(),
                _ => None,
            };
            (polled, rest_of_run)
        });
        match polled {
            Ok(Poll::Batch(pieces)) => {
                let list = PyList::empty(py);
                for b in pieces {
                    list.append(b.to_pyarrow(py)?)?;
                }
                let rest_of_run = rest_of_run
                    .map(|(batch, each)| Ok::<_, PyErr>((batch.to_pyarrow(py)?, each)))
                    .transpose()?;
                Ok((0, Some(list), rest_of_run))
            }
            Ok(Poll::Pending) => Ok((1, None, None)),
            Ok(Poll::Done) => Ok((2, None, None)),
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
                if !stats.dead_letter_files.is_empty() {
                    let dead = &stats.dead_letter_files;
                    d.set_item("dead_letter_rows", dead.iter().map(|f| f.rows).sum::<u64>())?;
                    let paths: Vec<String> = dead.iter().map(|f| f.path.clone()).collect();
                    d.set_item("dead_letter_paths", paths)?;
                }
                if let Some(r) = stats.resume {
                    let resume = PyDict::new(py);
                    resume.set_item("commits_recovered", r.report.commits_recovered)?;
                    resume.set_item("ids_done_before", r.report.ids_done)?;
                    resume.set_item("files_done_before", r.report.files_done)?;
                    resume.set_item("input_rows_done_before", r.report.input_rows_done)?;
                    resume.set_item("files_changed", r.report.files_changed)?;
                    resume.set_item("rows_skipped_by_id", r.rows_skipped_by_id)?;
                    resume.set_item("rows_skipped_by_position", r.rows_skipped_by_position)?;
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
