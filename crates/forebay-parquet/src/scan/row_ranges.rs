//! Reading chosen rows of chosen row groups, in the caller's order: what a training stream
//! that visits the dataset in a shuffled order of blocks needs (a block is a run of rows of
//! one row group).
//!
//! ```text
//!  row_group_layout() ──► [FileRowGroups: rows of each row group]   (every footer, in parallel)
//!
//!  scan_row_ranges([RowRange{file, row group, rows}, ...])
//!        │ in the given order, ≤ prefetch decoding at once
//!        ▼
//!   a whole row group ──► read as a plain scan reads it (forebay's flat decoders)
//!   part of one       ──► a row selection: with the page index (`for_row_ranges`), only
//!                         the pages holding those rows are fetched and decoded; a file
//!                         without one has its pages located once per row group
//!                         (`page_locations`), to the same effect
//!        ▼
//!   ScanStream: each range's rows, in order, ranges in the order given
//! ```
//!
//! Ranges read rows as the file holds them: a dataset with a filter or a row filter is
//! refused (rows would be dropped, and positions would no longer mean rows).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use futures::StreamExt;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use tokio::sync::{mpsc, Semaphore};

use super::accounting::{decoded_bytes_estimate, Admission, Charges};
use super::driver::{drain_in_order, forward_next, run_unit};
use super::stream::BatchResult;
use super::{DatasetInner, ParquetDataset, ScanStream, Unit};
use crate::error::{ParquetError, Result};

/// Rows `rows` (offsets within the row group) of row group `row_group` of the dataset's file
/// `file_index`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowRange {
    pub file_index: usize,
    pub row_group: usize,
    pub rows: Range<u64>,
}

/// A file of the dataset and the number of rows of each of its row groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRowGroups {
    pub file_index: usize,
    /// The file's URI or absolute path.
    pub uri: Arc<str>,
    /// Its size in bytes.
    pub size: u64,
    /// Rows of each row group, in file order.
    pub row_group_rows: Vec<u64>,
    /// Estimated decoded (Arrow) bytes of the selected columns of each row group.
    pub row_group_bytes: Vec<u64>,
    /// Estimated decoded bytes of all the columns of each row group, whichever are selected:
    /// what a layout that must not depend on the selection (a training order) sizes by.
    pub row_group_all_bytes: Vec<u64>,
}

impl ParquetDataset {
    /// Every file's row groups and their row counts (each footer read once, in parallel).
    /// Skips and filters are not applied: this is the dataset as stored.
    pub fn row_group_layout(&self) -> Result<Vec<FileRowGroups>> {
        let inner = self.inner.clone();
        self.block_on(async move { row_group_layout(inner).await })
    }

    /// The same files and options, for [`scan_row_ranges`](Self::scan_row_ranges): as if
    /// built with [`for_row_ranges`](crate::ParquetDatasetBuilder::for_row_ranges)
    /// (footers cached without their page index are read again, with it).
    pub fn for_row_ranges(&self) -> ParquetDataset {
        if self.inner.options.for_row_ranges {
            return self.clone();
        }
        let mut options = self.inner.options.clone();
        options.for_row_ranges = true;
        let dataset = self.with_options(options);
        dataset.inner.opened.lock().expect("cache lock").clear();
        dataset
    }

    /// Stream the rows of `ranges`, range after range in the given order (a range's batches
    /// hold its rows in file order). A dataset built with
    /// [`for_row_ranges`](crate::ParquetDatasetBuilder::for_row_ranges) reads only the
    /// pages a partial range needs. Refused (the stream's first item is an error) when the
    /// dataset has a filter or a row filter, or a range is outside its row group.
    pub fn scan_row_ranges(&self, ranges: Vec<RowRange>) -> ScanStream {
        let (tx, rx) = mpsc::channel(2);
        let inner = self.inner.clone();
        let driver = self
            .inner
            .options
            .runtime_handle()
            .spawn(drive_ranges(inner, ranges, tx));
        ScanStream::new(rx, self.schema(), driver, self.inner.options.limit)
    }
}

async fn row_group_layout(inner: Arc<DatasetInner>) -> Result<Vec<FileRowGroups>> {
    // Files whose partition values the filter rules out are not part of the dataset here.
    let files = (0..inner.files.len())
        .filter(|&i| !inner.excluded_by_partition(i))
        .collect();
    let opened = inner.open_in_order(files);
    futures::pin_mut!(opened);
    let mut layout = Vec::with_capacity(inner.files.len());
    while let Some(file) = opened.next().await {
        let file = file?;
        let footer = file.reader_meta.metadata();
        let groups = footer.row_groups();
        layout.push(FileRowGroups {
            file_index: file.index,
            uri: file.entry.uri.clone(),
            size: file.entry.size,
            row_group_rows: groups.iter().map(|g| g.num_rows().max(0) as u64).collect(),
            row_group_bytes: groups
                .iter()
                .map(|g| {
                    g.columns()
                        .iter()
                        .enumerate()
                        .filter(|(leaf, _)| file.projection.leaf_included(*leaf))
                        .map(|(_, c)| decoded_bytes_estimate(c))
                        .sum()
                })
                .collect(),
            row_group_all_bytes: groups
                .iter()
                .map(|g| g.columns().iter().map(decoded_bytes_estimate).sum())
                .collect(),
        });
    }
    Ok(layout)
}

