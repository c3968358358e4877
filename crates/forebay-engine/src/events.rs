//! Events of a run, for logging (the Python package forwards them to `logging`).

use std::sync::Arc;

/// Something that happened during a run.
#[derive(Debug, Clone, PartialEq)]
pub enum PipelineEvent {
    /// The run started with these stages.
    Started {
        stages: Vec<String>,
        memory_limit: u64,
    },
    /// A worker process started.
    WorkerStarted { stage: String, pid: u32 },
    /// A worker process died; `retrying` says whether its batch runs again.
    WorkerDied {
        stage: String,
        pid: u32,
        how: String,
        retrying: bool,
    },
    /// Batches moved out of memory (into the object store, or on to disk).
    Spilled { stage: String, bytes: u64 },
    /// An output file was published under its final name.
    FileWritten { path: String, rows: u64, bytes: u64 },
    /// Something the user should know, though the run goes on (shown as a warning).
    Warning { message: String },
    /// The run ended (successfully or not).
    Finished {
        rows: u64,
        seconds: f64,
        error: Option<String>,
    },
}

/// Receives events; called from the engine's threads.
pub type EventSink = Arc<dyn Fn(&PipelineEvent) + Send + Sync>;
