//! Strings and binaries (BYTE_ARRAY) as Utf8 / Binary arrays (32-bit offsets): the files
//! pyarrow, Spark and DuckDB write are read as these, and each value is copied once, into
//! the batch's value buffer.
//!
//! ```text
//!  dictionary page [len|bytes][len|bytes]…  ──► (start, length) of each entry in the page
//!  indexed page    indices                  ──► entries gathered: their bytes appended
//!  PLAIN page      [len|bytes][len|bytes]…  ──► each value's bytes appended
//!                                  │ one length per row (a null row's is 0)
//!                                  ▼
//!  offsets = running sum of the lengths; UTF-8 checked once per dictionary, and once over
//!  the bytes of a batch that took PLAIN values (every offset checked to fall between
//!  characters)
//! ```

use arrow_array::{BinaryArray, StringArray};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};

use super::*;

/// Where the decoder is within the current data page.
enum PageValues {
    /// No page open (at the start, or after one is used up).
    None,
    /// PLAIN values: `next` is the byte where the next value's length starts, `left` the
    /// values not yet read.
    Plain {
        page: Bytes,
        next: usize,
        left: usize,
    },
    /// Dictionary indices, `left` of them not yet read.
    Indexed { left: usize },
}

/// The chunk's dictionary: its entries' bytes one after another, then [`SHORT`] bytes of
/// padding, and where each entry lies in them.
struct Dictionary {
    bytes: Vec<u8>,
    /// (start, length) of each entry in `bytes`.
    entries: Vec<(u32, u32)>,
}

/// A value of at most this many bytes is copied as this many (a fixed-size copy, no call to
/// `memcpy`), and the extra bytes cut off again: most strings in tables are short.
const SHORT: usize = 16;

/// Append `source[start..start + length]` to `out`, reading up to [`SHORT`] bytes past it
/// when `source` has them.
#[inline(always)]
fn append_value(out: &mut Vec<u8>, source: &[u8], start: usize, length: usize) {
    match source.get(start..start + SHORT) {
        Some(short) if length <= SHORT => {
            let short: &[u8; SHORT] = short.try_into().expect("SHORT bytes");
            out.extend_from_slice(short);
            out.truncate(out.len() - (SHORT - length));
        }
        _ => out.extend_from_slice(&source[start..start + length]),
    }
}

pub(super) struct OffsetDecoder {
    cursor: PageCursor,
    /// Strings: checked to be UTF-8.
    utf8: bool,
    dictionary: Option<Dictionary>,
    page: PageValues,
    /// The bytes of the batch being read, value after value.
    bytes: Vec<u8>,
    /// Dictionary entries gathered for the values being read.
    gathered: Vec<(u32, u32)>,
    /// Bytes per row of the batch before (0 before the first): a batch's buffer is sized
    /// by it once, instead of growing (each growth of a large buffer is fresh memory the
    /// kernel clears).
    bytes_per_row: f64,
    /// The batch being read took values from a PLAIN page (unchecked UTF-8; a dictionary's
    /// entries are checked when it is read).
    plain_in_batch: bool,
}

impl OffsetDecoder {
    pub(super) fn new(pages: FetchedPages, utf8: bool, nullable: bool) -> Self {
        Self {
            cursor: PageCursor::new(pages, nullable),
            utf8,
            dictionary: None,
            page: PageValues::None,
            bytes: Vec::new(),
            gathered: Vec::new(),
            bytes_per_row: 0.0,
            plain_in_batch: false,
        }
    }
}

impl PageValueReader for OffsetDecoder {
    /// A value's length (a null row's is 0).
    type Value = u32;

    fn cursor(&mut self) -> &mut PageCursor {
        &mut self.cursor
    }

    fn open_page(&mut self) -> Result<bool, String> {
        self.page = PageValues::None;
        loop {
            match self.cursor.next(self.dictionary.is_some())? {
                None => return Ok(false),
                Some(NextPage::Dictionary { values, count }) => {
                    let mut entries = Vec::with_capacity(count);
                    let mut bytes = Vec::with_capacity(values.len() + SHORT);
                    let mut next = 0;
                    for _ in 0..count {
                        let (start, end) = plain_value(&values, next)?;
                        entries.push((bytes.len() as u32, (end - start) as u32));
                        bytes.extend_from_slice(&values[start..end]);
                        next = end;
                    }
                    if self.utf8 {
                        check_utf8(&bytes, entries.iter().map(|&(start, _)| start as usize))?;
                    }
                    bytes.extend_from_slice(&[0; SHORT]);
                    self.dictionary = Some(Dictionary { bytes, entries });
                }
                Some(NextPage::Plain { values, count }) => {
                    self.page = PageValues::Plain {
                        page: values,
                        next: 0,
                        left: count,
                    };
                    return Ok(true);
                }
                Some(NextPage::Indexed { count }) => {
                    self.page = PageValues::Indexed { left: count };
                    return Ok(true);
                }
            }
        }
    }

