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

/// Batches of a scan, in order: a [`Stream`] for async code, or, through
/// [`blocking_iter`](Self::blocking_iter), an [`Iterator`] for threads that may block.
/// Dropping it cancels the scan.
///
/// ```no_run
/// use futures::StreamExt;
/// # async fn run() -> forebay_parquet::Result<()> {
/// use forebay_parquet::{DatasetSource, ParquetDataset};
/// let dataset = ParquetDataset::builder(DatasetSource::uris(["data/"]))
///     .build_async()
///     .await?;
/// let mut batches = dataset.scan();
/// while let Some(batch) = batches.next().await {
///     let batch = batch?;
///     println!("{} rows of {}", batch.batch.num_rows(), batch.provenance.file);
/// }
/// # Ok(()) }
/// // From a plain thread: for batch in dataset.scan().blocking_iter() { ... }
/// ```
pub struct ScanStream {
    rx: mpsc::Receiver<BatchResult>,
    schema: SchemaRef,
    driver: tokio::task::JoinHandle<()>,
    /// Rows still to yield under a limit (None: no limit).
    remaining: Option<u64>,
}

impl ScanStream {
    pub(super) fn new(
        rx: mpsc::Receiver<BatchResult>,
        schema: SchemaRef,
        driver: tokio::task::JoinHandle<()>,
        limit: Option<u64>,
    ) -> Self {
        ScanStream {
            rx,
            schema,
            driver,
            remaining: limit,
        }
    }

    /// `item` under the limit: a batch cut to the rows still wanted; none once the limit is
    /// reached (the driver is stopped then).
    fn limited(&mut self, item: Option<BatchResult>) -> Option<BatchResult> {
        let Some(remaining) = self.remaining.as_mut() else {
            return item;
        };
        if *remaining == 0 {
            return None;
        }
        let Some(Ok(mut batch)) = item else {
            return item;
        };
        let rows = batch.batch.num_rows() as u64;
        if rows >= *remaining {
            batch.batch = batch.batch.slice(0, *remaining as usize);
            *remaining = 0;
            self.driver.abort();
            self.rx.close();
        } else {
            *remaining -= rows;
        }
        Some(Ok(batch))
    }

    fn limit_reached(&self) -> bool {
        self.remaining == Some(0)
    }

    /// The schema of every batch.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Next batch, waiting for it. On a worker of a multi-threaded tokio runtime the
    /// runtime is told this thread blocks; on the thread of a current-thread runtime that
    /// also runs the scan it would wait forever: await the [`Stream`] there.
    pub fn next_blocking(&mut self) -> Option<BatchResult> {
        if self.limit_reached() {
            return None;
        }
        let rx = &mut self.rx;
        let mut wait = || futures::executor::block_on(rx.recv());
        let item = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            _ => wait(),
        };
        self.limited(item)
    }

    /// The batches as a blocking [`Iterator`] (see [`next_blocking`](Self::next_blocking)).
    pub fn blocking_iter(self) -> BlockingScan {
        BlockingScan(self)
    }
}

/// A [`ScanStream`] as a blocking [`Iterator`]: [`ScanStream::blocking_iter`].
pub struct BlockingScan(ScanStream);

impl BlockingScan {
    /// The schema of every batch.
    pub fn schema(&self) -> SchemaRef {
        self.0.schema()
    }
}

impl Iterator for BlockingScan {
    type Item = BatchResult;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_blocking()
    }
}

impl Drop for ScanStream {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Stream for ScanStream {
    type Item = BatchResult;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.limit_reached() {
            return Poll::Ready(None);
        }
        let item = std::task::ready!(self.rx.poll_recv(cx));
        Poll::Ready(self.limited(item))
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
