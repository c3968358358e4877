//! Decoders of our own for flat, required columns: integers, dates, floats and decimals
//! (`fixed_width`), strings and binaries as views (`byte_view`), PLAIN or
//! dictionary-encoded.
//!
//! ```text
//!  column chunk bytes ──► FetchedPages (pages; Snappy ones decompressed into recycled
//!                             │         buffers, see `pages`)
//!                             ▼
//!                         next_page: dictionary page │ PLAIN values │ dictionary indices
//!                             │                                         (hybrid.rs)
//!                             ▼
//!      fixed_width: values gathered from the dictionary page as stored, each converted
//!                   (a decimal widened) straight into a new buffer ──► PrimitiveArray
//!      byte_view:   dictionary as views over its page; views gathered, or made over a
//!                   PLAIN page ──► StringViewArray / BinaryViewArray
//! ```
//!
//! Why not the parquet crate's own readers: for these columns it zero-fills every output
//! buffer and dictionary before writing it, and for a decimal it gathers 64-bit values and
//! then widens each one to 128 bits. Polars does neither, and on TPC-H lineitem those costs
//! were most of its lead over forebay's scan (BENCHMARKS.md, sessions 21-22). Here a
//! dictionary is read where its page holds it and values are written once, into
//! uninitialised capacity.
//!
//! Only what this reads with certainty is taken ([`FlatType::of`], [`chunk_is_supported`]);
//! anything else (nulls, nesting, other encodings, row selections) stays with the parquet
//! crate, and the scan splices the two column by column.

mod byte_view;
mod fixed_width;
mod hybrid;

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::schema::types::ColumnDescriptor;

use crate::pages::{FetchedPages, PageBuffers};
pub(crate) use fixed_width::FixedWidthType;
use hybrid::{HybridIndices, Indices, BLOCK};

/// The columns these decoders read: a Parquet physical type and the Arrow type the scan
/// gives it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FlatType {
    FixedWidth(FixedWidthType),
    /// BYTE_ARRAY as Utf8View (`utf8`: each value is checked to be UTF-8) or BinaryView.
    ByteView {
        utf8: bool,
    },
}

impl FlatType {
    /// The type to decode `leaf` as, when the scan decodes it as `data_type` and this module
    /// reads it: a top-level required column of a supported type.
    pub(crate) fn of(leaf: &ColumnDescriptor, data_type: &DataType) -> Option<Self> {
        if leaf.max_def_level() != 0 || leaf.max_rep_level() != 0 || leaf.path().parts().len() != 1
        {
            return None;
        }
        match (leaf.physical_type(), data_type) {
            (PhysicalType::BYTE_ARRAY, DataType::Utf8View) => Some(Self::ByteView { utf8: true }),
            (PhysicalType::BYTE_ARRAY, DataType::BinaryView) => {
                Some(Self::ByteView { utf8: false })
            }
            (physical, data_type) => FixedWidthType::of(physical, data_type).map(Self::FixedWidth),
        }
    }
}

/// Whether `chunk`'s footer promises pages this module reads: PLAIN or dictionary-encoded
/// data pages, from any codec. A page that breaks the promise is reported as corrupt.
// BIT_PACKED is deprecated as a data encoding, yet writers still list it for levels.
#[allow(deprecated)]
pub(crate) fn chunk_is_supported(chunk: &ColumnChunkMetaData) -> bool {
    let supported = |e: Encoding| {
        matches!(
            e,
            Encoding::PLAIN
                | Encoding::PLAIN_DICTIONARY
                | Encoding::RLE_DICTIONARY
                // Level encodings listed by some writers for every column.
                | Encoding::RLE
                | Encoding::BIT_PACKED
        )
    };
    match chunk.page_encoding_stats_mask() {
        Some(mask) => mask.encodings().all(supported),
        None => chunk.encodings().all(supported),
    }
}

/// Decodes one column chunk as batches of Arrow arrays.
pub(crate) trait FlatDecoder: Send {
    /// The next `rows` values as one array; an error when the chunk is corrupt or holds
    /// fewer values.
    fn next_array(&mut self, rows: usize) -> Result<ArrayRef, String>;

    /// An error when the chunk holds values after the last row read (the footer promised
    /// fewer rows than the pages hold).
    fn finish(&mut self) -> Result<(), String>;
}

/// A decoder for `chunk` (its bytes `bytes`, fetched from the file offset `start`) of
/// `rows` rows, decoded as `ty`.
pub(crate) fn decoder(
    ty: &FlatType,
    chunk: &ColumnChunkMetaData,
    start: u64,
    bytes: Bytes,
    rows: usize,
    buffers: &Arc<PageBuffers>,
) -> Result<Box<dyn FlatDecoder>, String> {
    let pages = FetchedPages::new(chunk, start, bytes, rows, buffers).map_err(|e| e.to_string())?;
    Ok(match ty {
        FlatType::FixedWidth(ty) => fixed_width::decoder(ty, pages),
        FlatType::ByteView { utf8 } => Box::new(byte_view::ViewDecoder::new(pages, *utf8)),
    })
}

/// A page as the decoders see it.
enum NextPage {
    /// The chunk's dictionary: `count` PLAIN values.
    Dictionary { values: Bytes, count: usize },
    /// `count` PLAIN values.
    Plain { values: Bytes, count: usize },
    /// `count` indices into the dictionary, read with [`PageCursor::indices`].
    Indexed { count: usize },
}

/// A chunk's pages as both decoders walk them, with the reader of the open page's indices
/// (kept, with its buffer, from page to page).
struct PageCursor {
    pages: FetchedPages,
    indices: Option<HybridIndices>,
    /// A data page was opened.
    data_pages_seen: bool,
}

