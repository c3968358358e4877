//! Integers, dates, timestamps, floats and decimals (INT32/INT64/FLOAT/DOUBLE, and decimals as
//! FIXED_LEN_BYTE_ARRAY of up to 16 bytes, as pyarrow writes them): values are gathered from
//! the dictionary page as it stores them, or read from a PLAIN page, and converted to the
//! output type (a decimal's i64 or big-endian bytes → i128 too) straight into the output
//! buffer.

use arrow_array::types::{
    ArrowPrimitiveType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int32Type, Int64Type,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
};
use arrow_array::PrimitiveArray;
use arrow_schema::DataType;
use arrow_schema::TimeUnit;
use parquet::basic::{ConvertedType, LogicalType, TimeUnit as StoredUnit};

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
    /// INT64 as `Timestamp(unit, tz)` in the unit the file stores (milli-, micro- or
    /// nanoseconds): the same bits.
    Timestamp(DataType),
    /// FIXED_LEN_BYTE_ARRAY of `width` (1 to 16) bytes, big-endian two's complement, as
    /// `Decimal128(precision, scale)`, sign-extended.
    FixedBytesDecimal128 {
        width: usize,
        data_type: DataType,
    },
}

impl FixedWidthType {
    /// The type to decode a flat column of `physical` type as, when the scan
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

    /// A timestamp column (INT64) decoded as `data_type`, when that is a timestamp in the
    /// unit the column stores (another unit is a conversion, left to the parquet crate).
    pub(super) fn timestamp(leaf: &ColumnDescriptor, data_type: &DataType) -> Option<Self> {
        let DataType::Timestamp(unit, _) = data_type else {
            return None;
        };
        let stored = match (leaf.logical_type_ref(), leaf.converted_type()) {
            (Some(LogicalType::Timestamp(timestamp)), _) => match timestamp.unit {
                StoredUnit::MILLIS => TimeUnit::Millisecond,
                StoredUnit::MICROS => TimeUnit::Microsecond,
                StoredUnit::NANOS => TimeUnit::Nanosecond,
            },
            (None, ConvertedType::TIMESTAMP_MILLIS) => TimeUnit::Millisecond,
            (None, ConvertedType::TIMESTAMP_MICROS) => TimeUnit::Microsecond,
            _ => return None,
        };
        (leaf.physical_type() == PhysicalType::INT64 && stored == *unit)
            .then(|| Self::Timestamp(data_type.clone()))
    }

    /// A decimal stored as FIXED_LEN_BYTE_ARRAY of `width` bytes, decoded as `data_type`.
    pub(super) fn fixed_bytes(width: i32, data_type: &DataType) -> Option<Self> {
        match data_type {
            DataType::Decimal128(..) if (1..=16).contains(&width) => {
                Some(Self::FixedBytesDecimal128 {
                    width: width as usize,
                    data_type: data_type.clone(),
                })
            }
            _ => None,
        }
    }
}

/// A decimal stored in `W` big-endian bytes, as an i128.
#[derive(Clone, Copy)]
struct BigEndianDecimal<const W: usize>(i128);

impl<const W: usize> From<BigEndianDecimal<W>> for i128 {
    fn from(value: BigEndianDecimal<W>) -> i128 {
        value.0
    }
}

impl<const W: usize> PlainValue for BigEndianDecimal<W> {
    type Le = [u8; W];
    const WIDTH: usize = W;
    fn stored(bytes: &[u8]) -> &[[u8; W]] {
        bytes.as_chunks().0
    }
    /// (Big-endian, despite the name: the stored bytes, sign-extended.)
    fn from_le(stored: [u8; W]) -> Self {
        let negative = stored.first().is_some_and(|&b| b & 0x80 != 0);
        let mut wide = [if negative { 0xff } else { 0 }; 16];
        wide[16 - W..].copy_from_slice(&stored);
        BigEndianDecimal(i128::from_be_bytes(wide))
    }
}

/// A decoder of `pages` as `ty` (with definition levels when `nullable`).
pub(super) fn decoder(
    ty: &FixedWidthType,
    pages: FetchedPages,
    nullable: bool,
) -> Box<dyn FlatDecoder> {
    let pages = PageCursor::new(pages, nullable);
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
        FixedWidthType::Timestamp(data_type) => match data_type {
            DataType::Timestamp(TimeUnit::Millisecond, _) => {
                Box::new(ChunkDecoder::<i64, TimestampMillisecondType>::new(
                    pages,
                    data_type.clone(),
                ))
            }
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                Box::new(ChunkDecoder::<i64, TimestampMicrosecondType>::new(
                    pages,
                    data_type.clone(),
                ))
            }
            _ => Box::new(ChunkDecoder::<i64, TimestampNanosecondType>::new(
                pages,
                data_type.clone(),
            )),
        },
        FixedWidthType::FixedBytesDecimal128 { width, data_type } => {
            macro_rules! by_width {
                ($($w:literal)*) => {
                    match width {
                        $($w => Box::new(ChunkDecoder::<BigEndianDecimal<$w>, Decimal128Type>::new(
                            pages,
                            data_type.clone(),
                        )),)*
                        _ => unreachable!("widths outside 1..=16 are not taken (`fixed_bytes`)"),
                    }
                };
            }
            by_width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
        }
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
    fn new(cursor: PageCursor, data_type: DataType) -> Self {
        Self {
            cursor,
            data_type,
            dictionary: None,
            page: PageValues::None,
            _types: std::marker::PhantomData,
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
}

impl<P, A> PageValueReader for ChunkDecoder<P, A>
where
    P: PlainValue,
    A: ArrowPrimitiveType,
    A::Native: From<P>,
{
    type Value = A::Native;

    fn cursor(&mut self) -> &mut PageCursor {
        &mut self.cursor
    }

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

    fn read_values(&mut self, want: usize, out: &mut Vec<A::Native>) -> Result<usize, String> {
        match &mut self.page {
            PageValues::None => Ok(0),
            PageValues::Plain(bytes) => {
                let n = want.min(bytes.len() / P::WIDTH);
                P::extend_converted(&bytes[..n * P::WIDTH], out);
                *bytes = bytes.slice(n * P::WIDTH..);
                Ok(n)
            }
            PageValues::Indexed { left } => {
                let dictionary = P::stored(self.dictionary.as_deref().expect("checked at open"));
                let indices = self.cursor.indices();
                gather(indices, dictionary, want, left, out, |le| {
                    A::Native::from(P::from_le(le))
                })
            }
        }
    }

    fn values_left(&self) -> bool {
        match &self.page {
            PageValues::None => false,
            PageValues::Plain(bytes) => !bytes.is_empty(),
            PageValues::Indexed { left } => *left > 0,
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
        let nulls = read_rows(self, rows, &mut values)?;
        let array =
            PrimitiveArray::<A>::new(values.into(), nulls).with_data_type(self.data_type.clone());
        Ok(Arc::new(array))
    }

    fn finish(&mut self) -> Result<(), String> {
        finish_chunk(self)
    }
}
