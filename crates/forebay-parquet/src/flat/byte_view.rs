//! Strings and binaries (BYTE_ARRAY) as Utf8View / BinaryView arrays, without copying a
//! value: a view points into the page that holds it.
//!
//! ```text
//!  dictionary page [len|bytes][len|bytes]…  ──► one view per entry (buffer 0 of a batch
//!                                               that uses it; UTF-8 checked once, here)
//!  indexed page    indices                  ──► views gathered from the dictionary's
//!  PLAIN page      [len|bytes][len|bytes]…  ──► a view per value, the page a buffer of
//!                                               the batch
//! ```
//!
//! A value of at most 12 bytes lives in its view; a longer one is named by (buffer, offset).
//! The views are built here, so the array is assembled without the checks Arrow would
//! otherwise repeat over every value (see the SAFETY note in `next_array`).

use arrow_array::builder::make_view;
use arrow_array::{BinaryViewArray, StringViewArray};
use arrow_buffer::{Buffer, ScalarBuffer};

use super::*;

/// Where the decoder is within the current data page.
enum PageValues {
    /// No page open (at the start, or after one is used up).
    None,
    /// PLAIN values: `page` is the whole page (the buffer views point into), `next` the
    /// byte where the next value's length starts, `left` the values not yet read, `buffer`
    /// the page's place in the batch's buffers once the batch took a value from it.
    Plain {
        page: Bytes,
        next: usize,
        left: usize,
        buffer: Option<u32>,
    },
    /// Dictionary indices, `left` of them not yet read.
    Indexed { left: usize },
}

/// The chunk's dictionary: a view per entry, pointing into `page`, which is buffer 0 of
/// every batch of the chunk when some entry is long.
struct Dictionary {
    views: Vec<u128>,
    page: Buffer,
    /// Some entry is longer than 12 bytes, so a batch using the dictionary needs `page`.
    points_into_page: bool,
}

pub(super) struct ViewDecoder {
    cursor: PageCursor,
    /// Strings: every value is checked to be UTF-8.
    utf8: bool,
    dictionary: Option<Dictionary>,
    page: PageValues,
    /// The data buffers of the batch being read: the dictionary's page first (its long
    /// views name buffer 0), then each PLAIN page the batch reads from, added when it first
    /// does.
    buffers: Vec<Buffer>,
}

impl ViewDecoder {
    pub(super) fn new(pages: FetchedPages, utf8: bool, nullable: bool) -> Self {
        Self {
            cursor: PageCursor::new(pages, nullable),
            utf8,
            dictionary: None,
            page: PageValues::None,
            buffers: Vec::new(),
        }
    }
}

impl PageValueReader for ViewDecoder {
    /// A null row's view is 0: an empty value.
    type Value = u128;

    fn cursor(&mut self) -> &mut PageCursor {
        &mut self.cursor
    }

