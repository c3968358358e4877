//! Arrow values in the store: an Arrow IPC stream written straight into the arena, read
//! back in place.
//!
//! Writing uses arrow-ipc's `StreamEncoder`, which returns the stream as a list of buffers
//! that *reference* the arrays' own buffers (only the small flatbuffer headers and padding
//! are new), so a put copies each payload byte exactly once: into the arena. The stored
//! object is a complete IPC stream (schema, dictionaries, record batches, end marker), so
//! any Arrow implementation can read the region as is.
//!
//! One exception to "the arrays' own buffers": a slice of a string/binary *view* array
//! references every data buffer of the array it was cut from, and IPC writes data buffers
//! whole. A 10,000-row slice of a batch decoded from Parquet would carry all the decoded pages
//! its parent's views point into (~7x the bytes for 65,536-row batches cut into 10,000-row
//! chunks). Such columns are compacted first ([`compact_views`]): the strings they reference
//! are copied once into fresh buffers, and those are what the put copies.
//!
//! Reading walks the stream's message headers and builds arrays whose buffers are slices
//! of the pinned region: no copy and no per-value work. Validation (UTF-8, offsets) is
//! skipped because the bytes were written by [`encode`] from valid arrays and the region is
//! immutable since; a region restored from disk was checksum-verified first.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{BinaryViewType, ByteViewType, StringViewType};
use arrow_array::{Array, ArrayRef, GenericByteViewArray, RecordBatch};
use arrow_buffer::Buffer;
use arrow_data::UnsafeFlag;
use arrow_ipc::reader::{read_dictionary_impl, RecordBatchDecoder};
use arrow_ipc::writer::StreamEncoder;
use arrow_ipc::{root_as_message, MessageHeader};
use arrow_schema::{ArrowError, DataType, Schema, SchemaRef};

/// Encode batches (all of `schema`) as IPC stream buffers; the payload buffers are the
/// arrays' own (zero copy), except for view columns that reference far more bytes than they
/// use ([`compact_views`]).
pub fn encode(schema: &Schema, batches: &[RecordBatch]) -> Result<Vec<Buffer>, ArrowError> {
    let mut encoder = StreamEncoder::try_new(schema)?;
    let mut out = Vec::new();
    for b in batches {
        if b.schema().fields() != schema.fields() {
            return Err(ArrowError::SchemaError(format!(
                "batch schema {} differs from the value's schema {}",
                b.schema(),
                schema
            )));
        }
        out.extend(encoder.encode(&compact_views(b)?)?);
    }
    out.extend(encoder.finish()?);
    Ok(out)
}

/// Wasted bytes a view column may carry before it is compacted: below this, copying the few
/// strings costs more than writing the unused bytes along.
const VIEW_SLACK_BYTES: usize = 64 << 10;

/// `batch` with every top-level Utf8View/BinaryView column whose data buffers hold more than
/// twice the bytes its views point at (and `VIEW_SLACK_BYTES` more) replaced by a compacted
/// copy. Views that share bytes (a dictionary-decoded column repeats the same strings) count
/// once per view, so such columns are left alone. Nested view arrays are written as they are.
pub fn compact_views(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    fn compacted<T: ByteViewType + ?Sized>(array: &GenericByteViewArray<T>) -> Option<ArrayRef> {
        let held: usize = array.data_buffers().iter().map(|b| b.len()).sum();
        if held <= VIEW_SLACK_BYTES {
            return None;
        }
        // Strings of up to 12 bytes live in the view itself.
        let used: usize = array
            .views()
            .iter()
            .map(|&v| v as u32 as usize)
            .filter(|&len| len > 12)
            .sum();
        (held > 2 * used + VIEW_SLACK_BYTES).then(|| Arc::new(array.gc()) as ArrayRef)
    }
    let mut columns: Option<Vec<ArrayRef>> = None;
    for (i, column) in batch.columns().iter().enumerate() {
        let replacement = match column.data_type() {
            DataType::Utf8View => compacted::<StringViewType>(column.as_string_view()),
            DataType::BinaryView => compacted::<BinaryViewType>(column.as_binary_view()),
            _ => None,
        };
        if let Some(replacement) = replacement {
            columns.get_or_insert_with(|| batch.columns().to_vec())[i] = replacement;
        }
    }
    match columns {
        None => Ok(batch.clone()),
        Some(columns) => RecordBatch::try_new_with_options(
            batch.schema(),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        ),
    }
}

