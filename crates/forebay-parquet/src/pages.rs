//! Pages of column chunks already fetched, with Snappy pages decompressed into recycled
//! buffers.
//!
//! ```text
//!  fetched chunk bytes ──► SerializedPageReader (told the chunk is uncompressed: headers
//!                            │                    only, pages handed over as stored)
//!                            ▼
//!                          FetchedPages: a Snappy page ──► a buffer from PageBuffers
//!                            │                              (back to the pool when the
//!                            │                               last array using it is dropped)
//!                            ▼
//!        forebay's own decoders (`flat`)  /  the parquet crate's decoders (via FetchedRowGroup)
//! ```
//!
//! Why: the parquet crate decompresses each page into a new buffer that it first fills
//! with zeros, and most of those buffers are fresh memory the kernel must fault in and
//! clear as well. On TPC-H lineitem the zeroing alone was 4 % of a scan's CPU. A recycled
//! buffer has been written before, so it needs neither. Other codecs are left to the page
//! reader, as before.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use parquet::arrow::arrow_reader::RowGroups;
use parquet::basic::Compression;
use parquet::column::page::{Page, PageIterator, PageMetadata, PageReader};
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData, RowGroupMetaData};
use parquet::file::serialized_reader::SerializedPageReader;

use crate::io::FetchedRegion;

/// Buffers kept for reuse at most, and their bytes at most.
const MAX_BUFFERS: usize = 64;
const MAX_BYTES: usize = 16 << 20;

/// Decompression buffers returned by the pages that used them, ready for another page.
#[derive(Default)]
pub(crate) struct PageBuffers {
    free: Mutex<FreeBuffers>,
}

#[derive(Default)]
struct FreeBuffers {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl PageBuffers {
    /// A buffer of at least `len` initialised bytes: the smallest returned one that fits
    /// without wasting more than a quarter of it (its bytes are some earlier page's), or a
    /// new one. A page never sits in a buffer much larger than itself: batches hold their
    /// pages, and a 30 KB page in a 1 MB buffer would hold the whole megabyte.
    fn take(&self, len: usize) -> Vec<u8> {
        let fits = |size: usize| size >= len && size - len <= len / 4 + 4096;
        let reused = {
            let mut free = self.free.lock().expect("page buffer lock");
            let best = free
                .buffers
                .iter()
                .enumerate()
                .filter(|(_, b)| fits(b.len()))
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            best.map(|i| {
                let buffer = free.buffers.swap_remove(i);
                free.bytes -= buffer.len();
                buffer
            })
        };
        reused.unwrap_or_else(|| vec![0; len])
    }

    fn give_back(&self, buffer: Vec<u8>) {
        let mut free = self.free.lock().expect("page buffer lock");
        if free.buffers.len() < MAX_BUFFERS && free.bytes + buffer.len() <= MAX_BYTES {
            free.bytes += buffer.len();
            free.buffers.push(buffer);
        }
    }
}

/// The first `len` bytes of a pooled buffer, as the owner of a [`Bytes`]; the buffer goes
/// back to its pool when the last `Bytes` (or Arrow buffer made from one) is dropped.
struct Recycled {
    buffer: Vec<u8>,
    len: usize,
    pool: Arc<PageBuffers>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buffer[..self.len]
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buffer));
    }
}

/// The pages of one fetched column chunk; see the module docs.
pub(crate) struct FetchedPages {
    pages: SerializedPageReader<FetchedRegion>,
    /// Set when the chunk is Snappy-compressed and its pages come as stored.
    snappy: Option<(snap::raw::Decoder, Arc<PageBuffers>)>,
}

impl FetchedPages {
    /// The pages of `chunk` (`rows` rows), whose bytes `bytes` were fetched from the file
    /// offset `start`.
    pub(crate) fn new(
        chunk: &ColumnChunkMetaData,
        start: u64,
        bytes: Bytes,
        rows: usize,
        buffers: &Arc<PageBuffers>,
    ) -> Result<Self> {
        let region = Arc::new(FetchedRegion::new(start, bytes));
        if chunk.compression() != Compression::SNAPPY {
            return Ok(Self {
                pages: SerializedPageReader::new(region, chunk, rows, None)?,
                snappy: None,
            });
        }
        let as_stored = chunk
            .clone()
            .into_builder()
            .set_compression(Compression::UNCOMPRESSED)
            .build()?;
        Ok(Self {
            pages: SerializedPageReader::new(region, &as_stored, rows, None)?,
            snappy: Some((snap::raw::Decoder::new(), buffers.clone())),
        })
    }

