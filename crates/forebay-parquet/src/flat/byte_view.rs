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
    /// byte where the next value's length starts, `left` the values not yet read.
    Plain {
        page: Bytes,
        next: usize,
        left: usize,
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
}

impl ViewDecoder {
    pub(super) fn new(pages: FetchedPages, utf8: bool) -> Self {
        Self {
            cursor: PageCursor::new(pages),
            utf8,
            dictionary: None,
            page: PageValues::None,
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
}

impl FlatDecoder for ViewDecoder {
    fn next_array(&mut self, rows: usize) -> Result<ArrayRef, String> {
        let mut views: Vec<u128> = Vec::with_capacity(rows);
        if matches!(self.page, PageValues::None) {
            // Reads the dictionary page first, if the chunk has one and this is its first
            // batch. (At the chunk's end the loop below reports the missing values.)
            self.open_page()?;
        }
        // The batch's data buffers: the dictionary's page first (its long views name buffer
        // 0), then each PLAIN page the batch reads from, added when it first does.
        let mut buffers: Vec<Buffer> = Vec::new();
        if let Some(dictionary) = &self.dictionary {
            if dictionary.points_into_page {
                buffers.push(dictionary.page.clone());
            }
        }
        let mut plain_buffer: Option<u32> = None;
        while views.len() < rows {
            let want = rows - views.len();
            let read = match &mut self.page {
                PageValues::None => 0,
                PageValues::Plain { page, next, left } => {
                    let n = want.min(*left);
                    if n > 0 {
                        let index = *plain_buffer.get_or_insert_with(|| {
                            buffers.push(Buffer::from(page.clone()));
                            buffers.len() as u32 - 1
                        });
                        *next = plain_views(page, *next, n, index, self.utf8, &mut views)?;
                        *left -= n;
                    }
                    if *left == 0 {
                        self.page = PageValues::None;
                        plain_buffer = None;
                    }
                    n
                }
                PageValues::Indexed { left } => {
                    let dictionary = self.dictionary.as_ref().expect("checked at open");
                    let indices = self.cursor.indices();
                    let read = gather(indices, &dictionary.views, want, left, &mut views, |v| v)?;
                    if *left == 0 {
                        self.page = PageValues::None;
                    }
                    read
                }
            };
            if read == 0 && matches!(self.page, PageValues::None) && !self.open_page()? {
                return Err(format!(
                    "the chunk's pages end after {} of the {rows} values of a batch",
                    views.len()
                ));
            }
        }
        let views = ScalarBuffer::from(views);
        let buffers: Arc<[Buffer]> = buffers.into();
        // SAFETY: every view was made here by `make_view` over a value that lies within the
        // buffer it names: a long view's buffer index is the place, in `buffers`, of the page
        // it was read from (a PLAIN page, or the dictionary's page, always buffer 0 when it
        // has long entries: the dictionary page comes before any data page, so it is known
        // when a batch starts), its offset is the value's start in that page, and
        // `plain_views` checked the value's end against the page's length. For strings
        // every value was checked to be UTF-8 (a dictionary's once, when it was read).
        let array: ArrayRef = if self.utf8 {
            Arc::new(unsafe { StringViewArray::new_unchecked(views, buffers, None) })
        } else {
            Arc::new(unsafe { BinaryViewArray::new_unchecked(views, buffers, None) })
        };
        Ok(array)
    }

    fn finish(&mut self) -> Result<(), String> {
        // Pages of no values may follow the last value; any value is one too many.
        loop {
            let values_left = matches!(
                self.page,
                PageValues::Plain { left, .. } | PageValues::Indexed { left } if left > 0
            );
            if values_left {
                return Err("the chunk's pages hold more values than the row group's rows".into());
            }
            if !self.open_page()? {
                return Ok(());
            }
        }
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
