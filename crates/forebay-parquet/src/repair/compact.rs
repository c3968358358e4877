//! Rewriting footers at the Thrift level: without fields whose wire type contradicts the
//! Parquet spec, or without the INTERVAL annotation arrow-rs reads with a loss.
//!
//! A Parquet footer is a `FileMetaData` struct in Thrift's compact protocol. Thrift's own
//! generated readers skip a field whose wire type is not the one they expect; arrow-rs's
//! decoder refuses the whole footer instead. This module rewrites the footer without such
//! fields, along the path the reader needs:
//!
//! ```text
//! FileMetaData ─4: list<RowGroup>─► RowGroup ─1: list<ColumnChunk>─► ColumnChunk ─3─► ColumnMetaData
//!      └─2: list<SchemaElement>─► SchemaElement
//! ```
//!
//! Only those five structs are checked (each field id against the spec's wire type); every
//! other value is copied byte for byte. [`drop_interval_annotations`] also drops a schema
//! element's `converted_type` when it is INTERVAL: arrow-rs reads such a column as
//! `interval[day_time]`, dropping the months, where pyarrow reads the 12 bytes as
//! `fixed_size_binary[12]`; without the annotation arrow-rs reads them as pyarrow does. Field headers of a rewritten struct are re-encoded,
//! because the compact protocol stores each field id as a delta from the previous one.
//!
//! [`read_page_header`] uses the same reader for the few fields of a page header that
//! measuring a column chunk needs.

/// Compact protocol wire types.
mod wire {
    pub const STOP: u8 = 0;
    pub const BOOL_TRUE: u8 = 1;
    pub const BOOL_FALSE: u8 = 2;
    pub const BYTE: u8 = 3;
    pub const I16: u8 = 4;
    pub const I32: u8 = 5;
    pub const I64: u8 = 6;
    pub const DOUBLE: u8 = 7;
    pub const BINARY: u8 = 8;
    pub const LIST: u8 = 9;
    pub const SET: u8 = 10;
    pub const MAP: u8 = 11;
    pub const STRUCT: u8 = 12;
}

/// The structs on the path to column chunk metadata, with the spec's wire type per field.
#[derive(Clone, Copy)]
enum Checked {
    FileMetaData,
    RowGroup,
    ColumnChunk,
    ColumnMetaData,
    SchemaElement,
}

/// `ConvertedType::INTERVAL` in the Thrift enum.
const CONVERTED_TYPE_INTERVAL: i64 = 21;

impl Checked {
    /// The expected wire type of field `id` (None: not in the spec; kept as it is).
    fn expected(self, id: i16) -> Option<u8> {
        use wire::*;
        Some(match (self, id) {
            (Checked::FileMetaData, 1) => I32,
            (Checked::FileMetaData, 2 | 4 | 5 | 7) => LIST,
            (Checked::FileMetaData, 3) => I64,
            (Checked::FileMetaData, 6 | 9) => BINARY,
            (Checked::FileMetaData, 8) => STRUCT,
            (Checked::RowGroup, 1 | 4) => LIST,
            (Checked::RowGroup, 2 | 3 | 5 | 6) => I64,
            (Checked::RowGroup, 7) => I16,
            (Checked::ColumnChunk, 1 | 9) => BINARY,
            (Checked::ColumnChunk, 2 | 4 | 6) => I64,
            (Checked::ColumnChunk, 5 | 7) => I32,
            (Checked::ColumnChunk, 3 | 8) => STRUCT,
            (Checked::ColumnMetaData, 1 | 4 | 15) => I32,
            (Checked::ColumnMetaData, 2 | 3 | 8 | 13) => LIST,
            (Checked::ColumnMetaData, 5 | 6 | 7 | 9 | 10 | 11 | 14) => I64,
            (Checked::ColumnMetaData, 12 | 16 | 17) => STRUCT,
            (Checked::SchemaElement, 1 | 2 | 3 | 5 | 6 | 7 | 8 | 9) => I32,
            (Checked::SchemaElement, 4) => BINARY,
            (Checked::SchemaElement, 10) => STRUCT,
            _ => return None,
        })
    }

    /// The checked struct a field's value (or list elements) holds, if any.
    fn child(self, id: i16) -> Option<Checked> {
        match (self, id) {
            (Checked::FileMetaData, 2) => Some(Checked::SchemaElement),
            (Checked::FileMetaData, 4) => Some(Checked::RowGroup),
            (Checked::RowGroup, 1) => Some(Checked::ColumnChunk),
            (Checked::ColumnChunk, 3) => Some(Checked::ColumnMetaData),
            _ => None,
        }
    }
}

