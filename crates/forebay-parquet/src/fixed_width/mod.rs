//! A decoder of our own for flat, required, fixed-width columns: integers, dates, floats
//! and decimals stored as INT32/INT64, PLAIN or dictionary-encoded.
//!
//! ```text
//!  column chunk bytes ──► FetchedPages (pages; Snappy ones decompressed into recycled
//!                             │         buffers, see `pages`)
//!                             │ dictionary page: PLAIN values, widened once to the output type
//!                             │ data pages: PLAIN values, or dictionary indices (hybrid.rs)
//!                             ▼
//!  next_array(rows) ──► values gathered straight into a new buffer ──► PrimitiveArray
//! ```
//!
//! Why not the parquet crate's own reader: for these columns it zero-fills every output
//! buffer, dictionary and decompressed page before writing it (and allocates a new one for
//! each page), and for a decimal it gathers 64-bit values and
//! then widens each one to 128 bits. Polars does neither, and on TPC-H lineitem those costs
//! were the whole of its lead over forebay's scan (BENCHMARKS.md, sessions 21-22). Here the
//! dictionary is widened once and values are written once, into uninitialised capacity.
//!
//! Only what this reads with certainty is taken ([`FixedWidthType::of`],
//! [`chunk_is_supported`]); anything else (nulls, nesting, other encodings, row
//! selections) stays with the parquet crate, and the scan splices the two column by column.

mod hybrid;

use std::sync::Arc;

use arrow::array::{ArrayRef, ArrowPrimitiveType, PrimitiveArray};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int32Type, Int64Type,
};
use bytes::Bytes;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::schema::types::ColumnDescriptor;

use crate::pages::{FetchedPages, PageBuffers};
use hybrid::{HybridIndices, Indices, BLOCK};

/// The column types this decoder reads: a Parquet physical type and the Arrow type the scan
/// gives it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FixedWidthType {
    /// INT32 as Int32 or Date32 (the same bits).
    Int32(DataType),
    Int64,
    Float32,
    Float64,
    /// INT32 or INT64 as `Decimal128(precision, scale)`, sign-extended.
    Decimal128 {
        physical: PhysicalType,
        data_type: DataType,
    },
}

