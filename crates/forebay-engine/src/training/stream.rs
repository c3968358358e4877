//! Reading a share of an epoch: the windows its batches touch, each permuted whole by the
//! reader thread, in the order the batches first need them, while the consumer cuts
//! batches out of the ones before.
//!
//! ```text
//!  reader thread:  window t ──scan_row_ranges(its blocks)──► decoded batches
//!                  ──interleave(window permutation), column by column──► the window in
//!                    sequence order (charged to the pool; the decoded batches let go)
//!                  ──rendezvous (a channel of capacity 0)──► consumer
//!                  (in file order, no shuffle: the decoded batches go as they are)
//!  consumer:       batch i's positions ──EpochOrder::pieces──► slices of windows (zero-copy;
//!                  a batch across two windows is the concatenation of two slices); a window
//!                  is let go after the last batch that takes from it
//! ```
//!
//! The permutation is applied to a whole window at once, a column at a time, so that its
//! random reads stay within one column of one window (a few MB, in cache), not across all
//! columns of the window per output row: a gather per output batch ran at a third of the
//! speed. Alive at most: the windows batches are taken from (one, two while a batch spans
//! two; with lanes, one per lane the share takes from), and the one being read with its
//! permuted copy, which `start` checks fit the memory limit. A batch handed out is a slice of its window: holding it
//! keeps that window's buffers alive.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, SchemaRef};
use crossbeam_channel::{Receiver, Sender};
use forebay_parquet::ParquetDataset;

use super::deal::Share;
use super::order::EpochOrder;
use crate::error::{EngineError, Result};
use crate::memory::{Admission, CancelToken, MemoryConsumer, MemoryPool, Reservation};

/// A window read into memory, its rows in sequence order.
struct Window {
    index: usize,
    /// Its samples in sequence order: one permuted batch, or (in file order) the batches as
    /// decoded.
    batches: Vec<RecordBatch>,
    /// Sample of the window each of `batches` starts at.
    starts: Vec<u64>,
    _reservations: Vec<Reservation>,
}

impl Window {
    /// Zero-copy slices holding samples `offset..offset + len` of the window.
    fn slices(&self, offset: u64, len: u64, out: &mut Vec<RecordBatch>) {
        let end = offset + len;
        let first = self.starts.partition_point(|&s| s <= offset) - 1;
        for (batch, &start) in self.batches[first..].iter().zip(&self.starts[first..]) {
            if start >= end {
                break;
            }
            let from = offset.max(start);
            let to = end.min(start + batch.num_rows() as u64);
            out.push(batch.slice((from - start) as usize, (to - from) as usize));
        }
    }
}

/// One consumer's batches of one epoch, from a position in it (see the module docs).
pub struct EpochStream {
    order: Arc<EpochOrder>,
    share: Share,
    consumed: u64,
    schema: SchemaRef,
    next_batch: u64,
    batches: u64,
    /// For each window read, in the order read, the last batch that takes from it.
    last_uses: std::collections::VecDeque<u64>,
    rows_read: u64,
    windows: Option<Receiver<Result<Window>>>,
    /// Windows received and still to be taken from (one without lanes; with lanes, one
    /// per lane of this share), each with the last batch that takes from it.
    alive: Vec<(Window, u64)>,
    cancel: CancelToken,
    reader: Option<JoinHandle<()>>,
}