/// What the rewrite found: `None` when the bytes are not a well-formed compact struct.
pub(crate) struct Sanitized {
    pub footer: Vec<u8>,
    /// `(struct, field id)` of every dropped field, for the log message.
    pub dropped: Vec<(&'static str, i16)>,
}

/// Rewrite a `FileMetaData` footer without mistyped fields. `None` if the bytes are not a
/// well-formed compact-protocol struct (then the original error stands).
pub(crate) fn drop_mistyped_fields(footer: &[u8]) -> Option<Sanitized> {
    rewrite(footer, false)
}

/// Rewrite a `FileMetaData` footer without mistyped fields and without INTERVAL converted
/// types (each dropped one is `("SchemaElement", 6)` in [`Sanitized::dropped`]).
pub(crate) fn drop_interval_annotations(footer: &[u8]) -> Option<Sanitized> {
    rewrite(footer, true)
}

fn rewrite(footer: &[u8], drop_interval: bool) -> Option<Sanitized> {
    let mut rewriter = Rewriter {
        cursor: Cursor {
            input: footer,
            pos: 0,
        },
        out: Vec::with_capacity(footer.len()),
        dropped: Vec::new(),
        drop_interval,
    };
    rewriter.struct_(Checked::FileMetaData)?;
    Some(Sanitized {
        footer: rewriter.out,
        dropped: rewriter.dropped,
    })
}

/// Reads compact-protocol values from a byte slice; every read checks the bounds.
struct Cursor<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.input.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn zigzag(&mut self) -> Option<i64> {
        let raw = self.varint()?;
        Some(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    /// A field header: `(field id, wire type)`, or `None` at the struct's stop byte.
    fn field_header(&mut self, last_id: i16) -> Option<Option<(i16, u8)>> {
        let header = self.byte()?;
        let ty = header & 0x0f;
        if ty == wire::STOP {
            return Some(None);
        }
        let id = match header >> 4 {
            0 => i16::try_from(self.zigzag()?).ok()?,
            delta => last_id.checked_add(i16::from(delta))?,
        };
        Some(Some((id, ty)))
    }

    /// Advance past one value of wire type `ty` (a field's value: booleans take no bytes).
    fn skip(&mut self, ty: u8, in_collection: bool) -> Option<()> {
        use wire::*;
        match ty {
            BOOL_TRUE | BOOL_FALSE if in_collection => self.byte().map(drop),
            BOOL_TRUE | BOOL_FALSE => Some(()),
            BYTE => self.byte().map(drop),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => {
                self.pos = self.pos.checked_add(8).filter(|&p| p <= self.input.len())?;
                Some(())
            }
            BINARY => {
                let len = usize::try_from(self.varint()?).ok()?;
                self.pos = self
                    .pos
                    .checked_add(len)
                    .filter(|&p| p <= self.input.len())?;
                Some(())
            }
            LIST | SET => {
                let (len, elem) = self.list_header()?;
                (0..len).try_for_each(|_| self.skip(elem, true))
            }
            MAP => {
                let len = self.varint()?;
                if len == 0 {
                    return Some(());
                }
                let kinds = self.byte()?;
                (0..len).try_for_each(|_| {
                    self.skip(kinds >> 4, true)?;
                    self.skip(kinds & 0x0f, true)
                })
            }
            STRUCT => {
                let mut last = 0;
                while let Some((id, field_ty)) = self.field_header(last)? {
                    last = id;
                    self.skip(field_ty, false)?;
                }
                Some(())
            }
            _ => None,
        }
    }

    fn list_header(&mut self) -> Option<(u64, u8)> {
        let header = self.byte()?;
        let len = match header >> 4 {
            15 => self.varint()?,
            short => u64::from(short),
        };
        Some((len, header & 0x0f))
    }
}

/// Copies a footer through a [`Cursor`], dropping mistyped fields of the checked structs.
struct Rewriter<'a> {
    cursor: Cursor<'a>,
    out: Vec<u8>,
    dropped: Vec<(&'static str, i16)>,
    /// Also drop `SchemaElement.converted_type` when it is INTERVAL.
    drop_interval: bool,
}

impl Rewriter<'_> {
    /// Whether the field at the cursor (its header read) is an INTERVAL annotation to drop.
    fn is_dropped_interval(&self, kind: Checked, id: i16, ty: u8) -> bool {
        if !(self.drop_interval && matches!(kind, Checked::SchemaElement) && id == 6) {
            return false;
        }
        let mut peek = Cursor {
            input: self.cursor.input,
            pos: self.cursor.pos,
        };
        ty == wire::I32 && peek.zigzag() == Some(CONVERTED_TYPE_INTERVAL)
    }

