//! The scan's driver: a file's row groups become units, up to `prefetch` of them decode at
//! once, and their batches are forwarded in order.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, Semaphore};

use super::decode::decode_unit;
use super::footer::FOOTER_CONCURRENCY;
use super::runtime::panic_message;
use super::stream::BatchResult;
use super::{DatasetInner, OpenedFile, Unit};
use crate::error::ParquetError;

/// Rows per batch of the scan's first unit (when `batch_size` is larger).
const FIRST_UNIT_BATCH_ROWS: usize = 8192;

/// The scan driver: opens files ahead, keeps up to `prefetch` units decoding, and forwards
/// their batches in order.
pub(super) async fn drive(inner: Arc<DatasetInner>, out: mpsc::Sender<BatchResult>) {
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
            _ => true,
        })
        .collect();
    let opening = futures::stream::iter(wanted)
        .map(|i| {
            let inner = inner.clone();
            tokio::spawn(async move { inner.open_for_scan(i).await })
        })
        .buffered(FOOTER_CONCURRENCY);
    futures::pin_mut!(opening);
    // Each unit with its file's bytes when the file was fetched whole with its footer (held
    // until the file's units are decoded: at most the files opened ahead of the scan).
    let mut pending_units: VecDeque<(Arc<OpenedFile>, Unit, Option<Bytes>)> = VecDeque::new();
    let mut in_flight: VecDeque<mpsc::Receiver<BatchResult>> = VecDeque::new();
    let mut files_done = false;
    // The scan's first unit decodes smaller batches: its first batch is what the whole
    // pipeline waits for, and it is decoded while the next units compete for the cores.
    let mut batch_rows = inner.options.batch_size.min(FIRST_UNIT_BATCH_ROWS);

    loop {
        // Top up: launch units until `prefetch` are in flight or there are no more.
        while in_flight.len() < inner.prefetch {
            if let Some((file, unit, whole_file)) = pending_units.pop_front() {
                let (tx, rx) = mpsc::channel(2);
                tokio::spawn(run_unit(
                    inner.clone(),
                    file,
                    unit,
                    whole_file,
                    batch_rows,
                    tx,
                    decode_permits.clone(),
                ));
                batch_rows = inner.options.batch_size;
                in_flight.push_back(rx);
                continue;
            }
            if files_done {
                break;
            }
            match opening.next().await {
                None => files_done = true,
                Some(Ok(Ok((file, whole_file)))) => {
                    for unit in inner.plan_units(&file) {
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
                        pending_units.push_back((file.clone(), unit, whole_file.clone()));
                    }
                }
                Some(Ok(Err(err))) => {
                    // Batches of earlier files first, then the error, in order.
                    drain_in_order(&mut in_flight, &out).await;
                    let _ = out.send(Err(err)).await;
                    return;
                }
                Some(Err(join)) => {
                    drain_in_order(&mut in_flight, &out).await;
                    let _ = out
                        .send(Err(ParquetError::InvalidArgument(format!(
                            "footer task failed: {join}"
                        ))))
                        .await;
                    return;
                }
            }
        }
        let Some(front) = in_flight.front_mut() else {
            return;
        };
        match front.recv().await {
            Some(Ok(batch)) => {
                if out.send(Ok(batch)).await.is_err() {
                    return; // consumer gone: dropping the receivers cancels the units
                }
            }
            Some(Err(err)) => {
                let _ = out.send(Err(err)).await;
                return;
            }
            None => {
                in_flight.pop_front();
            }
        }
    }
}

async fn drain_in_order(
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

/// Decode one row group into `tx`, batch by batch.
async fn run_unit(
    inner: Arc<DatasetInner>,
    file: Arc<OpenedFile>,
    unit: Unit,
    whole_file: Option<Bytes>,
    batch_rows: usize,
    tx: mpsc::Sender<BatchResult>,
    permits: Arc<Semaphore>,
) {
    let path = unit.file.clone();
    let rg = unit.row_group;
    let tx_panic = tx.clone();
    let work = AssertUnwindSafe(decode_unit(
        inner, file, unit, whole_file, batch_rows, tx, permits,
    ));
    if let Err(panic) = work.catch_unwind().await {
        let _ = tx_panic
            .send(Err(ParquetError::Corrupt {
                path: path.to_string(),
                row_group: Some(rg),
                reason: format!("decoding failed: {}", panic_message(&panic)),
            }))
            .await;
    }
}
