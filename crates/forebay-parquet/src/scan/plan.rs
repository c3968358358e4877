//! A scan's plan for a host engine: the row groups a scan would read, with their sizes and
//! column statistics, and a scan of a chosen set of them.
//!
//! ```text
//!  footers (read in parallel, cached) ──► skips ──► filter pruning (statistics, page index)
//!      ──► ScanUnit { file, row group, rows, bytes, per-column min / max / nulls }
//!  host: group units into partitions ──► dataset.scan_units(partition) per worker
//! ```
//!
//! The units are the scan's own (what [`ParquetDataset::scan`] would decode), so a host that
//! splits them into partitions and scans each reads every row exactly once.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef};
use futures::StreamExt;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::file::metadata::ParquetMetaData;

use arrow_schema::Schema;

use super::accounting::decoded_bytes_estimate;
use super::evolve::widen;
use super::metrics::ScanMetrics;
use super::{OpenedFile, ParquetDataset, ScanSkip, ScanStream};
use crate::error::Result;
use crate::io::FileEntry;

/// One row group a scan reads: where it is, how large, and what its columns hold.
#[derive(Debug, Clone)]
pub struct ScanUnit {
    /// Position of the file in the dataset's file list.
    pub file_index: usize,
    /// The file's URI or absolute path.
    pub file: Arc<str>,
    pub row_group: usize,
    /// Rows in the row group.
    pub rows: u64,
    /// Rows the scan decodes: fewer than `rows` when the page index let a filter skip pages.
    pub rows_to_read: u64,
    /// Bytes of the selected columns as stored (what is fetched).
    pub compressed_bytes: u64,
    /// Their estimated size decoded (Arrow).
    pub decoded_bytes: u64,
    /// Statistics of the output columns, in output order.
    pub columns: Vec<ColumnStatistics>,
}

/// What a row group's footer says about one output column. Unknown values are `None` (the
/// file has no statistics for it, or it is nested).
#[derive(Debug, Clone)]
pub struct ColumnStatistics {
    pub column: String,
    /// One value, of the column's output type.
    pub min: Option<ArrayRef>,
    pub max: Option<ArrayRef>,
    pub null_count: Option<u64>,
}

impl ParquetDataset {
    /// The row groups a scan reads (after skips and the filter's pruning), in scan order,
    /// with sizes and column statistics; every footer is read (in parallel, and cached for
    /// the scans).
    pub fn plan(&self) -> Result<Vec<ScanUnit>> {
        let this = self.clone();
        self.block_on(async move { this.plan_async().await })
    }

    /// [`plan`](Self::plan) for async callers.
    pub async fn plan_async(&self) -> Result<Vec<ScanUnit>> {
        let inner = self.inner.clone();
        let opened = inner.open_in_order(inner.files_not_skipped());
        futures::pin_mut!(opened);
        // Pruning counts go to a plan's own counters, not the scans'.
        let metrics = ScanMetrics::default();
        let mut units = Vec::new();
        while let Some(file) = opened.next().await {
            let file = file?;
            let footer = file.reader_meta.metadata();
            let statistics = FileStatistics::of(&file, &self.schema());
            for unit in inner.plan_units(&file, &metrics) {
                if let Some(s) = &inner.options.skip {
                    if s.0.skip_row_group_in(&file.entry, footer, unit.row_group) {
                        continue;
                    }
                }
                units.push(scan_unit(&file, footer, &statistics, &unit));
            }
        }
        Ok(units)
    }

    /// Scan only `units` (from [`plan`](Self::plan)): their batches in scan order (file,
    /// then row group), whatever order they are given in. A host gives each partition its
    /// share of the plan.
    pub fn scan_units(&self, units: &[ScanUnit]) -> ScanStream {
        let only = OnlyUnits(
            units
                .iter()
                .map(|u| (u.file.clone(), u.row_group))
                .collect(),
        );
        self.and_skip(Arc::new(only)).scan()
    }
}

/// A scan's skip that keeps only the listed row groups.
struct OnlyUnits(HashSet<(Arc<str>, usize)>);

impl ScanSkip for OnlyUnits {
    fn skip_file(&self, file: &FileEntry) -> bool {
        !self.0.iter().any(|(f, _)| f.as_ref() == file.uri())
    }

    fn skip_row_group(&self, file: &FileEntry, row_group: usize) -> bool {
        !self.0.contains(&(Arc::from(file.uri()), row_group))
    }
}