    fn write_varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.out.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.out.push(value as u8);
    }

    /// Copy the bytes the cursor moves over while `read` runs.
    fn copy_while(&mut self, read: impl FnOnce(&mut Cursor<'_>) -> Option<()>) -> Option<()> {
        let start = self.cursor.pos;
        read(&mut self.cursor)?;
        self.out
            .extend_from_slice(&self.cursor.input[start..self.cursor.pos]);
        Some(())
    }

    /// Rewrite a struct of a checked kind, dropping mistyped fields.
    fn struct_(&mut self, kind: Checked) -> Option<()> {
        let mut last_read: i16 = 0;
        let mut last_written: i16 = 0;
        let as_bool = |t: u8| {
            if t == wire::BOOL_FALSE {
                wire::BOOL_TRUE
            } else {
                t
            }
        };
        loop {
            let Some((id, ty)) = self.cursor.field_header(last_read)? else {
                self.out.push(wire::STOP);
                return Some(());
            };
            last_read = id;
            if let Some(expected) = kind.expected(id) {
                if as_bool(expected) != as_bool(ty) || self.is_dropped_interval(kind, id, ty) {
                    self.cursor.skip(ty, false)?;
                    self.dropped.push((kind.name(), id));
                    continue;
                }
            }
            // Field header, re-encoded relative to the last field written.
            let delta = i32::from(id) - i32::from(last_written);
            if (1..=15).contains(&delta) {
                self.out.push(((delta as u8) << 4) | ty);
            } else {
                self.out.push(ty);
                let zigzag = ((i64::from(id) << 1) ^ (i64::from(id) >> 63)) as u64;
                self.write_varint(zigzag);
            }
            last_written = id;
            match kind.child(id) {
                Some(child) if ty == wire::STRUCT => self.struct_(child)?,
                Some(child) if ty == wire::LIST => {
                    let mut header = (0, 0);
                    self.copy_while(|c| {
                        header = c.list_header()?;
                        Some(())
                    })?;
                    let (len, elem) = header;
                    for _ in 0..len {
                        if elem == wire::STRUCT {
                            self.struct_(child)?;
                        } else {
                            self.copy_while(|c| c.skip(elem, true))?;
                        }
                    }
                }
                _ => self.copy_while(|c| c.skip(ty, false))?,
            }
        }
    }
}

/// The fields of a Parquet `PageHeader` that measuring a column chunk needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageHeaderSummary {
    /// Bytes of the encoded header itself.
    pub header_len: usize,
    /// `PageType`: 0 data, 1 index, 2 dictionary, 3 data v2.
    pub page_type: i32,
    pub compressed_page_size: i32,
    /// Values of a data page (v1 or v2), 0 for other pages.
    pub num_values: i64,
}

/// Read the page header at the start of `bytes`; `None` if it is not a complete header.
pub(crate) fn read_page_header(bytes: &[u8]) -> Option<PageHeaderSummary> {
    let mut c = Cursor {
        input: bytes,
        pos: 0,
    };
    let (mut page_type, mut compressed, mut num_values) = (None, None, 0i64);
    let mut last = 0;
    while let Some((id, ty)) = c.field_header(last)? {
        last = id;
        match (id, ty) {
            (1, wire::I32) => page_type = Some(i32::try_from(c.zigzag()?).ok()?),
            (3, wire::I32) => compressed = Some(i32::try_from(c.zigzag()?).ok()?),
            // DataPageHeader (5) and DataPageHeaderV2 (8) both start with num_values (i32).
            (5 | 8, wire::STRUCT) => {
                let mut inner_last = 0;
                while let Some((inner_id, inner_ty)) = c.field_header(inner_last)? {
                    inner_last = inner_id;
                    if (inner_id, inner_ty) == (1, wire::I32) {
                        num_values = c.zigzag()?;
                    } else {
                        c.skip(inner_ty, false)?;
                    }
                }
            }
            _ => c.skip(ty, false)?,
        }
    }
    Some(PageHeaderSummary {
        header_len: c.pos,
        page_type: page_type?,
        compressed_page_size: compressed.filter(|&n| n >= 0)?,
        num_values,
    })
}

