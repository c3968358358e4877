//! Opening a file: its footer read (once per dataset) and turned into a read plan.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

use arrow_schema::{Field, Schema};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;

use super::evolve::Adapter;
use super::footer::{read_footer, FOOTER_CONCURRENCY, MOST_FILES_OPENED_AHEAD};
use super::page_locations::PageLocations;
use super::partitions::FileFilter;
use super::runtime::panic_message;
use super::schema::{
    apply_dictionary_hints, apply_embedded_time_zones, apply_int96_unit, check_map_keys_required,
    check_same_schema, check_supported_types, flat_columns, resolve_projection,
};
use super::{DatasetInner, FilteredWhole, OpenedFile, WholeDecode};
use crate::error::{corrupt_from, ParquetError, Result};
use crate::io::{FileEntry, ObjectFileReader, RangePolicy};
use crate::predicate::Predicate;

impl DatasetInner {
    /// The files a [`ScanSkip`](super::ScanSkip) and the filter's terms on partition
    /// columns leave, by index.
    pub(super) fn files_not_skipped(&self) -> Vec<usize> {
        (0..self.files.len())
            .filter(|&i| match &self.options.skip {
                Some(s) => !s.0.skip_file(&self.files[i]),
                None => true,
            })
            .filter(|&i| !self.excluded_by_partition(i))
            .collect()
    }

    /// Whether the filter's terms on partition columns rule file `index` out.
    pub(super) fn excluded_by_partition(&self, index: usize) -> bool {
        self.partitions
            .as_ref()
            .is_some_and(|p| matches!(p.filter_of(index), FileFilter::Excluded))
    }

    /// [`ParquetDataset::filter_keeps_whole_files`](super::ParquetDataset::filter_keeps_whole_files).
    pub(super) fn filter_keeps_whole_files(&self) -> bool {
        self.options.filter.is_some()
            && self
                .partitions
                .as_ref()
                .is_some_and(|p| p.decide_the_filter())
    }

    /// The filter file `index`'s rows are read under: the dataset's, less what its
    /// partition values decide.
    fn filter_of_file(&self, index: usize) -> Option<&Predicate> {
        match &self.partitions {
            None => self.options.filter.as_ref(),
            Some(partitions) => match partitions.filter_of(index) {
                FileFilter::Rows(rows) => Some(rows),
                FileFilter::All | FileFilter::Excluded => None,
            },
        }
    }

    /// Footers and read plans of files `indices`, in that order, `FOOTER_CONCURRENCY` read at
    /// once locally, [`MOST_FILES_OPENED_AHEAD`] on an object store, where each waits a round
    /// trip (each from the cache or read now).
    pub(super) fn open_in_order(
        self: &Arc<Self>,
        indices: Vec<usize>,
    ) -> impl futures::Stream<Item = Result<Arc<OpenedFile>>> {
        let remote = indices
            .first()
            .is_some_and(|&i| self.files[i].local_path.is_none());
        let at_once = if remote {
            MOST_FILES_OPENED_AHEAD
        } else {
            FOOTER_CONCURRENCY
        };
        let inner = self.clone();
        futures::stream::iter(indices)
            .map(move |i| {
                let inner = inner.clone();
                async move { inner.open(i).await }
            })
            .buffered(at_once)
    }

    /// Footer and read plan of file `index`, from the cache or read now.
    pub(super) async fn open(self: &Arc<Self>, index: usize) -> Result<Arc<OpenedFile>> {
        Ok(self.open_with(index, false).await?.0)
    }

    /// [`open`](Self::open) for the scan, which reads the file next: a small file on an
    /// object store not opened yet is fetched whole with its footer, and the bytes come
    /// back with it (for the scan's units of this file; the cache keeps only the plan).
    /// Not under a filter, whose statistics may prune the whole file once its footer is
    /// read: then the data would have been fetched for nothing.
    pub(super) async fn open_for_scan(
        self: &Arc<Self>,
        index: usize,
    ) -> Result<(Arc<OpenedFile>, Option<Bytes>)> {
        self.open_with(index, self.options.filter.is_none()).await
    }