impl PageCursor {
    fn new(pages: FetchedPages) -> Self {
        Self {
            pages,
            indices: None,
            data_pages_seen: false,
        }
    }

    /// The next page, or `None` after the last. The previous page's bytes are let go of
    /// first (so that their buffer can be reused). `has_dictionary`: the decoder holds the
    /// chunk's dictionary (a second one, or indices without one, are errors).
    fn next(&mut self, has_dictionary: bool) -> Result<Option<NextPage>, String> {
        if let Some(indices) = &mut self.indices {
            indices.release();
        }
        let next = match read_page(&mut self.pages)? {
            None => None,
            Some(RawPage::Dictionary { .. }) if has_dictionary => {
                return Err("the chunk has a second dictionary page".into())
            }
            Some(RawPage::Dictionary { values, count }) => {
                Some(NextPage::Dictionary { values, count })
            }
            Some(RawPage::Plain { values, count }) => {
                self.data_pages_seen = true;
                Some(NextPage::Plain { values, count })
            }
            Some(RawPage::Indexed { .. }) if !has_dictionary => {
                return Err("a dictionary-encoded page comes before any dictionary".into())
            }
            Some(RawPage::Indexed { indices, count }) => {
                self.data_pages_seen = true;
                HybridIndices::open(&mut self.indices, indices)?;
                Some(NextPage::Indexed { count })
            }
        };
        Ok(next)
    }

    /// The open indexed page's indices.
    fn indices(&mut self) -> &mut HybridIndices {
        self.indices.as_mut().expect("an indexed page is open")
    }
}

/// A page as read from the chunk.
enum RawPage {
    Dictionary { values: Bytes, count: usize },
    Plain { values: Bytes, count: usize },
    Indexed { indices: IndexedPage, count: usize },
}

/// A dictionary-encoded page's indices: their bit width and their runs.
struct IndexedPage {
    width: u8,
    runs: Bytes,
}

/// The chunk's next page (data pages of either version, without their levels: a required
/// flat column has none), or `None` after the last.
fn read_page(pages: &mut FetchedPages) -> Result<Option<RawPage>, String> {
    loop {
        let Some(page) = pages.get_next_page().map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let (buf, num_values, encoding, levels) = match page {
            Page::DictionaryPage {
                buf,
                num_values,
                encoding,
                ..
            } => {
                if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                    return Err(format!("a dictionary page is encoded as {encoding}"));
                }
                return Ok(Some(RawPage::Dictionary {
                    values: buf,
                    count: num_values as usize,
                }));
            }
            Page::DataPage {
                buf,
                num_values,
                encoding,
                ..
            } => (buf, num_values, encoding, 0),
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                num_nulls,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => {
                if num_nulls != 0 {
                    return Err(format!(
                        "a page of this required column counts {num_nulls} nulls"
                    ));
                }
                (
                    buf,
                    num_values,
                    encoding,
                    (def_levels_byte_len + rep_levels_byte_len) as usize,
                )
            }
        };
        if buf.len() < levels {
            return Err("a data page is shorter than its levels".into());
        }
        let values = buf.slice(levels..);
        let count = num_values as usize;
        return match encoding {
            Encoding::PLAIN => Ok(Some(RawPage::Plain { values, count })),
            Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
                let Some(&width) = values.first() else {
                    if count == 0 {
                        continue;
                    }
                    return Err("a dictionary-encoded page is empty".into());
                };
                Ok(Some(RawPage::Indexed {
                    indices: IndexedPage {
                        width,
                        runs: values.slice(1..),
                    },
                    count,
                }))
            }
            other => Err(format!(
                "a data page is encoded as {other}, which the footer does not list"
            )),
        };
    }
}

/// Append up to `want` values of a dictionary-encoded page (`left` indices not yet read)
/// to `out`: `dictionary[index]`, passed through `convert`. Returns how many.
///
/// Indices are range-checked a block at a time (by their largest), and not at all when
/// their bit width cannot reach past the dictionary's end.
fn gather<D: Copy, T: Copy>(
    indices: &mut HybridIndices,
    dictionary: &[D],
    want: usize,
    left: &mut usize,
    out: &mut Vec<T>,
    convert: impl Fn(D) -> T,
) -> Result<usize, String> {
    let always_in_range = 1u64
        .checked_shl(indices.width() as u32)
        .is_some_and(|reach| reach <= dictionary.len() as u64);
    let mut read = 0;
    while read < want && *left > 0 {
        let max = (want - read).min(*left).min(BLOCK);
        let n = match indices.next(max)? {
            Indices::Repeat { index, count } => {
                let value = *dictionary
                    .get(index as usize)
                    .ok_or_else(|| out_of_range(index, dictionary.len()))?;
                out.extend(std::iter::repeat_n(convert(value), count));
                count
            }
            Indices::Listed(listed) => {
                if !always_in_range {
                    let largest = listed.iter().copied().max().unwrap_or(0);
                    if largest as usize >= dictionary.len() {
                        return Err(out_of_range(largest, dictionary.len()));
                    }
                }
                // SAFETY: every index is below the dictionary's length: either its bit width
                // cannot express a larger one (`always_in_range`), or the block's largest was
                // checked above.
                out.extend(
                    listed
                        .iter()
                        .map(|&i| convert(unsafe { *dictionary.get_unchecked(i as usize) })),
                );
                listed.len()
            }
        };
        read += n;
        *left -= n;
    }
    Ok(read)
}

fn out_of_range(index: u32, len: usize) -> String {
    format!("dictionary index {index} is out of range (the dictionary has {len} values)")
}

#[cfg(test)]
mod tests;
