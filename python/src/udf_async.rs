//! An async Python map function as an engine worker with many calls in flight: the glue
//! between the engine's `submit` / `completed` and `forebay._async_udf.AsyncRunner`, whose
//! event loop runs on this worker's thread while it waits for finished calls.

use std::collections::HashMap;
use std::time::Duration;

use arrow_array::RecordBatch;
use forebay_engine::{MapWorker, StageFailure, WorkerContext};

use pyo3::prelude::*;

use crate::arrow_export::BatchExporter;
use crate::arrow_import::import_map_output;
use crate::errors::failure;
use crate::thread_state::KeptThreadState;

/// One worker: its `AsyncRunner` and the input of each call in flight (outputs that are
/// slices of their input are validated as such; see `arrow_import`).
pub(crate) struct PyAsyncWorker {
    runner: Py<PyAny>,
    in_flight: usize,
    inputs: HashMap<u64, RecordBatch>,
    exporter: BatchExporter,
    /// Declared last: dropped after the Python objects.
    _thread_state: KeptThreadState,
}

impl PyAsyncWorker {
    pub(crate) fn new(
        runner: Py<PyAny>,
        in_flight: usize,
        thread_state: KeptThreadState,
    ) -> PyAsyncWorker {
        PyAsyncWorker {
            runner,
            in_flight,
            inputs: HashMap::new(),
            exporter: BatchExporter::default(),
            _thread_state: thread_state,
        }
    }
}

impl MapWorker for PyAsyncWorker {
    fn call(
        &mut self,
        _: RecordBatch,
        _: &WorkerContext<'_>,
    ) -> Result<Vec<RecordBatch>, StageFailure> {
        Err(StageFailure::BadOutput(
            "an async function's calls are submitted, not made one at a time".into(),
        ))
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn submit(
        &mut self,
        call: u64,
        batch: RecordBatch,
        _: &WorkerContext<'_>,
    ) -> Result<(), StageFailure> {
        Python::attach(|py| -> PyResult<()> {
            let input = self.exporter.export(py, &batch)?;
            self.runner.call_method1(py, "submit", (call, input))?;
            Ok(())
        })
        .map_err(failure)?;
        self.inputs.insert(call, batch);
        Ok(())
    }

    fn completed(
        &mut self,
        timeout: Duration,
        _: &WorkerContext<'_>,
    ) -> Result<Vec<(u64, Result<Vec<RecordBatch>, StageFailure>)>, StageFailure> {
        Python::attach(|py| -> PyResult<_> {
            let done = self
                .runner
                .call_method1(py, "completed", (timeout.as_secs_f64(),))?;
            let mut finished = Vec::new();
            for item in done.bind(py).try_iter()? {
                let (call, ok, value): (u64, bool, Bound<'_, PyAny>) = item?.extract()?;
                let input = self.inputs.remove(&call);
                let outcome = match (ok, input) {
                    (true, Some(input)) => value
                        .try_iter()
                        .and_then(|items| {
                            items
                                .map(|b| import_map_output(&b?, &input))
                                .collect::<PyResult<Vec<_>>>()
                        })
                        .map_err(failure),
                    (true, None) => Err(StageFailure::BadOutput(format!(
                        "the event loop finished call {call}, which it was not given"
                    ))),
                    (false, _) => Err(failure(PyErr::from_value(value))),
                };
                finished.push((call, outcome));
            }
            Ok(finished)
        })
        .map_err(failure)
    }

    fn close(&mut self) {
        // Cancel what still runs and close the loop, with the GIL held.
        Python::attach(|py| {
            let _ = self.runner.call_method0(py, "close");
            let _ = std::mem::replace(&mut self.runner, py.None());
            self.exporter = BatchExporter::default();
        });
        self.inputs.clear();
    }
}