async fn drive_ranges(
    inner: Arc<DatasetInner>,
    ranges: Vec<RowRange>,
    out: mpsc::Sender<BatchResult>,
) {
    // A filter decided by partition values keeps whole files: their rows are the file's.
    let rows_filtered = inner.options.filter.is_some() && !inner.filter_keeps_whole_files();
    if rows_filtered || inner.options.row_filter.is_some() {
        let _ = out
            .send(Err(ParquetError::InvalidArgument(
                "reading row ranges of a dataset with a filter: a range's rows must be the \
                 file's rows; build the dataset without a filter, or with one on hive \
                 partition columns only"
                    .into(),
            )))
            .await;
        return;
    }
    let permits = Arc::new(Semaphore::new(inner.threads));
    let mut in_flight: VecDeque<mpsc::Receiver<BatchResult>> = VecDeque::new();
    let mut charges = Charges::new(&inner);
    let mut ranges = ranges.into_iter().peekable();
    loop {
        while in_flight.len() < inner.prefetch {
            let Some(range) = ranges.peek() else { break };
            let range_rows = (range.rows.end - range.rows.start).max(1) as usize;
            let (tx, rx) = mpsc::channel(2);
            match unit_of(&inner, range).await {
                Ok((file, unit)) => {
                    match charges.admit(&file, &unit, in_flight.is_empty()) {
                        Admission::Granted(bytes) => charges.started(bytes),
                        Admission::Wait => break, // the oldest range handed on first
                        Admission::Refused(err) => {
                            drain_in_order(&mut in_flight, &out).await;
                            let _ = out.send(Err(err)).await;
                            return;
                        }
                    }
                    ranges.next();
                    in_flight.push_back(rx);
                    tokio::spawn(run_unit(
                        inner.clone(),
                        file,
                        unit,
                        None,
                        None,
                        // Decoders size their buffers for a batch: no bigger than the range.
                        inner.options.batch_size.min(range_rows),
                        tx,
                        permits.clone(),
                    ));
                }
                Err(err) => {
                    ranges.next();
                    charges.started(0);
                    in_flight.push_back(rx);
                    let _ = tx.send(Err(err)).await;
                }
            }
        }
        if !forward_next(&mut in_flight, &mut charges, &out).await {
            return;
        }
    }
}

/// The unit that reads `range`: its file opened (footer from the cache), a whole row group
/// or a selection of its rows.
async fn unit_of(
    inner: &Arc<DatasetInner>,
    range: &RowRange,
) -> Result<(Arc<super::OpenedFile>, Unit)> {
    let Some(entry) = inner.files.get(range.file_index) else {
        return Err(ParquetError::InvalidArgument(format!(
            "row range of file {}: the dataset has {} files",
            range.file_index,
            inner.files.len()
        )));
    };
    let file = inner.open(range.file_index).await?;
    let footer = file.reader_meta.metadata();
    let groups = footer.row_groups();
    let Some(group) = groups.get(range.row_group) else {
        return Err(ParquetError::InvalidArgument(format!(
            "{}: row group {} asked for, the file has {}",
            entry.uri,
            range.row_group,
            groups.len()
        )));
    };
    let rows = group.num_rows().max(0) as u64;
    if range.rows.start >= range.rows.end || range.rows.end > rows {
        return Err(ParquetError::InvalidArgument(format!(
            "{}: rows {:?} of row group {} asked for, it has {rows}",
            entry.uri, range.rows, range.row_group
        )));
    }
    let first_row: u64 = groups[..range.row_group]
        .iter()
        .map(|g| g.num_rows().max(0) as u64)
        .sum();
    let selection = if range.rows == (0..rows) {
        None
    } else {
        let mut selectors = Vec::with_capacity(3);
        if range.rows.start > 0 {
            selectors.push(RowSelector::skip(range.rows.start as usize));
        }
        selectors.push(RowSelector::select(
            (range.rows.end - range.rows.start) as usize,
        ));
        if range.rows.end < rows {
            selectors.push(RowSelector::skip((rows - range.rows.end) as usize));
        }
        Some(RowSelection::from(selectors))
    };
    let unit = Unit::new(&file, range.row_group, first_row, selection);
    Ok((file, unit))
}