/// Decode an IPC stream whose bytes are `data`; arrays point into `data`.
pub fn decode(data: &Buffer) -> Result<(SchemaRef, Vec<RecordBatch>), ArrowError> {
    let bytes = data.as_slice();
    let mut pos = 0usize;
    let mut schema: Option<SchemaRef> = None;
    let mut dictionaries: HashMap<i64, ArrayRef> = HashMap::new();
    let mut batches = Vec::new();
    let err = |m: String| ArrowError::IpcError(m);
    // SAFETY of skipping validation: see the module docs.
    let mut skip = UnsafeFlag::new();
    unsafe { skip.set(true) };
    loop {
        let Some(prefix) = bytes.get(pos..pos + 8) else {
            return Err(err(format!(
                "stream ends without an end marker at byte {pos}"
            )));
        };
        if prefix[0..4] != [0xff; 4] {
            return Err(err(format!("missing continuation marker at byte {pos}")));
        }
        let meta_len = i32::from_le_bytes(prefix[4..8].try_into().unwrap());
        if meta_len == 0 {
            break;
        }
        let meta_start = pos + 8;
        let meta_end = meta_start
            .checked_add(usize::try_from(meta_len).map_err(|_| err("negative length".into()))?)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| err(format!("message at byte {pos} runs past the object")))?;
        let message = root_as_message(&bytes[meta_start..meta_end])
            .map_err(|e| err(format!("bad message header at byte {pos}: {e}")))?;
        let body_len = usize::try_from(message.bodyLength())
            .map_err(|_| err("negative body length".into()))?;
        let body_end = meta_end
            .checked_add(body_len)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| {
                err(format!(
                    "message body at byte {meta_end} runs past the object"
                ))
            })?;
        let body = data.slice_with_length(meta_end, body_len);
        match message.header_type() {
            MessageHeader::Schema => {
                let fb = message
                    .header_as_schema()
                    .ok_or_else(|| err("unreadable schema message".into()))?;
                schema = Some(Arc::new(arrow_ipc::convert::try_fb_to_schema(fb)?));
            }
            MessageHeader::DictionaryBatch => {
                let s = schema
                    .as_ref()
                    .ok_or_else(|| err("dictionary before schema".into()))?;
                let batch = message
                    .header_as_dictionary_batch()
                    .ok_or_else(|| err("unreadable dictionary message".into()))?;
                read_dictionary_impl(
                    &body,
                    batch,
                    s,
                    &mut dictionaries,
                    &message.version(),
                    true,
                    skip.clone(),
                )?;
            }
            MessageHeader::RecordBatch => {
                let s = schema
                    .as_ref()
                    .ok_or_else(|| err("record batch before schema".into()))?;
                let batch = message
                    .header_as_record_batch()
                    .ok_or_else(|| err("unreadable record batch message".into()))?;
                let version = message.version();
                let decoded =
                    RecordBatchDecoder::try_new(&body, batch, s.clone(), &dictionaries, &version)?
                        .with_require_alignment(true)
                        .with_skip_validation(skip.clone())
                        .read_record_batch()?;
                batches.push(decoded);
            }
            other => return Err(err(format!("unexpected message {other:?} at byte {pos}"))),
        }
        pos = body_end;
    }
    let schema = schema.ok_or_else(|| err("stream has no schema".into()))?;
    Ok((schema, batches))
}