    fn read_values(&mut self, want: usize, lengths: &mut Vec<u32>) -> Result<usize, String> {
        match &mut self.page {
            PageValues::None => Ok(0),
            PageValues::Plain { page, next, left } => {
                let n = want.min(*left);
                self.plain_in_batch |= n > 0;
                let first = *next;
                for _ in 0..n {
                    let (start, end) = plain_value(page, *next)?;
                    lengths.push((end - start) as u32);
                    *next = end;
                }
                // The values without their length prefixes.
                self.bytes.reserve(*next - first - 4 * n + SHORT);
                let mut at = first;
                for &length in &lengths[lengths.len() - n..] {
                    append_value(&mut self.bytes, page, at + 4, length as usize);
                    at += 4 + length as usize;
                }
                *left -= n;
                Ok(n)
            }
            PageValues::Indexed { left } => {
                let dictionary = self.dictionary.as_ref().expect("checked at open");
                self.gathered.clear();
                let indices = self.cursor.indices();
                let read = gather(
                    indices,
                    &dictionary.entries,
                    want,
                    left,
                    &mut self.gathered,
                    |e| e,
                )?;
                let total: usize = self.gathered.iter().map(|&(_, l)| l as usize).sum();
                self.bytes.reserve(total + SHORT);
                for &(start, length) in &self.gathered {
                    append_value(
                        &mut self.bytes,
                        &dictionary.bytes,
                        start as usize,
                        length as usize,
                    );
                    lengths.push(length);
                }
                Ok(read)
            }
        }
    }

    fn values_left(&self) -> bool {
        matches!(
            self.page,
            PageValues::Plain { left, .. } | PageValues::Indexed { left } if left > 0
        )
    }
}

impl FlatDecoder for OffsetDecoder {
    fn next_array(&mut self, rows: usize) -> Result<ArrayRef, String> {
        let mut lengths: Vec<u32> = Vec::with_capacity(rows);
        self.plain_in_batch = false;
        // A little over the batch before's rate, so that a batch of similar values fits.
        self.bytes = Vec::with_capacity((rows as f64 * self.bytes_per_row * 1.1) as usize + SHORT);
        let nulls = read_rows(self, rows, &mut lengths)?;
        let mut bytes = std::mem::take(&mut self.bytes);
        self.bytes_per_row = bytes.len() as f64 / rows.max(1) as f64;
        if bytes.capacity() > bytes.len() + bytes.len() / 8 + 4096 {
            // A first batch grows its buffer by doubling: up to twice its bytes, held as
            // long as the batch is. Giving back the tail does not copy.
            bytes.shrink_to_fit();
        }
        if bytes.len() > i32::MAX as usize {
            return Err(format!(
                "a batch of {rows} rows holds {} bytes of values, more than a 32-bit offset \
                 reaches: read with a smaller batch size",
                bytes.len()
            ));
        }
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0i32);
        let mut end = 0i32;
        for &length in &lengths {
            // Cannot overflow: the lengths add up to `bytes.len()`, checked above.
            end += length as i32;
            offsets.push(end);
        }
        if self.utf8 && self.plain_in_batch {
            check_utf8(&bytes, offsets.iter().map(|&o| o as usize))?;
        }
        // SAFETY: the offsets start at 0 and never decrease (they add lengths), and the last
        // is `bytes.len()` (every length's bytes were appended, a null row's length is 0),
        // which fits an i32 (checked above). For strings, every value is UTF-8: the bytes of
        // a batch with PLAIN values were checked, with every offset on a character boundary,
        // and a value gathered from the dictionary is an entry checked so when it was read.
        let offsets = unsafe { OffsetBuffer::new_unchecked(ScalarBuffer::from(offsets)) };
        let values = Buffer::from_vec(bytes);
        let array: ArrayRef = if self.utf8 {
            Arc::new(unsafe { StringArray::new_unchecked(offsets, values, nulls) })
        } else {
            Arc::new(unsafe { BinaryArray::new_unchecked(offsets, values, nulls) })
        };
        Ok(array)
    }

    fn finish(&mut self) -> Result<(), String> {
        finish_chunk(self)
    }
}

/// Whether `bytes` is UTF-8 with a character boundary at each of `starts` (values that are
/// each UTF-8: a valid whole may still cut a character between two values).
fn check_utf8(bytes: &[u8], mut starts: impl Iterator<Item = usize>) -> Result<(), String> {
    let invalid = || "a string value is not valid UTF-8".to_string();
    let text = simdutf8::basic::from_utf8(bytes).map_err(|_| invalid())?;
    match starts.all(|start| text.is_char_boundary(start)) {
        true => Ok(()),
        false => Err(invalid()),
    }
}

/// The PLAIN value whose 4-byte little-endian length starts at byte `at` of `page`: where
/// its bytes start and end.
fn plain_value(page: &[u8], at: usize) -> Result<(usize, usize), String> {
    let length = page
        .get(at..at + 4)
        .ok_or("a PLAIN value's length lies beyond its page")?;
    let length = u32::from_le_bytes(length.try_into().expect("4 bytes")) as usize;
    let start = at + 4;
    let end = start
        .checked_add(length)
        .filter(|&end| end <= page.len() && end <= u32::MAX as usize)
        .ok_or("a PLAIN value lies beyond its page")?;
    Ok((start, end))
}