impl Checked {
    fn name(self) -> &'static str {
        match self {
            Checked::FileMetaData => "FileMetaData",
            Checked::RowGroup => "RowGroup",
            Checked::ColumnChunk => "ColumnChunk",
            Checked::ColumnMetaData => "ColumnMetaData",
            Checked::SchemaElement => "SchemaElement",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FileMetaData { 1: 1, 4: [RowGroup { 1: [ColumnChunk { 3: ColumnMetaData }], 3: 6 }] }
    /// where ColumnMetaData holds field 1 (i32, as the spec says) and three mistyped fields.
    fn footer_with_mistyped_field() -> Vec<u8> {
        let mut cm = Vec::new();
        cm.extend([0x15, 0x0e]); // 1: i32 = 7 (zigzag 14)
        cm.extend([0x26, 0x14]); // 3 (delta 2): an i64 where the spec has a list -> dropped
        cm.extend([0xc9, 0x25, 0x02, 0x04]); // 15 (delta 12): list<i32> [1, 2] -> dropped
        cm.extend([0x16, 0x02]); // 16 (delta 1): an i64 where the spec has a struct -> dropped
        cm.push(0x00);
        let mut chunk = vec![0x3c]; // 3 (delta 3): struct ColumnMetaData
        chunk.extend(&cm);
        chunk.push(0x00);
        let mut rg = vec![0x19, 0x1c]; // 1: list<struct> of 1
        rg.extend(&chunk);
        rg.extend([0x26, 0x0c]); // 3 (delta 2): i64 num_rows = 6
        rg.push(0x00);
        let mut fmd = vec![0x15, 0x02]; // 1: i32 version = 1
        fmd.extend([0x39, 0x1c]); // 4 (delta 3): list<struct> of 1
        fmd.extend(&rg);
        fmd.push(0x00);
        fmd
    }

    #[test]
    fn mistyped_fields_are_dropped_and_headers_reencoded() {
        let input = footer_with_mistyped_field();
        let out = drop_mistyped_fields(&input).expect("well formed");
        assert_eq!(
            out.dropped,
            vec![
                ("ColumnMetaData", 3),
                ("ColumnMetaData", 15),
                ("ColumnMetaData", 16)
            ]
        );
        // Expected: the same footer with ColumnMetaData holding field 1 only.
        let expected: Vec<u8> = vec![
            0x15, 0x02, 0x39, 0x1c, 0x19, 0x1c, 0x3c, 0x15, 0x0e, 0x00, 0x00, 0x26, 0x0c, 0x00,
            0x00,
        ];
        assert_eq!(out.footer, expected);
        // Nothing to drop: the rewrite is the identity.
        let again = drop_mistyped_fields(&out.footer).unwrap();
        assert!(again.dropped.is_empty());
        assert_eq!(again.footer, out.footer);
    }

    #[test]
    fn interval_annotations_are_dropped_and_other_converted_types_kept() {
        // FileMetaData { 1: 1, 2: [SchemaElement { 4: "a", 6: INTERVAL }, SchemaElement { 4: "b", 6: UTF8 }] }
        let mut fmd = vec![0x15, 0x02, 0x19, 0x2c];
        fmd.extend([0x48, 0x01, b'a', 0x25, 0x2a, 0x00]); // 4: "a", 6 (delta 2): i32 21
        fmd.extend([0x48, 0x01, b'b', 0x25, 0x00, 0x00]); // 4: "b", 6: i32 0 (UTF8)
        fmd.push(0x00);
        let out = drop_interval_annotations(&fmd).expect("well formed");
        assert_eq!(out.dropped, vec![("SchemaElement", 6)]);
        let mut expected = vec![0x15, 0x02, 0x19, 0x2c];
        expected.extend([0x48, 0x01, b'a', 0x00]);
        expected.extend([0x48, 0x01, b'b', 0x25, 0x00, 0x00]);
        expected.push(0x00);
        assert_eq!(out.footer, expected);
        // The mistyped-field rewrite leaves the annotation alone.
        let kept = drop_mistyped_fields(&fmd).unwrap();
        assert!(kept.dropped.is_empty());
        assert_eq!(kept.footer, fmd);
    }

    #[test]
    fn page_headers_are_read() {
        // type 0 (data), uncompressed 106, compressed 106, DataPageHeader { num_values 25 }
        let header = [
            0x15, 0x00, 0x15, 0xd4, 0x01, 0x15, 0xd4, 0x01, 0x2c, 0x15, 0x32, 0x00, 0x00,
        ];
        let mut bytes = header.to_vec();
        bytes.extend([0xaa; 8]); // page data follows
        let summary = read_page_header(&bytes).unwrap();
        assert_eq!(
            summary,
            PageHeaderSummary {
                header_len: header.len(),
                page_type: 0,
                compressed_page_size: 106,
                num_values: 25
            }
        );
        assert!(read_page_header(&header[..header.len() - 1]).is_none());
    }

    #[test]
    fn truncated_input_is_refused() {
        let input = footer_with_mistyped_field();
        for cut in 0..input.len() {
            assert!(
                drop_mistyped_fields(&input[..cut]).is_none(),
                "cut at {cut}"
            );
        }
    }
}
