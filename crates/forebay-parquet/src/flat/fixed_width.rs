//! Integers, dates, floats and decimals (INT32/INT64/FLOAT/DOUBLE): values are gathered
//! from the dictionary page as it stores them, or read from a PLAIN page, and converted to
//! the output type (a decimal's i64 → i128 too) straight into the output buffer.

use arrow_array::types::{
    ArrowPrimitiveType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int32Type, Int64Type,
};
use arrow_array::PrimitiveArray;
use arrow_schema::DataType;

use super::*;

/// The fixed-width columns read: a Parquet physical type and the Arrow type the scan gives
/// it.
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
    /// The type to decode a flat required column of `physical` type as, when the scan
    /// decodes it as `data_type`.
    pub(super) fn of(physical: PhysicalType, data_type: &DataType) -> Option<Self> {
        match (physical, data_type) {
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

/// A decoder of `pages` as `ty`.
pub(super) fn decoder(ty: &FixedWidthType, pages: FetchedPages) -> Box<dyn FlatDecoder> {
    match ty {
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
    }
}

/// A Parquet physical value stored PLAIN as little-endian bytes.
trait PlainValue: Copy {
    /// Its stored bytes.
    type Le: Copy;
    const WIDTH: usize;
    /// `bytes` (a multiple of the width long) as stored values.
    fn stored(bytes: &[u8]) -> &[Self::Le];
    fn from_le(le: Self::Le) -> Self;

    /// The values `bytes` holds (`bytes.len()` a multiple of the width), converted and
    /// appended to `out`.
    fn extend_converted<T: From<Self>>(bytes: &[u8], out: &mut Vec<T>) {
        out.extend(
            Self::stored(bytes)
                .iter()
                .map(|&le| T::from(Self::from_le(le))),
        );
    }
}

macro_rules! plain_value {
    ($($t:ty),*) => {$(
        impl PlainValue for $t {
            type Le = [u8; std::mem::size_of::<$t>()];
            const WIDTH: usize = std::mem::size_of::<$t>();
            fn stored(bytes: &[u8]) -> &[Self::Le] {
                bytes.as_chunks().0
            }
            fn from_le(le: Self::Le) -> Self {
                <$t>::from_le_bytes(le)
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
    cursor: PageCursor,
    data_type: DataType,
    /// The dictionary page's values, as stored: a value is converted (a decimal's i64
    /// widened to i128 too) as it is gathered, so the dictionary is never copied and, for a
    /// decimal, is read at half the width.
    dictionary: Option<Bytes>,
    page: PageValues,
    _types: std::marker::PhantomData<fn() -> (P, A)>,
}

impl<P, A> ChunkDecoder<P, A>
where
    P: PlainValue,
    A: ArrowPrimitiveType,
    A::Native: From<P>,
{
    fn new(pages: FetchedPages, data_type: DataType) -> Self {
        Self {
            cursor: PageCursor::new(pages),
            data_type,
            dictionary: None,
            page: PageValues::None,
            _types: std::marker::PhantomData,
        }
    }

    /// Open the next data page (reading a dictionary page first if one comes); `false` when
    /// the chunk has no more pages.
    fn open_page(&mut self) -> Result<bool, String> {
        self.page = PageValues::None;
        loop {
            match self.cursor.next(self.dictionary.is_some())? {
                None => return Ok(false),
                Some(NextPage::Dictionary { values, count }) => {
                    self.dictionary = Some(Self::values_of("a dictionary page", values, count)?);
                }
                Some(NextPage::Plain { values, count }) => {
                    self.page = PageValues::Plain(Self::values_of("a PLAIN page", values, count)?);
                    return Ok(true);
                }
                Some(NextPage::Indexed { count }) => {
                    self.page = PageValues::Indexed { left: count };
                    return Ok(true);
                }
            }
        }
    }

    /// The bytes of `page`'s `count` stored values; an error when it holds fewer.
    fn values_of(page: &str, values: Bytes, count: usize) -> Result<Bytes, String> {
        let bytes = count * P::WIDTH;
        if values.len() < bytes {
            return Err(format!(
                "{page} of {count} values holds {} bytes",
                values.len()
            ));
        }
        Ok(values.slice(..bytes))
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
                let dictionary = P::stored(self.dictionary.as_deref().expect("checked at open"));
                let indices = self.cursor.indices();
                let read = gather(indices, dictionary, want, left, out, |le| {
                    A::Native::from(P::from_le(le))
                })?;
                if *left == 0 {
                    self.page = PageValues::None;
                }
                Ok(read)
            }
        }
    }
}

impl<P, A> FlatDecoder for ChunkDecoder<P, A>
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
        // Pages of no values may follow the last value; any value is one too many.
        loop {
            let values_left = match &self.page {
                PageValues::None => false,
                PageValues::Plain(bytes) => !bytes.is_empty(),
                PageValues::Indexed { left } => *left > 0,
            };
            if values_left {
                return Err("the chunk's pages hold more values than the row group's rows".into());
            }
            if !self.open_page()? {
                return Ok(());
            }
        }
    }
}
