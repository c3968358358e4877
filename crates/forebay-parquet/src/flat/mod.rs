//! Decoders of our own for flat columns, required or nullable: integers, dates, timestamps,
//! floats and decimals (`fixed_width`), strings and binaries as views (`byte_view`) or with
//! 32-bit offsets (`byte_offsets`), PLAIN or dictionary-encoded; a nullable column's
//! definition levels are read by `levels`.
//!
//! ```text
//!  column chunk bytes ──► FetchedPages (pages; Snappy ones decompressed into recycled
//!                             │         buffers, see `pages`)
//!                             ▼
//!                         read_page: dictionary page │ data page: its rows (levels.rs:
//!                             │                        which hold a value) and values:
//!                             │                        PLAIN │ dictionary indices (hybrid.rs)
//!                             ▼
//!      read_rows: a batch's rows page by page; each decoder reads the values they hold,
//!                 spread over the rows when some are null (a null buffer only then)
//!      fixed_width:  values gathered from the dictionary page as stored, each converted
//!                    (a decimal widened) straight into a new buffer ──► PrimitiveArray
//!      byte_view:    dictionary as views over its page; views gathered, or made over a
//!                    PLAIN page ──► StringViewArray / BinaryViewArray
//!      byte_offsets: each value's bytes copied once into the batch's buffer, offsets
//!                    from the lengths ──► StringArray / BinaryArray
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
//! anything else (nesting, other encodings, row selections) stays with the parquet crate,
//! and the scan splices the two column by column.

mod byte_offsets;
mod byte_view;
mod fixed_width;
pub(crate) mod hybrid;
mod levels;

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
use levels::{BatchNulls, PageRows, TakenRows};

/// The columns these decoders read: a Parquet physical type and the Arrow type the scan
/// gives it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FlatType {
    FixedWidth(FixedWidthType),
    /// BYTE_ARRAY as Utf8View (`utf8`: each value is checked to be UTF-8) or BinaryView.
    ByteView {
        utf8: bool,
    },
    /// BYTE_ARRAY as Utf8 (`utf8`: checked to be UTF-8) or Binary, 32-bit offsets.
    ByteOffsets {
        utf8: bool,
    },
}

impl FlatType {
    /// The type to decode `leaf` as, when the scan decodes it as `data_type` and this module
    /// reads it: a top-level column (required or nullable) of a supported type.
    pub(crate) fn of(leaf: &ColumnDescriptor, data_type: &DataType) -> Option<Self> {
        if leaf.max_def_level() > 1 || leaf.max_rep_level() != 0 || leaf.path().parts().len() != 1 {
            return None;
        }
        match (leaf.physical_type(), data_type) {
            (PhysicalType::BYTE_ARRAY, DataType::Utf8View) => Some(Self::ByteView { utf8: true }),
            (PhysicalType::BYTE_ARRAY, DataType::BinaryView) => {
                Some(Self::ByteView { utf8: false })
            }
            (PhysicalType::BYTE_ARRAY, DataType::Utf8) => Some(Self::ByteOffsets { utf8: true }),
            (PhysicalType::BYTE_ARRAY, DataType::Binary) => Some(Self::ByteOffsets { utf8: false }),
            (PhysicalType::INT64, DataType::Timestamp(..)) => {
                FixedWidthType::timestamp(leaf, data_type).map(Self::FixedWidth)
            }
            (PhysicalType::FIXED_LEN_BYTE_ARRAY, data_type) => {
                FixedWidthType::fixed_bytes(leaf.type_length(), data_type).map(Self::FixedWidth)
            }
            (physical, data_type) => FixedWidthType::of(physical, data_type).map(Self::FixedWidth),
        }
    }
}

