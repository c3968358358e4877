//! Counters of what a dataset's scans read and pruned.

use std::sync::atomic::AtomicU64;

use crate::io::IoMetricsSnapshot;

/// Counters of what pruning skipped, summed over every scan of a dataset.
#[derive(Debug, Default)]
pub(super) struct ScanMetrics {
    pub(super) row_groups_total: AtomicU64,
    pub(super) row_groups_pruned_by_statistics: AtomicU64,
    pub(super) row_groups_pruned_by_page_index: AtomicU64,
    pub(super) rows_pruned_by_page_index: AtomicU64,
    pub(super) files_skipped: AtomicU64,
    pub(super) files_pruned_by_partition: AtomicU64,
    pub(super) row_groups_skipped: AtomicU64,
    pub(super) flat_decoder_chunks: AtomicU64,
    pub(super) row_groups_filtered_after_decoding: AtomicU64,
    pub(super) row_groups_pages_located: AtomicU64,
}

/// A point-in-time copy of a dataset's pruning and I/O counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanMetricsSnapshot {
    pub row_groups_total: u64,
    pub row_groups_pruned_by_statistics: u64,
    pub row_groups_pruned_by_page_index: u64,
    pub rows_pruned_by_page_index: u64,
    /// Files a [`ScanSkip`](super::ScanSkip) skipped (neither footer nor data read).
    pub files_skipped: u64,
    /// Files a filter ruled out by their hive partition values (neither footer nor data
    /// read; see [`with_hive_partitioning`](super::ParquetDatasetBuilder::with_hive_partitioning)).
    pub files_pruned_by_partition: u64,
    /// Row groups a [`ScanSkip`](super::ScanSkip) skipped (data not read).
    pub row_groups_skipped: u64,
    /// Column chunks decoded by forebay's own flat-column decoders (see
    /// [`ParquetDatasetBuilder::with_flat_decoder`](super::ParquetDatasetBuilder::with_flat_decoder)) rather than the parquet crate.
    pub flat_decoder_chunks: u64,
    /// Row groups a filter kept most rows of, decoded whole and then filtered (see
    /// [`ParquetDatasetBuilder::with_filter`](super::ParquetDatasetBuilder::with_filter)).
    pub row_groups_filtered_after_decoding: u64,
    /// Row groups of files without a page index whose pages forebay located, the first time
    /// part of one was read (by [`scan_row_ranges`](super::ParquetDataset::scan_row_ranges)),
    /// so that a range reads its own pages only.
    pub row_groups_pages_located: u64,
    pub io: IoMetricsSnapshot,
}
