//! Nulls of a flat nullable (OPTIONAL) column: which rows of a page hold a value, and how a
//! batch's values are spread over its rows.
//!
//! ```text
//!  data page v1:  [4-byte length][definition levels, RLE hybrid, 1 bit]  [values]
//!  data page v2:  [definition levels, RLE hybrid, 1 bit, length in the header] [values]
//!                        │ (level 1: the row holds a value; 0: null)
//!                        ▼
//!  PageRows: the page's rows, and their validity unless every row holds a value
//!                        │ take(n): n rows, how many values they need, their validity
//!                        ▼
//!  decoder: reads that many values ──► spread over the n rows (nulls left as zeros)
//!  BatchNulls: the batch's validity, made only once a null is met
//! ```
//!
//! A page with no null (the usual case, even in a nullable column) costs one run of ones
//! to read, and no bitmap anywhere.

use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder, NullBuffer};
use bytes::Bytes;

use super::hybrid::{HybridIndices, Indices, BLOCK};

/// The rows of the open data page: how many, how many are handed out, which hold a value.
#[derive(Debug, Default)]
pub(super) struct PageRows {
    len: usize,
    taken: usize,
    /// `None`: every row holds a value.
    validity: Option<BooleanBuffer>,
}

/// Rows taken from a page by [`PageRows::take`].
pub(super) struct TakenRows {
    pub(super) rows: usize,
    /// Values those rows hold (rows that are not null).
    pub(super) values: usize,
    /// Their validity, when some of them are null.
    pub(super) validity: Option<BooleanBuffer>,
}

impl PageRows {
    /// A page of `len` rows, each holding a value.
    pub(super) fn all_valid(len: usize) -> Self {
        Self {
            len,
            taken: 0,
            validity: None,
        }
    }

    /// A page of `len` rows whose definition levels (1 bit wide) are `levels`. Returns the
    /// rows and how many values the page holds.
    pub(super) fn from_levels(len: usize, levels: Bytes) -> Result<(Self, usize), String> {
        let (validity, values) = decode_levels(len, levels)?;
        let rows = Self {
            len,
            taken: 0,
            validity,
        };
        Ok((rows, values))
    }

    /// Rows not handed out yet.
    pub(super) fn left(&self) -> usize {
        self.len - self.taken
    }

    /// The next `max` rows at most.
    pub(super) fn take(&mut self, max: usize) -> TakenRows {
        let rows = max.min(self.left());
        let validity = self
            .validity
            .as_ref()
            .map(|v| v.slice(self.taken, rows))
            .filter(|v| v.count_set_bits() < rows);
        self.taken += rows;
        let values = validity.as_ref().map_or(rows, |v| v.count_set_bits());
        TakenRows {
            rows,
            values,
            validity,
        }
    }
}

/// The validity of `len` rows from their definition levels (`None` when all are 1), and
/// how many are 1.
fn decode_levels(len: usize, levels: Bytes) -> Result<(Option<BooleanBuffer>, usize), String> {
    let mut runs = HybridIndices::new(1, levels)?;
    let mut bits: Option<BooleanBufferBuilder> = None;
    let (mut read, mut valid) = (0, 0);
    let start_bits = |read: usize| {
        let mut builder = BooleanBufferBuilder::new(len);
        builder.append_n(read, true);
        builder
    };
    while read < len {
        let ended = |e: String| e.replace("dictionary indices", "definition levels");
        match runs.next((len - read).min(BLOCK)).map_err(ended)? {
            Indices::Repeat { index, count } => {
                let defined = match index {
                    0 => false,
                    1 => true,
                    other => return Err(format!("a definition level is {other} (at most 1)")),
                };
                if !defined && bits.is_none() {
                    bits = Some(start_bits(read));
                }
                if let Some(bits) = &mut bits {
                    bits.append_n(count, defined);
                }
                valid += if defined { count } else { 0 };
                read += count;
            }
            Indices::Listed(levels) => {
                let ones = levels.iter().filter(|&&l| l == 1).count();
                // Bit-packed at width 1: every level is 0 or 1.
                if ones < levels.len() && bits.is_none() {
                    bits = Some(start_bits(read));
                }
                if let Some(bits) = &mut bits {
                    for &level in levels {
                        bits.append(level == 1);
                    }
                }
                valid += ones;
                read += levels.len();
            }
        }
    }
    Ok((bits.map(|mut b| b.finish()), valid))
}

