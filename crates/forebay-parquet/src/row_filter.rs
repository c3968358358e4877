//! A caller's own row test, run while a row group is decoded (late materialisation).
//!
//! ```text
//!  row group ──decode the filter's columns──► ScanRowFilter::keep ──► mask
//!                                                                     │ rows kept only
//!                                    decode the other columns ◄───────┘
//!  every row dropped ──► the unit yields one empty batch (its provenance still arrives)
//!
//!  before that, a one-column filter that decides_by_values, on a chunk that is all
//!  dictionary (footer) ──► its dictionary page ──► decide_by_values ──► DropAll: no data
//!                                       page read │ KeepAll: decoded without keep │ RowByRow
//! ```
//!
//! A [`Predicate`](crate::Predicate) is data the scan understands (it also prunes by
//! statistics); a [`ScanRowFilter`] is code the scan only calls, for tests no statistics can
//! answer: the engine's resume drops rows whose id a checkpoint index already holds. Rows it
//! drops cost the decoding of its own columns alone, never of the rest of the row.
//! [`ArrowPredicates`] are a host engine's own filters as the parquet crate's predicates
//! (arrow-rs `ArrowPredicate`s, built per file as DataFusion builds its row filters), run in
//! the same place.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{ArrowError, Field};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowPredicate, ArrowPredicateFn, ArrowReaderMetadata};
use parquet::arrow::ProjectionMask;

use crate::dictionary::{decode_dictionary_page, dictionary_page_range};
use crate::error::column_not_found;
use crate::error::{ParquetError, Result};
use crate::io::ObjectFileReader;

/// The error a [`ScanRowFilter`] reports; the scan wraps it in [`ParquetError::RowFilter`]
/// with the file and row group.
pub type RowFilterError = Box<dyn std::error::Error + Send + Sync>;

/// Rows to drop while decoding, decided by the caller's code. Install with
/// [`ParquetDatasetBuilder::with_row_filter`](crate::ParquetDatasetBuilder::with_row_filter)
/// or [`ParquetDataset::with_row_filter`](crate::ParquetDataset::with_row_filter).
///
/// A row group whose every row is dropped still yields one batch of zero rows, with its
/// provenance, so that a caller following provenance (the engine's lineage) sees it end.
pub trait ScanRowFilter: Send + Sync {
    /// The top-level columns [`ScanRowFilter::keep`] reads.
    fn columns(&self) -> &[String];

    /// Which rows of `batch` to keep (true keeps; a null drops). `batch` holds exactly the
    /// filter's columns, named as in the file, and the rows that earlier filters kept.
    fn keep(&self, batch: &RecordBatch) -> std::result::Result<BooleanArray, RowFilterError>;

    /// Whether [`ScanRowFilter::decide_by_values`] may decide anything now. When true, a
    /// filter of one column gets the distinct values of each row group that the footer
    /// shows to be entirely dictionary-encoded, before any data page is read. The default
    /// (false) reads no dictionary page.
    fn decides_by_values(&self) -> bool {
        false
    }

    /// Decide a whole row group from `values`: every distinct value its column can hold
    /// (the chunk's dictionary, in the column's type or a dictionary column's value type, no
    /// nulls; it may hold values no row uses). `rows` is how many rows of the row group the
    /// scan reads. Must agree with [`ScanRowFilter::keep`]: [`RowGroupDecision::DropAll`]
    /// only if `keep` would drop every one of `values`, [`RowGroupDecision::KeepAll`] only if
    /// it would keep every one. A row group dropped whole yields one empty batch, as if
    /// `keep` had dropped each row.
    fn decide_by_values(
        &self,
        values: &ArrayRef,
        rows: u64,
    ) -> std::result::Result<RowGroupDecision, RowFilterError> {
        let _ = (values, rows);
        Ok(RowGroupDecision::RowByRow)
    }
}

