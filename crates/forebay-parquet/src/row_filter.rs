//! A caller's own row test, run while a row group is decoded (late materialisation).
//!
//! ```text
//!  row group ──decode the filter's columns──► ScanRowFilter::keep ──► mask
//!                                                                     │ rows kept only
//!                                    decode the other columns ◄───────┘
//!  every row dropped ──► the unit yields one empty batch (its provenance still arrives)
//! ```
//!
//! A [`Predicate`](crate::Predicate) is data the scan understands (it also prunes by
//! statistics); a [`ScanRowFilter`] is code the scan only calls, for tests no statistics can
//! answer: the engine's resume drops rows whose id a checkpoint index already holds. Rows it
//! drops cost the decoding of its own columns alone, never of the rest of the row.

use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch};
use arrow::error::ArrowError;
use parquet::arrow::arrow_reader::{ArrowPredicate, ArrowPredicateFn, ArrowReaderMetadata};
use parquet::arrow::ProjectionMask;

use crate::error::{ParquetError, Result};
use crate::scan::column_not_found;

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
}

/// A [`ScanRowFilter`] in the builder (which derives `Debug`).
#[derive(Clone)]
pub(crate) struct RowFilterHook(pub(crate) Arc<dyn ScanRowFilter>);

impl std::fmt::Debug for RowFilterHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScanRowFilter({:?})", self.0.columns())
    }
}

impl RowFilterHook {
    /// The parquet crate's predicate running this filter on one row group of `path`.
    pub(crate) fn predicate(
        &self,
        reader_meta: &ArrowReaderMetadata,
        path: &str,
        row_group: usize,
    ) -> Result<Box<dyn ArrowPredicate>> {
        let schema = reader_meta.schema();
        let roots = self
            .0
            .columns()
            .iter()
            .map(|column| {
                schema
                    .index_of(column)
                    .map_err(|_| column_not_found(schema, column, path))
            })
            .collect::<Result<Vec<usize>>>()?;
        let mask = ProjectionMask::roots(reader_meta.parquet_schema(), roots);
        let filter = self.0.clone();
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

    use arrow::array::{AsArray, Int64Array, StringArray};
    use arrow::datatypes::Int64Type;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;
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
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        path.to_str().unwrap().to_string()
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
        let batches: Vec<_> = dataset.scan().map(|b| b.unwrap()).collect();

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
        let rows: usize = dataset.scan().map(|b| b.unwrap().batch.num_rows()).sum();
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
        let err = failing.scan().find_map(|b| b.err()).expect("an error");
        assert_eq!(err.kind(), ErrorKind::RowFilter);
        let message = err.to_string();
        assert!(message.contains(&path), "{message}");
        assert!(message.contains("row group 0"), "{message}");
        assert!(message.contains("the index is unavailable"), "{message}");

        let misnamed = base.with_row_filter(Arc::new(Failing(vec!["nope".into()])));
        let err = misnamed.scan().find_map(|b| b.err()).expect("an error");
        assert_eq!(err.kind(), ErrorKind::ColumnNotFound);
        assert!(err.to_string().contains("'nope'"), "{err}");
    }
}
