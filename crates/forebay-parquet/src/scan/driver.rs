//! The scan's driver: a file's row groups become units, up to `prefetch` of them decode at
//! once, and their batches are forwarded in order.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use super::accounting::{Admission, Charges};
use super::decode::{check_chunk_sizes, decode_unit};
use super::fetch_ahead::{decoded_bytes, fetch_unit, FetchDepth};
use super::runtime::panic_message;
use super::stream::BatchResult;
use super::{DatasetInner, OpenedFile, Unit};
use crate::error::{ParquetError, Result};
use crate::io::FetchedRanges;

/// Rows per batch of the scan's first unit (when `batch_size` is larger).
const FIRST_UNIT_BATCH_ROWS: usize = 8192;

/// A unit waiting for its turn to decode, with what was fetched for it already.
struct PendingUnit {
    file: Arc<OpenedFile>,
    unit: Unit,
    /// The whole file, when the footer request fetched it (a small remote file).
    whole_file: Option<Bytes>,
    /// Its column chunks, requested ahead of its decoding (see `fetch_ahead`).
    fetching: Option<JoinHandle<Result<FetchedRanges>>>,
    /// What it was charged to the host's pool ahead of its start (see `accounting`).
    charged: Option<usize>,
}

impl PendingUnit {
    fn needs_fetch(&self) -> bool {
        self.whole_file.is_none() && self.fetching.is_none()
    }
}

impl Drop for PendingUnit {
    /// A scan dropped (its consumer gone) stops the requests it made ahead.
    fn drop(&mut self) {
        if let Some(fetching) = &self.fetching {
            fetching.abort();
        }
    }
}

/// What a footer task gives the driver: the file opened (with its bytes if it was fetched
/// whole), or why not.
type OpenResult =
    std::result::Result<Result<(Arc<OpenedFile>, Option<Bytes>)>, tokio::task::JoinError>;

/// What the driver does with a file the footer tasks opened.
enum Opened {
    /// Its units (those not skipped) are pending.
    Planned,
    /// No more files.
    Done,
    /// The scan ends with this error, after the batches of earlier units.
    Failed(ParquetError),
}

impl Opened {
    /// Note in the driver's state that the files are done, or the error the scan ends with.
    fn note(self, files_done: &mut bool, failed: &mut Option<ParquetError>) {
        match self {
            Opened::Planned => {}
            Opened::Done => *files_done = true,
            Opened::Failed(err) => *failed = Some(err),
        }
    }
}