/// A host's row filters as the parquet crate's predicates, made for each row group a scan
/// decodes (a predicate's `ProjectionMask` indexes one file's leaves). They run after the
/// scan's [`Predicate`](crate::Predicate) and [`ScanRowFilter`], in the order given, each on
/// the rows the ones before kept; the scan only calls them (no pruning). Install with
/// [`ParquetDatasetBuilder::with_arrow_predicates`](crate::ParquetDatasetBuilder::with_arrow_predicates).
///
/// ```
/// use forebay_parquet::parquet::arrow::arrow_reader::{ArrowPredicate, ArrowPredicateFn, ArrowReaderMetadata};
/// use forebay_parquet::parquet::arrow::ProjectionMask;
/// use forebay_parquet::{ArrowPredicates, RowFilterError};
///
/// /// Rows whose `score` is above 0.5, as a host would build the predicate itself.
/// struct ScoreAbove;
///
/// impl ArrowPredicates for ScoreAbove {
///     fn columns(&self) -> &[String] {
///         static COLUMNS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
///         COLUMNS.get_or_init(|| vec!["score".into()])
///     }
///     fn predicates(
///         &self,
///         file: &ArrowReaderMetadata,
///         _path: &str,
///         _row_group: usize,
///     ) -> Result<Vec<Box<dyn ArrowPredicate>>, RowFilterError> {
///         let root = file.schema().index_of("score")?;
///         let mask = ProjectionMask::roots(file.parquet_schema(), [root]);
///         Ok(vec![Box::new(ArrowPredicateFn::new(mask, |batch| {
///             let score = batch.column(0);
///             let half = forebay_parquet::arrow_array::Float64Array::new_scalar(0.5);
///             arrow_ord::cmp::gt(score, &half)
///         }))])
///     }
/// }
/// ```
pub trait ArrowPredicates: Send + Sync {
    /// The top-level columns the predicates read (a row count under them reads these).
    fn columns(&self) -> &[String];

    /// The predicates for row group `row_group` of the file at `path`, whose footer and
    /// schema (as the scan decodes it) are `file`.
    fn predicates(
        &self,
        file: &ArrowReaderMetadata,
        path: &str,
        row_group: usize,
    ) -> std::result::Result<Vec<Box<dyn ArrowPredicate>>, RowFilterError>;
}

/// What [`ScanRowFilter::decide_by_values`] decided for a row group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowGroupDecision {
    /// Every row is kept: the row group is decoded without calling `keep`.
    KeepAll,
    /// No row is kept: the row group's data pages are never read.
    DropAll,
    /// Call `keep` on the decoded rows, as if nothing had been decided.
    RowByRow,
}

/// The caller's row filters in the builder (which derives `Debug`): a [`ScanRowFilter`],
/// [`ArrowPredicates`], or both.
#[derive(Clone, Default)]
pub(crate) struct RowFilterHook {
    pub(crate) rows: Option<Arc<dyn ScanRowFilter>>,
    pub(crate) arrow: Option<Arc<dyn ArrowPredicates>>,
}

impl std::fmt::Debug for RowFilterHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowFilterHook")
            .field("rows", &self.rows.as_ref().map(|r| r.columns().to_vec()))
            .field("arrow", &self.arrow.as_ref().map(|a| a.columns().to_vec()))
            .finish()
    }
}

/// A row group decided from its dictionary page, and that page, which the decoder can use
/// instead of fetching it again.
pub(crate) struct DictionaryDecision {
    pub(crate) decision: RowGroupDecision,
    pub(crate) page_range: Range<u64>,
    pub(crate) page: Bytes,
}

/// What deciding a row group by its dictionary takes: the filter, its column's field and
/// leaf, and the dictionary page.
struct ByDictionary<'a> {
    filter: &'a Arc<dyn ScanRowFilter>,
    field: &'a Field,
    leaf: usize,
    page_range: Range<u64>,
}

