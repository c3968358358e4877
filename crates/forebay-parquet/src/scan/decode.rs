//! Decoding one unit (a row group, or the rows of it a selection keeps): forebay's own flat
//! decoders where they apply, the parquet crate for the rest.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_schema::Schema;
use futures::StreamExt;
use parquet::arrow::arrow_reader::{
    ArrowPredicate, ArrowPredicateFn, ParquetRecordBatchReader, RowFilter,
};
use parquet::arrow::async_reader::{
    AsyncFileReader, ParquetRecordBatchStream, ParquetRecordBatchStreamBuilder,
};
use parquet::arrow::parquet_to_arrow_field_levels;
use parquet::arrow::ProjectionMask;
use tokio::sync::{mpsc, Semaphore};

use super::fetch_ahead::fetch_filtered_unit;
use super::selectivity::keep_matching;
use super::stream::BatchResult;
use super::stream::{BatchProvenance, ProvenancedBatch};
use super::{DatasetInner, FlatColumn, OpenedFile, Unit, WholeDecode};
use crate::error::{corrupt, corrupt_from, ParquetError, Result};
use crate::flat::{self, FlatDecoder};
use crate::io::ObjectFileReader;
use crate::pages::FetchedRowGroup;
use crate::row_filter::RowGroupDecision;

/// The most a column chunk may decompress to by default (what 32-bit Arrow offsets index).
pub const DEFAULT_MAX_COLUMN_CHUNK_BYTES: u64 = i32::MAX as u64;

/// Refuse a row group whose selected column chunks decompress past the limit (see
/// [`ParquetDatasetBuilder::with_max_column_chunk_bytes`]), before anything is fetched.
pub(super) fn check_chunk_sizes(
    inner: &DatasetInner,
    file: &OpenedFile,
    path: &str,
    rg: usize,
) -> Result<()> {
    let limit = inner.options.max_column_chunk_bytes;
    let group = file.reader_meta.metadata().row_group(rg);
    for (leaf, column) in group.columns().iter().enumerate() {
        let bytes = column.uncompressed_size().max(0) as u64;
        if bytes > limit && file.projection.leaf_included(leaf) {
            return Err(ParquetError::TooLarge {
                path: path.to_string(),
                row_group: rg,
                column: column.column_path().string(),
                bytes,
                limit,
            });
        }
    }
    Ok(())
}

