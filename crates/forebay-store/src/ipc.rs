//! Arrow values in the store: an Arrow IPC stream written straight into the arena, read
//! back in place.
//!
//! Writing uses arrow-ipc's `StreamEncoder`, which returns the stream as a list of buffers
//! that *reference* the arrays' own buffers (only the small flatbuffer headers and padding
//! are new), so a put copies each payload byte exactly once: into the arena. The stored
//! object is a complete IPC stream (schema, dictionaries, record batches, end marker), so
//! any Arrow implementation can read the region as is.
//!
//! Reading walks the stream's message headers and builds arrays whose buffers are slices
//! of the pinned region: no copy and no per-value work. Validation (UTF-8, offsets) is
//! skipped because the bytes were written by [`encode`] from valid arrays and the region is
//! immutable since; a region restored from disk was checksum-verified first.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_data::UnsafeFlag;
use arrow_ipc::reader::{read_dictionary_impl, RecordBatchDecoder};
use arrow_ipc::writer::StreamEncoder;
use arrow_ipc::{root_as_message, MessageHeader};
use arrow_schema::{ArrowError, Schema, SchemaRef};

/// Encode batches (all of `schema`) as IPC stream buffers; the payload buffers are the
/// arrays' own (zero copy).
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
        out.extend(encoder.encode(b)?);
    }
    out.extend(encoder.finish()?);
    Ok(out)
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