impl RowFilterHook {
    /// Ask the filter to decide row group `row_group` of `path` (`rows` rows read) from the
    /// values of its dictionary page (see [`ScanRowFilter::decide_by_values`]). `None` when
    /// the filter does not decide by values now, or the footer does not show that the
    /// dictionary holds every value of the row group; `RowByRow` with the page when the page
    /// was fetched but not read with certainty.
    pub(crate) async fn decide_by_dictionary(
        &self,
        reader: &ObjectFileReader,
        reader_meta: &ArrowReaderMetadata,
        path: &str,
        row_group: usize,
        rows: u64,
    ) -> Result<Option<DictionaryDecision>> {
        let Some(ByDictionary {
            filter,
            field,
            leaf,
            page_range,
        }) = self.decides_by(reader_meta, row_group)
        else {
            return Ok(None);
        };
        let metadata = reader_meta.metadata();
        let page = reader.fetch(page_range.clone()).await?;
        let chunk = metadata.row_group(row_group).column(leaf);
        let values =
            decode_dictionary_page(chunk, page_range.clone(), page.clone(), field.data_type());
        let decision = match values {
            None => RowGroupDecision::RowByRow,
            Some(values) => {
                filter
                    .decide_by_values(&values, rows)
                    .map_err(|e| ParquetError::RowFilter {
                        path: path.to_string(),
                        row_group,
                        reason: e.to_string(),
                    })?
            }
        };
        Ok(Some(DictionaryDecision {
            decision,
            page_range,
            page,
        }))
    }

    /// The dictionary page [`Self::decide_by_dictionary`] reads for `row_group`, if it reads
    /// one: a scan fetches it before the decision takes a core.
    pub(crate) fn dictionary_page(
        &self,
        reader_meta: &ArrowReaderMetadata,
        row_group: usize,
    ) -> Option<Range<u64>> {
        self.decides_by(reader_meta, row_group)
            .map(|by| by.page_range)
    }