pub(super) async fn decode_unit(
    inner: Arc<DatasetInner>,
    file: Arc<OpenedFile>,
    unit: Unit,
    fetched: crate::io::FetchedRanges,
    batch_rows: usize,
    tx: mpsc::Sender<BatchResult>,
    permits: Arc<Semaphore>,
) {
    let path = unit.file.to_string();
    let rg = unit.row_group;
    let declared_rows = file.reader_meta.metadata().row_group(rg).num_rows().max(0) as u64;
    if let Err(e) = check_chunk_sizes(&inner, &file, &path, rg) {
        let _ = tx.send(Err(e)).await;
        return;
    }
    let provenance_of = |first_row: Option<u64>, batch_index: usize| BatchProvenance {
        file: unit.file.clone(),
        file_index: unit.file_index,
        row_group: rg,
        row_group_first_row: unit.first_row,
        first_row,
        batch_index,
    };
    let fetched_ahead = !fetched.is_empty();
    let mut reader = ObjectFileReader::new(
        file.entry.clone(),
        inner.io.clone(),
        inner.range_policy_for(&file.entry),
    )
    .with_metadata(file.reader_meta.metadata().clone())
    .with_fetched(fetched);
    // The row filter may decide the whole row group from its dictionary page first (see
    // `ScanRowFilter::decide_by_values`): dropped unread, or read without the filter.
    let mut row_filter = inner.options.row_filter.as_ref();
    let mut dictionary_page = None;
    if let Some(hook) = row_filter {
        // On an object store its dictionary page is fetched before the decision takes a
        // core (a round trip under a decode permit held the other units back).
        dictionary_page = hook.dictionary_page(&file.reader_meta, rg);
        if let (Some(range), None) = (dictionary_page.clone(), &file.entry.local_path) {
            match reader.fetch(range.clone()).await {
                Ok(bytes) => reader = reader.with_fetched(vec![(range, bytes)]),
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
        let rows = unit
            .selection
            .as_ref()
            .map_or(declared_rows, |s| s.row_count() as u64);
        let decided = {
            let _permit = permits.acquire().await.expect("semaphore is never closed");
            hook.decide_by_dictionary(&reader, &file.reader_meta, &path, rg, rows)
                .await
        };
        match decided {
            Ok(None) => {}
            Ok(Some(decided)) => {
                match decided.decision {
                    RowGroupDecision::DropAll => {
                        // As when the row filter drops every row (see `ScanRowFilter`).
                        let provenance = provenance_of(None, 0);
                        let batch = RecordBatch::new_empty(file.output_schema.clone());
                        let item = file
                            .finish_batch(batch, rg)
                            .map(|batch| ProvenancedBatch { batch, provenance });
                        let _ = tx.send(item).await;
                        return;
                    }
                    RowGroupDecision::KeepAll => row_filter = None,
                    RowGroupDecision::RowByRow => {}
                }
                reader = reader.with_prefetched(decided.page_range, decided.page);
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
    let rows_are_consecutive =
        unit.selection.is_none() && file.filter.is_none() && row_filter.is_none();
    // A filter that keeps most rows: decode the row group whole, then filter (`selectivity`).
    let filter_after_decoding = match (&file.filter, &file.filtered_whole) {
        (Some((_, bound)), Some(filtered))
            if unit.selection.is_none()
                && row_filter.is_none()
                && inner.filter_selectivity.decode_whole() =>
        {
            inner
                .scan_metrics
                .row_groups_filtered_after_decoding
                .fetch_add(1, Ordering::Relaxed);
            Some((bound, filtered))
        }
        _ => None,
    };
    let whole_decode = match filter_after_decoding {
        Some((_, filtered)) => Some(&filtered.decode),
        None => rows_are_consecutive.then_some(&file.whole),
    };
    let mut decoding = if let Some(plan) = whole_decode {
        match WholeRowGroup::open(&inner, &file, plan, &reader, rg, batch_rows, &path).await {
            Ok(whole) => Decoding::Whole(whole),
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    } else {
        // Its chunks fetched ahead, or now (before decoding takes a core).
        let reader = if fetched_ahead {
            reader
        } else {
            match fetch_filtered_unit(&inner, &file, &unit, dictionary_page.as_ref()).await {
                Ok(chunks) => reader.with_fetched(chunks),
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        };
        // Part of a row group of a file without a page index: where its pages are, so
        // that only the selection's are read (see `page_locations`).
        let reader_meta = match &unit.selection {
            Some(_) => {
                let found = {
                    let _permit = permits.acquire().await.expect("semaphore is never closed");
                    file.page_locations.reader_meta(&inner, &file, rg).await
                };
                match found {
                    Ok(meta) => meta,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
            None => file.reader_meta.clone(),
        };
        let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, reader_meta)
            .with_projection(file.projection.clone())
            .with_batch_size(batch_rows)
            .with_row_groups(vec![rg]);
        if let Some(selection) = unit.selection {
            builder = builder.with_row_selection(selection);
        }
        let mut predicates: Vec<Box<dyn ArrowPredicate>> = Vec::new();
        if let Some((mask, bound)) = &file.filter {
            let bound = bound.clone();
            let measured = inner.filter_selectivity.clone();
            let predicate = ArrowPredicateFn::new(mask.clone(), move |batch| {
                let keep = bound.evaluate(&batch)?;
                measured.record(batch.num_rows() as u64, keep.true_count() as u64);
                Ok(keep)
            });
            predicates.push(Box::new(predicate));
        }
        if let Some(hook) = row_filter {
            match hook.predicates(&file.reader_meta, &path, rg) {
                Ok(made) => predicates.extend(made),
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
        if !predicates.is_empty() {
            builder = builder.with_row_filter(RowFilter::new(predicates));
        }
        match builder.build() {
            Ok(stream) => Decoding::Filtered(stream),
            Err(e) => {
                let _ = tx.send(Err(corrupt_from(&path, Some(rg), e))).await;
                return;
            }
        }
    };
    let mut next_row = unit.first_row;
    let mut batch_index = 0;
    // Rows decoded whole (before a filter after decoding).
    let mut decoded_whole = 0u64;
    loop {
        let next = {
            let _permit = permits.acquire().await.expect("semaphore is never closed");
            match &mut decoding {
                Decoding::Filtered(stream) => stream.next().await.map(|r| {
                    r.map(|b| (b.num_rows(), b.columns().to_vec()))
                        .map_err(|e| ParquetError::from_decode(&path, Some(rg), e))
                }),
                Decoding::Whole(whole) => {
                    let next = whole.next(&path, rg);
                    if let Some(Ok((rows, _))) = &next {
                        decoded_whole += *rows as u64;
                    }
                    match (next, filter_after_decoding) {
                        (Some(Ok((_, columns))), Some((bound, filtered))) => Some(keep_matching(
                            filtered,
                            columns,
                            bound,
                            &inner.filter_selectivity,
                            &path,
                            rg,
                        )),
                        (next, _) => next,
                    }
                }
            }
        };
        let columns = match next {
            None => {
                if row_filter.is_some() && batch_index == 0 {
                    // The row filter dropped every row: say so with an empty batch, so that
                    // provenance shows the unit ended (see `ScanRowFilter`).
                    let provenance = provenance_of(None, batch_index);
                    let batch = RecordBatch::new_empty(file.output_schema.clone());
                    let item = file
                        .finish_batch(batch, rg)
                        .map(|batch| ProvenancedBatch { batch, provenance });
                    let _ = tx.send(item).await;
                    return;
                }
                // Decoded whole, every row of the row group must come out; a shortfall
                // means the decoder could not make sense of the data (never silently drop).
                if matches!(decoding, Decoding::Whole(_)) && decoded_whole != declared_rows {
                    let reason = format!(
                        "decoded {decoded_whole} rows but the row group declares {declared_rows}"
                    );
                    let _ = tx.send(Err(corrupt(&path, Some(rg), reason))).await;
                    return;
                }
                if let Decoding::Whole(whole) = &mut decoding {
                    if let Err(e) = whole.own.finish(&path, rg) {
                        let _ = tx.send(Err(e)).await;
                    }
                }
                return;
            }
            Some(Err(e)) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
            Some(Ok(columns)) => columns,
        };
        let (rows, columns) = columns;
        if rows == 0 {
            continue;
        }
        let columns = file.reorder.iter().map(|&i| columns[i].clone()).collect();
        // (With only partition columns asked for, no column: the row count says the rows.)
        let with_rows = RecordBatchOptions::new().with_row_count(Some(rows));
        let batch = match RecordBatch::try_new_with_options(
            file.output_schema.clone(),
            columns,
            &with_rows,
        ) {
            Ok(b) => file.finish_batch(b, rg),
            Err(e) => Err(corrupt_from(&path, Some(rg), e)),
        };
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        let rows = rows as u64;
        let provenance = provenance_of(rows_are_consecutive.then_some(next_row), batch_index);
        next_row += rows;
        batch_index += 1;
        if tx
            .send(Ok(ProvenancedBatch { batch, provenance }))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// How a unit's rows are decoded.
enum Decoding {
    /// Rows selected or filtered: the parquet crate's async reader does it all.
    Filtered(ParquetRecordBatchStream<ObjectFileReader>),
    /// Every row of the row group, from its chunks fetched whole (see [`WholeRowGroup`]).
    Whole(WholeRowGroup),
}

/// A row group read whole: the column chunks of its plan ([`WholeDecode`]) fetched in one
/// request, the flat ones decoded by forebay's own decoders (`flat`), the others
/// by the parquet crate over pages from `pages` (Snappy pages into recycled buffers).
struct WholeRowGroup {
    /// Columns in a decoded batch.
    decoded_columns: usize,
    /// The parquet crate's part of each batch; `None` when every column is forebay's.
    theirs: Option<ParquetRecordBatchReader>,
    own: OwnDecoders,
    /// Rows not yet decoded, and rows per batch (to cut batches when every column is
    /// forebay's).
    rows_left: usize,
    batch_rows: usize,
}

impl WholeRowGroup {
    async fn open(
        inner: &DatasetInner,
        file: &OpenedFile,
        plan: &WholeDecode,
        reader: &ObjectFileReader,
        rg: usize,
        batch_rows: usize,
        path: &str,
    ) -> Result<Self> {
        let metadata = file.reader_meta.metadata();
        let group = metadata.row_group(rg);
        let parquet_schema = file.reader_meta.parquet_schema();
        if group.num_rows() <= 0 {
            // Nothing to decode (and an empty row group's chunks may not even parse).
            return Ok(Self {
                decoded_columns: plan.schema.fields().len(),
                theirs: None,
                own: OwnDecoders { chunks: Vec::new() },
                rows_left: 0,
                batch_rows,
            });
        }
        let leaves: Vec<usize> = (0..parquet_schema.num_columns())
            .filter(|&leaf| plan.projection.leaf_included(leaf))
            .collect();
        let ranges: Vec<std::ops::Range<u64>> = leaves
            .iter()
            .map(|&leaf| {
                let (start, len) = group.column(leaf).byte_range();
                start..start + len
            })
            .collect();
        let fetched = reader
            .clone()
            .get_byte_ranges(ranges.clone())
            .await
            .map_err(|e| ParquetError::from_decode(path, Some(rg), e))?;
        let mut chunks = vec![None; parquet_schema.num_columns()];
        for ((&leaf, range), bytes) in leaves.iter().zip(ranges).zip(fetched) {
            chunks[leaf] = Some((range.start, bytes));
        }
        let rows = usize::try_from(group.num_rows().max(0)).unwrap_or(usize::MAX);

        let own_columns: Vec<&FlatColumn> = plan
            .flat_columns
            .iter()
            .filter(|c| flat::chunk_is_supported(group.column(c.leaf)))
            .collect();
        let mut own = OwnDecoders { chunks: Vec::new() };
        for column in &own_columns {
            let chunk = group.column(column.leaf);
            let name = chunk.column_path().string();
            let (start, bytes) = chunks[column.leaf]
                .clone()
                .expect("selected leaves are fetched");
            let decoder = flat::decoder(&column.ty, chunk, start, bytes, rows, &inner.page_buffers)
                .map_err(|reason| corrupt(path, Some(rg), format!("column {name}: {reason}")))?;
            own.chunks.push((column.position, name, decoder));
        }
        inner
            .scan_metrics
            .flat_decoder_chunks
            .fetch_add(own_columns.len() as u64, Ordering::Relaxed);

        let their_leaves: Vec<usize> = leaves
            .into_iter()
            .filter(|&leaf| own_columns.iter().all(|c| c.leaf != leaf))
            .collect();
        let theirs = if their_leaves.is_empty() {
            None
        } else {
            let mask = ProjectionMask::leaves(parquet_schema, their_leaves);
            let levels = parquet_to_arrow_field_levels(
                parquet_schema,
                mask,
                Some(file.reader_meta.schema().fields()),
            )
            .map_err(|e| corrupt_from(path, Some(rg), e))?;
            let row_group = FetchedRowGroup {
                metadata,
                row_group: rg,
                chunks,
                buffers: inner.page_buffers.clone(),
            };
            let reader = ParquetRecordBatchReader::try_new_with_row_groups(
                &levels, &row_group, batch_rows, None,
            )
            .map_err(|e| corrupt_from(path, Some(rg), e))?;
            Some(reader)
        };
        Ok(Self {
            decoded_columns: plan.schema.fields().len(),
            theirs,
            own,
            rows_left: rows,
            batch_rows,
        })
    }

    /// The next batch's rows and columns (in decoded order), or `None` after the last.
    fn next(&mut self, path: &str, rg: usize) -> Option<Result<(usize, Vec<ArrayRef>)>> {
        let batch = match &mut self.theirs {
            Some(reader) => match reader.next()? {
                Ok(batch) => batch,
                Err(e) => return Some(Err(corrupt_from(path, Some(rg), e))),
            },
            None if self.rows_left == 0 => return None,
            // Every column is forebay's: a batch of rows without columns for `splice`.
            None => {
                let rows = self.batch_rows.min(self.rows_left);
                let options = RecordBatchOptions::new().with_row_count(Some(rows));
                RecordBatch::try_new_with_options(Arc::new(Schema::empty()), Vec::new(), &options)
                    .expect("a batch without columns is valid")
            }
        };
        self.rows_left = self.rows_left.saturating_sub(batch.num_rows());
        Some(self.own.splice(batch, self.decoded_columns, path, rg))
    }
}

/// The column chunks of one row group that forebay's own decoders read, spliced
/// into the parquet crate's batches.
struct OwnDecoders {
    /// Per chunk: its position in the decoded batch, its column's name, its decoder.
    chunks: Vec<(usize, String, Box<dyn FlatDecoder>)>,
}

impl OwnDecoders {
    /// The decoded batch's rows and columns: `batch`'s (the parquet crate's part) with this
    /// row group's next `batch.num_rows()` values of each own chunk put in their places.
    fn splice(
        &mut self,
        batch: RecordBatch,
        decoded_columns: usize,
        path: &str,
        rg: usize,
    ) -> Result<(usize, Vec<ArrayRef>)> {
        let rows = batch.num_rows();
        if self.chunks.is_empty() {
            return Ok((rows, batch.columns().to_vec()));
        }
        let mut columns: Vec<Option<ArrayRef>> = vec![None; decoded_columns];
        for (position, name, decoder) in &mut self.chunks {
            let array = decoder
                .next_array(rows)
                .map_err(|reason| corrupt(path, Some(rg), format!("column {name}: {reason}")))?;
            columns[*position] = Some(array);
        }
        let mut theirs = batch.columns().iter();
        let columns = columns
            .into_iter()
            .map(|own| {
                own.or_else(|| theirs.next().cloned()).ok_or_else(|| {
                    corrupt(
                        path,
                        Some(rg),
                        "the decoded batch lacks columns (forebay bug)",
                    )
                })
            })
            .collect::<Result<_>>()?;
        Ok((rows, columns))
    }

    /// An error when an own chunk holds more values than the rows read.
    fn finish(&mut self, path: &str, rg: usize) -> Result<()> {
        for (_, name, decoder) in &mut self.chunks {
            decoder
                .finish()
                .map_err(|reason| corrupt(path, Some(rg), format!("column {name}: {reason}")))?;
        }
        Ok(())
    }
}