/// A batch's validity as its rows are taken: nothing until the first null.
pub(super) struct BatchNulls {
    rows: usize,
    capacity: usize,
    bits: Option<BooleanBufferBuilder>,
}

impl BatchNulls {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            rows: 0,
            capacity,
            bits: None,
        }
    }

    /// Rows taken so far.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// `rows` more rows, of this validity (`None`: all hold a value).
    pub(super) fn push(&mut self, rows: usize, validity: Option<&BooleanBuffer>) {
        match (validity, &mut self.bits) {
            (None, None) => {}
            (None, Some(bits)) => bits.append_n(rows, true),
            (Some(validity), bits) => bits
                .get_or_insert_with(|| {
                    let mut builder = BooleanBufferBuilder::new(self.capacity);
                    builder.append_n(self.rows, true);
                    builder
                })
                .append_buffer(validity),
        }
        self.rows += rows;
    }

    pub(super) fn finish(self) -> Option<NullBuffer> {
        self.bits
            .map(|mut b| NullBuffer::new(b.finish()))
            .filter(|n| n.null_count() > 0)
    }
}

/// Spread the values `values[start..]` (one per valid row of `validity`) over the rows
/// `start..start + validity.len()`, a null row getting `T::default()`.
pub(super) fn spread<T: Copy + Default>(
    values: &mut Vec<T>,
    start: usize,
    validity: &BooleanBuffer,
) {
    let mut next = values.len();
    values.resize(start + validity.len(), T::default());
    // Backwards, so that no value is overwritten before it moves: the value of a valid row
    // i is at most at row i.
    for row in (0..validity.len()).rev() {
        values[start + row] = if validity.value(row) {
            next -= 1;
            values[next]
        } else {
            T::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_of_runs_and_packed_groups_give_the_validity() {
        // A repeated run of 5 ones, one of 3 zeros, then a packed group of 8: 1 0 1 1 0 0 0 1.
        let levels = Bytes::from_static(&[5 << 1, 1, 3 << 1, 0, (1 << 1) | 1, 0b1000_1101]);
        let (rows, values) = PageRows::from_levels(16, levels).unwrap();
        assert_eq!(values, 9);
        let validity = rows.validity.as_ref().unwrap();
        let bits: Vec<bool> = validity.iter().collect();
        let expected = [
            [true; 5].as_slice(),
            &[false; 3],
            &[true, false, true, true, false, false, false, true],
        ]
        .concat();
        assert_eq!(bits, expected);
    }

    #[test]
    fn a_page_without_nulls_has_no_bitmap() {
        let (mut rows, values) =
            PageRows::from_levels(1000, Bytes::from_static(&[0xd0, 0x0f, 1])).unwrap();
        assert_eq!(values, 1000);
        assert!(rows.validity.is_none());
        let taken = rows.take(600);
        assert_eq!((taken.rows, taken.values), (600, 600));
        assert!(taken.validity.is_none());
        assert_eq!(rows.take(600).rows, 400);
    }

    #[test]
    fn bad_levels_are_errors() {
        // A level of 2 in a column whose levels are at most 1.
        let err = PageRows::from_levels(4, Bytes::from_static(&[4 << 1, 2])).unwrap_err();
        assert!(err.contains("definition level is 2"), "{err}");
        // Levels that end before the rows do.
        let err = PageRows::from_levels(9, Bytes::from_static(&[4 << 1, 1])).unwrap_err();
        assert!(err.contains("definition levels end"), "{err}");
    }

    #[test]
    fn spread_puts_values_at_valid_rows() {
        let validity = BooleanBuffer::from(vec![false, true, true, false, true]);
        let mut values = vec![7, 1, 2, 3];
        spread(&mut values, 1, &validity);
        assert_eq!(values, [7, 0, 1, 2, 0, 3]);
        let mut nulls = BatchNulls::new(8);
        nulls.push(2, None);
        assert!(nulls.bits.is_none());
        nulls.push(5, Some(&validity));
        nulls.push(1, None);
        let nulls = nulls.finish().unwrap();
        assert_eq!(
            nulls.iter().collect::<Vec<_>>(),
            [true, true, false, true, true, false, true, true]
        );
    }
}