    /// What deciding `row_group` by dictionary takes; `None` when it is not decided so.
    fn decides_by<'a>(
        &'a self,
        reader_meta: &'a ArrowReaderMetadata,
        row_group: usize,
    ) -> Option<ByDictionary<'a>> {
        // A decision covers the whole hook: not with a host's predicates, which decide nothing.
        let (Some(filter), None) = (&self.rows, &self.arrow) else {
            return None;
        };
        let [column] = filter.columns() else {
            return None;
        };
        if !filter.decides_by_values() {
            return None;
        }
        let field = reader_meta.schema().field_with_name(column).ok()?;
        let (leaf, page_range) = dictionary_page_range(reader_meta.metadata(), row_group, column)?;
        Some(ByDictionary {
            filter,
            field,
            leaf,
            page_range,
        })
    }

    /// Every top-level column the filters read.
    pub(crate) fn columns(&self) -> Vec<String> {
        let rows = self.rows.iter().flat_map(|r| r.columns().iter());
        let arrow = self.arrow.iter().flat_map(|a| a.columns().iter());
        let mut columns: Vec<String> = rows.chain(arrow).cloned().collect();
        columns.sort_unstable();
        columns.dedup();
        columns
    }

    /// The parquet crate's predicates running the filters on one row group of `path`: the
    /// [`ScanRowFilter`]'s, then the host's [`ArrowPredicates`].
    pub(crate) fn predicates(
        &self,
        reader_meta: &ArrowReaderMetadata,
        path: &str,
        row_group: usize,
    ) -> Result<Vec<Box<dyn ArrowPredicate>>> {
        let mut predicates = Vec::new();
        if let Some(filter) = &self.rows {
            predicates.push(Self::rows_predicate(filter, reader_meta, path, row_group)?);
        }
        if let Some(host) = &self.arrow {
            let made = host.predicates(reader_meta, path, row_group).map_err(|e| {
                ParquetError::RowFilter {
                    path: path.to_string(),
                    row_group,
                    reason: format!("building the host's predicates: {e}"),
                }
            })?;
            predicates.extend(made);
        }
        Ok(predicates)
    }

    /// The parquet crate's predicate running `filter` on one row group of `path`.
    fn rows_predicate(
        filter: &Arc<dyn ScanRowFilter>,
        reader_meta: &ArrowReaderMetadata,
        path: &str,
        row_group: usize,
    ) -> Result<Box<dyn ArrowPredicate>> {
        let schema = reader_meta.schema();
        let roots = filter
            .columns()
            .iter()
            .map(|column| {
                schema
                    .index_of(column)
                    .map_err(|_| column_not_found(schema, column, path))
            })
            .collect::<Result<Vec<usize>>>()?;
        let mask = ProjectionMask::roots(reader_meta.parquet_schema(), roots);
        let filter = filter.clone();
        let path = path.to_string();
        Ok(Box::new(ArrowPredicateFn::new(mask, move |batch| {
            filter.keep(&batch).map_err(|e| {
                ArrowError::ExternalError(Box::new(ParquetError::RowFilter {
                    path: path.clone(),
                    row_group,
                    reason: e.to_string(),
                }))
            })
        })))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Int64Array, StringArray};
    use parquet::file::properties::WriterProperties;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    use super::*;
    use crate::test_files::write_parquet_file;
    use crate::{DatasetSource, ErrorKind, ParquetDataset, Predicate};

    /// Keeps odd ids and rows of row groups 1.. only, counting the rows it sees and the
    /// columns of every batch it is shown.
    struct OddIdsAfterFirstGroup {
        columns: Vec<String>,
        rows_seen: AtomicUsize,
        shown_columns: Mutex<Vec<usize>>,
    }

    impl OddIdsAfterFirstGroup {
        fn new() -> Arc<OddIdsAfterFirstGroup> {
            Arc::new(OddIdsAfterFirstGroup {
                columns: vec!["id".into()],
                rows_seen: AtomicUsize::new(0),
                shown_columns: Mutex::new(Vec::new()),
            })
        }
    }

    impl ScanRowFilter for OddIdsAfterFirstGroup {
        fn columns(&self) -> &[String] {
            &self.columns
        }
        fn keep(&self, batch: &RecordBatch) -> std::result::Result<BooleanArray, RowFilterError> {
            self.rows_seen
                .fetch_add(batch.num_rows(), Ordering::Relaxed);
            self.shown_columns.lock().unwrap().push(batch.num_columns());
            let ids = batch.column(0).as_primitive::<Int64Type>();
            Ok(ids
                .iter()
                .map(|id| id.map(|v| v >= 100 && v % 2 == 1))
                .collect())
        }
    }

    /// Three row groups of 100 rows: `id` 0..300, `name` "n{id}".
    fn write_file(dir: &std::path::Path) -> String {
        let path = dir.join("in.parquet");
        let ids = Int64Array::from_iter_values(0..300);
        let names = StringArray::from_iter_values((0..300).map(|i| format!("n{i}")));
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(ids) as _),
            ("name", Arc::new(names) as _),
        ])
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        write_parquet_file(&path, &batch, props)
    }

    #[test]
    fn keeps_what_the_filter_keeps_and_reports_every_row_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(dir.path());
        let filter = OddIdsAfterFirstGroup::new();
        let dataset = ParquetDataset::builder(DatasetSource::uris([path.clone()]))
            .with_columns(["name", "id"])
            .build()
            .unwrap()
            .with_row_filter(filter.clone());
        let batches: Vec<_> = dataset.scan().blocking_iter().map(|b| b.unwrap()).collect();

        // Row group 0 loses every row and still reports, with one empty batch.
        let groups: Vec<(usize, usize)> = batches
            .iter()
            .map(|b| (b.provenance.row_group, b.batch.num_rows()))
            .collect();
        assert_eq!(groups, vec![(0, 0), (1, 50), (2, 50)]);
        assert!(batches.iter().all(|b| b.provenance.first_row.is_none()));
        assert_eq!(batches[0].batch.schema(), dataset.schema());

        // Exactly the odd ids from 100 on, with their own names (output column order kept).
        let mut ids = Vec::new();
        for b in &batches {
            let names = b.batch.column(0).as_string::<i32>();
            let id = b.batch.column(1).as_primitive::<Int64Type>();
            for row in 0..b.batch.num_rows() {
                assert_eq!(names.value(row), format!("n{}", id.value(row)));
                ids.push(id.value(row));
            }
        }
        assert_eq!(ids, (100..300).filter(|i| i % 2 == 1).collect::<Vec<_>>());

        // The filter saw each row once, and only its own column.
        assert_eq!(filter.rows_seen.load(Ordering::Relaxed), 300);
        assert!(filter.shown_columns.lock().unwrap().iter().all(|&c| c == 1));

        // Counting applies the filter too; what a scan reads is known from footers (an upper
        // bound of its rows), less what a skip leaves out.
        assert_eq!(dataset.known_row_count(), None);
        assert_eq!(dataset.count_rows().unwrap(), 100);
        assert_eq!(dataset.rows_to_read(), Some(300));
        assert_eq!(
            dataset.with_skip(Arc::new(FirstRowGroup)).rows_to_read(),
            Some(200)
        );
        let plain = ParquetDataset::open([path]).unwrap();
        assert_eq!(plain.known_row_count(), Some(300));
        let skipping = plain.with_skip(Arc::new(FirstRowGroup));
        assert_eq!(skipping.count_rows().unwrap(), 200);
        assert_eq!(skipping.rows_to_read(), Some(200));
    }

    /// Skips row group 0 of every file.
    struct FirstRowGroup;

    impl crate::ScanSkip for FirstRowGroup {
        fn skip_file(&self, _: &crate::FileEntry) -> bool {
            false
        }
        fn skip_row_group(&self, _: &crate::FileEntry, row_group: usize) -> bool {
            row_group == 0
        }
    }

    #[test]
    fn runs_after_a_predicate_and_sees_only_its_survivors() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(dir.path());
        let filter = OddIdsAfterFirstGroup::new();
        let dataset = ParquetDataset::builder(DatasetSource::uris([path]))
            .with_filter(Predicate::lt("id", 250))
            .with_row_filter(filter.clone())
            .build()
            .unwrap();
        let rows: usize = dataset
            .scan()
            .blocking_iter()
            .map(|b| b.unwrap().batch.num_rows())
            .sum();
        assert_eq!(rows, 75, "odd ids in 100..250");
        assert!(filter.rows_seen.load(Ordering::Relaxed) <= 250);
    }

    struct Failing(Vec<String>);

    impl ScanRowFilter for Failing {
        fn columns(&self) -> &[String] {
            &self.0
        }
        fn keep(&self, _: &RecordBatch) -> std::result::Result<BooleanArray, RowFilterError> {
            Err("the index is unavailable".into())
        }
    }

    #[test]
    fn a_failing_or_misnamed_filter_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(dir.path());
        let base = ParquetDataset::open([path.clone()]).unwrap();

        let failing = base.with_row_filter(Arc::new(Failing(vec!["id".into()])));
        let err = failing
            .scan()
            .blocking_iter()
            .find_map(|b| b.err())
            .expect("an error");
        assert_eq!(err.kind(), ErrorKind::RowFilter);
        let message = err.to_string();
        assert!(message.contains(&path), "{message}");
        assert!(message.contains("row group 0"), "{message}");
        assert!(message.contains("the index is unavailable"), "{message}");

        let misnamed = base.with_row_filter(Arc::new(Failing(vec!["nope".into()])));
        let err = misnamed
            .scan()
            .blocking_iter()
            .find_map(|b| b.err())
            .expect("an error");
        assert_eq!(err.kind(), ErrorKind::ColumnNotFound);
        assert!(err.to_string().contains("'nope'"), "{err}");
    }

    /// Drops the ids of a set and decides row groups by their dictionary, recording the
    /// decisions it made and the rows `keep` saw.
    struct DropsSet {
        columns: Vec<String>,
        done: std::collections::HashSet<i64>,
        decisions: Mutex<Vec<(usize, RowGroupDecision)>>,
        rows_seen: AtomicUsize,
    }

    impl DropsSet {
        fn new(done: impl IntoIterator<Item = i64>) -> Arc<DropsSet> {
            Arc::new(DropsSet {
                columns: vec!["id".into()],
                done: done.into_iter().collect(),
                decisions: Mutex::new(Vec::new()),
                rows_seen: AtomicUsize::new(0),
            })
        }
    }

    impl ScanRowFilter for DropsSet {
        fn columns(&self) -> &[String] {
            &self.columns
        }
        fn keep(&self, batch: &RecordBatch) -> std::result::Result<BooleanArray, RowFilterError> {
            self.rows_seen
                .fetch_add(batch.num_rows(), Ordering::Relaxed);
            let ids = batch.column(0).as_primitive::<Int64Type>();
            Ok(ids
                .iter()
                .map(|id| Some(id.is_none_or(|v| !self.done.contains(&v))))
                .collect())
        }
        fn decides_by_values(&self) -> bool {
            true
        }
        fn decide_by_values(
            &self,
            values: &ArrayRef,
            rows: u64,
        ) -> std::result::Result<RowGroupDecision, RowFilterError> {
            let values = values.as_primitive::<Int64Type>();
            let done = values
                .values()
                .iter()
                .filter(|v| self.done.contains(v))
                .count();
            let decision = match done {
                0 => RowGroupDecision::KeepAll,
                n if n == values.len() => RowGroupDecision::DropAll,
                _ => RowGroupDecision::RowByRow,
            };
            self.decisions
                .lock()
                .unwrap()
                .push((rows as usize, decision));
            Ok(decision)
        }
    }

    #[test]
    fn a_row_group_decided_by_its_dictionary_is_dropped_unread_or_read_without_the_filter() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(dir.path());
        // Row group 0 entirely done, row group 1 partly, row group 2 not at all.
        let filter = DropsSet::new((0..100).chain([150]));
        let dataset = ParquetDataset::builder(DatasetSource::uris([path.clone()]))
            .with_coalesce_gap(0)
            .with_row_filter(filter.clone())
            .build()
            .unwrap();
        let batches: Vec<_> = dataset.scan().blocking_iter().map(|b| b.unwrap()).collect();

        let groups: Vec<(usize, usize)> = batches
            .iter()
            .map(|b| (b.provenance.row_group, b.batch.num_rows()))
            .collect();
        assert_eq!(groups, vec![(0, 0), (1, 99), (2, 100)]);
        let ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                b.batch
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(ids, (100..300).filter(|&i| i != 150).collect::<Vec<_>>());
        // A row group read whole is consecutive rows again.
        assert_eq!(batches[2].provenance.first_row, Some(200));

        let mut decisions = filter.decisions.lock().unwrap().clone();
        decisions.sort_by_key(|(_, d)| format!("{d:?}"));
        assert_eq!(
            decisions,
            vec![
                (100, RowGroupDecision::DropAll),
                (100, RowGroupDecision::KeepAll),
                (100, RowGroupDecision::RowByRow)
            ]
        );
        assert_eq!(
            filter.rows_seen.load(Ordering::Relaxed),
            100,
            "row group 1 only"
        );

        // Bytes read: row group 0's id dictionary page alone, then rows 1 and 2 whole, their
        // dictionary pages fetched once.
        let file = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let meta = file.metadata();
        let id0 = meta.row_group(0).column(0);
        let dictionary0 = (id0.data_page_offset() - id0.dictionary_page_offset().unwrap()) as u64;
        let whole = |rg: usize| {
            meta.row_group(rg)
                .columns()
                .iter()
                .map(|c| c.compressed_size() as u64)
                .sum::<u64>()
        };
        assert_eq!(
            dataset.metrics().io.data_bytes,
            dictionary0 + whole(1) + whole(2)
        );
    }

    #[test]
    fn no_dictionary_is_read_where_it_would_not_hold_every_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain.parquet");
        let ids = Int64Array::from_iter((0..300).map(|i| (i % 7 != 0).then_some(i % 150)));
        let batch = RecordBatch::try_from_iter([("id", Arc::new(ids) as _)]).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        write_parquet_file(&path, &batch, props);
        let filter = DropsSet::new(0..150);
        let dataset = ParquetDataset::open([path.to_str().unwrap()])
            .unwrap()
            .with_row_filter(filter.clone());
        let rows: usize = dataset
            .scan()
            .blocking_iter()
            .map(|b| b.unwrap().batch.num_rows())
            .sum();
        // Nulls are kept by `keep`; a dictionary cannot show them, so none was asked.
        assert_eq!(rows, 300 / 7 + 1);
        assert!(filter.decisions.lock().unwrap().is_empty());
        assert_eq!(filter.rows_seen.load(Ordering::Relaxed), 300);
    }
}
