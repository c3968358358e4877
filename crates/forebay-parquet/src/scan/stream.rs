//! What a scan yields: batches with their provenance, as a stream or an iterator.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use futures::Stream;
use tokio::sync::mpsc;

/// Where a batch came from. Lets the engine skip finished work on resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchProvenance {
    /// The file's URI or absolute path.
    pub file: Arc<str>,
    /// Position of the file in the dataset's file list.
    pub file_index: usize,
    /// Row group within the file.
    pub row_group: usize,
    /// Index (within the file) of the row group's first row.
    pub row_group_first_row: u64,
    /// Index (within the file) of the batch's first row. Rows of an unfiltered batch are
    /// consecutive from here. `None` when a filter or page skipping removed rows, since the
    /// batch's rows are then not consecutive.
    pub first_row: Option<u64>,
    /// Ordinal of this batch among those of its row group.
    pub batch_index: usize,
}

/// A batch of the scan, or the error that ended it.
pub(super) type BatchResult = crate::error::Result<ProvenancedBatch>;

/// A decoded batch and where it came from.
#[derive(Debug, Clone)]
pub struct ProvenancedBatch {
    pub batch: RecordBatch,
    pub provenance: BatchProvenance,
}

/// Batches of a scan, in order. Use as a blocking [`Iterator`] from synchronous code or as
/// a [`Stream`] from async code. Dropping it cancels the scan.
pub struct ScanStream {
    pub(super) rx: mpsc::Receiver<BatchResult>,
    pub(super) schema: SchemaRef,
    pub(super) driver: tokio::task::JoinHandle<()>,
}

impl ScanStream {
    /// The schema of every batch.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Next batch, waiting for it (not for use on an async runtime's thread).
    pub fn next_blocking(&mut self) -> Option<BatchResult> {
        futures::executor::block_on(self.rx.recv())
    }
}

impl Drop for ScanStream {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Iterator for ScanStream {
    type Item = BatchResult;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_blocking()
    }
}

impl Stream for ScanStream {
    type Item = BatchResult;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// Plain batches, as an Arrow [`RecordBatchReader`](arrow_array::RecordBatchReader)
/// (what the Arrow C stream interface exports).
pub struct RecordBatchIter(pub ScanStream);

impl Iterator for RecordBatchIter {
    type Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0
            .next_blocking()
            .map(|r| r.map(|p| p.batch).map_err(Into::into))
    }
}

impl arrow_array::RecordBatchReader for RecordBatchIter {
    fn schema(&self) -> SchemaRef {
        self.0.schema()
    }
}