    /// `page` with its values decompressed (when this reader decompresses).
    fn decompress(&mut self, mut page: Page) -> Result<Page> {
        let Some((decoder, pool)) = &mut self.snappy else {
            return Ok(page);
        };
        let mut into_buffer = |prefix: &[u8], compressed: &[u8]| -> Result<Bytes> {
            let failed = |e: snap::Error| {
                ParquetError::General(format!("a page does not decompress (Snappy): {e}"))
            };
            let values = if compressed.is_empty() {
                0
            } else {
                snap::raw::decompress_len(compressed).map_err(failed)?
            };
            let len = prefix.len() + values;
            let mut buffer = pool.take(len);
            buffer[..prefix.len()].copy_from_slice(prefix);
            if values > 0 {
                let written = decoder
                    .decompress(compressed, &mut buffer[prefix.len()..len])
                    .map_err(failed)?;
                if written != values {
                    return Err(ParquetError::General(format!(
                        "a page decompresses to {written} bytes, not the {values} it declares"
                    )));
                }
            }
            Ok(Bytes::from_owner(Recycled {
                buffer,
                len,
                pool: pool.clone(),
            }))
        };
        match &mut page {
            Page::DataPage { buf, .. } | Page::DictionaryPage { buf, .. } => {
                *buf = into_buffer(&[], buf)?;
            }
            Page::DataPageV2 {
                buf,
                def_levels_byte_len,
                rep_levels_byte_len,
                is_compressed,
                ..
            } => {
                if *is_compressed {
                    // Levels come first and are never compressed.
                    let levels = (*def_levels_byte_len as usize + *rep_levels_byte_len as usize)
                        .min(buf.len());
                    *buf = into_buffer(&buf[..levels], &buf[levels..])?;
                    *is_compressed = false;
                }
            }
        }
        Ok(page)
    }
}

impl Iterator for FetchedPages {
    type Item = Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for FetchedPages {
    fn get_next_page(&mut self) -> Result<Option<Page>> {
        match self.pages.get_next_page()? {
            Some(page) => self.decompress(page).map(Some),
            None => Ok(None),
        }
    }

    fn peek_next_page(&mut self) -> Result<Option<PageMetadata>> {
        self.pages.peek_next_page()
    }

    fn skip_next_page(&mut self) -> Result<()> {
        self.pages.skip_next_page()
    }

    fn at_record_boundary(&mut self) -> Result<bool> {
        self.pages.at_record_boundary()
    }
}

/// One row group whose column chunks were fetched whole, for the parquet crate's decoders
/// (`ParquetRecordBatchReader::try_new_with_row_groups`).
pub(crate) struct FetchedRowGroup<'a> {
    pub(crate) metadata: &'a ParquetMetaData,
    pub(crate) row_group: usize,
    /// Per leaf of the file: its chunk's file offset and bytes, when fetched.
    pub(crate) chunks: Vec<Option<(u64, Bytes)>>,
    pub(crate) buffers: Arc<PageBuffers>,
}

impl FetchedRowGroup<'_> {
    fn group(&self) -> &RowGroupMetaData {
        self.metadata.row_group(self.row_group)
    }
}

impl RowGroups for FetchedRowGroup<'_> {
    fn num_rows(&self) -> usize {
        usize::try_from(self.group().num_rows()).unwrap_or(0)
    }

    fn column_chunks(&self, leaf: usize) -> Result<Box<dyn PageIterator>> {
        let (start, bytes) = self
            .chunks
            .get(leaf)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                ParquetError::General(format!("column chunk {leaf} was not fetched (forebay bug)"))
            })?;
        let pages = FetchedPages::new(
            self.group().column(leaf),
            *start,
            bytes.clone(),
            self.num_rows(),
            &self.buffers,
        )?;
        Ok(Box::new(OneChunk(Some(Box::new(pages)))))
    }

    fn row_groups(&self) -> Box<dyn Iterator<Item = &RowGroupMetaData> + '_> {
        Box::new(std::iter::once(self.group()))
    }

    fn metadata(&self) -> &ParquetMetaData {
        self.metadata
    }
}

/// The page reader of a column's only chunk.
struct OneChunk(Option<Box<dyn PageReader>>);

impl Iterator for OneChunk {
    type Item = Result<Box<dyn PageReader>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.take().map(Ok)
    }
}

impl PageIterator for OneChunk {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_last_page_is_dropped() {
        let pool = Arc::new(PageBuffers::default());
        let mut buffer = pool.take(100_000);
        buffer[..3].copy_from_slice(b"abc");
        let address = buffer.as_ptr();
        let page = Bytes::from_owner(Recycled {
            buffer,
            len: 3,
            pool: pool.clone(),
        });
        let slice = page.slice(1..);
        assert_eq!(&page[..], b"abc");
        drop(page);
        // Still held by the slice.
        assert_eq!(pool.free.lock().unwrap().buffers.len(), 0);
        assert_eq!(&slice[..], b"bc");
        drop(slice);
        let again = pool.take(90_000);
        assert_eq!(again.as_ptr(), address, "the same buffer, reused");
        assert_eq!(again.len(), 100_000, "its initialised length is kept");
        pool.give_back(again);
        // Too large a buffer for a small page is not used; nor too small a one.
        assert_eq!(pool.take(10_000).len(), 10_000);
        assert_eq!(pool.take(200_000).len(), 200_000);
        let fitting = pool.take(100_000);
        assert_eq!(fitting.as_ptr(), address);
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_bytes() {
        let pool = PageBuffers::default();
        for _ in 0..10 {
            pool.give_back(vec![0; MAX_BYTES / 4]);
        }
        let free = pool.free.lock().unwrap();
        assert_eq!(free.buffers.len(), 4);
        assert!(free.bytes <= MAX_BYTES);
    }
}
