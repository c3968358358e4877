//! Which row groups and rows of a file a filter may match: row groups by their statistics,
//! rows by the page index.

use std::sync::atomic::Ordering;

use arrow_array::Array;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::RowSelection;

use super::metrics::ScanMetrics;
use super::{DatasetInner, OpenedFile, Unit};
use crate::predicate::ContainerStats;

impl DatasetInner {
    /// Row groups of `file` that may hold matching rows, with page-level selections; what
    /// was pruned is counted in `metrics` (the scan's, or a plan's own).
    pub(super) fn plan_units(&self, file: &OpenedFile, metrics: &ScanMetrics) -> Vec<Unit> {
        let metadata = file.reader_meta.metadata();
        let row_groups = metadata.row_groups();
        let mut first_row = 0u64;
        let starts: Vec<u64> = row_groups
            .iter()
            .map(|rg| {
                let s = first_row;
                first_row += rg.num_rows().max(0) as u64;
                s
            })
            .collect();
        metrics
            .row_groups_total
            .fetch_add(row_groups.len() as u64, Ordering::Relaxed);
        let all = || {
            (0..row_groups.len())
                .map(|rg| Unit::new(file, rg, starts[rg], None))
                .collect()
        };
        let Some((_, bound)) = &file.filter else {
            return all();
        };

        let schema = file.reader_meta.schema().clone();
        let parquet_schema = file.reader_meta.parquet_schema();
        let orders = metadata
            .file_metadata()
            .column_orders()
            .map(|v| v.as_slice());
        let converter = |column: &str| -> Option<StatisticsConverter<'_>> {
            StatisticsConverter::try_new(column, &schema, parquet_schema)
                .ok()
                .map(|c| {
                    c.with_missing_null_counts_as_zero(false)
                        .with_column_orders(orders)
                })
        };
        let keep = bound.may_match(row_groups.len(), &mut |column| {
            let c = converter(column)?;
            Some(ContainerStats {
                mins: c.row_group_mins(row_groups.iter()).ok()?,
                maxes: c.row_group_maxes(row_groups.iter()).ok()?,
                null_counts: c.row_group_null_counts(row_groups.iter()).ok()?,
                row_counts: c.row_group_row_counts(row_groups.iter()).ok().flatten(),
                min_exact: c.row_group_is_min_value_exact(row_groups.iter()).ok(),
                max_exact: c.row_group_is_max_value_exact(row_groups.iter()).ok(),
                slots_per_container: None,
            })
        });
        let pruned = keep.iter().filter(|k| !**k).count() as u64;
        metrics
            .row_groups_pruned_by_statistics
            .fetch_add(pruned, Ordering::Relaxed);

        let page_index = metadata.page_index().map(|pi| pi.as_ref());
        let mut units = Vec::new();
        for (rg, _) in keep.iter().enumerate().filter(|(_, k)| **k) {
            let rows = row_groups[rg].num_rows().max(0) as usize;
            let selection = page_index.and_then(|pi| {
                let rg_list = [rg];
                let keep_rows = bound.may_match(rows, &mut |column| {
                    let c = converter(column)?;
                    let spans = c
                        .data_page_row_counts(pi, row_groups, rg_list.iter())
                        .ok()
                        .flatten()?;
                    if spans.null_count() > 0 {
                        return None;
                    }
                    Some(ContainerStats {
                        mins: c.data_page_mins(pi, rg_list.iter()).ok()?,
                        maxes: c.data_page_maxes(pi, rg_list.iter()).ok()?,
                        null_counts: c.data_page_null_counts(pi, rg_list.iter()).ok()?,
                        row_counts: Some(spans.clone()),
                        min_exact: None,
                        max_exact: None,
                        slots_per_container: Some(
                            spans.values().iter().map(|v| *v as usize).collect(),
                        ),
                    })
                });
                let selected = keep_rows.iter().filter(|k| **k).count();
                (selected < rows).then(|| (selection_from_mask(&keep_rows), rows - selected))
            });
            match selection {
                Some((_, skipped)) if skipped == rows => {
                    metrics
                        .row_groups_pruned_by_page_index
                        .fetch_add(1, Ordering::Relaxed);
                    metrics
                        .rows_pruned_by_page_index
                        .fetch_add(skipped as u64, Ordering::Relaxed);
                }
                Some((sel, skipped)) => {
                    metrics
                        .rows_pruned_by_page_index
                        .fetch_add(skipped as u64, Ordering::Relaxed);
                    units.push(Unit::new(file, rg, starts[rg], Some(sel)));
                }
                None => units.push(Unit::new(file, rg, starts[rg], None)),
            }
        }
        units
    }
}

fn selection_from_mask(keep: &[bool]) -> RowSelection {
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < keep.len() {
        if keep[i] {
            let start = i;
            while i < keep.len() && keep[i] {
                i += 1;
            }
            ranges.push(start..i);
        } else {
            i += 1;
        }
    }
    RowSelection::from_consecutive_ranges(ranges.into_iter(), keep.len())
}