/// Statistics of every row group of a file, per column of the dataset (one array entry per
/// row group), computed once per file.
struct FileStatistics(Vec<(String, Option<RowGroupValues>)>);

enum RowGroupValues {
    Known {
        mins: ArrayRef,
        maxes: ArrayRef,
        null_counts: arrow_array::UInt64Array,
    },
    /// The file lacks the column (schema evolution): all nulls.
    Absent { rows: Vec<u64> },
}

impl FileStatistics {
    fn of(file: &OpenedFile, dataset: &Schema) -> FileStatistics {
        let footer = file.reader_meta.metadata();
        let groups = footer.row_groups();
        let schema = file.reader_meta.schema();
        let parquet_schema = file.reader_meta.parquet_schema();
        let orders = footer.file_metadata().column_orders().map(|v| v.as_slice());
        let cast =
            |name: &str, values: ArrayRef| match file.adapter.get().and_then(|a| a.cast_of(name)) {
                Some(to) => widen(&values, to).ok(),
                None => Some(values),
            };
        FileStatistics(
            dataset
                .fields()
                .iter()
                .map(|field| {
                    let name = field.name().clone();
                    // A hive partition column: no statistics said (unknown, never pruned by).
                    if file
                        .partitions
                        .as_ref()
                        .is_some_and(|p| p.schema.index_of(&name).is_ok())
                    {
                        return (name, None);
                    }
                    if file.output_schema.index_of(&name).is_err() {
                        let rows = groups.iter().map(|g| g.num_rows().max(0) as u64).collect();
                        return (name, Some(RowGroupValues::Absent { rows }));
                    }
                    let values = StatisticsConverter::try_new(&name, schema, parquet_schema)
                        .ok()
                        .map(|c| {
                            c.with_missing_null_counts_as_zero(false)
                                .with_column_orders(orders)
                        })
                        .and_then(|c| {
                            Some(RowGroupValues::Known {
                                mins: cast(&name, c.row_group_mins(groups.iter()).ok()?)?,
                                maxes: cast(&name, c.row_group_maxes(groups.iter()).ok()?)?,
                                null_counts: c.row_group_null_counts(groups.iter()).ok()?,
                            })
                        });
                    (name, values)
                })
                .collect(),
        )
    }

    fn of_row_group(&self, row_group: usize) -> Vec<ColumnStatistics> {
        let value = |array: &ArrayRef| {
            (row_group < array.len() && array.is_valid(row_group))
                .then(|| array.slice(row_group, 1))
        };
        self.0
            .iter()
            .map(|(column, values)| match values {
                Some(RowGroupValues::Known {
                    mins,
                    maxes,
                    null_counts,
                }) => ColumnStatistics {
                    column: column.clone(),
                    min: value(mins),
                    max: value(maxes),
                    null_count: (row_group < null_counts.len() && null_counts.is_valid(row_group))
                        .then(|| null_counts.value(row_group)),
                },
                Some(RowGroupValues::Absent { rows }) => ColumnStatistics {
                    column: column.clone(),
                    min: None,
                    max: None,
                    null_count: rows.get(row_group).copied(),
                },
                None => ColumnStatistics {
                    column: column.clone(),
                    min: None,
                    max: None,
                    null_count: None,
                },
            })
            .collect()
    }
}

fn scan_unit(
    file: &OpenedFile,
    footer: &ParquetMetaData,
    statistics: &FileStatistics,
    unit: &super::Unit,
) -> ScanUnit {
    let group = footer.row_group(unit.row_group);
    let rows = group.num_rows().max(0) as u64;
    let selected = group
        .columns()
        .iter()
        .enumerate()
        .filter(|(leaf, _)| file.projection.leaf_included(*leaf));
    let (compressed_bytes, decoded_bytes) = selected.fold((0, 0), |(c, d), (_, chunk)| {
        (
            c + chunk.compressed_size().max(0) as u64,
            d + decoded_bytes_estimate(chunk),
        )
    });
    ScanUnit {
        file_index: file.index,
        file: file.entry.uri.clone(),
        row_group: unit.row_group,
        rows,
        rows_to_read: unit
            .selection
            .as_ref()
            .map_or(rows, |s| s.row_count() as u64),
        compressed_bytes,
        decoded_bytes,
        columns: statistics.of_row_group(unit.row_group),
    }
}
