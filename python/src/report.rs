//! What a run reports, as Python values: its statistics as dicts, its events as
//! `(level, text)` pairs for the Python side to log.

use std::sync::{Arc, Mutex};

use forebay_engine::{PipelineEvent, RunStats};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

pub(crate) fn stats_dict<'py>(py: Python<'py>, stats: &RunStats) -> PyResult<Bound<'py, PyDict>> {
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
        sd.set_item("rows_errored", s.rows_errored)?;
        let errored = PyList::empty(py);
        for row in &s.errored {
            let rd = PyDict::new(py);
            rd.set_item("file", &row.file)?;
            rd.set_item("row_group", row.row_group)?;
            rd.set_item("row", row.row)?;
            rd.set_item("error_type", &row.error_type)?;
            rd.set_item("message", &row.message)?;
            errored.append(rd)?;
        }
        sd.set_item("errored", errored)?;
        stages.append(sd)?;
    }
    d.set_item("stages", stages)?;
    Ok(d)
}

/// Events of a run, collected for the Python side to log.
#[derive(Clone, Default)]
pub(crate) struct EventLog(pub(crate) Arc<Mutex<Vec<PipelineEvent>>>);

impl EventLog {
    pub(crate) fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
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
