//! Sharing a dataset's input between tasks without reading footers first: byte-range
//! splits, and skips that add up.
//!
//! A planner that knows only file sizes (from a listing) cuts each file into byte ranges,
//! one per task. A task reads the row groups whose first byte lies in its range, the rule
//! Hadoop and Spark splits follow: every row group belongs to exactly one range, whatever
//! the ranges are, so the tasks of one file together read each of its row groups once.
//!
//! ```text
//!  file (300 bytes)  │ rg 0: 0..90 │ rg 1: 90..200 │ rg 2: 200..260 │ footer │
//!  ranges            [0, 100)        [100, 200)      [200, 300)
//!  reads             rg 0 and rg 1   nothing         rg 2
//!                    (rg 1 starts at 90, inside the first range)
//! ```
//!
//! [`AllSkips`](crate::AllSkips) combines skips (a resume's finished input and a task's range): a file or
//! row group is skipped when any of them says so.

use std::collections::HashMap;
use std::ops::Range;

use parquet::file::metadata::ParquetMetaData;

use crate::io::FileEntry;
use crate::scan::ScanSkip;

/// Byte ranges of files a task reads: the row groups whose first byte lies in the file's
/// range. Files without a range are read whole.
#[derive(Debug, Clone, Default)]
pub struct ByteRangeSplit {
    ranges: HashMap<String, Range<u64>>,
}

impl ByteRangeSplit {
    /// No ranges yet: every file is read whole.
    pub fn new() -> Self {
        Self::default()
    }

    /// Read only the row groups of `uri` (as the dataset names it) starting in `range`.
    pub fn with_range(mut self, uri: impl Into<String>, range: Range<u64>) -> Self {
        self.ranges.insert(uri.into(), range);
        self
    }

    /// The range given for `uri`, if any.
    pub fn range(&self, uri: &str) -> Option<&Range<u64>> {
        self.ranges.get(uri)
    }
}

/// Where a row group's data starts: its first column chunk's first page (the dictionary
/// page when there is one).
pub fn row_group_start(footer: &ParquetMetaData, row_group: usize) -> u64 {
    let meta = footer.row_group(row_group);
    meta.columns()
        .iter()
        .map(|c| c.byte_range().0)
        .min()
        .unwrap_or(0)
}

impl ScanSkip for ByteRangeSplit {
    fn skip_file(&self, file: &FileEntry) -> bool {
        // A range past the file's end holds no row group: no need for the footer.
        self.ranges
            .get(file.uri())
            .is_some_and(|r| r.start >= file.size() || r.is_empty())
    }

    fn skip_row_group(&self, _file: &FileEntry, _row_group: usize) -> bool {
        false // decided with the footer, in skip_row_group_in
    }

    fn skip_row_group_in(
        &self,
        file: &FileEntry,
        footer: &ParquetMetaData,
        row_group: usize,
    ) -> bool {
        self.ranges
            .get(file.uri())
            .is_some_and(|r| !r.contains(&row_group_start(footer, row_group)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Int64Array, RecordBatch};
    use parquet::file::properties::WriterProperties;
    use proptest::prelude::*;

    use super::*;
    use crate::test_files::write_parquet_file;
    use crate::{DatasetSource, ParquetDataset};

    /// `rows` ids in row groups of `group` rows; returns the path and the file's size.
    fn write_file(dir: &std::path::Path, rows: i64, group: usize) -> (String, u64) {
        let path = dir.join("in.parquet");
        let ids = Int64Array::from_iter_values(0..rows);
        let batch = RecordBatch::try_from_iter([("id", Arc::new(ids) as _)]).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group))
            .set_dictionary_enabled(false)
            .build();
        let path = write_parquet_file(&path, &batch, props);
        let size = std::fs::metadata(&path).unwrap().len();
        (path, size)
    }

    /// Ids and row groups a scan of `path` limited to `range` yields.
    fn read_range(path: &str, range: Range<u64>) -> (Vec<i64>, Vec<usize>) {
        let dataset = ParquetDataset::builder(DatasetSource::uris([path.to_string()]))
            .build()
            .unwrap();
        let split = ByteRangeSplit::new().with_range(path, range);
        let mut ids = Vec::new();
        let mut groups = Vec::new();
        for batch in dataset.and_skip(Arc::new(split)).scan().blocking_iter() {
            let batch = batch.unwrap();
            groups.push(batch.provenance.row_group);
            ids.extend(batch.batch.column(0).as_primitive::<Int64Type>().values());
        }
        groups.dedup();
        (ids, groups)
    }

    #[test]
    fn a_file_cut_anywhere_is_read_once_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (path, size) = write_file(dir.path(), 1_000, 100);
        // One range: everything.
        let (all, groups) = read_range(&path, 0..size);
        assert_eq!(all, (0..1_000).collect::<Vec<_>>());
        assert_eq!(groups, (0..10).collect::<Vec<_>>());
        // A range past the last row group's start (the footer) reads nothing.
        assert!(read_range(&path, size - 8..size).0.is_empty());
        // Combined with another skip, both apply.
        struct SkipFirst;
        impl ScanSkip for SkipFirst {
            fn skip_file(&self, _: &FileEntry) -> bool {
                false
            }
            fn skip_row_group(&self, _: &FileEntry, rg: usize) -> bool {
                rg == 0
            }
        }
        let dataset = ParquetDataset::builder(DatasetSource::uris([path.clone()]))
            .build()
            .unwrap()
            .with_skip(Arc::new(SkipFirst))
            .and_skip(Arc::new(
                ByteRangeSplit::new().with_range(&path, 0..size / 2),
            ));
        let rows: usize = dataset
            .scan()
            .blocking_iter()
            .map(|b| b.unwrap().batch.num_rows())
            .sum();
        let half = read_range(&path, 0..size / 2).0;
        assert!(half.len() > 100 && half.len() < 1_000, "{}", half.len());
        assert_eq!(rows, half.len() - 100);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]
        /// However a file is cut into ranges, the ranges together read every row once,
        /// in order.
        #[test]
        fn any_cut_reads_every_row_once(cuts in proptest::collection::vec(0.0f64..1.0, 0..6)) {
            let dir = tempfile::tempdir().unwrap();
            let (path, size) = write_file(dir.path(), 2_000, 150);
            let mut bounds: Vec<u64> = cuts.iter().map(|c| (c * size as f64) as u64).collect();
            bounds.extend([0, size]);
            bounds.sort_unstable();
            let mut ids = Vec::new();
            for pair in bounds.windows(2) {
                ids.extend(read_range(&path, pair[0]..pair[1]).0);
            }
            prop_assert_eq!(ids, (0..2_000).collect::<Vec<_>>());
        }
    }
}