impl EpochStream {
    /// Start reading `share`'s batches of the epoch `order` from sample `consumed` on.
    /// `dataset` is the dataset `order`'s layout was made from (built `for_row_ranges`).
    /// Fails when the windows alive at once (see the module docs) do not fit in `pool`'s
    /// limit.
    pub fn start(
        dataset: ParquetDataset,
        order: Arc<EpochOrder>,
        share: Share,
        consumed: u64,
        pool: &MemoryPool,
    ) -> Result<EpochStream> {
        share.validate()?;
        let rows = order.rows();
        let batches = if rows == 0 {
            0
        } else {
            share.worker_batches(rows, consumed)
        };
        let reads = plan_reads(&order, &share, rows, consumed, batches);
        // Memory at its most: the windows alive when the next one is being read (from
        // when the one before it is first taken from), and the next one with its permuted
        // copy.
        let mut peak = reads
            .first()
            .map_or(0, |r| 2 * order.window_bytes(r.window));
        let mut alive_bytes = 0u64;
        let mut ends: Vec<(u64, u64)> = Vec::new(); // (last use, bytes) of alive windows
        for (n, read) in reads.iter().enumerate() {
            ends.retain(|&(last, bytes)| {
                let keep = last >= read.first_use;
                if !keep {
                    alive_bytes -= bytes;
                }
                keep
            });
            let bytes = order.window_bytes(read.window);
            alive_bytes += bytes;
            ends.push((read.last_use, bytes));
            let next = reads
                .get(n + 1)
                .map_or(0, |next| order.window_bytes(next.window));
            peak = peak.max(alive_bytes + 2 * next);
        }
        if peak > pool.limit() as u64 {
            let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
            let largest = reads
                .iter()
                .map(|r| order.window_bytes(r.window))
                .max()
                .unwrap_or(0);
            return Err(EngineError::InvalidArgument(format!(
                "the shuffle windows need ~{:.1} MiB at times (decoded; windows of up to \
                 ~{:.1} MiB: the ones batches are taken from, one per lane this rank takes \
                 from, and the one read ahead with its permuted copy): more than the memory \
                 limit of {:.1} MiB. Lower window_rows or raise the memory limit",
                mib(peak),
                mib(largest),
                mib(pool.limit() as u64)
            )));
        }
        let rows_read = reads.iter().map(|r| order.window_rows(r.window)).sum();
        let last_uses = reads.iter().map(|r| r.last_use).collect();
        let needed = reads.iter().map(|r| r.window).collect();
        let schema = dataset.schema();
        let cancel = CancelToken::new();
        let (tx, rx) = crossbeam_channel::bounded(0);
        let reader = {
            let order = order.clone();
            let holder = pool.consumer("training stream (shuffle windows)");
            let cancel = cancel.clone();
            std::thread::Builder::new()
                .name(forebay_io::threads::thread_name("training-read"))
                .spawn(move || read_windows(dataset, order, needed, holder, cancel, tx))
                .map_err(|e| {
                    EngineError::InvalidArgument(format!("could not start a thread: {e}"))
                })?
        };
        Ok(EpochStream {
            order,
            share,
            consumed,
            schema,
            next_batch: 0,
            batches,
            last_uses,
            rows_read,
            windows: Some(rx),
            alive: Vec::new(),
            cancel,
            reader: Some(reader),
        })
    }

    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Batches this stream yields in all.
    pub fn len(&self) -> u64 {
        self.batches
    }

    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }

    /// Rows of the windows this stream reads (every row of a window is decoded): the
    /// dataset's rows for one rank without lanes; with lanes, about its share of them.
    pub fn rows_read(&self) -> u64 {
        self.rows_read
    }

    fn window(&mut self, index: usize) -> Result<&Window> {
        if let Some(at) = self.alive.iter().position(|(w, _)| w.index == index) {
            return Ok(&self.alive[at].0);
        }
        let received = self.windows.as_ref().and_then(|rx| rx.recv().ok());
        let window = match received {
            Some(window) => window?,
            None => {
                return Err(EngineError::InvalidArgument(
                    "the training stream's reader stopped".into(),
                ))
            }
        };
        if window.index != index {
            return Err(EngineError::InvalidArgument(format!(
                "the training stream's reader sent window {} where {index} was due",
                window.index
            )));
        }
        let last_use = self.last_uses.pop_front().unwrap_or(u64::MAX);
        self.alive.push((window, last_use));
        Ok(&self.alive.last().expect("just pushed").0)
    }

    fn next_batch(&mut self) -> Result<RecordBatch> {
        let rows = self.order.rows();
        let mut pieces = Vec::with_capacity(2);
        for range in self
            .share
            .batch_positions(rows, self.consumed, self.next_batch)
        {
            self.order.pieces(range, &mut pieces);
        }
        let mut slices: Vec<RecordBatch> = Vec::with_capacity(pieces.len());
        for piece in pieces {
            self.window(piece.window)?.slices(
                piece.offsets.start,
                piece.offsets.end - piece.offsets.start,
                &mut slices,
            );
        }
        // Let go of the windows no later batch takes from (until read again).
        let done = self.next_batch;
        self.alive.retain(|&(_, last_use)| last_use != done);
        self.next_batch += 1;
        match slices.len() {
            1 => Ok(slices.pop().expect("one slice")),
            _ => {
                arrow_select::concat::concat_batches(&self.schema, &slices).map_err(assembly_failed)
            }
        }
    }
}

