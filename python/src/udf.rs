//! A Python map function as the engine's map workers: each engine thread gets its own
//! `forebay._udf.Runner`, the GIL held only inside each call, the next batch converted ahead
//! (see `lookahead`).

use std::sync::Arc;

use arrow_array::RecordBatch;
use forebay_engine::{MapFn, MapWorker, PrepareNext, StageFailure, WorkerContext};

use pyo3::prelude::*;

use crate::arrow_export::BatchExporter;
use crate::arrow_import::import_map_output;
use crate::errors::failure;
use crate::lookahead::{NextBatchPreparer, PreparedInputs};
use crate::thread_state::KeptThreadState;
use crate::udf_async::PyAsyncWorker;

/// A Python map function run on engine threads. `make_worker()` is called once per worker
/// and returns its `forebay._udf.Runner`: `prepare(pyarrow.RecordBatch)` makes the function's
/// input, `run(input)` calls the function, `finish(output)` turns what it returned into a list
/// of `pyarrow.RecordBatch`.
pub(crate) struct PyFunction {
    pub(crate) make_worker: Py<PyAny>,
}

pub(crate) struct PyFunctionWorker {
    prepare: Py<PyAny>,
    run: Py<PyAny>,
    finish: Py<PyAny>,
    /// `isolate(batch, error)`: with `on_error="skip"`, the outputs of the rows the function
    /// does not fail on and the errored rows (see `forebay_engine::errored`).
    isolate: Option<Py<PyAny>>,
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
        // An async function's runner keeps calls in flight (see `udf_async`).
        let runner = Python::attach(|py| -> PyResult<_> {
            let runner = self.make_worker.call0(py)?;
            let in_flight = match runner.getattr(py, "in_flight") {
                Ok(n) => Some(n.extract::<usize>(py)?),
                Err(_) => None,
            };
            Ok((runner, in_flight))
        })
        .map_err(failure)?;
        let runner = match runner {
            (runner, Some(in_flight)) => {
                return Ok(Box::new(PyAsyncWorker::new(
                    runner,
                    in_flight,
                    thread_state,
                )));
            }
            (runner, None) => runner,
        };
        let (prepare, run, finish, isolate) = Python::attach(|py| -> PyResult<_> {
            let isolates: bool = runner.getattr(py, "isolates")?.extract(py)?;
            Ok((
                runner.getattr(py, "prepare")?,
                runner.getattr(py, "run")?,
                runner.getattr(py, "finish")?,
                isolates
                    .then(|| runner.getattr(py, "isolate"))
                    .transpose()?,
            ))
        })
        .map_err(failure)?;
        Ok(Box::new(PyFunctionWorker {
            prepare,
            run,
            finish,
            isolate,
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
            let out = match (out, &self.isolate) {
                (Err(error), Some(isolate)) => {
                    let input = self.exporter.export(py, &batch)?;
                    isolate.call1(py, (input, error.value(py)))?
                }
                (out, _) => self.finish.call1(py, (out?,))?,
            };
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
            self.isolate = None;
            self.exporter = BatchExporter::default();
        });
    }
}