/// Whether `chunk`'s footer promises pages this module reads: PLAIN or dictionary-encoded
/// data pages, from any codec, and for a nullable column definition levels in RLE. A page
/// that breaks the promise is reported as corrupt.
// BIT_PACKED is deprecated as a data encoding, yet writers still list it for levels.
#[allow(deprecated)]
pub(crate) fn chunk_is_supported(chunk: &ColumnChunkMetaData) -> bool {
    let nullable = chunk.column_descr().max_def_level() > 0;
    let supported = |e: Encoding| match e {
        Encoding::PLAIN
        | Encoding::PLAIN_DICTIONARY
        | Encoding::RLE_DICTIONARY
        // Level encodings listed by some writers for every column.
        | Encoding::RLE => true,
        // Listed for a required column's (absent) levels by some writers; a nullable
        // column's levels in it are read by the parquet crate.
        Encoding::BIT_PACKED => !nullable,
        _ => false,
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
    let nullable = chunk.column_descr().max_def_level() > 0;
    Ok(match ty {
        FlatType::FixedWidth(ty) => fixed_width::decoder(ty, pages, nullable),
        FlatType::ByteView { utf8 } => {
            Box::new(byte_view::ViewDecoder::new(pages, *utf8, nullable))
        }
        FlatType::ByteOffsets { utf8 } => {
            Box::new(byte_offsets::OffsetDecoder::new(pages, *utf8, nullable))
        }
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

/// A chunk's pages as the decoders walk them, with the reader of the open page's indices
/// (kept, with its buffer, from page to page) and the open page's rows.
struct PageCursor {
    pages: FetchedPages,
    /// The column is nullable: its data pages have definition levels.
    nullable: bool,
    indices: Option<HybridIndices>,
    /// The open data page's rows (none before the first).
    rows: PageRows,
    /// A data page was opened.
    data_pages_seen: bool,
}

impl PageCursor {
    fn new(pages: FetchedPages, nullable: bool) -> Self {
        Self {
            pages,
            nullable,
            indices: None,
            rows: PageRows::default(),
            data_pages_seen: false,
        }
    }

    /// The next page, or `None` after the last. The previous page's bytes are let go of
    /// first (so that their buffer can be reused). `has_dictionary`: the decoder holds the
    /// chunk's dictionary (a second one, or indices without one, are errors). A data page's
    /// `count` is the values it holds (its rows that are not null).
    fn next(&mut self, has_dictionary: bool) -> Result<Option<NextPage>, String> {
        if let Some(indices) = &mut self.indices {
            indices.release();
        }
        if self.rows.left() > 0 {
            return Err("a page was left before all its rows were read".into());
        }
        let next = match read_page(&mut self.pages, self.nullable)? {
            None => None,
            Some(RawPage::Dictionary { .. }) if has_dictionary => {
                return Err("the chunk has a second dictionary page".into())
            }
            Some(RawPage::Dictionary { values, count }) => {
                Some(NextPage::Dictionary { values, count })
            }
            Some(RawPage::Plain {
                values,
                count,
                rows,
            }) => {
                self.data_pages_seen = true;
                self.rows = rows;
                Some(NextPage::Plain { values, count })
            }
            Some(RawPage::Indexed { .. }) if !has_dictionary => {
                return Err("a dictionary-encoded page comes before any dictionary".into())
            }
            Some(RawPage::Indexed {
                indices,
                count,
                rows,
            }) => {
                self.data_pages_seen = true;
                self.rows = rows;
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

    /// Rows of the open data page not read yet.
    fn rows_left(&self) -> usize {
        self.rows.left()
    }

    /// The open page's next `max` rows at most, their validity added to `nulls`.
    fn take_rows(&mut self, max: usize, nulls: &mut BatchNulls) -> TakenRows {
        let taken = self.rows.take(max);
        nulls.push(taken.rows, taken.validity.as_ref());
        taken
    }
}

/// A page as read from the chunk.
enum RawPage {
    Dictionary {
        values: Bytes,
        count: usize,
    },
    Plain {
        values: Bytes,
        count: usize,
        rows: PageRows,
    },
    Indexed {
        indices: IndexedPage,
        count: usize,
        rows: PageRows,
    },
}

/// A dictionary-encoded page's indices: their bit width and their runs.
struct IndexedPage {
    width: u8,
    runs: Bytes,
}

/// The chunk's next page (data pages of either version: their values, and their rows from
/// the definition levels of a `nullable` column), or `None` after the last.
fn read_page(pages: &mut FetchedPages, nullable: bool) -> Result<Option<RawPage>, String> {
    loop {
        let Some(page) = pages.get_next_page().map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let (values, encoding, (rows, count)) = match page {
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
                def_level_encoding,
                ..
            } => {
                let rows = num_values as usize;
                if !nullable {
                    (buf, encoding, (PageRows::all_valid(rows), rows))
                } else {
                    if def_level_encoding != Encoding::RLE {
                        return Err(format!(
                            "a data page's definition levels are encoded as \
                             {def_level_encoding}, which the footer does not list"
                        ));
                    }
                    // [length: 4 bytes, little-endian][levels][values]
                    let length = buf
                        .get(..4)
                        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                        .filter(|&length| length <= buf.len() - 4)
                        .ok_or("a data page is shorter than its definition levels")?;
                    let levels = buf.slice(4..4 + length);
                    let values = buf.slice(4 + length..);
                    (values, encoding, PageRows::from_levels(rows, levels)?)
                }
            }
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                num_nulls,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => {
                let rows = num_values as usize;
                let (rep, def) = (rep_levels_byte_len as usize, def_levels_byte_len as usize);
                if buf.len() < rep + def {
                    return Err("a data page is shorter than its levels".into());
                }
                let values = buf.slice(rep + def..);
                let rows = match (nullable, num_nulls) {
                    (_, 0) => (PageRows::all_valid(rows), rows),
                    (false, nulls) => {
                        return Err(format!(
                            "a page of this required column counts {nulls} nulls"
                        ))
                    }
                    (true, nulls) => {
                        let levels = buf.slice(rep..rep + def);
                        let (page_rows, values) = PageRows::from_levels(rows, levels)?;
                        if values + nulls as usize != rows {
                            return Err(format!(
                                "a data page counts {nulls} nulls in its header and {} in \
                                 its definition levels",
                                rows - values
                            ));
                        }
                        (page_rows, values)
                    }
                };
                (values, encoding, rows)
            }
        };
        return match encoding {
            Encoding::PLAIN => Ok(Some(RawPage::Plain {
                values,
                count,
                rows,
            })),
            Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
                let Some(&width) = values.first() else {
                    if count == 0 {
                        if rows.left() == 0 {
                            continue;
                        }
                        // Only nulls: no indices, not even their width.
                        return Ok(Some(RawPage::Plain {
                            values,
                            count,
                            rows,
                        }));
                    }
                    return Err("a dictionary-encoded page is empty".into());
                };
                Ok(Some(RawPage::Indexed {
                    indices: IndexedPage {
                        width,
                        runs: values.slice(1..),
                    },
                    count,
                    rows,
                }))
            }
            other => Err(format!(
                "a data page is encoded as {other}, which the footer does not list"
            )),
        };
    }
}

/// What [`read_rows`] needs of a decoder: its pages, and its values page by page.
trait PageValueReader {
    /// A value as the output array holds it (a null row holds `default()`).
    type Value: Copy + Default;

    fn cursor(&mut self) -> &mut PageCursor;

    /// Open the next data page (reading a dictionary page first if one comes); `false`
    /// when the chunk has no more pages.
    fn open_page(&mut self) -> Result<bool, String>;

    /// Append up to `want` values of the open page to `out`; how many (0: it has none left).
    fn read_values(&mut self, want: usize, out: &mut Vec<Self::Value>) -> Result<usize, String>;

    /// The open page holds values not read yet.
    fn values_left(&self) -> bool;
}

/// [`FlatDecoder::finish`] of any decoder: pages of no rows may follow the last row; any
/// row or value is one too many.
fn finish_chunk<R: PageValueReader>(reader: &mut R) -> Result<(), String> {
    loop {
        if reader.values_left() || reader.cursor().rows_left() > 0 {
            return Err("the chunk's pages hold more values than the row group's rows".into());
        }
        if !reader.open_page()? {
            return Ok(());
        }
    }
}

/// Append `rows` rows' values to `values`, page after page, a null row's as
/// `Value::default()`; returns their validity (`None` when no row is null).
fn read_rows<R: PageValueReader>(
    reader: &mut R,
    rows: usize,
    values: &mut Vec<R::Value>,
) -> Result<Option<arrow_buffer::NullBuffer>, String> {
    let mut nulls = BatchNulls::new(rows);
    while nulls.rows() < rows {
        if reader.cursor().rows_left() == 0 {
            if !reader.open_page()? {
                return Err(format!(
                    "the chunk's pages end after {} of the {rows} values of a batch",
                    nulls.rows()
                ));
            }
            continue;
        }
        let taken = reader.cursor().take_rows(rows - nulls.rows(), &mut nulls);
        let start = values.len();
        let mut read = 0;
        while read < taken.values {
            let n = reader.read_values(taken.values - read, values)?;
            if n == 0 {
                return Err("a data page holds fewer values than its rows".into());
            }
            read += n;
        }
        if let Some(validity) = &taken.validity {
            levels::spread(values, start, validity);
        }
    }
    Ok(nulls.finish())
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