    async fn open_with(
        self: &Arc<Self>,
        index: usize,
        whole_if_small: bool,
    ) -> Result<(Arc<OpenedFile>, Option<Bytes>)> {
        if let Some(found) = self.opened.lock().expect("cache lock").get(&index) {
            return Ok((found.clone(), None));
        }
        let entry = self.files[index].clone();
        let this = self.clone();
        let task =
            AssertUnwindSafe(async move { this.open_uncached(index, entry, whole_if_small).await });
        let (opened, whole_file) = match task.catch_unwind().await {
            Ok(result) => {
                let (opened, whole_file) = result?;
                (Arc::new(opened), whole_file)
            }
            Err(panic) => {
                return Err(ParquetError::Corrupt {
                    path: self.files[index].uri.to_string(),
                    row_group: None,
                    reason: format!(
                        "the Parquet footer could not be decoded: {}",
                        panic_message(&panic)
                    ),
                    source: None,
                })
            }
        };
        self.opened
            .lock()
            .expect("cache lock")
            .insert(index, opened.clone());
        Ok((opened, whole_file))
    }

    async fn open_uncached(
        &self,
        index: usize,
        entry: FileEntry,
        whole_if_small: bool,
    ) -> Result<(OpenedFile, Option<Bytes>)> {
        let path = entry.uri.to_string();
        let footer = read_footer(
            &entry,
            &self.io,
            self.wants_page_index(),
            whole_if_small,
            self.take_tail_ahead(index),
        )
        .await?;
        let metadata = footer.metadata;
        check_supported_types(metadata.file_metadata().schema_descr(), &path)?;
        let file_schema = {
            let plain = ArrowReaderMetadata::try_new(metadata.clone(), ArrowReaderOptions::new())
                .map_err(|e| ParquetError::from_decode(&path, None, e))?;
            plain.schema().clone()
        };
        check_map_keys_required(metadata.file_metadata().schema(), &path)?;
        let hinted = apply_dictionary_hints(&file_schema, &self.options.dictionary_columns, &path)?;
        let hinted = apply_int96_unit(&hinted, &metadata, self.options.int96_unit);
        let hinted = apply_embedded_time_zones(&hinted, &metadata);
        if let Some(partitions) = &self.partitions {
            partitions.check_file(&hinted, &path)?;
        }
        let reader_meta = ArrowReaderMetadata::try_new(
            metadata.clone(),
            ArrowReaderOptions::new().with_schema(hinted.clone()),
        )
        .map_err(|e| corrupt_from(&path, None, e))?;
        let parquet_schema = reader_meta.parquet_schema();

        // Files that may differ (`evolve`) read the dataset's columns they have.
        let present = self
            .options
            .evolves()
            .then(|| self.columns_present(&hinted, &path))
            .transpose()?;
        let (projection, requested_roots) = resolve_projection(
            parquet_schema,
            &hinted,
            present.as_deref().or(self.file_columns.as_deref()),
            &path,
        )?;
        // Decoded batches hold the selected roots in file order; output follows the request.
        let mut selected_roots: Vec<usize> = requested_roots.clone();
        selected_roots.sort_unstable();
        selected_roots.dedup();
        let reorder: Vec<usize> = requested_roots
            .iter()
            .map(|r| selected_roots.binary_search(r).expect("root is selected"))
            .collect();
        let whole = self.whole_decode(&entry, &reader_meta, projection.clone(), &selected_roots)?;
        let decoded_schema = whole.schema.clone();
        let output_schema = Arc::new(Schema::new(
            reorder
                .iter()
                .map(|&i| decoded_schema.field(i).clone())
                .collect::<Vec<Field>>(),
        ));
        let adapter = OnceLock::new();
        match self.schema.get() {
            Some(dataset) if self.options.evolves() => {
                let _ = adapter.set(Adapter::new(&output_schema, dataset.clone(), &path)?);
            }
            Some(first) => {
                let first_path = &self.files[self.schema_file].uri;
                check_same_schema(first, &output_schema, &path, first_path)?
            }
            None => {}
        }
        let (filter, filtered_whole) = match self.filter_of_file(index) {
            None => (None, None),
            Some(predicate) => {
                let bound = predicate.bind(&hinted, &path)?;
                let roots: Vec<usize> = bound
                    .columns()
                    .iter()
                    .map(|c| hinted.index_of(c).expect("bind checked the column"))
                    .collect();
                let filtered_whole =
                    self.filtered_whole(&entry, &reader_meta, &whole, &selected_roots, &roots)?;
                let mask = ProjectionMask::roots(parquet_schema, roots);
                (Some((mask, bound)), Some(filtered_whole))
            }
        };
        let opened = OpenedFile {
            entry,
            index,
            reader_meta,
            projection,
            reorder,
            output_schema,
            adapter,
            filter,
            whole,
            filtered_whole,
            page_locations: PageLocations::new(metadata.num_row_groups()),
            partitions: self.partitions.clone(),
        };
        Ok((opened, footer.whole_file))
    }