    fn open_page(&mut self) -> Result<bool, String> {
        self.page = PageValues::None;
        loop {
            match self.cursor.next(self.dictionary.is_some())? {
                None => return Ok(false),
                Some(NextPage::Dictionary { values, count }) => {
                    if self.cursor.data_pages_seen {
                        // The format puts it first; batches rely on it (their buffer 0).
                        return Err("the dictionary page comes after data pages".into());
                    }
                    let mut views = Vec::with_capacity(count);
                    plain_views(&values, 0, count, 0, self.utf8, &mut views)?;
                    let points_into_page = views.iter().any(|&v| v as u32 > 12);
                    self.dictionary = Some(Dictionary {
                        views,
                        page: Buffer::from(values),
                        points_into_page,
                    });
                }
                Some(NextPage::Plain { values, count }) => {
                    self.page = PageValues::Plain {
                        page: values,
                        next: 0,
                        left: count,
                        buffer: None,
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

    fn read_values(&mut self, want: usize, views: &mut Vec<u128>) -> Result<usize, String> {
        match &mut self.page {
            PageValues::None => Ok(0),
            PageValues::Plain {
                page,
                next,
                left,
                buffer,
            } => {
                let n = want.min(*left);
                if n > 0 {
                    let index = *buffer.get_or_insert_with(|| {
                        self.buffers.push(Buffer::from(page.clone()));
                        self.buffers.len() as u32 - 1
                    });
                    *next = plain_views(page, *next, n, index, self.utf8, views)?;
                    *left -= n;
                }
                Ok(n)
            }
            PageValues::Indexed { left } => {
                let dictionary = self.dictionary.as_ref().expect("checked at open");
                let indices = self.cursor.indices();
                gather(indices, &dictionary.views, want, left, views, |v| v)
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

impl FlatDecoder for ViewDecoder {
    fn next_array(&mut self, rows: usize) -> Result<ArrayRef, String> {
        let mut views: Vec<u128> = Vec::with_capacity(rows);
        if self.cursor.rows_left() == 0 {
            // Reads the dictionary page first, if the chunk has one and this is its first
            // batch. (At the chunk's end `read_rows` reports the missing rows.)
            self.open_page()?;
        }
        self.buffers.clear();
        if let PageValues::Plain { buffer, .. } = &mut self.page {
            *buffer = None; // a buffer of the batch before
        }
        if let Some(dictionary) = &self.dictionary {
            if dictionary.points_into_page {
                self.buffers.push(dictionary.page.clone());
            }
        }
        let nulls = read_rows(self, rows, &mut views)?;
        let views = ScalarBuffer::from(views);
        let buffers: Arc<[Buffer]> = std::mem::take(&mut self.buffers).into();
        // SAFETY: every view was made here by `make_view` over a value that lies within the
        // buffer it names: a long view's buffer index is the place, in `buffers`, of the page
        // it was read from (a PLAIN page, or the dictionary's page, always buffer 0 when it
        // has long entries: the dictionary page comes before any data page, so it is known
        // when a batch starts), its offset is the value's start in that page, and
        // `plain_views` checked the value's end against the page's length. A null row's view
        // is 0, an empty inline value. For strings every value was checked to be UTF-8 (a
        // dictionary's once, when it was read).
        let array: ArrayRef = if self.utf8 {
            Arc::new(unsafe { StringViewArray::new_unchecked(views, buffers, nulls) })
        } else {
            Arc::new(unsafe { BinaryViewArray::new_unchecked(views, buffers, nulls) })
        };
        Ok(array)
    }

    fn finish(&mut self) -> Result<(), String> {
        finish_chunk(self)
    }
}

/// Append views of the `count` PLAIN values (a 4-byte little-endian length, then the bytes)
/// starting at byte `from` of `page`, which is buffer `buffer` of their array. Returns where
/// the next value starts.
///
/// UTF-8 (when `utf8`) is checked over spans of values rather than value by value: a length
/// below 128 is the bytes `[len, 0, 0, 0]`, all ASCII, which neither are invalid nor can end
/// or continue a multi-byte character, so a span of such values with their lengths is valid
/// exactly when every value is. A longer value's length closes the span before it.
pub(super) fn plain_views(
    page: &[u8],
    from: usize,
    count: usize,
    buffer: u32,
    utf8: bool,
    out: &mut Vec<u128>,
) -> Result<usize, String> {
    let mut next = from;
    let mut unchecked_from = from;
    for _ in 0..count {
        let length = page
            .get(next..next + 4)
            .ok_or("a PLAIN value's length lies beyond its page")?;
        let len = u32::from_le_bytes(length.try_into().expect("4 bytes")) as usize;
        let start = next + 4;
        let end = start
            .checked_add(len)
            .filter(|&end| end <= page.len())
            .ok_or("a PLAIN value lies beyond its page")?;
        if utf8 && len >= 128 {
            check_utf8(&page[unchecked_from..next])?;
            unchecked_from = start;
        }
        let offset = u32::try_from(start).map_err(|_| "a page of 4 GiB or more")?;
        out.push(make_view(&page[start..end], buffer, offset));
        next = end;
    }
    if utf8 {
        check_utf8(&page[unchecked_from..next])?;
    }
    Ok(next)
}

fn check_utf8(bytes: &[u8]) -> Result<(), String> {
    simdutf8::basic::from_utf8(bytes)
        .map(|_| ())
        .map_err(|_| "a string value is not valid UTF-8".to_string())
}
