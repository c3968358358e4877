//! Page locations of files written without a page index, found once per row group, so that
//! reading part of a row group reads only the pages that hold it.
//!
//! ```text
//!  a selection of part of row group g, the file has no offset index
//!        │ first time for g: its selected column chunks fetched whole
//!        ▼
//!  each chunk's pages walked (SerializedPageReader over a region that records where it
//!  reads): a page's header offset and size ──► PageLocation { offset, size, first row }
//!     rows of a page: a v2 header's num_rows; a v1 page of a flat column: its num_values;
//!     a v1 page of a repeated column: its repetition levels that are 0 (decompressed)
//!        ▼
//!  PageLocations: the file's metadata with the offset indexes found so far (g's among them)
//!        ▼
//!  the parquet crate reads the selection's pages only, as with a written page index
//! ```
//!
//! Why: without an offset index the crate finds a row by decoding every page before it. A
//! training stream reads a row group in blocks that land in different windows, so each block
//! decompressed the chunk up to itself: on rows of ~4 KB (token lists, 1 MiB pages) a
//! shuffled epoch decompressed its data ~16 times over. With the locations found once, the
//! first block of a row group pays one walk of its chunks (flat columns: headers only;
//! repeated ones: one decompression) and every block reads about its own pages.
//!
//! A row group whose pages cannot be located safely (a repeated column's page starting
//! inside a row, levels not in the RLE hybrid, rows not adding up to the footer's, an
//! unreadable page) is read as before: the crate finds its rows itself and reports what is
//! wrong with the file.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::page_index::PageIndexProvider;
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::page_index::offset_index::{OffsetIndexMetaData, PageLocation};
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;

use super::{DatasetInner, OpenedFile};
use crate::error::{corrupt_from, ParquetError, Result};
use crate::flat::hybrid::{HybridIndices, Indices};
use crate::io::{FetchedRegion, ObjectFileReader};

/// Page locations found for a file's row groups (see the module docs).
pub(super) struct PageLocations {
    /// The locations found, shared with the metadata below (filled in place: a row group
    /// found later does not rebuild the metadata).
    found: Arc<FoundOffsetIndexes>,
    /// The file's reader metadata with `found` as its page index, made on the first use.
    reader_meta: OnceLock<ArrowReaderMetadata>,
}

/// The offset indexes of the row groups whose pages were located; the page index of the
/// metadata a located row group is read with.
#[derive(Debug)]
struct FoundOffsetIndexes {
    row_groups: Vec<OnceLock<RowGroupPages>>,
}

#[derive(Debug)]
enum RowGroupPages {
    /// Per leaf of the file: its chunk's locations (None: a leaf not read).
    Located(Vec<Option<OffsetIndexMetaData>>),
    /// Read as before (see the module docs).
    Unusable,
}

impl PageIndexProvider for FoundOffsetIndexes {
    fn has_offset_indexes(&self) -> bool {
        true
    }

    fn has_column_indexes(&self) -> bool {
        false
    }

    fn column_index(&self, _row_group: usize, _column: usize) -> Option<&ColumnIndexMetaData> {
        None
    }