impl FixedWidthType {
    /// The type to decode `leaf` as, when the scan decodes it as `data_type` and this module
    /// reads it: a top-level required column of a supported type.
    pub(crate) fn of(leaf: &ColumnDescriptor, data_type: &DataType) -> Option<Self> {
        if leaf.max_def_level() != 0 || leaf.max_rep_level() != 0 || leaf.path().parts().len() != 1
        {
            return None;
        }
        match (leaf.physical_type(), data_type) {
            (PhysicalType::INT32, DataType::Int32 | DataType::Date32) => {
                Some(Self::Int32(data_type.clone()))
            }
            (PhysicalType::INT64, DataType::Int64) => Some(Self::Int64),
            (PhysicalType::FLOAT, DataType::Float32) => Some(Self::Float32),
            (PhysicalType::DOUBLE, DataType::Float64) => Some(Self::Float64),
            (physical @ (PhysicalType::INT32 | PhysicalType::INT64), DataType::Decimal128(..)) => {
                Some(Self::Decimal128 {
                    physical,
                    data_type: data_type.clone(),
                })
            }
            _ => None,
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
pub(crate) trait FixedWidthDecoder: Send {
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
    ty: &FixedWidthType,
    chunk: &ColumnChunkMetaData,
    start: u64,
    bytes: Bytes,
    rows: usize,
    buffers: &Arc<PageBuffers>,
) -> Result<Box<dyn FixedWidthDecoder>, String> {
    let pages = FetchedPages::new(chunk, start, bytes, rows, buffers).map_err(|e| e.to_string())?;
    Ok(match ty {
        FixedWidthType::Int32(data_type) if *data_type == DataType::Date32 => Box::new(
            ChunkDecoder::<i32, Date32Type>::new(pages, data_type.clone()),
        ),
        FixedWidthType::Int32(data_type) => Box::new(ChunkDecoder::<i32, Int32Type>::new(
            pages,
            data_type.clone(),
        )),
        FixedWidthType::Int64 => {
            Box::new(ChunkDecoder::<i64, Int64Type>::new(pages, DataType::Int64))
        }
        FixedWidthType::Float32 => Box::new(ChunkDecoder::<f32, Float32Type>::new(
            pages,
            DataType::Float32,
        )),
        FixedWidthType::Float64 => Box::new(ChunkDecoder::<f64, Float64Type>::new(
            pages,
            DataType::Float64,
        )),
        FixedWidthType::Decimal128 {
            physical: PhysicalType::INT32,
            data_type,
        } => Box::new(ChunkDecoder::<i32, Decimal128Type>::new(
            pages,
            data_type.clone(),
        )),
        FixedWidthType::Decimal128 { data_type, .. } => Box::new(
            ChunkDecoder::<i64, Decimal128Type>::new(pages, data_type.clone()),
        ),
    })
}

/// A Parquet physical value stored PLAIN as little-endian bytes.
trait PlainValue: Copy {
    /// The values `bytes` holds (`bytes.len()` a multiple of the width), converted and
    /// appended to `out`.
    fn extend_converted<T: From<Self>>(bytes: &[u8], out: &mut Vec<T>);
    const WIDTH: usize;
}

macro_rules! plain_value {
    ($($t:ty),*) => {$(
        impl PlainValue for $t {
            const WIDTH: usize = std::mem::size_of::<$t>();
            fn extend_converted<T: From<Self>>(bytes: &[u8], out: &mut Vec<T>) {
                let (values, _) = bytes.as_chunks::<{ std::mem::size_of::<$t>() }>();
                out.extend(values.iter().map(|le| T::from(<$t>::from_le_bytes(*le))));
            }
        }
    )*};
}
plain_value!(i32, i64, f32, f64);

/// Where the decoder is within the current data page.
enum PageValues {
    /// No page open (at the start, or after one is used up).
    None,
    /// PLAIN values: `bytes` holds the ones not read yet.
    Plain(Bytes),
    /// Dictionary indices, `left` of them not read yet.
    Indexed { left: usize },
}

/// Decodes a chunk of physical type `P` into arrays of `A`.
struct ChunkDecoder<P: PlainValue, A: ArrowPrimitiveType> {
    pages: FetchedPages,
    data_type: DataType,
    /// The dictionary page's values, already converted to the output type.
    dictionary: Option<Vec<A::Native>>,
    page: PageValues,
    indices: Option<HybridIndices>,
    _physical: std::marker::PhantomData<P>,
}

impl<P, A> ChunkDecoder<P, A>
where
    P: PlainValue,
    A: ArrowPrimitiveType,
    A::Native: From<P>,
{
    fn new(pages: FetchedPages, data_type: DataType) -> Self {
        Self {
            pages,
            data_type,
            dictionary: None,
            page: PageValues::None,
            indices: None,
            _physical: std::marker::PhantomData,
        }
    }

    /// Open the next data page (reading a dictionary page first if one comes); `false` when
    /// the chunk has no more pages.
    fn open_page(&mut self) -> Result<bool, String> {
        loop {
            // The previous page is read: let go of it, so that its buffer can be reused.
            self.page = PageValues::None;
            if let Some(indices) = &mut self.indices {
                indices.release();
            }
            let page = match self.pages.get_next_page().map_err(|e| e.to_string())? {
                None => return Ok(false),
                Some(page) => page,
            };
            let (buf, num_values, encoding, levels) = match page {
                Page::DictionaryPage {
                    buf,
                    num_values,
                    encoding,
                    ..
                } => {
                    if self.dictionary.is_some() {
                        return Err("the chunk has a second dictionary page".into());
                    }
                    if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                        return Err(format!("a dictionary page is encoded as {encoding}"));
                    }
                    let count = num_values as usize;
                    let bytes = buf.get(..count * P::WIDTH).ok_or_else(|| {
                        format!(
                            "a dictionary page of {count} values holds {} bytes",
                            buf.len()
                        )
                    })?;
                    let mut dictionary = Vec::with_capacity(count);
                    P::extend_converted(bytes, &mut dictionary);
                    self.dictionary = Some(dictionary);
                    continue;
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
            let values = buf
                .get(levels..)
                .map(|_| buf.slice(levels..))
                .ok_or("a data page is shorter than its levels")?;
            let count = num_values as usize;
            match encoding {
                Encoding::PLAIN => {
                    let bytes = count * P::WIDTH;
                    if values.len() < bytes {
                        return Err(format!(
                            "a PLAIN page of {count} values holds {} bytes",
                            values.len()
                        ));
                    }
                    self.page = PageValues::Plain(values.slice(..bytes));
                }
                Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
                    if self.dictionary.is_none() {
                        return Err("a dictionary-encoded page comes before any dictionary".into());
                    }
                    let Some(&width) = values.first() else {
                        if count == 0 {
                            continue;
                        }
                        return Err("a dictionary-encoded page is empty".into());
                    };
                    let data = values.slice(1..);
                    match &mut self.indices {
                        Some(indices) => indices.reset(width, data)?,
                        None => self.indices = Some(HybridIndices::new(width, data)?),
                    }
                    self.page = PageValues::Indexed { left: count };
                }
                other => {
                    return Err(format!(
                        "a data page is encoded as {other}, which the footer does not list"
                    ))
                }
            }
            return Ok(true);
        }
    }

    /// Append up to `want` values of the open page to `out`; how many.
    fn read_page(&mut self, want: usize, out: &mut Vec<A::Native>) -> Result<usize, String> {
        match &mut self.page {
            PageValues::None => Ok(0),
            PageValues::Plain(bytes) => {
                let n = want.min(bytes.len() / P::WIDTH);
                P::extend_converted(&bytes[..n * P::WIDTH], out);
                *bytes = bytes.slice(n * P::WIDTH..);
                if bytes.is_empty() {
                    self.page = PageValues::None;
                }
                Ok(n)
            }
            PageValues::Indexed { left } => {
                let dictionary = self.dictionary.as_deref().expect("checked at open");
                let indices = self.indices.as_mut().expect("set at open");
                let mut read = 0;
                while read < want && *left > 0 {
                    let max = (want - read).min(*left).min(BLOCK);
                    let n = match indices.next(max)? {
                        Indices::Repeat { index, count } => {
                            let value = *dictionary
                                .get(index as usize)
                                .ok_or_else(|| out_of_range(index, dictionary.len()))?;
                            out.extend(std::iter::repeat_n(value, count));
                            count
                        }
                        Indices::Listed(listed) => {
                            let largest = listed.iter().copied().max().unwrap_or(0);
                            if largest as usize >= dictionary.len() {
                                return Err(out_of_range(largest, dictionary.len()));
                            }
                            // SAFETY: every index is at most `largest`, checked above to be
                            // within the dictionary.
                            out.extend(
                                listed
                                    .iter()
                                    .map(|&i| unsafe { *dictionary.get_unchecked(i as usize) }),
                            );
                            listed.len()
                        }
                    };
                    read += n;
                    *left -= n;
                }
                if *left == 0 {
                    self.page = PageValues::None;
                }
                Ok(read)
            }
        }
    }
}

fn out_of_range(index: u32, len: usize) -> String {
    format!("dictionary index {index} is out of range (the dictionary has {len} values)")
}

impl<P, A> FixedWidthDecoder for ChunkDecoder<P, A>
where
    P: PlainValue + Send,
    A: ArrowPrimitiveType,
    A::Native: From<P>,
{
    fn next_array(&mut self, rows: usize) -> Result<ArrayRef, String> {
        let mut values = Vec::with_capacity(rows);
        while values.len() < rows {
            let read = self.read_page(rows - values.len(), &mut values)?;
            if read == 0 && matches!(self.page, PageValues::None) && !self.open_page()? {
                return Err(format!(
                    "the chunk's pages end after {} of the {rows} values of a batch",
                    values.len()
                ));
            }
        }
        let array =
            PrimitiveArray::<A>::new(values.into(), None).with_data_type(self.data_type.clone());
        Ok(Arc::new(array))
    }

    fn finish(&mut self) -> Result<(), String> {
        loop {
            match self.page {
                PageValues::Plain(ref bytes) if !bytes.is_empty() => {}
                PageValues::Indexed { left } if left > 0 => {}
                _ => {
                    if self.open_page()? {
                        continue;
                    }
                    return Ok(());
                }
            }
            return Err("the chunk's pages hold more values than the row group's rows".into());
        }
    }
}

#[cfg(test)]
mod tests;