    /// How a row group of the file read whole is decoded: the leaves of `projection`, one
    /// column per root of `roots` (sorted), forebay's decoders for the flat ones.
    fn whole_decode(
        &self,
        entry: &FileEntry,
        reader_meta: &ArrowReaderMetadata,
        projection: ProjectionMask,
        roots: &[usize],
    ) -> Result<WholeDecode> {
        let schema = ParquetRecordBatchStreamBuilder::new_with_metadata(
            ObjectFileReader::new(
                entry.clone(),
                self.io.clone(),
                RangePolicy::MergeGapsUpTo(0),
            ),
            reader_meta.clone(),
        )
        .with_projection(projection.clone())
        .with_row_groups(vec![])
        .build()
        .map_err(|e| corrupt_from(&entry.uri, None, e))?
        .schema()
        .clone();
        let flat_columns = if self.options.flat_decoder {
            flat_columns(reader_meta.parquet_schema(), roots, &schema)
        } else {
            Vec::new()
        };
        Ok(WholeDecode {
            projection,
            schema,
            flat_columns,
        })
    }

    /// How a row group is decoded whole and then filtered (see `selectivity`): `whole` with
    /// the filter's columns (`filter_roots`) it does not select, dropped after filtering.
    fn filtered_whole(
        &self,
        entry: &FileEntry,
        reader_meta: &ArrowReaderMetadata,
        whole: &WholeDecode,
        selected_roots: &[usize],
        filter_roots: &[usize],
    ) -> Result<FilteredWhole> {
        let missing: Vec<usize> = filter_roots
            .iter()
            .copied()
            .filter(|r| selected_roots.binary_search(r).is_err())
            .collect();
        if missing.is_empty() {
            return Ok(FilteredWhole {
                decode: whole.clone(),
                returned: None,
            });
        }
        let mut roots: Vec<usize> = selected_roots.iter().chain(&missing).copied().collect();
        roots.sort_unstable();
        roots.dedup();
        let mut projection = whole.projection.clone();
        projection.union(&ProjectionMask::roots(
            reader_meta.parquet_schema(),
            missing,
        ));
        let returned = selected_roots
            .iter()
            .map(|r| roots.binary_search(r).expect("selected roots are decoded"))
            .collect();
        Ok(FilteredWhole {
            decode: self.whole_decode(entry, reader_meta, projection, &roots)?,
            returned: Some(returned),
        })
    }

    /// With schema evolution: the columns this file has of those the dataset reads (the
    /// dataset's schema once known; else, while a union is being worked out, the requested
    /// columns or all). A file with none of them is an error.
    fn columns_present(&self, file_schema: &Schema, path: &str) -> Result<Vec<String>> {
        let wanted: Vec<String> = match (self.schema.get(), &self.file_columns) {
            (Some(dataset), _) => dataset.fields().iter().map(|f| f.name().clone()).collect(),
            (None, Some(columns)) => columns.clone(),
            (None, None) => file_schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
        };
        // (None wanted: only hive partition columns are read.)
        let wanted_some = !wanted.is_empty();
        let present: Vec<String> = wanted
            .into_iter()
            .filter(|name| file_schema.index_of(name).is_ok())
            .collect();
        if present.is_empty() && wanted_some {
            return Err(ParquetError::SchemaMismatch {
                path: path.to_string(),
                first: "the dataset's schema".into(),
                reason: format!(
                    "the file has none of the columns read (it has {:?})",
                    file_schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                ),
            });
        }
        Ok(present)
    }

    fn wants_page_index(&self) -> bool {
        (self.options.filter.is_some() || self.options.for_row_ranges)
            && self.options.use_page_index
    }

    /// How the ranges of `entry` a decoder asks for become requests: the builder's fixed
    /// gap when it set one, only the bytes asked for when the file is read with positioned
    /// reads, else planned against the link (`io::request_plan`). Decided by how the file is
    /// read, not by how it is named.
    pub(super) fn range_policy_for(&self, entry: &FileEntry) -> RangePolicy {
        match (self.coalesce_gap, &entry.local_path) {
            (Some(gap), _) => RangePolicy::MergeGapsUpTo(gap),
            (None, Some(_)) => RangePolicy::MergeGapsUpTo(0),
            (None, None) => RangePolicy::Planned,
        }
    }
}