impl Iterator for EpochStream {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next_batch >= self.batches {
            return None;
        }
        let batch = self.next_batch();
        if batch.is_err() {
            self.next_batch = self.batches; // the error ends the stream
            self.stop();
        }
        Some(batch)
    }
}

impl EpochStream {
    fn stop(&mut self) {
        self.cancel.cancel();
        self.windows = None; // the reader's send fails
        self.alive.clear();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl Drop for EpochStream {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One read of a window: the first and the last batch that take from it.
struct WindowRead {
    window: usize,
    first_use: u64,
    last_use: u64,
}

/// The windows `batches` batches of `share` take from, in the order first needed. A window
/// is read once and held from its first batch to its last, except that a padded last batch
/// which wraps to the start of the epoch (after other windows) reads the first windows
/// again rather than holding them all epoch.
fn plan_reads(
    order: &EpochOrder,
    share: &Share,
    rows: u64,
    consumed: u64,
    batches: u64,
) -> Vec<WindowRead> {
    let mut reads: Vec<WindowRead> = Vec::new();
    // The read of each window taking samples so far, and in which pass over the epoch.
    let mut open: HashMap<usize, (usize, u32)> = HashMap::new();
    let (mut pass, mut last_start) = (0u32, 0u64);
    let mut pieces = Vec::new();
    for i in 0..batches {
        for range in share.batch_positions(rows, consumed, i) {
            if range.start < last_start {
                pass += 1; // wrapped to the epoch's start
            }
            last_start = range.start;
            pieces.clear();
            order.pieces(range, &mut pieces);
            for piece in &pieces {
                match open.get_mut(&piece.window) {
                    // Still in use: the same pass, or the batch right after its last.
                    Some((at, read_pass)) if *read_pass == pass || reads[*at].last_use + 1 >= i => {
                        reads[*at].last_use = i;
                        *read_pass = pass;
                    }
                    _ => {
                        open.insert(piece.window, (reads.len(), pass));
                        reads.push(WindowRead {
                            window: piece.window,
                            first_use: i,
                            last_use: i,
                        });
                    }
                }
            }
        }
    }
    reads
}

/// The rows `indices` of `batches`, each column gathered on its own, the columns shared
/// among the cores (the gather is most of a shuffled stream's work).
fn permute_columns(
    schema: SchemaRef,
    batches: &[RecordBatch],
    indices: &[(usize, usize)],
) -> Result<RecordBatch> {
    let columns = schema.fields().len();
    if columns == 0 {
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(indices.len()));
        return RecordBatch::try_new_with_options(schema, Vec::new(), &options)
            .map_err(assembly_failed);
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(columns)
        .max(1);
    let gather = |column: usize| {
        let sources: Vec<&dyn Array> = batches.iter().map(|b| b.column(column).as_ref()).collect();
        arrow_select::interleave::interleave(&sources, indices)
    };
    let mut gathered: Vec<Option<std::result::Result<ArrayRef, ArrowError>>> =
        (0..columns).map(|_| None).collect();
    std::thread::scope(|scope| {
        let chunks: Vec<_> = gathered
            .chunks_mut(columns.div_ceil(threads))
            .enumerate()
            .map(|(i, chunk)| {
                let first = i * columns.div_ceil(threads);
                let gather = &gather;
                scope.spawn(move || {
                    for (k, slot) in chunk.iter_mut().enumerate() {
                        *slot = Some(gather(first + k));
                    }
                })
            })
            .collect();
        for chunk in chunks {
            let _ = chunk.join();
        }
    });
    let arrays = gathered
        .into_iter()
        .map(|a| {
            a.unwrap_or_else(|| Err(ArrowError::ComputeError("a gather thread panicked".into())))
        })
        .collect::<std::result::Result<Vec<ArrayRef>, ArrowError>>()
        .map_err(assembly_failed)?;
    RecordBatch::try_new_with_options(
        schema,
        arrays,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(indices.len())),
    )
    .map_err(assembly_failed)
}

fn assembly_failed(e: arrow_schema::ArrowError) -> EngineError {
    EngineError::InvalidArgument(format!(
        "training stream: putting a window in order, or joining the two windows a batch \
         spans, failed: {e}"
    ))
}

/// The reader thread: each needed window, read whole and handed over.
fn read_windows(
    dataset: ParquetDataset,
    order: Arc<EpochOrder>,
    needed: Vec<usize>,
    holder: MemoryConsumer,
    cancel: CancelToken,
    tx: Sender<Result<Window>>,
) {
    for index in needed {
        let window = read_window(&dataset, &order, index, &holder, &cancel);
        let failed = window.is_err();
        if tx.send(window).is_err() || failed {
            return;
        }
    }
}

fn read_window(
    dataset: &ParquetDataset,
    order: &EpochOrder,
    index: usize,
    holder: &MemoryConsumer,
    cancel: &CancelToken,
) -> Result<Window> {
    cancel.check()?;
    let mut batches = Vec::new();
    let mut reservations = Vec::new();
    let mut starts = Vec::new();
    let mut rows = 0u64;
    for batch in dataset
        .scan_row_ranges(order.window_blocks(index))
        .blocking_iter()
    {
        let batch = batch?.batch;
        if batch.num_rows() == 0 {
            continue;
        }
        // Charged, never waited for: the rendezvous with the consumer is what bounds the
        // windows alive, and `start` checked that they fit (waiting here for room the
        // window's own first batches take could never end).
        reservations.push(holder.reserve_batch(&batch, Admission::Now)?);
        starts.push(rows);
        rows += batch.num_rows() as u64;
        batches.push(batch);
    }
    let expected = order.window_rows(index);
    if rows != expected {
        return Err(EngineError::InvalidArgument(format!(
            "shuffle window {index} of epoch {}: read {rows} rows where the files' footers \
             promise {expected} (did the files change while the stream ran?)",
            order.epoch()
        )));
    }
    if order.is_file_order() {
        return Ok(Window {
            index,
            batches,
            starts,
            _reservations: reservations,
        });
    }
    cancel.check()?;
    // (batch, row) of each sample, in sequence order.
    let mut batch_of_row = Vec::with_capacity(rows as usize);
    for (b, batch) in batches.iter().enumerate() {
        batch_of_row.extend((0..batch.num_rows()).map(|r| (b, r)));
    }
    let indices: Vec<(usize, usize)> = order
        .window_permutation(index)
        .iter()
        .map(|&row| batch_of_row[row as usize])
        .collect();
    drop(batch_of_row);
    let permuted = permute_columns(dataset.schema(), &batches, &indices)?;
    let reservation = holder.reserve_batch(&permuted, Admission::Now)?;
    drop(reservations);
    Ok(Window {
        index,
        batches: vec![permuted],
        starts: vec![0],
        _reservations: vec![reservation],
    })
}