/// The scan driver: opens files ahead, keeps up to `prefetch` units decoding and, on object
/// stores, more fetching their data (as many as decoding needs, at most `fetch_ahead`: see
/// `FetchDepth`), and forwards their batches in order.
pub(super) async fn drive(
    inner: Arc<DatasetInner>,
    out: mpsc::Sender<BatchResult>,
    fetch_ahead: usize,
) {
    let decode_permits = Arc::new(Semaphore::new(inner.threads));
    let skip = inner.options.skip.clone();
    let wanted: Vec<usize> = (0..inner.files.len())
        .filter(|&i| match &skip {
            Some(s) if s.0.skip_file(&inner.files[i]) => {
                inner
                    .scan_metrics
                    .files_skipped
                    .fetch_add(1, Ordering::Relaxed);
                false
            }
            _ if inner.excluded_by_partition(i) => {
                inner
                    .scan_metrics
                    .files_pruned_by_partition
                    .fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => true,
        })
        .collect();
    let opening = futures::stream::iter(wanted)
        .map(|i| {
            let inner = inner.clone();
            tokio::spawn(async move { inner.open_for_scan(i).await })
        })
        .buffered(inner.files_opened_ahead(fetch_ahead));
    futures::pin_mut!(opening);
    // Units with their file's bytes when the file was fetched whole with its footer (held
    // until the file's units are decoded: at most the files opened ahead of the scan), or
    // with the requests made ahead for their column chunks.
    let mut pending_units: VecDeque<PendingUnit> = VecDeque::new();
    let mut in_flight: VecDeque<mpsc::Receiver<BatchResult>> = VecDeque::new();
    let mut files_done = false;
    // The scan's first unit decodes smaller batches: its first batch is what the whole
    // pipeline waits for, and it is decoded while the next units compete for the cores.
    let mut batch_rows = inner.options.batch_size.min(FIRST_UNIT_BATCH_ROWS);
    let plan = |opened: Option<OpenResult>, pending: &mut VecDeque<PendingUnit>| -> Opened {
        let (file, whole_file) = match opened {
            None => return Opened::Done,
            Some(Ok(Ok(opened))) => opened,
            Some(Ok(Err(err))) => return Opened::Failed(err),
            Some(Err(join)) => {
                return Opened::Failed(ParquetError::InvalidArgument(format!(
                    "footer task failed: {join}"
                )))
            }
        };
        for unit in inner.plan_units(&file, &inner.scan_metrics) {
            if let Some(s) = &skip {
                let footer = file.reader_meta.metadata();
                if s.0.skip_row_group_in(&file.entry, footer, unit.row_group) {
                    inner
                        .scan_metrics
                        .row_groups_skipped
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            pending.push_back(PendingUnit {
                file: file.clone(),
                unit,
                whole_file: whole_file.clone(),
                fetching: None,
                charged: None,
            });
        }
        Opened::Planned
    };

    // A file that failed to open ends the scan once the units of the files before it are
    // decoded and forwarded.
    let mut failed: Option<ParquetError> = None;
    let mut charges = Charges::new(&inner);
    let mut wanted = RowsWanted::new(&inner);
    let mut depth = FetchDepth::new(fetch_ahead);
    let mut depth_sized = false;
    loop {
        // Top up: launch units until `prefetch` are in flight, there are no more, the
        // units launched hold the rows a limit wants, or the host's pool wants units in
        // flight handed on first.
        while in_flight.len() < inner.prefetch && !wanted.reached() {
            if let Some(mut pending) = pending_units.pop_front() {
                let charged = match pending.charged.take() {
                    Some(bytes) => bytes,
                    None => {
                        let nothing_held = in_flight.is_empty()
                            && pending_units.iter().all(|p| p.charged.is_none());
                        match charges.admit(&pending.file, &pending.unit, nothing_held) {
                            Admission::Granted(bytes) => bytes,
                            Admission::Wait if in_flight.is_empty() => {
                                // Only units charged ahead hold memory: take their charges
                                // back (and stop their requests), then ask again.
                                for ahead in pending_units.iter_mut() {
                                    if let Some(bytes) = ahead.charged.take() {
                                        charges.release(bytes);
                                        if let Some(fetching) = ahead.fetching.take() {
                                            fetching.abort();
                                        }
                                    }
                                }
                                pending_units.push_front(pending);
                                continue;
                            }
                            Admission::Wait => {
                                pending_units.push_front(pending);
                                break;
                            }
                            Admission::Refused(err) => {
                                drain_in_order(&mut in_flight, &out).await;
                                let _ = out.send(Err(err)).await;
                                return;
                            }
                        }
                    }
                };
                charges.started(charged);
                wanted.launched(&pending);
                if let Some(fetching) = &pending.fetching {
                    depth.unit_started(fetching.is_finished());
                }
                let (tx, rx) = mpsc::channel(2);
                tokio::spawn(run_unit(
                    inner.clone(),
                    pending.file.clone(),
                    pending.unit.clone(),
                    pending.whole_file.take(),
                    pending.fetching.take(),
                    batch_rows,
                    tx,
                    decode_permits.clone(),
                ));
                batch_rows = inner.options.batch_size;
                in_flight.push_back(rx);
                continue;
            }
            if files_done || failed.is_some() {
                break;
            }
            plan(opening.next().await, &mut pending_units).note(&mut files_done, &mut failed);
        }
        // Ahead of decoding: request the data of the next units, opening more files as far
        // as their footers are read already (never waiting for one here; the wait below
        // wakes when the next one is).
        let mut footer_awaited = false;
        if !depth_sized {
            // Before the first unit fetched ahead: start as deep as the link needs.
            let first_remote = pending_units
                .iter()
                .find(|p| p.needs_fetch() && inner.fetch_ahead_for(&p.file, 1) > 0);
            if let Some(first) = first_remote {
                let bytes = decoded_bytes(&first.file, first.unit.row_group);
                depth.start_for_link(inner.io.link.round_trip(), bytes, inner.threads);
                depth_sized = true;
            }
        }
        while failed.is_none() && !wanted.reached() {
            // Units holding data or waiting for it (a small file's bytes count for each of
            // its units): what bounds the bytes held ahead.
            let mut ahead = pending_units.iter().filter(|p| !p.needs_fetch()).count();
            let mut rows_before = wanted.launched_rows;
            for pending in pending_units.iter_mut() {
                if wanted.covered_by(rows_before) {
                    break; // a limit has its rows in the units before this one
                }
                rows_before += unit_rows(pending);
                if !pending.needs_fetch() {
                    continue;
                }
                if ahead >= inner.fetch_ahead_for(&pending.file, depth.now()) {
                    break;
                }
                match charges.admit(&pending.file, &pending.unit, false) {
                    Admission::Granted(bytes) => pending.charged = Some(bytes),
                    _ => break, // the pool wants memory back first: fetch nothing more ahead
                }
                let (file, unit) = (&pending.file, &pending.unit);
                if unit.selection.is_some() {
                    break; // its decoder reads only the pages it selects
                }
                if check_chunk_sizes(&inner, file, &unit.file, unit.row_group).is_err() {
                    break; // its decoding will fail the scan: fetch nothing past it
                }
                pending.fetching = Some(fetch_unit(&inner, file, unit));
                ahead += 1;
            }
            let room = pending_units.iter().all(|p| !p.needs_fetch()) && ahead < depth.now();
            if files_done || !room {
                break;
            }
            let Some(opened) = opening.next().now_or_never() else {
                footer_awaited = true;
                break;
            };
            plan(opened, &mut pending_units).note(&mut files_done, &mut failed);
        }
        if pending_units.is_empty() {
            if let Some(err) = failed.take() {
                // Batches of earlier files first, then the error, in order.
                drain_in_order(&mut in_flight, &out).await;
                let _ = out.send(Err(err)).await;
                return;
            }
        }
        // Wait for the oldest unit's next batch, or, when units could be fetched ahead from
        // a file whose footer is still on its way, for that footer: on a slow link the
        // footers of the first files arrive while the first unit's data is still on the
        // way, and their units' requests should not wait for its first batch.
        let next = if footer_awaited && !in_flight.is_empty() {
            let waited = tokio::select! {
                opened = opening.next() => Waited::Footer(opened),
                next = next_of_oldest(&mut in_flight) => Waited::Batch(next),
            };
            match waited {
                Waited::Footer(opened) => {
                    plan(opened, &mut pending_units).note(&mut files_done, &mut failed);
                    continue;
                }
                Waited::Batch(next) => next,
            }
        } else {
            next_of_oldest(&mut in_flight).await
        };
        if !forward(next, &mut in_flight, &mut charges, &out).await {
            return;
        }
    }
}

/// What the driver's wait ended with.
enum Waited {
    Footer(Option<OpenResult>),
    Batch(Option<Option<BatchResult>>),
}

/// The rows a scan's limit wants ([`with_limit`](crate::ParquetDatasetBuilder::with_limit)),
/// against the rows of the units launched. Only without filters: rows are then known from
/// the footers before decoding.
struct RowsWanted {
    limit: Option<u64>,
    launched_rows: u64,
}

impl RowsWanted {
    fn new(inner: &DatasetInner) -> Self {
        let filtered = inner.options.filter.is_some() || inner.options.row_filter.is_some();
        RowsWanted {
            limit: inner.options.limit.filter(|_| !filtered),
            launched_rows: 0,
        }
    }

    fn covered_by(&self, rows: u64) -> bool {
        self.limit.is_some_and(|limit| rows >= limit)
    }

    fn reached(&self) -> bool {
        self.covered_by(self.launched_rows)
    }

    fn launched(&mut self, unit: &PendingUnit) {
        self.launched_rows += unit_rows(unit);
    }
}

/// Rows a unit yields (no filter): its page selection's, else its row group's.
fn unit_rows(unit: &PendingUnit) -> u64 {
    match &unit.unit.selection {
        Some(selection) => selection.row_count() as u64,
        None => unit
            .file
            .reader_meta
            .metadata()
            .row_group(unit.unit.row_group)
            .num_rows()
            .max(0) as u64,
    }
}

/// Forward the next batch of the oldest unit in flight (or let that unit go, and its charge,
/// when it is done). False when the scan ends: nothing in flight, an error forwarded, or the
/// consumer gone (dropping the receivers then cancels the units).
pub(super) async fn forward_next(
    in_flight: &mut VecDeque<mpsc::Receiver<BatchResult>>,
    charges: &mut Charges,
    out: &mpsc::Sender<BatchResult>,
) -> bool {
    let next = next_of_oldest(in_flight).await;
    forward(next, in_flight, charges, out).await
}

/// The oldest unit's next result (`Some(None)`: that unit is done; `None`: nothing in
/// flight). Cancel-safe: dropped before it is ready, it takes nothing.
async fn next_of_oldest(
    in_flight: &mut VecDeque<mpsc::Receiver<BatchResult>>,
) -> Option<Option<BatchResult>> {
    match in_flight.front_mut() {
        Some(front) => Some(front.recv().await),
        None => None,
    }
}

/// [`forward_next`]'s second half: forward what [`next_of_oldest`] gave.
async fn forward(
    next: Option<Option<BatchResult>>,
    in_flight: &mut VecDeque<mpsc::Receiver<BatchResult>>,
    charges: &mut Charges,
    out: &mpsc::Sender<BatchResult>,
) -> bool {
    let Some(next) = next else {
        return false;
    };
    match next {
        Some(Ok(batch)) => out.send(Ok(batch)).await.is_ok(),
        Some(Err(err)) => {
            let _ = out.send(Err(err)).await;
            false
        }
        None => {
            in_flight.pop_front();
            charges.finished_oldest();
            true
        }
    }
}

pub(super) async fn drain_in_order(
    in_flight: &mut VecDeque<mpsc::Receiver<BatchResult>>,
    out: &mpsc::Sender<BatchResult>,
) {
    while let Some(mut rx) = in_flight.pop_front() {
        while let Some(item) = rx.recv().await {
            let stop = item.is_err();
            if out.send(item).await.is_err() || stop {
                return;
            }
        }
    }
}

/// Decode one row group into `tx`, batch by batch, from what was fetched for it and what its
/// decoder fetches.
#[allow(clippy::too_many_arguments)] // the driver's state for one unit, passed once
pub(super) async fn run_unit(
    inner: Arc<DatasetInner>,
    file: Arc<OpenedFile>,
    unit: Unit,
    whole_file: Option<Bytes>,
    fetching: Option<JoinHandle<Result<FetchedRanges>>>,
    batch_rows: usize,
    tx: mpsc::Sender<BatchResult>,
    permits: Arc<Semaphore>,
) {
    let path = unit.file.clone();
    let rg = unit.row_group;
    let fetched = match (whole_file, fetching) {
        (Some(bytes), _) => vec![(0..bytes.len() as u64, bytes)],
        (None, Some(fetching)) => match fetching.await {
            Ok(Ok(fetched)) => fetched,
            Ok(Err(err)) => {
                let _ = tx.send(Err(err)).await;
                return;
            }
            Err(join) => {
                let _ = tx
                    .send(Err(ParquetError::InvalidArgument(format!(
                        "{path}: the request for row group {rg} failed: {join}"
                    ))))
                    .await;
                return;
            }
        },
        (None, None) => Vec::new(),
    };
    let tx_panic = tx.clone();
    let work = AssertUnwindSafe(decode_unit(
        inner, file, unit, fetched, batch_rows, tx, permits,
    ));
    if let Err(panic) = work.catch_unwind().await {
        let _ = tx_panic
            .send(Err(ParquetError::Corrupt {
                path: path.to_string(),
                row_group: Some(rg),
                reason: format!("decoding failed: {}", panic_message(&panic)),
                source: None,
            }))
            .await;
    }
}