    fn offset_index(&self, row_group: usize, column: usize) -> Option<&OffsetIndexMetaData> {
        match self.row_groups.get(row_group)?.get()? {
            RowGroupPages::Located(leaves) => leaves.get(column)?.as_ref(),
            RowGroupPages::Unusable => None,
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl PageLocations {
    pub(super) fn new(row_groups: usize) -> Self {
        Self {
            found: Arc::new(FoundOffsetIndexes {
                row_groups: (0..row_groups).map(|_| OnceLock::new()).collect(),
            }),
            reader_meta: OnceLock::new(),
        }
    }

    /// The reader metadata to read a selection of `row_group` of `file` with: the file's own
    /// when it has an offset index (or the row group's pages cannot be located), else one
    /// holding the row group's page locations, found now the first time.
    pub(super) async fn reader_meta(
        &self,
        inner: &DatasetInner,
        file: &OpenedFile,
        row_group: usize,
    ) -> Result<ArrowReaderMetadata> {
        let metadata = file.reader_meta.metadata();
        let has_own_index = metadata
            .page_index()
            .is_some_and(|index| index.has_offset_indexes());
        let Some(slot) = self.found.row_groups.get(row_group) else {
            return Ok(file.reader_meta.clone());
        };
        if has_own_index {
            return Ok(file.reader_meta.clone());
        }
        if slot.get().is_none() {
            // Two units of the row group may look at once: both find the same locations,
            // the first kept.
            let located = match locate_row_group(inner, file, row_group).await? {
                Some(leaves) => RowGroupPages::Located(leaves),
                None => RowGroupPages::Unusable,
            };
            if slot.set(located).is_ok() && matches!(slot.get(), Some(RowGroupPages::Located(_))) {
                inner
                    .scan_metrics
                    .row_groups_pages_located
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        match slot.get() {
            Some(RowGroupPages::Located(_)) => {}
            _ => return Ok(file.reader_meta.clone()),
        }
        if let Some(meta) = self.reader_meta.get() {
            return Ok(meta.clone());
        }
        let with_index = with_offset_indexes(&file.reader_meta, self.found.clone())
            .map_err(|e| corrupt_from(&file.entry.uri, Some(row_group), e))?;
        Ok(self.reader_meta.get_or_init(|| with_index).clone())
    }
}

/// `base` with `found` as its page index.
fn with_offset_indexes(
    base: &ArrowReaderMetadata,
    found: Arc<FoundOffsetIndexes>,
) -> parquet::errors::Result<ArrowReaderMetadata> {
    let metadata = base
        .metadata()
        .as_ref()
        .clone()
        .into_builder()
        .set_page_index(Some(found as Arc<dyn PageIndexProvider>))
        .build();
    ArrowReaderMetadata::try_new(
        Arc::new(metadata),
        ArrowReaderOptions::new().with_schema(base.schema().clone()),
    )
}

/// The page locations of the chunks of `row_group` that `file` reads, or None when they
/// cannot be located safely.
async fn locate_row_group(
    inner: &DatasetInner,
    file: &OpenedFile,
    row_group: usize,
) -> Result<Option<Vec<Option<OffsetIndexMetaData>>>> {
    let metadata = file.reader_meta.metadata();
    let group = metadata.row_group(row_group);
    let rows = group.num_rows().max(0) as u64;
    let reader = ObjectFileReader::new(
        file.entry.clone(),
        inner.io.clone(),
        inner.range_policy_for(&file.entry),
    );
    // A local file is walked page by page (a page in memory at a time); a remote one's
    // chunks are fetched whole, one at a time.
    let local = match &file.entry.local_path {
        Some(path) => Some(
            std::fs::File::open(path)
                .map_err(|e| ParquetError::from_local_io(file.entry.uri.to_string(), e))?,
        ),
        None => None,
    };
    let mut leaves = vec![None; group.columns().len()];
    for (leaf, chunk) in group.columns().iter().enumerate() {
        if !file.projection.leaf_included(leaf) {
            continue;
        }
        let max_repetition = max_repetition_of(metadata, leaf);
        let located = match &local {
            Some(local) => {
                let local = local
                    .try_clone()
                    .map_err(|e| ParquetError::from_local_io(file.entry.uri.to_string(), e))?;
                locate_chunk(chunk, local, rows, max_repetition)
            }
            None => {
                let (start, len) = chunk.byte_range();
                let bytes = reader.fetch(start..start + len).await?;
                locate_chunk(
                    chunk,
                    FetchedRegion::new(start, bytes),
                    rows,
                    max_repetition,
                )
            }
        };
        match located {
            Some(locations) => leaves[leaf] = Some(locations),
            None => return Ok(None),
        }
    }
    Ok(Some(leaves))
}

/// The highest repetition level of leaf `leaf` (0: a flat column).
fn max_repetition_of(metadata: &parquet::file::metadata::ParquetMetaData, leaf: usize) -> i16 {
    metadata
        .file_metadata()
        .schema_descr()
        .column(leaf)
        .max_rep_level()
}

/// The data pages of one column chunk (read from `bytes`: the file, or the chunk fetched)
/// and the first row of each, or None when they cannot be located (see the module docs).
fn locate_chunk<R: ChunkReader + 'static>(
    chunk: &parquet::file::metadata::ColumnChunkMetaData,
    bytes: R,
    rows: u64,
    max_repetition: i16,
) -> Option<OffsetIndexMetaData> {
    let start = chunk.byte_range().0;
    let region = Arc::new(RecordingRegion {
        region: bytes,
        reads: Mutex::new(Reads::default()),
    });
    // A flat column's rows are in its page headers: its pages go as stored (no
    // decompression). A repeated column's v1 pages are decompressed for their levels.
    let as_stored;
    let chunk = if max_repetition == 0 && chunk.compression() != Compression::UNCOMPRESSED {
        as_stored = chunk
            .clone()
            .into_builder()
            .set_compression(Compression::UNCOMPRESSED)
            .build()
            .ok()?;
        &as_stored
    } else {
        chunk
    };
    let mut pages = SerializedPageReader::new(region.clone(), chunk, rows as usize, None).ok()?;
    let mut locations = Vec::new();
    let mut first_row = 0u64;
    let mut levels = None;
    while let Some(page) = pages.get_next_page().ok()? {
        let (header, body_end) = region.reads.lock().ok()?.last_page()?;
        let page_rows = match &page {
            Page::DictionaryPage { .. } => {
                if !locations.is_empty() || header != start {
                    return None; // a dictionary after data pages: not as the crate reads
                }
                continue;
            }
            Page::DataPageV2 { num_rows, .. } => u64::from(*num_rows),
            Page::DataPage { num_values: 0, .. } => return None,
            Page::DataPage { num_values, .. } if max_repetition == 0 => u64::from(*num_values),
            Page::DataPage {
                buf,
                num_values,
                rep_level_encoding,
                ..
            } => {
                if *rep_level_encoding != Encoding::RLE {
                    return None;
                }
                rows_of_levels(buf, *num_values as usize, max_repetition, &mut levels)?
            }
        };
        if page_rows == 0 {
            return None; // pages that start at the same row are not a location
        }
        locations.push(PageLocation {
            offset: i64::try_from(header).ok()?,
            compressed_page_size: i32::try_from(body_end - header).ok()?,
            first_row_index: i64::try_from(first_row).ok()?,
        });
        first_row += page_rows;
    }
    (first_row == rows && !locations.is_empty()).then_some(OffsetIndexMetaData {
        page_locations: locations,
        unencoded_byte_array_data_bytes: None,
    })
}

/// Rows of a v1 data page of a repeated column: its repetition levels (`[4-byte length]
/// [RLE hybrid]` at the front of `page`) that are 0. None when the page does not start a
/// row, or the levels do not read.
fn rows_of_levels(
    page: &Bytes,
    levels: usize,
    max_repetition: i16,
    reader: &mut Option<HybridIndices>,
) -> Option<u64> {
    let len = u32::from_le_bytes(page.get(..4)?.try_into().ok()?) as usize;
    let runs = page.slice(4..4usize.checked_add(len).filter(|end| *end <= page.len())?);
    let width = (16 - (max_repetition as u16).leading_zeros()) as u8;
    match reader {
        Some(reader) => reader.reset(width, runs).ok()?,
        None => *reader = Some(HybridIndices::new(width, runs).ok()?),
    }
    let reader = reader.as_mut().expect("set above");
    let mut rows = 0u64;
    let mut left = levels;
    let mut first = true;
    while left > 0 {
        let (zeros, read) = match reader.next(left).ok()? {
            Indices::Repeat { index, count } => {
                if first && index != 0 {
                    return None;
                }
                (if index == 0 { count } else { 0 }, count)
            }
            Indices::Listed(levels) => {
                if first && levels[0] != 0 {
                    return None;
                }
                (levels.iter().filter(|l| **l == 0).count(), levels.len())
            }
        };
        first = false;
        rows += zeros as u64;
        left -= read;
    }
    reader.release();
    Some(rows)
}

/// A fetched chunk that records where the page reader reads: each page's header is read
/// from where `get_read` starts, its body is `get_bytes`' range.
struct RecordingRegion<R> {
    region: R,
    reads: Mutex<Reads>,
}

#[derive(Default)]
struct Reads {
    /// Start of the last `get_read` (a page header).
    header: Option<u64>,
    /// The last page: its header's offset and its body's end.
    page: Option<(u64, u64)>,
}

impl Reads {
    fn last_page(&mut self) -> Option<(u64, u64)> {
        self.page.take()
    }
}

impl<R: ChunkReader> Length for RecordingRegion<R> {
    fn len(&self) -> u64 {
        self.region.len()
    }
}

impl<R: ChunkReader> ChunkReader for RecordingRegion<R> {
    type T = R::T;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        if let Ok(mut reads) = self.reads.lock() {
            reads.header = Some(start);
        }
        self.region.get_read(start)
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        if let Ok(mut reads) = self.reads.lock() {
            reads.page = reads.header.take().map(|h| (h, start + length as u64));
        }
        self.region.get_bytes(start, length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 page's front: `[4-byte length][runs]`, then (here) nothing else.
    fn page(runs: &[u8]) -> Bytes {
        let mut page = (runs.len() as u32).to_le_bytes().to_vec();
        page.extend_from_slice(runs);
        page.extend_from_slice(b"values follow");
        Bytes::from(page)
    }

    #[test]
    fn rows_are_the_repetition_levels_that_are_zero() {
        let mut reader = None;
        // Bit-packed, 1 bit: levels 0 1 1 0 1 (0 0 0 padding) = 0b0001_0110.
        assert_eq!(
            rows_of_levels(&page(&[0x03, 0x16]), 5, 1, &mut reader),
            Some(2)
        );
        // Runs: four 0s, then three 2s (width 2: one byte a value).
        assert_eq!(
            rows_of_levels(&page(&[8, 0, 6, 2]), 7, 2, &mut reader),
            Some(4)
        );
    }

    /// A file of an id and a list column, pages of a few rows, with or without a page index.
    fn file_with_lists(v2: bool, page_index: bool) -> Bytes {
        use arrow_array::builder::{Int32Builder, ListBuilder};
        use arrow_array::{ArrayRef, Int64Array, RecordBatch};
        use parquet::arrow::ArrowWriter;
        use parquet::file::properties::{WriterProperties, WriterVersion};
        let mut lists = ListBuilder::new(Int32Builder::new());
        for row in 0..300i32 {
            for i in 0..row % 9 {
                lists.values().append_value(row * 10 + i);
            }
            lists.append(row % 13 != 0);
        }
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..300)) as ArrayRef,
            ),
            ("tokens", Arc::new(lists.finish()) as ArrayRef),
        ])
        .unwrap();
        let props = WriterProperties::builder()
            .set_data_page_row_count_limit(20)
            .set_write_batch_size(20)
            .set_offset_index_disabled(!page_index)
            .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Chunk)
            .set_writer_version(if v2 {
                WriterVersion::PARQUET_2_0
            } else {
                WriterVersion::PARQUET_1_0
            })
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build();
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        Bytes::from(out)
    }

    #[test]
    fn pages_are_located_as_the_writer_would_have_indexed_them() {
        use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};
        for v2 in [false, true] {
            let file = file_with_lists(v2, false);
            let indexed = file_with_lists(v2, true);
            let metadata = ParquetMetaDataReader::new()
                .parse_and_finish(&file)
                .unwrap();
            let written = ParquetMetaDataReader::new()
                .with_page_index_policy(PageIndexPolicy::Required)
                .parse_and_finish(&indexed)
                .unwrap();
            let index = written.page_index().expect("the writer's page index");
            let group = metadata.row_group(0);
            for (leaf, chunk) in group.columns().iter().enumerate() {
                let repetition = max_repetition_of(&metadata, leaf);
                let located = locate_chunk(chunk, file.clone(), 300, repetition)
                    .unwrap_or_else(|| panic!("leaf {leaf} (v2: {v2}) located"));
                let expected = index.offset_index(0, leaf).expect("indexed");
                assert!(expected.page_locations.len() > 5, "pages of a few rows");
                assert_eq!(
                    located.page_locations, expected.page_locations,
                    "leaf {leaf} (v2: {v2})"
                );
            }
        }
    }

    #[test]
    fn damaged_chunks_are_located_or_not_never_a_panic() {
        use parquet::file::metadata::ParquetMetaDataReader;
        for v2 in [false, true] {
            let file = file_with_lists(v2, false);
            let metadata = ParquetMetaDataReader::new()
                .parse_and_finish(&file)
                .unwrap();
            let group = metadata.row_group(0);
            for (leaf, chunk) in group.columns().iter().enumerate() {
                let repetition = max_repetition_of(&metadata, leaf);
                let (start, len) = chunk.byte_range();
                for at in (start..start + len).step_by(7) {
                    for flip in [0x01u8, 0x80, 0xff] {
                        let mut damaged = file.to_vec();
                        damaged[at as usize] ^= flip;
                        let damaged = Bytes::from(damaged);
                        let located = std::panic::catch_unwind(|| {
                            locate_chunk(chunk, damaged, 300, repetition)
                        });
                        let located = located.unwrap_or_else(|_| {
                            panic!("leaf {leaf}, byte {at} ^ {flip:#x} (v2: {v2}) panicked")
                        });
                        if let Some(located) = located {
                            let rows: Vec<i64> = located
                                .page_locations
                                .iter()
                                .map(|p| p.first_row_index)
                                .collect();
                            assert!(rows.windows(2).all(|w| w[0] < w[1]) && rows[0] == 0);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_page_that_does_not_start_a_row_or_does_not_read_cannot_be_located() {
        let mut reader = None;
        // Starts with a level 1: the row began on the page before.
        assert_eq!(rows_of_levels(&page(&[10, 1]), 5, 1, &mut reader), None);
        assert_eq!(
            rows_of_levels(&page(&[0x03, 0x17]), 5, 1, &mut reader),
            None
        );
        // Fewer levels than the page declares; a length past the page.
        assert_eq!(rows_of_levels(&page(&[4, 0]), 5, 1, &mut reader), None);
        let mut cut = 1000u32.to_le_bytes().to_vec();
        cut.extend_from_slice(&[10, 0]);
        assert_eq!(rows_of_levels(&Bytes::from(cut), 5, 1, &mut reader), None);
        assert_eq!(
            rows_of_levels(&Bytes::from_static(&[1, 0]), 5, 1, &mut reader),
            None
        );
    }
}
